"""``descentlab report`` on a copy of a finished run re-judges every claim and reproduces its rows exactly."""

from __future__ import annotations

import json
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
    assert rows == committed["claims"]
    assert json.loads((copy / "results.json").read_text())["claims"] == committed["claims"]


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
    assert rejudged == json.loads((RESULTS / study / "results.json").read_text())["claims"]
    assert "Primary endpoint" in (copy / "report.md").read_text()
