"""`descentlab report` draws the training curves of metrics.csv, grouped into panels by name prefix."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from descentlab.logs import CurveWriter
from descentlab.report.curves import FIGURE, panel_of, plot_training_curves, read_curves


def _constrained_log(run_dir: Path, tag: str, steps: range, layers: int = 3) -> dict[int, dict[str, float]]:
    """What a constrained job's log steps write (the objective's f/g/λ/u, the loop's lr and skipped)."""
    written = {}
    with CurveWriter(run_dir, tag, tensorboard=False) as curves:
        for step in steps:
            values = {"loss": 2.0 / step, "lagrangian": 2.1 / step, "skipped": 0.0, "lr": 1e-3 / step}
            values |= {f"f/{i}": 2.0 / step + 0.1 * (layers - i) for i in range(layers + 1)}
            values |= {f"g/{i}": 0.01 * i - 0.02 for i in range(1, layers + 1)}
            values |= {f"lambda/{i}": 0.1 * i * step for i in range(1, layers + 1)}
            values |= {f"u/{i}": 0.05 * i for i in range(1, layers + 1)}
            curves.write(step, values)
            written[step] = values
    return written


def test_read_curves_keeps_the_last_row_of_a_rewritten_step_and_skips_a_torn_line(tmp_path) -> None:
    _constrained_log(tmp_path, "cons-seed0", range(1, 6))
    with CurveWriter(tmp_path, "cons-seed0", tensorboard=False) as curves:  # a resume rewrites steps 4, 5
        curves.write(4, {"loss": 9.0})
        curves.write(5, {"loss": 8.0})
    with open(tmp_path / "metrics.csv", "a") as fh:
        fh.write("1796514075.768,cons-seed0,6,lo")  # cut by a kill mid-write
    read = read_curves(tmp_path)
    steps, loss = read.series["cons-seed0"]["loss"]
    assert steps.tolist() == [1, 2, 3, 4, 5]
    np.testing.assert_allclose(loss, [2.0, 1.0, 2 / 3, 9.0, 8.0])
    assert read.names[:4] == ["loss", "lagrangian", "skipped", "lr"]
    assert read_curves(tmp_path / "absent").names == []


def test_names_group_into_panels_by_prefix() -> None:
    assert [panel_of(n) for n in ("loss", "f/0", "lambda/12", "u/1", "lr/1", "readout/n")] == [
        "loss", "f", "lambda", "u", "lr", "readout"
    ]  # fmt: skip


def test_a_figure_of_panels_from_several_jobs(tmp_path) -> None:
    for seed in range(3):
        _constrained_log(tmp_path, f"cons-seed{seed}", range(1, 41))
    path, caption = plot_training_curves(tmp_path, title="toy")
    assert path == FIGURE and (tmp_path / FIGURE).stat().st_size > 5000
    assert caption.startswith("Training curves from metrics.csv (3 jobs")
    for panel in ("multiplier λ_l", "slack u_l", "descent constraint ĝ_l", "learning rate", "f_l"):
        assert panel in caption, caption


def test_no_metrics_csv_no_figure(tmp_path) -> None:
    assert plot_training_curves(tmp_path) is None and not (tmp_path / "figures").exists()


def _image_data() -> bool:
    from descentlab.data import available_assets

    assets = available_assets()
    return bool(assets.get("fashion_mnist") or assets.get("mnist_5k"))


@pytest.mark.skipif(not _image_data(), reason="no image dataset installed (run `make setup`)")
def test_a_real_runs_report_shows_its_training_curves(tmp_path, capsys) -> None:
    from descentlab.cli import main

    overrides = ["n_train=300", "n_test=100", "train.epochs=1", "train.log_every=1", "train.progress=false"]
    assert main(["run", "smoke", "--out", str(tmp_path), *overrides]) == 0
    run_dir = Path(capsys.readouterr().out.strip().splitlines()[-1])
    report = (run_dir / "report.md").read_text()
    assert "![Training curves from metrics.csv (1 job" in report and f"]({FIGURE})" in report
    assert (run_dir / FIGURE).stat().st_size > 5000
    # the curve drawn is the loss the training log recorded, step for step
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in logged if "loss" in r and r.get("tag") == "erm-seed0"]
    steps, loss = read_curves(run_dir).series["erm-seed0"]["loss"]
    assert steps.tolist() == [r["step"] for r in logged] == list(range(1, 6))  # ceil(300 / 64) steps
    np.testing.assert_allclose(loss, [r["loss"] for r in logged])
    (run_dir / FIGURE).unlink()
    assert main(["report", str(run_dir)]) == 0 and (run_dir / FIGURE).is_file()
    assert (run_dir / "report.md").read_text() == report
