"""implicit-bias's claims on synthetic per-seed values with a known answer, judged by the engine from a cell
store (built by the legacy reader from the flat names the committed runs saved); and the committed run
re-judged from its saved arrays."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from descentlab.experiments.implicit_bias import claims as ib
from descentlab.experiments.implicit_bias.legacy import LEGACY_ARRAYS, store_from_flat
from descentlab.io import load_arrays
from descentlab.report.claims import EXPLORATORY_WORDS, NOT_IN_RUN, ONE_SEED, PENDING, judge
from descentlab.study.cells import CellStore

COMMITTED = Path(__file__).parents[2] / "docs" / "results" / "implicit-bias"


def _arrays(
    seeds: int = 12, sign_end: float = 0.97, lp4_end: float = 0.96, horst_gap: float = 0.05
) -> dict[str, np.ndarray]:
    """Per-seed values: the theorem's runs rise to ``sign_end`` (p = inf), ``lp4_end`` (p = 4), 0.98 (p = 2)
    and 0.95 (p = 3, 8), HORST beats Adam and HAM by clear margins, with seed-to-seed noise of 0.005-0.01."""
    rng = np.random.default_rng(1)
    steps = np.asarray([1, 10, 100, 1000, 10000, 100000], dtype=np.float64)
    rise = np.asarray([0.1, 0.3, 0.5, 0.7, 0.85, 1.0])

    def noise(*shape: int, sd: float = 0.005) -> np.ndarray:
        return rng.normal(0.0, sd, shape)

    decades = np.asarray([0.0, 1.0, 2.0])
    return {
        "theorem_steps": steps,
        "theorem_ratio__sign+mirror_after": sign_end * rise + noise(seeds, 6),
        "theorem_ratio__ngd+mirror_after": 0.98 * rise + noise(seeds, 6),
        "theorem_ratio__lp3+mirror_after": 0.95 * rise + noise(seeds, 6),
        "theorem_ratio__lp4+mirror_after": lp4_end * rise + noise(seeds, 6),
        "theorem_ratio__lp8+mirror_after": 0.95 * rise + noise(seeds, 6),
        "cls_l1_margin_ratio__horst": 0.97 + noise(seeds),
        "cls_l1_margin_ratio__adam": 0.43 + noise(seeds, sd=0.04),
        "cls_nnz__horst": 28 + rng.integers(-2, 3, seeds).astype(float),
        "cls_nnz__adam": np.full(seeds, 100.0),
        "reg_l1_ratio__horst": 2.5 + noise(seeds, sd=0.3),
        "reg_l1_ratio__adam": 2.8 + noise(seeds, sd=0.3),
        "scales_decades": decades,
        "scales_l1_margin_ratio__horst": 0.95 + noise(3, seeds),
        "scales_l1_margin_ratio__ham": 0.95 - horst_gap + noise(3, seeds),
    }


def _rows(arrays: dict[str, np.ndarray]) -> dict[tuple[str, str], object]:
    return {(r.name, r.at): r for r in judge(ib.CLAIMS, store_from_flat(arrays))}


def test_planted_effects_are_reproduced() -> None:
    rows = _rows(_arrays())
    assert [k for k, r in rows.items() if r.role == "primary"] == [("theorem-lp4-mirror", ib.END)]
    primary = rows["theorem-lp4-mirror", ib.END]
    assert primary.kind == "sized" and primary.threshold == ib.TAU and primary.method == "lp4+mirror_after"
    assert primary.verdict == "reproduced" and primary.estimate == pytest.approx(0.96, abs=0.01)
    assert primary.seeds == 12 and primary.examples == 1
    for key in (
        ("theorem-ngd-mirror", ib.END),
        ("theorem-lp3-mirror", ib.END),
        ("theorem-lp8-mirror", ib.END),
        ("horst-l1-direction", ""),
        ("horst-l1-vs-adam", ""),
        ("horst-sparser-than-adam", ""),
        ("horst-vs-ham-equal-scales", "0 decades"),
        ("horst-vs-ham-spread", "1 decades"),
        ("horst-vs-ham-spread", "2 decades"),
        ("horst-l1-direction-scales", "2 decades"),
    ):
        assert rows[key].verdict == "reproduced" and rows[key].role == "secondary", key
    # p = inf lies outside the theorem's stated scope: judged, labelled exploratory, outside Holm
    sign = rows["theorem-sign-mirror", ib.END]
    assert sign.role == "exploratory" and sign.verdict == EXPLORATORY_WORDS["reproduced"]
    assert sign.holm_verdict is None
    rising = rows["theorem-sign-mirror-rising", ""]
    # the ratio at the last step against the recorded step nearest a tenth of the run (10^4 of 10^5)
    assert rising.reference == "at step 10000" and rising.estimate == pytest.approx(0.97 * 0.15, abs=0.01)
    assert rising.role == "exploratory" and rising.verdict == EXPLORATORY_WORDS["reproduced"]


def test_a_run_short_of_tau_refutes_the_primary_but_never_through_sign_descent() -> None:
    arrays = _arrays(sign_end=0.7, lp4_end=0.7)
    flat = arrays["theorem_ratio__sign+mirror_after"]
    # no longer rising over the last decade (seed noise of 0.002 around no change: identical seeds would be
    # a degenerate interval, not a verdict)
    flat[:, -1] = flat[:, -2] + np.random.default_rng(5).normal(0.0, 0.002, flat.shape[0])
    rows = _rows(arrays)
    assert rows["theorem-lp4-mirror", ib.END].verdict == "refuted"
    # p = inf short of tau reads as an open question's answer here, not as a refutation of the paper
    assert rows["theorem-sign-mirror", ib.END].verdict == EXPLORATORY_WORDS["refuted"]
    assert rows["theorem-sign-mirror-rising", ""].verdict == EXPLORATORY_WORDS["refuted"]
    assert rows["theorem-ngd-mirror", ib.END].verdict == "reproduced"
    # HAM level with HORST within 0.001: "HORST > HAM by at least 0.01" is refuted, never reproduced
    rows = _rows(_arrays(horst_gap=0.0))
    assert rows["horst-vs-ham-equal-scales", "0 decades"].verdict != "reproduced"


def test_missing_runs_are_pending_diverged_seeds_count_and_one_seed_is_a_smoke_run() -> None:
    arrays = {k: v for k, v in _arrays().items() if not k.startswith("theorem_")}
    rows = _rows(arrays)
    assert rows["theorem-lp4-mirror", ""].verdict == PENDING
    assert rows["horst-l1-vs-adam", ""].verdict == "reproduced"
    # a run that saved no cells at all: every row pending, none not-in-run
    assert {r.verdict for r in judge(ib.CLAIMS, {})} == {PENDING}
    # a theorem run without the finite-p objects (the run before they existed): not in this run, named
    arrays = {k: v for k, v in _arrays().items() if not k.startswith("theorem_ratio__lp")}
    rows = _rows(arrays)
    for name in ("theorem-lp4-mirror", "theorem-lp3-mirror", "theorem-lp8-mirror"):
        assert rows[name, ""].verdict == NOT_IN_RUN, name
    assert "no lp4+mirror_after object" in rows["theorem-lp4-mirror", ""].reason
    assert rows["theorem-ngd-mirror", ib.END].verdict == "reproduced"
    overflowed = _arrays()
    overflowed["cls_l1_margin_ratio__adam"][3] = np.nan
    row = _rows(overflowed)["horst-l1-vs-adam", ""]  # a diverged seed is a result, counted against adam
    assert row.diverged == {"horst": 0, "adam": 1} and "adam diverged on 1 of" in row.reason
    one = {k: (v if k in ("theorem_steps", "scales_decades") else v[..., :1]) for k, v in _arrays().items()}
    for key in [k for k in one if k.startswith("theorem_ratio__")]:
        one[key] = _arrays()[key][:1]
    rows = _rows(one)  # one number per arm: a smoke run, labelled and not judged
    assert rows["theorem-lp4-mirror", ib.END].verdict == ONE_SEED
    assert rows["horst-l1-vs-adam", ""].verdict == ONE_SEED


def test_saved_arrays_give_one_primary_row(tmp_path: Path) -> None:
    """The run's cell store as written and read back: exactly one primary row, on the p = 4 object; the
    store keys cells ``metric/method[/decades]`` with the theorem's steps in the design record."""
    arrays = _arrays(seeds=5)
    store_from_flat(arrays).save(tmp_path)
    store = ib.claim_arrays(tmp_path)
    assert isinstance(store, CellStore) and store.design.extra["theorem"]["steps"][-1] == 100000
    assert (
        store.get("scales_l1_margin_ratio", "ham", 2.0).tolist()
        == arrays["scales_l1_margin_ratio__ham"][2].tolist()
    )
    rows = judge(ib.CLAIMS, store)
    (primary,) = [r for r in rows if r.role == "primary"]
    assert (primary.name, primary.at, primary.seeds) == ("theorem-lp4-mirror", ib.END, 5)
    assert primary.estimate == pytest.approx(arrays["theorem_ratio__lp4+mirror_after"][:, -1].mean())


def test_pilot_sizing_is_the_conservative_rule() -> None:
    """s_U = s sqrt((n-1) / chi2_{0.2, n-1}) and MDE = (t_{0.975, 19} + t_{0.8, 19}) s_U / sqrt(20)."""
    from scipy.stats import chi2, t

    values = np.asarray([0.93, 0.95, 0.91, 0.96])
    got = ib.pilot_sizing(values)
    s = float(np.std(values, ddof=1))
    s_u = s * np.sqrt(3 / chi2.ppf(0.2, 3))
    assert got["sd"] == pytest.approx(s) and got["sd_upper"] == pytest.approx(s_u)
    assert got["sd_upper"] > 1.5 * got["sd"]  # four pilot seeds: the bound is well above the estimate
    assert got["mde"] == pytest.approx((t.ppf(0.975, 19) + t.ppf(0.8, 19)) * s_u / np.sqrt(20))
    assert got["mean"] == pytest.approx(0.9375) and got["ci"][0] < 0.9375 < got["ci"][1]


def test_the_committed_run_is_judged_from_its_saved_arrays() -> None:
    """The committed full run (20 evaluation seeds) saved ``arrays/claims.npz``; it must agree with what its
    results.json reports, and the committed rows are the engine's judgement of it."""
    results = json.loads((COMMITTED / "results.json").read_text())
    arrays = load_arrays(COMMITTED / LEGACY_ARRAYS)
    assert arrays["cls_l1_margin_ratio__horst"].shape == (20,)
    for metric in ("cls_l1_margin_ratio", "cls_nnz", "reg_l1_ratio"):
        for m in ("horst", "adam"):
            mean = results["methods"][m]["metrics"][metric]
            assert arrays[f"{metric}__{m}"].mean() == pytest.approx(mean, abs=1e-12), (metric, m)
    assert arrays["scales_decades"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    for i, k in enumerate(("0", "1", "2", "3", "4")):
        for m, per in results["scales"]["per_seed"][k].items():
            assert arrays[f"scales_l1_margin_ratio__{m}"][i].tolist() == pytest.approx(per["l1_margin_ratio"])
    rows = {(r.name, r.at): r for r in judge(ib.CLAIMS, ib.claim_arrays(COMMITTED))}  # legacy.py's reader
    assert rows["theorem-sign-mirror", ib.END].seeds == 20
    committed = {(c["name"], c["at"]): c for c in results["claims"]}
    for key, row in rows.items():
        if key not in committed:
            # declared after that run (the finite-p objects): its theorem run had no such arm
            assert row.verdict == NOT_IN_RUN and f"theorem_ratio__{row.method}" not in arrays, key
            continue
        before = committed[key]
        if before.get("role") == row.role and row.verdict == "negligible" != before["verdict"]:
            # that run predates the engine's "negligible" outcome, which splits it off "reproduced": the
            # interval lies wholly between 0 and the smallest effect of interest on the claim's side
            side = 1.0 if row.direction == "greater" else -1.0
            inside = sorted((side * row.low, side * row.high))
            assert before["verdict"] == "reproduced" and inside[0] > 0 and inside[1] < row.threshold, key
        elif before.get("role") == row.role:
            assert row.verdict == before["verdict"], key
        else:  # re-declared since (p = inf became exploratory): the same evidence, read as exploratory
            assert row.role == "exploratory" and row.verdict == EXPLORATORY_WORDS[before["verdict"]], key
            assert row.estimate == pytest.approx(before["estimate"]), key
    assert set(committed) <= set(rows)


def test_the_earlier_run_rejudges_to_its_committed_rows() -> None:
    """``earlier/`` (a theorem run with two objects, no cell store) re-judged through ``legacy.py``: the same
    rows, the finite-p objects it lacked still "not in this run" with the same reason."""
    earlier = COMMITTED / "earlier"
    committed = json.loads((earlier / "results.json").read_text())["claims"]
    rows = [r.to_dict() for r in judge(ib.CLAIMS, ib.claim_arrays(earlier))]
    assert [(r["name"], r["at"], r["verdict"]) for r in rows] == [
        (c["name"], c["at"], c["verdict"]) for c in committed
    ]
    for row, before in zip(rows, committed, strict=True):
        assert row["reason"] == before["reason"], row["name"]
        if before["estimate"] is None:  # not in this run
            assert row["estimate"] is None, row["name"]
        else:
            assert row["estimate"] == pytest.approx(before["estimate"], rel=1e-9), row["name"]
