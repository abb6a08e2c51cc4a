"""``fit`` writes an optimizer's fallback lines (HORST's ``fallback_messages``) into the run's log once, also
through PrimalDual and across a resume, so a fallback is never only a warning (issue 46)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import descentlab as dl
from descentlab.optim.horst import HorstFallbackWarning
from descentlab.train.loop import TrainConfig, fit
from descentlab.train.objectives import ERM, Constrained
from descentlab.train.rundir import RunDir


def _data(n: int = 16) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=gen, dtype=torch.float64)
    return [{"x": x[i], "y": x[i].sum(0, keepdim=True)} for i in range(n)]


def _loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return (model(batch["x"]) - batch["y"]).pow(2).mean()


def _fallback_records(folder) -> list[dict]:
    return [r for r in RunDir(folder).metrics() if "optimizer_fallbacks" in r]


def _fit(folder, model: nn.Module, optimizer, objective, max_steps: int) -> None:
    cfg = TrainConfig(max_steps=max_steps, batch_size=4, log_every=2, checkpoint_every=2, progress=False)
    with pytest.warns(HorstFallbackWarning):  # a fresh optimizer warns once as well
        fit(model, _data(), objective=objective, optimizer=optimizer, cfg=cfg, run=RunDir(folder), tag="job")


def test_a_horst_fallback_reaches_the_run_log_once(tmp_path) -> None:
    # float64 CPU weights take HORST's foreach path by design ("cpu_dtype"), at every step
    model = nn.Linear(4, 1).double()
    optimizer = dl.HORST(model.parameters(), lr=1e-3)
    _fit(tmp_path, model, optimizer, ERM(_loss), max_steps=5)
    records = RunDir(tmp_path).metrics()
    assert [r["step"] for r in records] == [2, 4, 5]
    written = _fallback_records(tmp_path)
    assert [r["step"] for r in written] == [2]  # the first log step after it happened, and only there
    lines = written[0]["optimizer_fallbacks"]
    assert set(lines) == {"cpu_dtype"} and "float32 only" in lines["cpu_dtype"]
    assert "HORST: 4 tensor-step(s)" in lines["cpu_dtype"]  # 2 tensors x 2 steps, as of step 2
    assert "HORST: 10 tensor-step(s)" in optimizer.fallback_messages["cpu_dtype"]  # still counted after
    assert all(r["loss"] is not None for r in records)  # the record keeps its usual fields


def test_through_primal_dual_and_not_again_after_a_resume(tmp_path) -> None:
    class Layers(nn.Module):  # two layers, whose outputs' losses are f_0 and f_1
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 1).double(), nn.Linear(1, 1).double()

        def forward(self, x: torch.Tensor, output_hidden_states: bool = True, **_: object):
            h = self.a(x)
            return type("Out", (), {"hidden_states": (h, self.b(h))})()

    def head(h: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return (h - batch["y"]).pow(2).mean()

    def run(max_steps: int) -> None:
        torch.manual_seed(0)
        model = Layers()
        constraint = dl.LayerwiseDescent(num_layers=1, alpha=0.1, dual_lr=0.1)
        optimizer = dl.PrimalDual(dl.HORST(model.parameters(), lr=1e-3), constraint)
        _fit(tmp_path, model, optimizer, Constrained(constraint, readout=head), max_steps)

    run(3)
    assert [r["step"] for r in _fallback_records(tmp_path)] == [2]
    run(6)  # resumes from step 3: the optimizer state it loads carries the reason the log already holds
    assert [r["step"] for r in RunDir(tmp_path).metrics()] == [2, 3, 4, 6]  # the second fit did log
    assert [r["step"] for r in _fallback_records(tmp_path)] == [2]
