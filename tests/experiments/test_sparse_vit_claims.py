"""sparse-vit claims on job results whose answer is known: the positive control, the optimizer comparisons,
the weight-shape statistics and the grid-edge flags."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from descentlab.report.sparse_vit import accuracy_ci, method_blocks
from descentlab.report.sparse_vit_claims import (
    claims_table,
    evaluate_claims,
    selection_record,
    tensor_shape_stats,
)

N = 2000


def _job(acc: float, seed: int, shape: dict | None = None, lr: float = 1e-3, alpha: float = 0.0) -> dict:
    rng = np.random.default_rng(seed)
    hits = (rng.random(N) < acc).astype(int)
    return {
        "test": float(hits.mean()),
        "val": acc,
        "test_correct": hits.tolist(),
        "shape": shape,
        "lr": lr,
        "alpha": alpha,
        "checkpoint_sparsity": 0.9,
        "block_sparsity": [0.9],
    }


def _shape(frac: float, kurt: float) -> dict:
    return {"frac_below": [frac] * 6, "kurtosis": [kurt + i for i in range(6)], "global_frac_below": frac,
            "global_kurtosis": kurt}  # fmt: skip


def _runs(acc: float, base: int, shape: dict | None = None) -> list[dict]:
    return [_job(acc, base + s, shape) for s in range(3)]


def _by_claim(rows: list[dict]) -> dict[tuple[str, float], dict]:
    return {(r["claim"], r["sparsity"]): r for r in rows}


def test_claims_on_known_gaps() -> None:
    dense = {"adamw": _runs(0.90, 0)}
    sparse = {
        # the control: 10 points at 90 %, only 1 at 50 %
        "adamw": {0.5: _runs(0.89, 10), 0.9: _runs(0.80, 20, _shape(0.1, 5.0))},
        "horst": {0.5: _runs(0.89, 30), 0.9: _runs(0.86, 40, _shape(0.5, 50.0))},
        "ham": {0.5: _runs(0.89, 50), 0.9: _runs(0.88, 60)},
    }
    rows = _by_claim(evaluate_claims(sparse, dense, claim_sparsity=0.9, regime_gap=0.03, n_boot=400))
    assert set(rows) == {
        ("regime", 0.5), ("regime", 0.9), ("horst-beats-adamw", 0.5), ("horst-beats-adamw", 0.9),
        ("horst-beats-ham", 0.9), ("horst-peaked", 0.9), ("horst-heavy-tailed", 0.9),
    }  # fmt: skip
    assert rows["regime", 0.9]["verdict"] == "reproduced"
    assert rows["regime", 0.5]["verdict"] == "refuted"  # the CI lies entirely short of 3 points
    assert rows["regime", 0.9]["shape"] == [3, N] and rows["regime", 0.9]["estimate"] == pytest.approx(
        0.1, abs=0.01
    )
    assert rows["horst-beats-adamw", 0.9]["verdict"] == "reproduced"
    assert rows["horst-beats-adamw", 0.5]["verdict"] == "inconclusive"
    assert rows["horst-beats-adamw", 0.5]["min_detectable_effect"] > 0
    assert rows["horst-beats-ham", 0.9]["verdict"] == "refuted"
    peaked = rows["horst-peaked", 0.9]
    assert peaked["verdict"] == "reproduced" and peaked["shape"] == [3, 6]
    assert peaked["estimate"] == pytest.approx(0.4)
    assert rows["horst-heavy-tailed", 0.9]["estimate"] == pytest.approx(45.0)
    table = claims_table(list(rows.values()))
    assert len(table["rows"]) == 7 and "claimed >= 3" in " ".join(r[3] for r in table["rows"])


def test_the_paired_ci_uses_the_pairing() -> None:
    # b is a with 1 % of the images flipped to wrong: a large unpaired spread, but a tight paired CI
    a = _runs(0.7, 0)
    b = [dict(j, test_correct=[0 if i % 100 == 0 else c for i, c in enumerate(j["test_correct"])]) for j in a]
    rows = evaluate_claims(
        {"horst": {0.9: a}, "adamw": {0.9: b}}, {}, claim_sparsity=0.9, regime_gap=0.03, n_boot=400
    )
    (row,) = rows
    assert row["verdict"] == "reproduced" and 0 < row["ci"][0] < row["estimate"] < row["ci"][1]
    # unpaired, two 70 % accuracies over 6,000 cells would give a half-width of ~0.016
    assert row["ci"][1] - row["ci"][0] < 0.01


def test_accuracy_ci_brackets_the_mean_and_blocks_carry_it() -> None:
    runs = _runs(0.8, 0)
    low, high = accuracy_ci(runs)
    mean = np.mean([r["test"] for r in runs])
    assert low < mean < high and high - low < 0.05
    blocks = method_blocks({"adamw": {0.9: runs}}, {"adamw": runs})
    assert blocks["adamw"].curves["test_accuracy"].extra["ci95"] == [[low, high]]
    assert blocks["adamw-dense"].extra["test_accuracy_ci95"] == [low, high]
    assert accuracy_ci([{"test": 0.5}]) is None  # jobs without per-image results: no CI, no failure


def test_tensor_shape_stats_known_distributions() -> None:
    gen = torch.Generator().manual_seed(0)
    gauss = torch.randn(200_000, generator=gen)
    laplace = torch.distributions.Laplace(0.0, 1.0).sample((200_000,))
    spike = torch.cat([torch.zeros(900), torch.ones(100)])
    stats = tensor_shape_stats([gauss, laplace, spike], threshold=0.5)
    assert stats["kurtosis"][0] == pytest.approx(0.0, abs=0.05)  # Gaussian: excess kurtosis 0
    assert stats["kurtosis"][1] == pytest.approx(3.0, abs=0.2)  # Laplace: 3
    assert stats["frac_below"][2] == pytest.approx(0.9)
    assert stats["frac_below"][0] == pytest.approx(0.3829, abs=0.005)  # P(|Z| < 0.5)
    whole = torch.cat([gauss, laplace, spike])
    assert stats["global_frac_below"] == pytest.approx(float((whole.abs() < 0.5).double().mean()))


def test_selection_flags_a_choice_at_a_grid_edge() -> None:
    grid = [_job(v, i, lr=2e-3, alpha=a) for i, (a, v) in enumerate([(1.0, 0.80), (3.0, 0.82), (10.0, 0.81)])]
    edge = [_job(v, i, lr=lr) for i, (lr, v) in enumerate([(1e-3, 0.7), (2e-3, 0.75), (4e-3, 0.78)])]
    record, notes = selection_record({"horst": grid, "adamw": edge}, {"horst": 1, "adamw": 2})
    assert record["horst"]["chosen"] == {"lr": 2e-3, "alpha": 3.0, "val": 0.82}
    assert record["horst"]["at_edge"] == [] and len(record["horst"]["grid"]) == 3
    assert record["adamw"]["at_edge"] == ["lr"]  # alpha has one value: no edge to be at
    assert len(notes) == 1 and "adamw" in notes[0] and "edge" in notes[0]
