"""FSDP2 with the default, sampled readout (the other FSDP2 tests force the exact one): two gloo ranks
train through ``fit`` with PrimalDual(HORST); each rank draws its own token subsample, the ranks still agree
on λ and on every weight, the estimate says it was sampled, and HORST records the DTensor fallback."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("fsdp2_sampled_worker.py")


@pytest.mark.distributed
def test_fsdp2_fit_with_the_default_sampled_readout(torchrun, tmp_path) -> None:
    ranks, _ = torchrun(WORKER, tmp_path)
    a, b = ranks
    assert a["sampled"] and b["sampled"] and a["k"] < a["n"]  # the default sampled under grad
    assert torch.equal(a["lambda"], b["lambda"])  # ĝ is averaged over the ranks before the dual step
    assert torch.isfinite(a["lambda"]).all() and (a["lambda"] >= 0).all()
    assert all(torch.equal(a["params"][k], b["params"][k]) for k in a["params"])
    assert all(torch.isfinite(v).all() for v in a["params"].values())
    assert a["fallbacks"].get("tensor_subclass", 0) > 0  # DTensors: foreach by design, recorded
    assert a["reverted_total"] == 0
