"""Per-study figures (a study's ``figures.py``): drawn from saved results and arrays, rebuilt by the report."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from descentlab import experiments
from descentlab.io import load_arrays, save_arrays
from descentlab.report import write_report
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


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "toy-run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(RESULTS))
    save_arrays(run / "arrays" / "hist.npz", weights=np.random.default_rng(0).normal(size=500))
    return run


def test_report_rebuilds_the_same_figures_and_report(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    text = write_report(run, figures=_fake_figures).read_text()
    assert "![toy weights](figures/hist.png)" in text
    first = {p.name: p.read_bytes() for p in (run / "figures").iterdir()}
    assert set(first) == {"curves.png", "layer-loss.png", "hist.png"}
    shutil.rmtree(run / "figures")
    (run / "report.md").unlink()
    assert write_report(run, figures=_fake_figures).read_text() == text
    assert {p.name: p.read_bytes() for p in (run / "figures").iterdir()} == first


def test_a_study_without_figures_gets_the_generic_figures(tmp_path: Path) -> None:
    text = write_report(_run_dir(tmp_path)).read_text()
    assert "figures/curves.png" in text and "hist.png" not in text


def _study_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, figures_source: str
) -> experiments.Experiment:
    pkg = tmp_path / "toy_study"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""A toy study."""\n')
    (pkg / "report.py").write_text(figures_source)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("toy_study")]:
        monkeypatch.delitem(sys.modules, name)
    return experiments.Experiment("toy", importlib.import_module("toy_study"))


def test_a_study_report_module_s_figures_are_found_by_convention(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = (
        "from descentlab.report.figures import new_figure, save_figure\n"
        "def figures(results, run_dir):\n"
        "    fig, axes = new_figure(1, 1)\n"
        "    save_figure(fig, run_dir / 'figures' / 'own.png')\n"
        "    return [{'path': 'figures/own.png', 'caption': 'own'}]\n"
    )
    study = _study_package(tmp_path, monkeypatch, source)
    assert study.part("claims") is None and study.claims == []
    text = write_report(_run_dir(tmp_path), figures=study.figures).read_text()
    assert "![own](figures/own.png)" in text


def test_a_figure_module_with_a_broken_import_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    study = _study_package(tmp_path, monkeypatch, "import descentlab_no_such_dependency\n")
    with pytest.raises(ModuleNotFoundError, match="descentlab_no_such_dependency"):
        write_report(_run_dir(tmp_path), figures=study.figures)


def test_report_does_not_import_train_or_experiments() -> None:
    import descentlab.report as report_pkg

    source = "\n".join(p.read_text() for p in Path(report_pkg.__file__).parent.glob("*.py"))
    assert "descentlab.train" not in source and "descentlab.experiments" not in source
