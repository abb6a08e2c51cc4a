"""Reports: tables and figures from results.json; combined reports link figures relative to themselves."""

from __future__ import annotations

import json
import re
from pathlib import Path

from descentlab.report import write_combined_report, write_report
from descentlab.train.rundir import RunDir

RESULTS = {
    "experiment": "toy",
    "protocol": {"seeds": [0, 1]},
    "methods": {
        "erm": {
            "metrics": {"accuracy": 0.8},
            "curves": {
                "gaussian": {
                    "x_name": "gamma",
                    "x": [0, 1],
                    "metric": "accuracy",
                    "mean": [0.8, 0.6],
                    "std": [0.0, 0.004],
                }
            },
            "layer_loss": {"clean": [0.7, 0.71, 0.5]},
        },
        "constrained": {
            "metrics": {"accuracy": 0.79},
            "curves": {
                "gaussian": {
                    "x_name": "gamma",
                    "x": [0, 1],
                    "metric": "accuracy",
                    "mean": [0.79, 0.65],
                    "std": [0.0, 0.01],
                }
            },
            "layer_loss": {"clean": [0.7, 0.6, 0.5]},
        },
    },
}


def test_report_tables_flag_monotone_profiles_and_keep_small_stds(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path, "toy")
    (run.path / "results.json").write_text(json.dumps(RESULTS))
    text = write_report(run.path).read_text()
    assert "| erm | clean | 0.7000 | 0.7100 | 0.5000 | no |" in text
    assert "| constrained | clean | 0.7000 | 0.6000 | 0.5000 | yes |" in text
    assert "0.6000 ± 0.004" in text  # not rounded away to 0.00
    assert (run.path / "figures" / "curves.png").stat().st_size > 1000
    assert (run.path / "tables" / "metrics.csv").read_text().startswith("method,accuracy")


def test_combined_report_links_resolve_from_its_own_folder(tmp_path: Path) -> None:
    runs = []
    for _ in range(2):
        run = RunDir.create(tmp_path, "toy")
        (run.path / "results.json").write_text(json.dumps(RESULTS))
        runs.append(run.path)
    summary = RunDir.create(tmp_path, "summary")
    report = write_combined_report(summary.path / "report.md", runs)
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report.read_text())
    assert len(links) == 4 and all(not link.startswith("/") for link in links)
    assert all((report.parent / link).is_file() for link in links)


def test_a_report_says_whether_its_run_is_evidence_a_search_or_a_smoke_run(tmp_path: Path) -> None:
    from descentlab.report.build import preset_banner

    texts = {}
    for preset in ("full", "full-levels", "paper", "moonshot-search-w128", "quick", None):
        run = RunDir.create(tmp_path, "toy")
        (run.path / "results.json").write_text(json.dumps(RESULTS))
        (run.path / "config.json").write_text(json.dumps({"preset": preset}))
        texts[preset] = write_report(run.path).read_text()
    for preset in ("full", "full-levels", "paper"):  # declared companion runs are evidence too
        assert preset_banner(preset) is None and "not evidence" not in texts[preset]
    assert "A search, not evidence." in texts["moonshot-search-w128"]
    assert "A smoke run, not evidence." in texts["quick"] and "`quick` preset" in texts["quick"]
    assert "`default` preset" in texts[None]
