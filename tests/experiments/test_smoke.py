"""smoke: the framework's own end-to-end run, its report rebuilt from the run dir, and resume."""

from __future__ import annotations

import json

import pytest

from descentlab.cli import main
from descentlab.errors import AssetMissingError, ConfigError
from descentlab.experiments import run_experiment

TINY = ["n_train=256", "n_test=128", "hidden=16", "train.epochs=1", "train.batch_size=32", "seeds=[0,1]"]


@pytest.fixture
def tiny_run(tmp_path):
    try:
        return run_experiment("smoke", overrides=TINY, out=tmp_path)
    except AssetMissingError as exc:
        pytest.skip(f"no image dataset installed: {exc}")


def test_runs_and_the_report_rebuilds_from_the_run_dir(tiny_run) -> None:
    results = json.loads((tiny_run / "results.json").read_text())
    curve = results["methods"]["erm"]["curves"]["gaussian"]
    assert curve["x"] == [0.0, 0.25, 0.5, 1.0] and len(curve["std"]) == 4
    assert results["methods"]["erm"]["metrics"]["accuracy"] == curve["mean"][0] > 0.2  # chance: 0.1
    assert sorted(p.name for p in (tiny_run / "jobs").iterdir()) == ["erm-seed0.json", "erm-seed1.json"]
    per_seed = [json.loads((tiny_run / "jobs" / f"erm-seed{s}.json").read_text()) for s in (0, 1)]
    assert curve["mean"] == pytest.approx([(a + b) / 2 for a, b in zip(*per_seed, strict=True)], abs=1e-12)

    figures = {p.name: p.read_bytes() for p in (tiny_run / "figures").iterdir()}
    report = (tiny_run / "report.md").read_text()
    assert "curves.png" in figures
    for path in (tiny_run / "figures").iterdir():
        path.unlink()
    (tiny_run / "figures").rmdir()
    (tiny_run / "report.md").unlink()
    assert main(["report", str(tiny_run)]) == 0
    assert (tiny_run / "report.md").read_text() == report
    assert {p.name: p.read_bytes() for p in (tiny_run / "figures").iterdir()} == figures


def test_resume_returns_the_cached_seeds(tiny_run) -> None:
    results = (tiny_run / "results.json").read_text()
    log = (tiny_run / "metrics.jsonl").read_text()
    (tiny_run / "results.json").unlink()
    run_experiment("smoke", resume=tiny_run)
    assert (tiny_run / "metrics.jsonl").read_text() == log
    assert (tiny_run / "results.json").read_text() == results


def test_a_bad_learning_rate_is_rejected_before_running(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"optimizer\.lr"):
        run_experiment("smoke", overrides=["method.optimizer.lr=-1"], out=tmp_path)
    assert not any(tmp_path.iterdir())
