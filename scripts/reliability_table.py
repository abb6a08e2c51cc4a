"""Render docs/reliability.md's tables from the test suite: the fault matrix and the bad inputs.

Usage:
    .venv/bin/python scripts/reliability_table.py --write    # rewrite the fault matrix in docs/reliability.md
    .venv/bin/python scripts/reliability_table.py --faults   # print the fault matrix (tests/faults/matrix.py)
    .venv/bin/python scripts/reliability_table.py            # print the bad-input table, with the real messages
                                                             # (pasted under "Bad inputs")

The fault matrix is rendered from ``tests/faults/matrix.py`` (fault | outcome | test) between the
``<!-- fault-matrix:begin -->`` and ``<!-- fault-matrix:end -->`` markers; ``tests/faults/test_matrix.py``
fails when the committed table differs from the rendering.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # tiny_models, the test suite's model factories; faults.matrix

DOC = ROOT / "docs" / "reliability.md"
BEGIN, END = "<!-- fault-matrix:begin -->", "<!-- fault-matrix:end -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def fault_table() -> str:
    from faults.matrix import render

    return render()


def with_fault_table(doc: str, table: str) -> str:
    """``doc`` with the text between the fault-matrix markers replaced by ``table``."""
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{DOC} has no {BEGIN} ... {END} markers")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def bad_input_table() -> str:
    from tests.reliability.cases import CLI_CASES, LIBRARY_CASES
    from tests.reliability.test_bad_inputs import run_cli

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
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--faults", action="store_true", help="print the fault matrix")
    which.add_argument("--write", action="store_true", help="rewrite the fault matrix in docs/reliability.md")
    args = parser.parse_args(argv)
    if args.write:
        DOC.write_text(with_fault_table(DOC.read_text(), fault_table()))
    elif args.faults:
        print(fault_table())
    else:
        print(bad_input_table())


if __name__ == "__main__":
    main()
