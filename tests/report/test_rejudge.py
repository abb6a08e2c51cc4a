"""``descentlab report`` on a copy of a finished run re-judges every claim and reproduces its rows exactly."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from descentlab.cli import main
from descentlab.experiments import get, rejudge
from descentlab.report.readme import companion_runs

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
COMMITTED = sorted(p.parent.name for p in RESULTS.glob("*/results.json"))
# each study's companion runs (<study>/<preset>/), judged by the same claims from their own cells
COMPANIONS = [
    str(p.parent.relative_to(RESULTS)) for study in COMMITTED for p in companion_runs(RESULTS / study)
]


@pytest.mark.parametrize("study", COMMITTED + COMPANIONS)
def test_rejudging_a_committed_run_reproduces_its_claims(study: str, tmp_path: Path) -> None:
    committed = json.loads((RESULTS / study / "results.json").read_text())
    assert get(committed["experiment"]).claims, f"{study} declares no CLAIMS"
    copy = tmp_path / study
    shutil.copytree(RESULTS / study, copy, ignore=shutil.ignore_patterns(*sorted(_subruns(study))))
    rows = [r.to_dict() for r in rejudge(copy)]
    assert_same_rows(rows, committed["claims"])
    assert_same_rows(json.loads((copy / "results.json").read_text())["claims"], committed["claims"])


# Verdicts and every word compare exactly; numbers to a relative 1e-9. Why a tolerance at all: a committed
# row can come from another machine's BLAS (sparse-lm's matched-ols slope is an np.linalg.lstsq fit), which
# differs from a fresh computation at about 1e-13 relative; no verdict sits that close to its boundary.
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
REL = 1e-9


def assert_same_rows(rows: list[dict], committed: list[dict]) -> None:
    assert len(rows) == len(committed)
    for row, old in zip(rows, committed, strict=True):
        assert row.keys() == old.keys(), (row.get("name"), row.keys() ^ old.keys())
        for key, value in row.items():
            _assert_same(value, old[key], f"{row['name']}.{key}")


def _assert_same(value, old, where: str) -> None:
    if isinstance(value, float) or isinstance(old, float):
        assert value == pytest.approx(old, rel=REL, abs=1e-15), where
    elif isinstance(value, str) and isinstance(old, str):
        assert NUMBER.sub("#", value) == NUMBER.sub("#", old), where
        for new_n, old_n in zip(NUMBER.findall(value), NUMBER.findall(old), strict=True):
            # a number printed to 4 significant digits may round the other way: allow one unit in its last place
            assert float(new_n) == pytest.approx(float(old_n), rel=1e-3, abs=1e-12), where
    elif isinstance(value, dict) and isinstance(old, dict):
        assert value.keys() == old.keys(), where
        for k in value:
            _assert_same(value[k], old[k], f"{where}.{k}")
    elif isinstance(value, list) and isinstance(old, list):
        assert len(value) == len(old), where
        for i, (v, o) in enumerate(zip(value, old, strict=True)):
            _assert_same(v, o, f"{where}[{i}]")
    else:
        assert value == old, where


def test_the_row_comparison_tolerates_rounding_and_catches_changes() -> None:
    row = {"name": "x", "verdict": "reproduced", "estimate": 0.1, "reason": "+0.1 [+0.05, +0.15]; reproduced"}
    assert_same_rows([{**row, "estimate": 0.1 * (1 + 1e-13)}], [row])
    for changed in ({"verdict": "refuted"}, {"estimate": 0.1001}, {"reason": "+0.1 [+0.05, +0.15]; refuted"}):
        with pytest.raises(AssertionError):
            assert_same_rows([{**row, **changed}], [row])


def _subruns(study: str) -> set[str]:
    """The folders under a study's run that are runs of their own (companions, earlier), not its files."""
    return {p.parent.name for p in (RESULTS / study).glob("*/results.json")}


def test_report_command_rejudges_and_rebuilds(tmp_path: Path, capsys) -> None:
    study = "robust-sparse" if "robust-sparse" in COMMITTED else COMMITTED[0]
    copy = tmp_path / study
    shutil.copytree(RESULTS / study, copy)
    body = json.loads((copy / "results.json").read_text())
    body["claims"] = []  # a run whose rows were lost or never judged
    (copy / "results.json").write_text(json.dumps(body))
    assert main(["report", str(copy)]) == 0
    assert capsys.readouterr().out.strip().endswith("report.md")
    rejudged = json.loads((copy / "results.json").read_text())["claims"]
    assert_same_rows(rejudged, json.loads((RESULTS / study / "results.json").read_text())["claims"])
    assert "Primary endpoint" in (copy / "report.md").read_text()
