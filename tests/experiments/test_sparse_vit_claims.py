"""sparse-vit's claims on synthetic cells whose answer is known: a planted effect is reproduced, a null is not,
the regime control is a sized claim (a CI straddling 3 points does not pass), a missing cell pends; and the
tables' seed-level intervals and the shared weight-shape measurements."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from descentlab.experiments.sparse_vit.claims import CLAIMS, claim_arrays, key
from descentlab.experiments.sparse_vit.tables import accuracy_ci, method_blocks
from descentlab.io import save_arrays
from descentlab.report.claims import NOT_IN_RUN, ONE_SEED, PENDING, judge
from descentlab.sparsity.report import selection_record, tensor_shape_stats

N, SEEDS, LEVELS, AT = 2000, 6, (0.98, 0.99), 0.99


def _correct(acc: float | list[float], seed: int, seeds: int = SEEDS) -> np.ndarray:
    """``[seeds, N]`` correctness; seed s gets accuracy ``acc[s]`` (a scalar: the same for every seed)."""
    rng = np.random.default_rng(seed)
    accs = np.broadcast_to(np.asarray(acc, dtype=float), (seeds,))
    return (rng.random((seeds, N)) < accs[:, None]).astype(np.int8)


def _arrays(gain: float, *, ham: float = 0.0, seeds: int = SEEDS) -> dict[str, np.ndarray]:
    """AdamW at 0.80 (+ seed noise), HORST ``gain`` above it, HAM ``ham`` above it, a dense model at 0.90;
    the weight shape with HORST's tensors ``gain``-proportionally more peaked."""
    rng = np.random.default_rng(7)
    base = 0.80 + rng.normal(0, 0.003, seeds)
    out: dict[str, np.ndarray] = {
        "sparsities": np.asarray(LEVELS),
        "claim_sparsity": np.float64(AT),
        "paper_like_sparsity": np.float64(0.9),
        key("correct", "adamw", "dense"): _correct(0.90, 1, seeds),
    }
    for i, p in enumerate(LEVELS):
        out[key("correct", "adamw", p)] = _correct(list(base), 10 + i, seeds)
        out[key("correct", "horst", p)] = _correct(list(base + gain), 20 + i, seeds)
        out[key("correct", "ham", p)] = _correct(list(base + ham), 30 + i, seeds)
    out[key("correct", "adamw", "paper-like")] = _correct(list(base), 40, seeds)
    out[key("correct", "horst", "paper-like")] = _correct(list(base + gain), 41, seeds)
    for stat, scale in (("frac_below", 1.0), ("kurtosis", 300.0)):
        noise = rng.normal(0, 0.002 * scale, (2, seeds, 6))
        out[key(stat, "adamw", AT)] = 0.5 * scale + noise[0]
        out[key(stat, "horst", AT)] = (0.5 + 10 * gain) * scale + noise[1]
    return out


def _rows(arrays) -> dict[tuple[str, str], object]:
    return {(r.name, r.at): r for r in judge(CLAIMS, arrays)}


def test_declared_claims_one_primary_with_thresholds() -> None:
    primary = [s for s in CLAIMS if s.primary]
    assert [s.name for s in primary] == ["horst-adamw"] and primary[0].sesoi == 0.01
    regime = next(s for s in CLAIMS if s.name == "regime")
    assert regime.kind == "sized" and regime.size == 0.03
    assert all(s.threshold for s in CLAIMS) and all(s.description for s in CLAIMS)


def test_a_planted_gain_is_reproduced_and_a_null_is_not() -> None:
    rows = _rows(_arrays(0.06, ham=-0.06))
    assert rows["horst-adamw", "sparsity 99 %"].verdict == "reproduced"
    assert rows["horst-adamw", "sparsity 99 %"].estimate == pytest.approx(0.06, abs=0.01)
    assert rows["horst-adamw", "sparsity 99 %"].seeds == SEEDS
    assert rows["horst-adamw-levels", "sparsity 98 %"].holm_verdict == "reproduced"
    assert rows["horst-ham", "sparsity 99 %"].holm_verdict == "reproduced"
    assert rows["paper-like", "block Linears, sparsity 90 %"].holm_verdict == "reproduced"
    assert rows["horst-peaked", "sparsity 99 %, before the final pruning"].verdict == "reproduced"
    null = _rows(_arrays(0.0))
    assert null["horst-adamw", "sparsity 99 %"].verdict != "reproduced"
    assert all(r.verdict != "reproduced" for (name, _), r in null.items() if name.startswith("horst"))
    # HORST one point *worse* everywhere: the claims that it is better are refuted (SESOI 1 point)
    worse = _rows(_arrays(-0.03))
    assert worse["horst-adamw", "sparsity 99 %"].verdict == "refuted"


def test_the_regime_control_is_a_sized_claim() -> None:
    arrays = _arrays(0.0)
    rows = _rows(arrays)
    assert rows["regime", "sparsity 99 %"].verdict == "reproduced"  # 10 points lost, far beyond 3
    # the committed ViT regime at 98 %: about 2.95 points [2.46, 3.42] against a claimed 3 must not pass
    rng = np.random.default_rng(3)
    dense = _correct(0.8778, 5, 3)
    straddle = {**_arrays(0.0, seeds=3), key("correct", "adamw", "dense"): dense}
    sparse = dense.copy()
    for s, lost in enumerate((0.027, 0.034, 0.028)):  # per-seed losses around 3 points
        flip = rng.choice(np.flatnonzero(dense[s]), round(lost * N), replace=False)
        sparse[s, flip] = 0
    straddle[key("correct", "adamw", 0.98)] = sparse
    row = _rows(straddle)["regime", "sparsity 98 %"]
    assert row.low < 0.03 < row.high and row.verdict == "inconclusive"
    # a tight loss of one point is refuted as a 3-point regime
    small = dense.copy()
    for s in range(3):
        small[s, np.flatnonzero(dense[s])[: int(0.01 * N)]] = 0
    assert (
        _rows({**straddle, key("correct", "adamw", 0.98): small})["regime", "sparsity 98 %"].verdict
        == "refuted"
    )


def test_a_block_linear_run_is_the_paper_like_arm_and_names_its_set(tmp_path) -> None:
    # the full-paper-like preset: the run's own cells at 90 % (block Linears) judge paper-like; the primary
    # endpoint (every Linear/Conv prunable) has no comparison; every other row names the set
    arrays = {k: v for k, v in _arrays(0.06, ham=-0.06).items() if "paper-like" not in k}
    arrays |= {"prune": np.asarray("blocks"), "paper_like_sparsity": np.float64(0.99)}
    rows = _rows(arrays)
    assert rows["paper-like", "block Linears, sparsity 99 %"].verdict == "reproduced"
    assert rows["paper-like", "block Linears, sparsity 99 %"].estimate == pytest.approx(
        rows["horst-ham", "block Linears, sparsity 99 %"].estimate - 0.06, abs=0.01
    )
    # not "none of the arms": it trained AdamW and HORST, on another prunable set, and the reason says which
    primary = rows["horst-adamw", ""]
    assert primary.verdict == NOT_IN_RUN and primary.reason.startswith(
        "the run's prunable set is the block Linears only (acdc.prune=blocks); the primary compares AC/DC "
        "over every Linear/Conv weight (acdc.prune=all)"
    )
    assert ("regime", "block Linears, sparsity 98 %") in rows
    assert ("horst-peaked", "block Linears, sparsity 99 %, before the final pruning") in rows
    # the same set read back from a saved run's config when its arrays lack it
    del arrays["prune"]
    save_arrays(tmp_path / "arrays" / "claims.npz", **arrays)
    (tmp_path / "results.json").write_text('{"config": {"acdc": {"prune": "blocks"}}}')
    assert str(claim_arrays(tmp_path)["prune"]) == "blocks"
    # a run over every Linear/Conv weight without the side arm: paper-like pends on the side arm's cell
    assert (
        "correct/horst/paper-like" in _rows({**arrays, "prune": np.asarray("all")})["paper-like", ""].reason
    )


def test_missing_cells_pend_and_one_seed_is_not_judged(tmp_path) -> None:
    arrays = _arrays(0.06)
    del arrays[key("correct", "horst", "paper-like")]
    rows = {r.name: r for r in judge(CLAIMS, arrays)}
    assert rows["paper-like"].verdict == PENDING and "correct/horst/paper-like" in rows["paper-like"].reason
    one = _rows(_arrays(0.06, seeds=1))
    assert one["horst-adamw", "sparsity 99 %"].verdict == ONE_SEED
    # a run directory without arrays/claims.npz (the committed pre-engine run): every row pends, naming a cell
    (tmp_path / "results.json").write_text('{"config": {"sparsities": [0.98, 0.99], "claim_sparsity": 0.99}}')
    pending = judge(CLAIMS, claim_arrays(tmp_path))
    assert {r.verdict for r in pending} == {PENDING} and "correct/horst/0.99" in pending[0].reason
    save_arrays(tmp_path / "arrays" / "claims.npz", **_arrays(0.06))
    assert judge(CLAIMS, claim_arrays(tmp_path))[0].verdict == "reproduced"


def test_arms_the_config_never_had_are_not_in_this_run_and_saved_ones_are_judged(tmp_path) -> None:
    save_arrays(tmp_path / "arrays" / "claims.npz", **_arrays(0.06))
    cfg = {"sparsities": [0.98, 0.99], "claim_sparsity": 0.99, "methods": ["adamw", "horst"], "dense": None,
           "paper_like_seeds": []}  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps({"config": cfg}))
    rows = {r.name: r for r in judge(CLAIMS, claim_arrays(tmp_path))}
    for name, why in (
        ("horst-ham", "no ham arm"),
        ("paper-like", "no paper-like arm"),
        ("regime", "no dense"),
    ):
        assert rows[name].verdict == NOT_IN_RUN and why in rows[name].reason, name
    assert rows["horst-adamw"].verdict == "reproduced"
    # the full design: the same cells are judged
    cfg |= {"methods": ["adamw", "horst", "ham"], "dense": "adamw", "paper_like_seeds": [7, 8]}
    (tmp_path / "results.json").write_text(json.dumps({"config": cfg}))
    rows = {r.name: r for r in judge(CLAIMS, claim_arrays(tmp_path))}
    assert NOT_IN_RUN not in {rows[n].verdict for n in ("horst-ham", "paper-like", "regime")}


def _job(acc: float, seed: int, lr: float = 1e-3, alpha: float = 0.0) -> dict:
    hits = _correct(acc, seed, 1)[0]
    return {"test": float(hits.mean()), "val": acc, "test_correct": hits.tolist(), "lr": lr, "alpha": alpha,
            "checkpoint_sparsity": 0.9, "block_sparsity": [0.9]}  # fmt: skip


def test_accuracy_ci_is_seed_level_and_blocks_carry_it() -> None:
    runs = [_job(0.8, s) for s in range(3)]
    low, high = accuracy_ci(runs)
    mean = np.mean([r["test"] for r in runs])
    assert low < mean < high and high - low < 0.05
    # the seeds disagree by 10 points: the seed-level interval is wide, whatever the number of images
    spread = [_job(a, s) for s, a in enumerate((0.7, 0.8, 0.9))]
    lo2, hi2 = accuracy_ci(spread)
    assert hi2 - lo2 > 0.3
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


def test_the_figure_draws_the_paired_differences_the_committed_claims_were_judged_on() -> None:
    import json
    from pathlib import Path

    from descentlab.experiments.sparse_vit.figures import paired_differences
    from descentlab.io import load_arrays

    run = Path(__file__).parents[2] / "docs" / "results" / "sparse-vit"
    results = json.loads((run / "results.json").read_text())
    diffs = paired_differences(load_arrays(run / "arrays" / "claims.npz"), [0.99])
    assert set(diffs) == {"horst − adamw", "horst − ham"}
    for name, ((level, mean, low, high, per_seed),) in diffs.items():
        reference = name.split(" − ")[1]
        row = next(c for c in results["claims"] if c["method"] == "horst" and c["reference"] == reference)
        assert level == 0.99 and len(per_seed) == 8
        assert (mean, low, high) == pytest.approx(
            (100 * row["estimate"], 100 * row["low"], 100 * row["high"])
        )
        assert np.mean(per_seed) == pytest.approx(mean)
