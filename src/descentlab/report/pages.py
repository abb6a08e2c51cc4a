"""The claims tables of the result pages, generated from each run's ``results.json``.

A result page (``docs/results/<study>.md``) is prose around numbers; the verdict rows are the part a
reader quotes, so they are never typed by hand. Each table sits between two markers naming the run it
shows (the run folder under ``docs/results``, e.g. ``llm-robustness/full-seeds``)::

    <!-- claims: llm-robustness/full-seeds -->
    ...generated table...
    <!-- /claims -->

and :func:`refresh` rewrites every such block from the run's committed rows (the engine's
:func:`~descentlab.report.claims.claims_table`). A re-judged run therefore changes its pages in the same
command, and a test fails when a committed page differs from its regeneration::

    python -m descentlab.report.pages docs/results
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from descentlab.io import atomic_write_text
from descentlab.report.claims import claims_table, engine_rows, verdict_tally
from descentlab.report.tables import markdown_table

COMMAND = "python -m descentlab.report.pages docs/results"
_BLOCK = re.compile(r"(<!-- claims: (?P<run>[^ ]+) -->\n)(?P<body>.*?)(<!-- /claims -->)", re.S)


def render(results_dir: Path, run: str) -> str:
    """The generated table of run ``run`` (a folder under ``results_dir``), with its tally."""
    body = results_dir / run / "results.json"
    if not body.is_file():
        raise FileNotFoundError(f"a claims block names run {run!r}, but {body} does not exist")
    claims = engine_rows(json.loads(body.read_text()).get("claims", []))
    if not claims:
        raise ValueError(f"{body} holds no rows of the claims engine; re-judge it with `descentlab report`")
    table = claims_table(claims)
    return (
        f"{len(claims)} rows: {verdict_tally(claims)}. The verdict to quote is Holm-adjusted for secondary "
        "rows; the details column holds the unadjusted verdict, divergences and the seeds an undecided row "
        f"would need. Generated from `{run}/results.json` by `{COMMAND}`.\n\n"
        + markdown_table(table["columns"], table["rows"])
        + "\n"
    )


def refresh(page: str, results_dir: Path) -> str:
    """``page`` with every claims block regenerated."""
    return _BLOCK.sub(lambda m: m.group(1) + render(results_dir, m.group("run")) + m.group(4), page)


def blocks(page: str) -> list[str]:
    """The runs whose claims blocks ``page`` holds, in order."""
    return [m.group("run") for m in _BLOCK.finditer(page)]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    results_dir = Path(args[0] if args else "docs/results")
    for page in sorted(results_dir.glob("*.md")):
        text = page.read_text()
        new = refresh(text, results_dir)
        if new != text:
            atomic_write_text(page, new)
            print(page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
