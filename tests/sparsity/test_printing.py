"""Issue 33 (15): ``ACDC`` and ``sparsity_report`` print what a user wants to see at a glance."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from descentlab.sparsity import ACDC, ACDCSchedule, select_prunable, sparsity_report


def test_acdc_repr_names_sparsity_phase_step_and_masked_tensors(make_vit: Callable[..., nn.Module]) -> None:
    model = make_vit()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    schedule = ACDCSchedule(warmup=2, phase=2, last_decompressed=2, final=2)
    acdc = ACDC(model, opt, sparsity=0.8, schedule=schedule, total_steps=12)
    n = len(select_prunable(model))
    text = repr(acdc)
    assert text.startswith("ACDC(") and "sparsity=0.8" in text and "phase='dense' [0, 2)" in text
    assert "step=0/12" in text and f"masked=0/{n} tensors" in text
    for _ in range(2):
        acdc.step()
    text = repr(acdc)
    assert "phase='compressed' [2, 4)" in text and "step=2/12" in text and f"masked={n}/{n} tensors" in text


def test_sparsity_report_prints_one_row_per_layer_weight(make_vit: Callable[..., nn.Module]) -> None:
    model = make_vit(layers=2)
    with torch.no_grad():
        for t in select_prunable(model):
            t.param[: t.param.shape[0] // 2] = 0
    report = sparsity_report(model)
    text = str(report)
    lines = text.splitlines()
    assert lines[0].split() == ["tensor", "block", "entries", "zeros", "sparsity"]
    for name, count in report.tensors.items():
        row = next(line for line in lines if line.startswith(name + " "))
        assert row.split()[-1] == f"{count.sparsity:.4f}"
    assert sum("(block total)" in line for line in lines) == len(report.blocks) == 2
    assert (
        lines[-1].split()[:2] == ["global", "all"]
        and lines[-1].split()[-1] == f"{report.global_sparsity:.4f}"
    )
    assert len(lines) == 1 + len(report.tensors) + len(report.blocks) + 1
    assert report.table(per_tensor=False).count("\n") == len(report.blocks) + 1
