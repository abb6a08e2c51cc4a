"""implicit-bias's claims on synthetic per-seed values with a known answer, judged by the engine; and the
committed earlier run re-judged from the per-seed values its results.json recorded."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from descentlab.experiments.implicit_bias import claims as ib
from descentlab.io import load_arrays
from descentlab.report.claims import PENDING, judge

COMMITTED = Path(__file__).parents[2] / "docs" / "results" / "implicit-bias"


def _arrays(seeds: int = 12, sign_end: float = 0.97, horst_gap: float = 0.05) -> dict[str, np.ndarray]:
    """Per-seed values: the theorem's runs rise to ``sign_end`` (ngd to 0.98), HORST beats Adam and HAM by
    clear margins, with seed-to-seed noise of 0.005-0.01."""
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
    return {(r.name, r.at): r for r in judge(ib.CLAIMS, arrays)}


def test_planted_effects_are_reproduced() -> None:
    rows = _rows(_arrays())
    primary = rows["theorem-sign-mirror", "end of the decaying-step run"]
    assert primary.role == "primary" and primary.kind == "sized" and primary.threshold == ib.TAU
    assert primary.verdict == "reproduced" and primary.estimate == pytest.approx(0.97, abs=0.01)
    assert primary.seeds == 12 and primary.examples == 1
    for key in (
        ("theorem-ngd-mirror", "end of the decaying-step run"),
        ("horst-l1-direction", ""),
        ("horst-l1-vs-adam", ""),
        ("horst-sparser-than-adam", ""),
        ("horst-vs-ham-equal-scales", "0 decades"),
        ("horst-vs-ham-spread", "1 decades"),
        ("horst-vs-ham-spread", "2 decades"),
        ("horst-l1-direction-scales", "2 decades"),
    ):
        assert rows[key].verdict == "reproduced", key
    rising = rows["theorem-sign-mirror-rising", ""]
    # the ratio at the last step against the recorded step nearest a tenth of the run (10^4 of 10^5)
    assert rising.reference == "at step 10000" and rising.estimate == pytest.approx(0.97 * 0.15, abs=0.01)
    assert rising.verdict == "reproduced"


def test_a_sign_mirror_run_short_of_tau_refutes_the_primary() -> None:
    arrays = _arrays(sign_end=0.7)
    flat = arrays["theorem_ratio__sign+mirror_after"]
    flat[:, -1] = flat[:, -2]  # no longer rising over the last decade
    rows = _rows(arrays)
    assert rows["theorem-sign-mirror", "end of the decaying-step run"].verdict == "refuted"
    assert rows["theorem-sign-mirror-rising", ""].verdict == "refuted"
    # HAM level with HORST within 0.001: "HORST > HAM by at least 0.01" is refuted, never reproduced
    rows = _rows(_arrays(horst_gap=0.0))
    assert rows["horst-vs-ham-equal-scales", "0 decades"].verdict != "reproduced"


def test_missing_runs_are_pending_and_one_seed_is_not_judged() -> None:
    arrays = {k: v for k, v in _arrays().items() if not k.startswith("theorem_")}
    rows = _rows(arrays)
    assert rows["theorem-sign-mirror", ""].verdict == PENDING
    assert rows["horst-l1-vs-adam", ""].verdict == "reproduced"
    overflowed = _arrays()
    overflowed["cls_l1_margin_ratio__adam"][3] = np.nan
    assert _rows(overflowed)["horst-l1-vs-adam", ""].verdict == PENDING
    one = {k: (v if k in ("theorem_steps", "scales_decades") else v[..., :1]) for k, v in _arrays().items()}
    one["theorem_ratio__sign+mirror_after"] = _arrays()["theorem_ratio__sign+mirror_after"][:1]
    one["theorem_ratio__ngd+mirror_after"] = _arrays()["theorem_ratio__ngd+mirror_after"][:1]
    rows = _rows(one)  # one number per arm: nothing to judge, the rows wait for a run with more seeds
    assert rows["theorem-sign-mirror", ""].verdict == PENDING
    assert "at least two seeds" in rows["horst-l1-vs-adam", ""].reason


def test_the_committed_run_is_judged_from_its_saved_arrays() -> None:
    """The committed full run (20 evaluation seeds) saved ``arrays/claims.npz``; it must agree with what its
    results.json reports, and the committed rows are the engine's judgement of it."""
    results = json.loads((COMMITTED / "results.json").read_text())
    arrays = load_arrays(COMMITTED / ib.CLAIM_ARRAYS)
    assert arrays["cls_l1_margin_ratio__horst"].shape == (20,)
    for metric in ("cls_l1_margin_ratio", "cls_nnz", "reg_l1_ratio"):
        for m in ("horst", "adam"):
            mean = results["methods"][m]["metrics"][metric]
            assert arrays[f"{metric}__{m}"].mean() == pytest.approx(mean, abs=1e-12), (metric, m)
    assert arrays["scales_decades"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    for i, k in enumerate(("0", "1", "2", "3", "4")):
        for m, per in results["scales"]["per_seed"][k].items():
            assert arrays[f"scales_l1_margin_ratio__{m}"][i].tolist() == pytest.approx(per["l1_margin_ratio"])
    rows = _rows(arrays)
    assert rows["theorem-sign-mirror", "end of the decaying-step run"].seeds == 20
    committed = {(c["name"], c["at"]): c for c in results["claims"]}
    assert {k: r.verdict for k, r in rows.items()} == {k: c["verdict"] for k, c in committed.items()}
