"""Two gloo processes (torchrun) train a small BERT with constraints + HORST (+ AC/DC) and agree with one process.

One launch runs the phases of ``worker.py``: ``descentlab.train.loop.fit`` under DDP, a FSDP2
(``fully_shard``) loop with PrimalDual(HORST), and the smoke experiment through ``run_experiment``. The single-process reference runs the same functions in this
process, on the same global batches.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
import torch

from descentlab.errors import AssetMissingError

WORKER = Path(__file__).with_name("worker.py")
WORLD = 2


@pytest.fixture(scope="module")
def launched(torchrun, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], ModuleType, Path]:
    from descentlab.data import asset_path

    try:
        asset_path("minilm")  # its WordPiece vocabulary tokenizes the reviews
    except AssetMissingError as exc:
        pytest.skip(str(exc))
    out = tmp_path_factory.mktemp("ranks")
    ranks, worker = torchrun(WORKER, out, TOKENIZERS_PARALLELISM="false")
    return ranks, worker, out


@pytest.mark.distributed
def test_fit_under_ddp_agrees_across_ranks_and_with_one_process(launched) -> None:
    ranks, worker, _ = launched
    a, b = ranks[0]["fit"], ranks[1]["fit"]
    assert ranks[0]["world"] == WORLD
    # what must agree across ranks agrees bit for bit
    assert torch.equal(a["lambda"], b["lambda"])
    assert a["masks"].keys() == b["masks"].keys() and len(a["masks"]) == 6 * worker.LAYERS
    assert all(torch.equal(a["masks"][k], b["masks"][k]) for k in a["masks"])
    assert all(torch.equal(a["params"][k], b["params"][k]) for k in a["params"])
    assert a["metrics"] == b["metrics"] and torch.equal(a["curve"], b["curve"])
    # the run did something: duals moved, the final phase is compressed at 50 %
    assert float(a["lambda"].min()) > 0.05
    kept = sum(int(m.sum()) for m in a["masks"].values()) / sum(m.numel() for m in a["masks"].values())
    assert kept == pytest.approx(0.5, abs=1e-3)
    for name, mask in a["masks"].items():
        assert int((a["params"][name][~mask] != 0).sum()) == 0

    single = worker.train_fit()
    torch.testing.assert_close(a["lambda"], single["lambda"], rtol=0, atol=1e-6)
    agreement = [float((a["masks"][k] == single["masks"][k]).double().mean()) for k in a["masks"]]
    assert min(agreement) > 0.999  # a near-tie may flip under float noise; none did in practice
    for name, value in single["params"].items():
        torch.testing.assert_close(a["params"][name], value, rtol=1e-4, atol=1e-4)
    # metrics are gathered over the whole evaluation set, not one rank's share
    assert a["metrics"]["n"] == single["metrics"]["n"] == worker.N_EVAL == a["n_eval_curve"]
    assert a["metrics"]["accuracy"] == pytest.approx(single["metrics"]["accuracy"], abs=1.5 / worker.N_EVAL)
    assert a["metrics"]["loss"] == pytest.approx(single["metrics"]["loss"], rel=1e-5)
    torch.testing.assert_close(a["curve"], single["curve"], rtol=0, atol=1.5 / worker.N_EVAL)
    # every rank holds every example's value, in order: they average to the curve and match one process
    assert torch.equal(a["examples"], b["examples"]) and a["examples"].shape[-1] == worker.N_EVAL
    torch.testing.assert_close(a["examples"].mean(-1), a["curve"], rtol=0, atol=1e-12)
    assert float((a["examples"] == single["examples"]).double().mean()) > 0.98
    torch.testing.assert_close(a["profile"], single["profile"], rtol=1e-5, atol=1e-6)


@pytest.mark.distributed
def test_fsdp2_primal_dual_horst_matches_one_process(launched) -> None:
    ranks, worker, _ = launched
    a, b = ranks[0]["fsdp2"], ranks[1]["fsdp2"]
    name = "bert.embeddings.word_embeddings.weight"
    assert a["local_shapes"][name][0] * WORLD == a["params"][name].shape[0]  # really sharded
    assert torch.equal(a["lambda"], b["lambda"])
    assert all(torch.equal(a["params"][k], b["params"][k]) for k in a["params"])

    single = worker.train_fsdp2(sharded=False)
    assert single["local_shapes"][name] == tuple(single["params"][name].shape)
    torch.testing.assert_close(a["lambda"], single["lambda"], rtol=0, atol=1e-6)
    assert float(single["lambda"][-1].min()) > 0.05
    for key, value in single["params"].items():
        torch.testing.assert_close(a["params"][key], value, rtol=1e-4, atol=1e-4)


@pytest.mark.distributed
def test_an_experiment_under_torchrun_writes_one_run_directory(launched) -> None:
    ranks, _, out = launched
    runs = sorted((out / "runs").iterdir())
    assert [r["smoke_run_dir"] for r in ranks] == [str(runs[0])] * WORLD
    assert len(runs) == 1
    run = runs[0]
    assert json.loads((run / "status.json").read_text())["state"] == "done"
    assert (run / "report.md").is_file() and (run / "results.json").is_file()
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps))  # logged once, by rank 0
