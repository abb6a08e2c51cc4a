"""The fault matrix (tests/faults/matrix.py) names real tests, names every fault test of this package, and is
what docs/reliability.md shows."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from faults.matrix import FAULTS, render

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
    }


def _named() -> list[str]:
    return [t for f in FAULTS for t in f.tests]


def test_every_row_has_a_fault_an_outcome_and_a_test() -> None:
    assert FAULTS and all(f.fault.strip() and f.outcome.strip() and f.tests for f in FAULTS)
    assert len({f.fault for f in FAULTS}) == len(FAULTS)


@pytest.mark.parametrize("node", sorted(set(_named())))
def test_every_named_test_exists(node: str) -> None:
    path, _, name = node.partition("::")
    assert name and "[" not in name, f"{node}: name a test function without parameters"
    assert (ROOT / path).is_file(), f"{node}: no file {path}"
    assert name in _test_functions(ROOT / path), f"{node}: {path} defines no test {name}"


def test_every_fault_test_of_this_package_is_in_the_matrix() -> None:
    named = set(_named())
    missing = [
        f"{path.relative_to(ROOT)}::{name}"
        for path in sorted(HERE.glob("test_*.py"))
        if path.name != Path(__file__).name
        for name in sorted(_test_functions(path))
        if f"{path.relative_to(ROOT)}::{name}" not in named
    ]
    assert missing == [], f"add these to tests/faults/matrix.py: {missing}"


def test_the_committed_fault_table_is_the_rendering_of_the_matrix() -> None:
    spec = importlib.util.spec_from_file_location(
        "reliability_table", ROOT / "scripts" / "reliability_table.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    doc = script.DOC.read_text()
    assert script.with_fault_table(doc, render()) == doc, (
        "docs/reliability.md's fault matrix is stale: run .venv/bin/python scripts/reliability_table.py --write"
    )
