"""docs/results/README.md is generated from the committed results.json files and must not go stale."""

from __future__ import annotations

import json
from pathlib import Path

from descentlab.report.readme import companion_runs, results_index, study_section

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def test_the_committed_index_is_up_to_date() -> None:
    committed = (RESULTS / "README.md").read_text()
    assert committed == results_index(RESULTS), (
        "docs/results/README.md is stale: run `python -m descentlab.report.readme docs/results`"
    )


def test_every_results_page_has_its_committed_results() -> None:
    pages = {p.stem for p in RESULTS.glob("*.md")} - {"README"}
    assert pages and all((RESULTS / p / "results.json").is_file() for p in pages)


def test_a_study_section_leads_with_its_primary_verdict() -> None:
    row = {
        "name": "pruned-90",
        "description": "HORST prunes cheaper",
        "role": "primary",
        "kind": "directional",
        "direction": "less",
        "threshold": 0.05,
        "metric": "log-ppl",
        "method": "horst",
        "reference": "adamw",
        "at": "",
        "verdict": "inconclusive",
        "reason": "r",
        "estimate": -0.1,
        "low": -0.3,
        "high": 0.1,
    }
    text = "\n".join(study_section("sparse-lm", {"claims": [row]}))
    assert "**Primary endpoint: pruned-90**" in text and "**inconclusive**" in text
    legacy = "\n".join(study_section("old", {"claims": [{"claim": "x", "verdict": "reproduced"}]}))
    assert "pending re-run" in legacy and "reproduced" not in legacy
    assert json.loads(json.dumps(row)) == row


def test_a_companion_run_gets_its_own_section_and_earlier_runs_do_not(tmp_path: Path) -> None:
    row = {
        "name": "x",
        "role": "primary",
        "verdict": "inconclusive",
        "estimate": 0.1,
        "low": -0.1,
        "high": 0.3,
    }
    row |= {"description": "d", "kind": "directional", "direction": "less", "threshold": 0.05, "metric": "m"}
    row |= {"method": "a", "reference": "b", "at": "", "reason": "r"}
    (tmp_path / "study.md").write_text("# study\n")
    for folder in ("study", "study/full-b", "study/earlier", "study/earlier/old-preset"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "results.json").write_text(json.dumps({"claims": [row]}))
    assert [p.parent.name for p in companion_runs(tmp_path / "study")] == ["full-b"]
    text = results_index(tmp_path)
    assert "## study\n" in text and "### study, companion run `full-b`" in text
    assert "--preset full-b" in text and "old-preset" not in text and text.count("**Primary endpoint") == 2
