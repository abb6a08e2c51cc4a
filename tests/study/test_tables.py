"""study.tables: the Table dataclass serialises to the dict report/build.py renders, and the formatters
print the exact text the committed reports hold."""

from __future__ import annotations

import numpy as np
import pytest

from descentlab.io import save_json
from descentlab.report.build import write_report
from descentlab.study.tables import Table, ci, mean_sd, pm, signed_ci


def test_mean_sd_is_the_population_sd_by_default_and_the_sample_sd_on_request() -> None:
    assert mean_sd([0.602, 0.622]) == "0.612 ± 0.010"
    x = [1.0, 2.0, 4.0]
    assert mean_sd(x, 4) == f"{np.mean(x):.4f} ± {np.std(x):.4f}" == "2.3333 ± 1.2472"
    assert mean_sd(x, 4, ddof=1) == f"{np.mean(x):.4f} ± {np.std(x, ddof=1):.4f}" == "2.3333 ± 1.5275"
    assert mean_sd([0.5], ddof=1) == "0.500 ± 0.000"  # one value: no spread to estimate
    assert mean_sd([-0.25, 0.25], 2, signed=True) == "+0.00 ± 0.25"
    with pytest.raises(ValueError, match="no values"):
        mean_sd([])


def test_pm_ci_and_signed_ci_match_the_formats_the_studies_printed() -> None:
    assert pm(0.81234, 0.01251) == "0.8123 ± 0.0125"  # robust-sparse, video-denoising: .4f ± .4f
    assert pm(0.05, 0.011, 3, signed=True) == "+0.050 ± 0.011"  # sparse-lm: +.3f ± .3f
    assert pm(0.8123, 0.0125, 2, scale=100) == "81.23 ± 1.25"  # sparse-vit: percent
    assert ci(0.1, 0.25) == "[0.1000, 0.2500]"
    assert ci(-0.1, 0.25, 2, signed=True) == "[-0.10, +0.25]"
    assert signed_ci(0.0125, -0.001, 0.026) == "+0.0125 [-0.0010, +0.0260]"
    m, lo, hi = -0.03, -0.05, -0.01
    assert signed_ci(m, lo, hi) == f"{m:+.4f} [{lo:+.4f}, {hi:+.4f}]"  # robust-sparse, llm-robustness


def test_table_round_trips_to_the_report_dict_and_checks_row_lengths() -> None:
    t = Table("Accuracy, mean ± std over seeds", ["method", "γ=0"])
    t.add("erm", pm(0.8, 0.01))
    assert t.to_dict() == {"title": "Accuracy, mean ± std over seeds", "columns": ["method", "γ=0"],
                           "rows": [["erm", "0.8000 ± 0.0100"]]}  # fmt: skip
    assert Table("x", ["a"], [[1]], note="why").to_dict()["note"] == "why"
    with pytest.raises(ValueError, match="2 cells for 1 columns"):
        Table("x", ["a"]).add(1, 2)
    with pytest.raises(ValueError, match="row 1 has 1 cells for 2 columns"):
        Table("x", ["a", "b"], [[1, 2], [3]])


def test_a_table_renders_in_the_report_like_a_hand_written_dict(tmp_path) -> None:
    t = Table("Test accuracy", ["method", "accuracy"], [["erm", "0.8000 ± 0.0100"]])
    hand = {"title": "Test accuracy", "columns": ["method", "accuracy"], "rows": [["erm", "0.8000 ± 0.0100"]]}
    reports = []
    for name, table in (("typed", t.to_dict()), ("hand", hand)):
        save_json(
            tmp_path / name / "results.json",
            {"experiment": "x", "protocol": {}, "methods": {}, "tables": [table]},
        )
        reports.append(write_report(tmp_path / name).read_text())
    assert reports[0] == reports[1] and "| erm | 0.8000 ± 0.0100 |" in reports[0]
