"""The claims tables of the result pages are generated from the committed rows, never typed by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from descentlab.report.pages import blocks, refresh, render
from descentlab.report.readme import companion_runs

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
PAGES = sorted(p for p in RESULTS.glob("*.md") if p.stem != "README")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_every_claims_table_equals_its_regeneration(page: Path) -> None:
    text = page.read_text()
    assert refresh(text, RESULTS) == text, (
        "stale claims table: run `python -m descentlab.report.pages docs/results`"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_every_committed_run_of_the_study_has_its_table_on_the_page(page: Path) -> None:
    runs = [page.stem] if (RESULTS / page.stem / "results.json").is_file() else []
    runs += [str(c.parent.relative_to(RESULTS)) for c in companion_runs(RESULTS / page.stem)]
    assert blocks(page.read_text()) == runs


def test_a_block_naming_a_missing_run_is_an_error(tmp_path: Path) -> None:
    page = "<!-- claims: nowhere -->\nold\n<!-- /claims -->\n"
    with pytest.raises(FileNotFoundError, match="nowhere"):
        refresh(page, tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "results.json").write_text('{"claims": []}')
    with pytest.raises(ValueError, match="no rows"):
        render(tmp_path, "empty")


def test_a_stale_row_is_replaced_and_the_prose_around_it_kept() -> None:
    page = PAGES[0].read_text()
    run = blocks(page)[0]
    stale = page.replace(render(RESULTS, run), "| claim | verdict |\n|---|---|\n| x | reproduced |\n")
    assert stale != page and refresh(stale, RESULTS) == page
