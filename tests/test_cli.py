"""The command line: exit codes, messages, run directories, report rebuild, resume."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from descentlab.cli import main
from descentlab.data import available_assets


def _fashion_or_mnist() -> bool:
    assets = available_assets()
    return bool(assets.get("fashion_mnist") or assets.get("mnist_5k"))


def test_list_prints_registered_experiments(capsys) -> None:
    assert main(["list"]) == 0
    names = capsys.readouterr().out.split()
    assert "smoke" in names


def test_unknown_key_exits_2_naming_it(tmp_path, capsys) -> None:
    assert main(["run", "smoke", "--out", str(tmp_path), "bogus_key=1"]) == 2
    err = capsys.readouterr().err
    assert "bogus_key" in err and "valid keys" in err and "train.epochs" in err
    assert not any(tmp_path.iterdir()), "a config error must not create a run directory"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "no-such-experiment"], "unknown experiment"),
        (["run", "smoke", "method.optimizer.lr=-1"], "optimizer.lr must be a finite number >= 0"),
        (["run", "smoke", "train.epochs=two"], "train.epochs"),
        (["report", "/nonexistent"], "is not a directory"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, needle, tmp_path, capsys) -> None:
    assert main([*args, "--out", str(tmp_path)] if args[0] == "run" else args) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_usage_error_exits_2() -> None:
    proc = subprocess.run([sys.executable, "-m", "descentlab.cli", "run"], capture_output=True, text=True)
    assert proc.returncode == 2 and "name" in proc.stderr


@pytest.mark.skipif(not _fashion_or_mnist(), reason="no image dataset installed (run `make setup`)")
def test_run_writes_a_complete_run_directory_and_resume_is_a_no_op(tmp_path, capsys) -> None:
    overrides = ["n_train=200", "n_test=100", "train.epochs=1", "train.progress=false"]
    assert main(["run", "smoke", "--out", str(tmp_path), *overrides]) == 0
    run_dir = tmp_path / capsys.readouterr().out.strip().splitlines()[-1].split("/")[-1]
    for name in ("config.yaml", "config.json", "metrics.jsonl", "results.json", "report.md", "status.json"):
        assert (run_dir / name).is_file(), name
    results = json.loads((run_dir / "results.json").read_text())
    assert results["experiment"] == "smoke" and results["config"]["n_train"] == 200
    assert 0.3 < results["methods"]["erm"]["metrics"]["accuracy"] <= 1.0  # 10 classes: chance is 0.1
    report = (run_dir / "report.md").read_text()
    assert (
        "| erm |" in report
        and "figures/curves.png" in report
        and (run_dir / "figures" / "curves.png").is_file()
    )
    (run_dir / "report.md").unlink()
    assert main(["report", str(run_dir)]) == 0 and (run_dir / "report.md").read_text() == report
    steps_before = len((run_dir / "metrics.jsonl").read_text().splitlines())
    assert main(["run", "smoke", f"resume={run_dir}"]) == 0
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == steps_before  # nothing retrained
    assert main(["run", "smoke", f"resume={run_dir}", "n_train=5"]) == 2
