"""Typed results: every committed results.json survives from_dict -> to_dict unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from descentlab.report.results import Curve, MethodResult, Results

COMMITTED = sorted((Path(__file__).parents[2] / "docs" / "results").glob("*/results.json"))


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.parent.name)
def test_committed_results_round_trip(path: Path) -> None:
    data = json.loads(path.read_text())
    results = Results.from_dict(data)
    assert results.to_dict() == data
    # the typed view really parsed the curves (not just passed dicts through)
    curves = [c for m in results.methods.values() for c in m.curves.values()]
    assert curves and all(isinstance(c, Curve) and len(c.x) == len(c.mean) for c in curves)
    assert json.loads(json.dumps(results.to_dict())) == data


def test_committed_results_exist() -> None:
    assert len(COMMITTED) >= 3


def test_to_dict_writes_the_design_shape_and_keeps_extras() -> None:
    curve = Curve("gamma", [0, 1], "accuracy", [0.8, 0.7], [0.0, 0.01], extra={"summary": 0.75})
    method = MethodResult(metrics={"accuracy": 0.8}, curves={"gaussian": curve}, extra={"note": 1})
    out = Results("toy", methods={"erm": method}, extra={"version": 2}).to_dict()
    assert list(out) == [
        "experiment", "config", "protocol", "methods", "tables", "figures", "notes", "version"
    ]  # fmt: skip
    block = out["methods"]["erm"]
    assert list(block) == ["metrics", "curves", "note"]  # no layer_loss / sparsity when there is none
    assert block["curves"]["gaussian"] == {
        "x_name": "gamma", "x": [0, 1], "metric": "accuracy", "mean": [0.8, 0.7], "std": [0.0, 0.01],
        "summary": 0.75,
    }  # fmt: skip
    assert Results.from_dict(out).to_dict() == out
