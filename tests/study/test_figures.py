"""study.figures: panels to one saved PNG with its caption record (placed by report/build.py), and the seed
band drawn at exactly mean ± k·sd."""

from __future__ import annotations

import numpy as np
import pytest

from descentlab.io import save_json
from descentlab.report.build import write_report
from descentlab.report.figures import new_figure, plt
from descentlab.study.figures import panel_figure, plot_band


def test_panel_figure_saves_one_png_per_call_and_returns_its_record(tmp_path) -> None:
    drawn = []

    def draw(ax, name: str) -> None:
        drawn.append(name)
        plot_band(ax, [0, 1, 2], [0.9, 0.8, 0.6], [0.01, 0.02, 0.03], label=name)

    records = panel_figure(
        tmp_path, "figures/acc.png", ["erm", "constrained"], draw, "accuracy; band = ± std"
    )
    assert records == [{"path": "figures/acc.png", "caption": "accuracy; band = ± std"}]
    assert drawn == ["erm", "constrained"]
    assert (tmp_path / "figures" / "acc.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert panel_figure(tmp_path, "figures/none.png", [], draw, "x") == []
    assert not (tmp_path / "figures" / "none.png").exists()
    assert not plt.get_fignums()  # saved figures are closed


def test_the_record_is_placed_in_the_report(tmp_path) -> None:
    save_json(tmp_path / "results.json", {"experiment": "x", "protocol": {}, "methods": {}})

    def figures(results, run_dir):
        return panel_figure(run_dir, "figures/f.png", ["a"], lambda ax, _: ax.plot([0, 1]), "the caption")

    text = write_report(tmp_path, figures=figures).read_text()
    assert "![the caption](figures/f.png)" in text and "*the caption*" in text


@pytest.mark.parametrize("k", [1.0, 2.0])
def test_the_band_is_mean_plus_minus_k_sd(k: float) -> None:
    fig, axes = new_figure()
    ax = axes[0][0]
    x, mean, sd = np.array([0.0, 1.0, 2.0]), np.array([0.9, 0.8, 0.6]), np.array([0.01, 0.02, 0.03])
    plot_band(ax, x, mean, sd, label="m", k=k)
    (line,) = ax.get_lines()
    assert np.array_equal(line.get_ydata(), mean) and line.get_label() == "m"
    (band,) = ax.collections
    ys = band.get_paths()[0].vertices[:, 1]
    assert ys.max() == pytest.approx((mean + k * sd).max()) and ys.min() == pytest.approx(
        (mean - k * sd).min()
    )
    assert np.allclose(band.get_facecolor()[0][:3], plt.matplotlib.colors.to_rgb(line.get_color()))
    plt.close(fig)
