"""Per-experiment figures: drawn from saved results and arrays, rebuilt by write_report."""

from __future__ import annotations

import json
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from descentlab.io import load_arrays, save_arrays
from descentlab.report import registry, write_report
from descentlab.report.figures import new_figure, save_figure

RESULTS = {
    "experiment": "toy",
    "methods": {
        "erm": {
            "metrics": {"accuracy": 0.8},
            "curves": {
                "gaussian": {"x_name": "gamma", "x": [0, 1], "metric": "accuracy", "mean": [0.8, 0.6]}
            },
            "layer_loss": {"clean": [0.7, 0.71, 0.5]},
        }
    },
}


def _fake_figures(results: dict, run_dir: Path) -> list[dict]:
    data = load_arrays(run_dir / "arrays" / "hist.npz")
    fig, axes = new_figure(1, 1)
    axes[0][0].hist(data["weights"], bins=20)
    save_figure(fig, run_dir / "figures" / "hist.png")
    return [{"path": "figures/hist.png", "caption": f"{results['experiment']} weights"}]


@pytest.fixture
def fake_module(monkeypatch: pytest.MonkeyPatch) -> str:
    module = types.ModuleType("descentlab.report._fake_toy")
    module.figures = _fake_figures  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(registry.FIGURES, "toy", module.__name__)
    return module.__name__


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "toy-run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(RESULTS))
    save_arrays(run / "arrays" / "hist.npz", weights=np.random.default_rng(0).normal(size=500))
    return run


def test_report_rebuilds_the_same_figures_and_report(tmp_path: Path, fake_module: str) -> None:
    run = _run_dir(tmp_path)
    text = write_report(run).read_text()
    assert "![toy weights](figures/hist.png)" in text
    first = {p.name: p.read_bytes() for p in (run / "figures").iterdir()}
    assert set(first) == {"curves.png", "layer-loss.png", "hist.png"}
    shutil.rmtree(run / "figures")
    (run / "report.md").unlink()
    assert write_report(run).read_text() == text
    assert {p.name: p.read_bytes() for p in (run / "figures").iterdir()} == first


def test_an_experiment_without_a_figure_module_gets_the_generic_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(registry.FIGURES, "toy", "descentlab.report._not_written_yet")
    run = _run_dir(tmp_path)
    text = write_report(run).read_text()
    assert "figures/curves.png" in text and "hist.png" not in text


def test_a_figure_module_with_a_broken_import_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "descentlab.report._broken_toy"
    broken = tmp_path / "pkg"
    broken.mkdir()
    monkeypatch.setitem(registry.FIGURES, "toy", name)
    import descentlab.report as report_pkg

    (broken / "_broken_toy.py").write_text("import descentlab_no_such_dependency\n")
    monkeypatch.setattr(report_pkg, "__path__", [*report_pkg.__path__, str(broken)])
    with pytest.raises(ModuleNotFoundError, match="descentlab_no_such_dependency"):
        write_report(_run_dir(tmp_path))


def test_report_does_not_import_train_or_experiments() -> None:
    source = "\n".join(p.read_text() for p in Path(registry.__file__).parent.glob("*.py"))
    assert "descentlab.train" not in source and "descentlab.experiments" not in source
