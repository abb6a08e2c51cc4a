"""Render docs/reliability.md's table of bad inputs from the test suite's cases, with the real messages.

Usage: .venv/bin/python scripts/reliability_table.py > /tmp/table.md   (pasted between the markers)
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # tiny_models, the test suite's model factories

from tests.reliability.cases import CLI_CASES, LIBRARY_CASES  # noqa: E402
from tests.reliability.test_bad_inputs import run_cli  # noqa: E402


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def main() -> None:
    rows = ["| # | where | mistake | error | message |", "|---|---|---|---|---|"]
    n = 0
    for case in LIBRARY_CASES:
        n += 1
        try:
            case.call()
            message, kind = "(no error: the test fails)", "-"
        except Exception as exc:
            message, kind = str(exc), type(exc).__name__
        rows.append(f"| {n} | library | {_cell(case.mistake)} | `{kind}` | {_cell(message)} |")
    for case in CLI_CASES:
        n += 1
        err = io.StringIO()
        with tempfile.TemporaryDirectory() as out, contextlib.redirect_stderr(err):
            code = run_cli(case, Path(out))
        line = next((x for x in err.getvalue().splitlines() if x.startswith("descentlab: error")), "")
        where = f"`descentlab {' '.join(case.args)}`"
        rows.append(f"| {n} | {_cell(where)} | {_cell(case.mistake)} | exit {code} | {_cell(line)} |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
