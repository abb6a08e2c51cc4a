"""sparse-vit's claims on synthetic cells whose answer is known: a planted effect is reproduced, a null is not,
the regime control is a sized claim (a CI straddling 3 points does not pass), a missing cell pends, an arm
the design lacks is not in the run; the committed runs' old arrays read alike (legacy.py); and the tables'
seed-level intervals and the shared weight-shape measurements."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from descentlab.config import resolve_config
from descentlab.experiments.sparse_vit.claims import CLAIMS, claim_arrays
from descentlab.experiments.sparse_vit.config import SparseViTConfig, design
from descentlab.experiments.sparse_vit.report import accuracy_ci, method_blocks
from descentlab.report.claims import NOT_IN_RUN, ONE_SEED, PENDING, judge
from descentlab.sparsity.report import selection_record, tensor_shape_stats
from descentlab.study.cells import CellStore, cell_key

N, SEEDS, LEVELS, AT = 2000, 6, (0.98, 0.99), 0.99


def _correct(acc: float | list[float], seed: int, seeds: int = SEEDS) -> np.ndarray:
    """``[seeds, N]`` correctness; seed s gets accuracy ``acc[s]`` (a scalar: the same for every seed)."""
    rng = np.random.default_rng(seed)
    accs = np.broadcast_to(np.asarray(acc, dtype=float), (seeds,))
    return (rng.random((seeds, N)) < accs[:, None]).astype(np.int8)


def _arrays(gain: float, *, ham: float = 0.0, seeds: int = SEEDS, **config: object) -> CellStore:
    """AdamW at 0.80 (+ seed noise), HORST ``gain`` above it, HAM ``ham`` above it, a dense model at 0.90;
    the weight shape with HORST's tensors ``gain``-proportionally more peaked; the paper-like arm on its
    own seeds. The design is the config's (``config`` overrides it)."""
    settings = {"sparsities": list(LEVELS), "claim_sparsity": AT, "seeds": list(range(seeds)),
                "paper_like_seeds": [100 + s for s in range(seeds)], "acdc.prune": "all"} | config  # fmt: skip
    cfg = resolve_config(SparseViTConfig, overrides=[f"{k}={v}" for k, v in settings.items()])
    store = CellStore(design(cfg))
    rng = np.random.default_rng(7)
    base = 0.80 + rng.normal(0, 0.003, seeds)
    arms = {"adamw": 0.0, "horst": gain, "ham": ham}
    for i, p in enumerate(LEVELS):
        for k, (arm, shift) in enumerate(arms.items()):
            if arm in cfg.methods:
                store.put("correct", arm, p, _correct(list(base + shift), 10 * (k + 1) + i, seeds))
    if cfg.dense:
        store.put("correct", "adamw", "dense", _correct(0.90, 1, seeds))
    if cfg.paper_like_seeds:
        side = np.resize(base, len(cfg.paper_like_seeds))  # the side arm's own seeds
        store.put("correct", "adamw", "paper-like", _correct(list(side), 40, len(side)))
        store.put("correct", "horst", "paper-like", _correct(list(side + gain), 41, len(side)))
    for stat, scale in (("frac_below", 1.0), ("kurtosis", 300.0)):
        noise = rng.normal(0, 0.002 * scale, (2, seeds, 6))
        store.put(stat, "adamw", AT, 0.5 * scale + noise[0])
        store.put(stat, "horst", AT, (0.5 + 10 * gain) * scale + noise[1])
    return store


def _without(store: CellStore, *keys: str) -> CellStore:
    return CellStore(store.design, {k: v for k, v in store.items() if k not in keys})


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
    rows = _rows(_arrays(0.0))
    assert rows["regime", "sparsity 99 %"].verdict == "reproduced"  # 10 points lost, far beyond 3
    # the committed ViT regime at 98 %: about 2.95 points [2.46, 3.42] against a claimed 3 must not pass
    rng = np.random.default_rng(3)
    dense = _correct(0.8778, 5, 3)
    straddle = _arrays(0.0, seeds=3)
    straddle.put("correct", "adamw", "dense", dense)
    sparse = dense.copy()
    for s, lost in enumerate((0.027, 0.034, 0.028)):  # per-seed losses around 3 points
        flip = rng.choice(np.flatnonzero(dense[s]), round(lost * N), replace=False)
        sparse[s, flip] = 0
    straddle.put("correct", "adamw", 0.98, sparse)
    row = _rows(straddle)["regime", "sparsity 98 %"]
    assert row.low < 0.03 < row.high and row.verdict == "inconclusive"
    # a tight loss of one point is refuted as a 3-point regime
    small = dense.copy()
    for s in range(3):
        small[s, np.flatnonzero(dense[s])[: int(0.01 * N)]] = 0
    straddle.put("correct", "adamw", 0.98, small)
    assert _rows(straddle)["regime", "sparsity 98 %"].verdict == "refuted"


def test_a_block_linear_run_is_the_paper_like_arm_and_names_its_set() -> None:
    # the full-paper-like preset: the run's own cells at 99 % (block Linears) judge paper-like; the primary
    # endpoint (every Linear/Conv prunable) has no comparison; every other row names the set
    store = _arrays(
        0.06, ham=-0.06, **{"acdc.prune": "blocks", "paper_like_sparsity": AT, "paper_like_seeds": []}
    )
    assert "paper-like" not in store.design.conditions and store.design.extra["prune"] == "blocks"
    rows = _rows(store)
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


def test_missing_cells_pend_and_one_seed_is_not_judged(tmp_path) -> None:
    store = _without(_arrays(0.06), cell_key("correct", "horst", "paper-like"))
    rows = {r.name: r for r in judge(CLAIMS, store)}
    assert rows["paper-like"].verdict == PENDING and "correct/horst/paper-like" in rows["paper-like"].reason
    one = _rows(_arrays(0.06, seeds=1))
    assert one["horst-adamw", "sparsity 99 %"].verdict == ONE_SEED
    # the paper-like arm on its own seeds: 2 side seeds beside 6 main ones, judged over its 2
    side = _arrays(0.06, paper_like_seeds=[100, 101])
    assert side.design.seeds_at("paper-like") == (100, 101) and side["correct/horst/paper-like"].shape == (
        2,
        N,
    )
    assert _rows(side)["paper-like", "block Linears, sparsity 90 %"].seeds == 2
    # a run directory with neither cells nor results.json: every row pends, naming the store
    assert {r.verdict for r in judge(CLAIMS, claim_arrays(tmp_path))} == {PENDING}
    # the store round-trips through the run directory, its design record included
    side.save(tmp_path)
    assert CellStore.load(tmp_path).design == side.design
    assert [r.to_dict() for r in judge(CLAIMS, claim_arrays(tmp_path))] == [
        r.to_dict() for r in judge(CLAIMS, side)
    ]


def test_arms_the_config_never_had_are_not_in_this_run_and_saved_ones_are_judged() -> None:
    store = _arrays(0.06, methods="[adamw,horst]", dense="null", paper_like_seeds="[]")
    rows = {r.name: r for r in judge(CLAIMS, store)}
    for name, why in (
        ("horst-ham", "no ham arm"),
        ("paper-like", "no paper-like arm"),
        ("regime", "no dense"),
    ):
        assert rows[name].verdict == NOT_IN_RUN and why in rows[name].reason, name
    assert rows["horst-adamw"].verdict == "reproduced"
    # the full design: the same cells are judged
    rows = {r.name: r for r in judge(CLAIMS, _arrays(0.06))}
    assert NOT_IN_RUN not in {rows[n].verdict for n in ("horst-ham", "paper-like", "regime")}


def test_the_committed_runs_old_arrays_read_as_the_design_their_config_gives() -> None:
    """legacy.py: a committed run's flat claims.npz is the store a run of its config saves now (its design
    record equal to config.design of its config), and a run that saved no cells pends on each cell's key."""
    from pathlib import Path

    from descentlab.config import load_config_yaml

    results = Path(__file__).parents[2] / "docs" / "results" / "sparse-vit"
    for run in (results, results / "full-levels", results / "full-paper-like"):
        config = json.loads((run / "results.json").read_text())["config"]
        store = claim_arrays(run)
        assert store.design == design(load_config_yaml(SparseViTConfig, json.dumps(config))), run.name
        assert all(v.shape[0] == len(store.design.seeds) for v in store.values())
    earlier = claim_arrays(results / "earlier")
    assert len(earlier) == 0 and earlier.design.arms == ("adamw", "horst", "ham")
    rows = judge(CLAIMS, earlier)
    assert {r.verdict for r in rows} == {PENDING}
    assert "'correct/horst/0.99'" in rows[0].reason and "'paper_like_sparsity'" in rows[3].reason


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
    from pathlib import Path

    from descentlab.experiments.sparse_vit.report import paired_differences

    run = Path(__file__).parents[2] / "docs" / "results" / "sparse-vit"
    results = json.loads((run / "results.json").read_text())
    diffs = paired_differences(claim_arrays(run), [0.99])
    assert set(diffs) == {"horst − adamw", "horst − ham"}
    for name, ((level, mean, low, high, per_seed),) in diffs.items():
        reference = name.split(" − ")[1]
        row = next(c for c in results["claims"] if c["method"] == "horst" and c["reference"] == reference)
        assert level == 0.99 and len(per_seed) == 8
        assert (mean, low, high) == pytest.approx(
            (100 * row["estimate"], 100 * row["low"], 100 * row["high"])
        )
        assert np.mean(per_seed) == pytest.approx(mean)


@pytest.mark.parametrize(
    "preset", ["quick", "full", "full-paper-like", "full-levels", "moonshot-search-w128", "paper"]
)
def test_every_preset_s_design_judges_its_primary_unless_its_prunable_set_is_another(preset: str) -> None:
    """Synthetic cells of the preset's own design (config.design): its primary is judged over every seed
    of the preset, except in full-paper-like, whose block Linears are the paper-like arm (the reason says so);
    the paper preset also judges the paper-like row on its side arm's seeds."""
    from descentlab.config import resolve_config
    from descentlab.experiments.sparse_vit.config import PRESETS

    cfg = resolve_config(SparseViTConfig, preset=preset, presets=PRESETS)
    plan = design(cfg)
    store = CellStore(plan)
    rng = np.random.default_rng(0)
    for arm in plan.arms:
        for at in plan.conditions:
            store.put("correct", arm, at, rng.random((len(plan.seeds_at(at)), 50)) < 0.8)
        for stat in ("frac_below", "kurtosis"):
            store.put(stat, arm, cfg.claim_sparsity, rng.random((len(plan.seeds), 6)))
    rows = {(r.name, r.at): r for r in judge(CLAIMS, store)}
    primary = next(r for r in rows.values() if r.role == "primary")
    paper_like = next(r for (name, _), r in rows.items() if name == "paper-like")
    if cfg.acdc.prune == "blocks":
        assert primary.verdict == NOT_IN_RUN and "acdc.prune=blocks" in primary.reason
        assert paper_like.seeds == len(cfg.seeds)
    else:
        assert primary.verdict not in (NOT_IN_RUN, PENDING) and primary.seeds == len(cfg.seeds)
    if preset == "paper":  # every row judged: the levels 70 / 80 %, HAM, the regime, the paper-like arm
        assert {r.verdict for r in rows.values()}.isdisjoint({NOT_IN_RUN, PENDING}) and len(rows) == 10
        assert paper_like.seeds == len(cfg.paper_like_seeds) >= 2
