"""docs/results/README.md is generated from the committed results.json files and must not go stale."""

from __future__ import annotations

import json
from pathlib import Path

from descentlab.report.readme import results_index, study_section

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
