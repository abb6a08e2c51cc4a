"""The command line: exit codes, messages, run directories, report rebuild, resume."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

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
    assert "bogus_key" in err and len(err.strip().splitlines()) == 1 and len(err) < 300, err
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


def test_an_out_folder_that_cannot_be_made_exits_2_with_one_line(capsys) -> None:
    """Issue 33: `--out /proc/nope` printed a traceback and exited 1."""
    assert main(["run", "smoke", "--out", "/proc/nope/runs"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot create a run directory under /proc/nope/runs" in err and len(err.splitlines()) == 1


def test_resume_of_another_experiments_run_exits_2_naming_it(tmp_path, capsys) -> None:
    """Issue 33: resume= a run of another experiment gave a 3-line OmegaConf message."""
    other = tmp_path / "sparse-vit-20260101-000000"
    other.mkdir()
    (other / "config.yaml").write_text("vit:\n  depth: 2\nseeds: [0]\n")
    (other / "config.json").write_text(json.dumps({"experiment": "sparse-vit", "config": {}}))
    assert main(["run", "smoke", f"resume={other}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "sparse-vit" in err and f"descentlab run sparse-vit resume={other}" in err
    # without config.json the saved config itself does not fit: still one line
    (other / "config.json").unlink()
    assert main(["run", "smoke", f"resume={other}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "another experiment" in err, err


def test_a_run_that_fails_before_training_leaves_no_run_directory(tmp_path, capsys) -> None:
    """Issue 33: an input error found once the run started (here: a dataset that does not exist) left a
    half-made run directory behind; it now leaves nothing, and says so in its one line."""
    assert main(["run", "smoke", "--out", str(tmp_path), "dataset=no_such_dataset", "n_train=10"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no_such_dataset" in err, err
    assert list(tmp_path.iterdir()) == [], "nothing was trained: the run directory must be removed"


def test_a_folder_that_is_not_a_model_gives_one_clear_line(tmp_path) -> None:
    """Issue 33: a folder without a model gave a 5-line tokenizer message."""
    from descentlab.data import load_causal_lm, load_encoder_classifier
    from descentlab.errors import ModelError

    (tmp_path / "notes.txt").write_text("not a model\n")
    for load in (load_encoder_classifier, load_causal_lm):
        with pytest.raises(ModelError) as info:
            load(str(tmp_path))
        message = str(info.value)
        assert "\n" not in message and "not a model folder" in message and "config.json" in message, message


@pytest.mark.parametrize(
    ("typo", "offline"), [("minlm", "minilm"), ("MiniLM", "minilm"), ("smolm2", "smollm2")]
)
def test_an_offline_name_typo_fails_at_once_listing_the_offline_names(typo, offline) -> None:
    """Issue 33: 'minlm' cost ~45 s of hub retries and the error did not list the offline names."""
    import time

    from descentlab.data import load_causal_lm, load_encoder_classifier
    from descentlab.errors import ConfigError

    load = load_encoder_classifier if offline == "minilm" else load_causal_lm
    start = time.monotonic()
    with pytest.raises(ConfigError) as info:
        load(typo)
    assert time.monotonic() - start < 5
    message = str(info.value)
    assert f"did you mean {offline!r}" in message and f"Offline names: {offline}" in message, message


def test_a_key_typo_on_the_command_line_says_did_you_mean(tmp_path, capsys) -> None:
    assert main(["run", "smoke", "--out", str(tmp_path), "train.epoch=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did you mean 'train.epochs'" in err[0] and len(err[0]) < 300, err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("out", ["", "   "])
@pytest.mark.parametrize("command", [["run", "smoke"], ["demo"], ["reproduce"]])
def test_an_empty_out_exits_2_and_writes_nothing(command, out, tmp_path, monkeypatch, capsys) -> None:
    """Issue 45: `--out ''` ran into the current directory with exit 0."""
    monkeypatch.chdir(tmp_path)
    assert main([*command, "--out", out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out is empty" in err[0], err
    assert not any(tmp_path.iterdir())


def test_an_out_below_a_file_exits_2_with_one_line(tmp_path, capsys) -> None:
    (tmp_path / "file").write_text("")
    assert main(["run", "smoke", "--out", str(tmp_path / "file" / "runs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot create a run directory" in err[0], err


def test_an_unwritable_out_exits_2_with_one_line(tmp_path, capsys) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root ignores the mode bits
            pytest.skip("this user can write to a read-only folder")
        assert main(["run", "smoke", "--out", str(locked / "runs")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "cannot create a run directory" in err[0], err
    finally:
        locked.chmod(0o700)


@pytest.mark.skipif(not _fashion_or_mnist(), reason="no image dataset installed (run `make setup`)")
def test_a_run_from_a_config_file_records_provenance_and_curves(tmp_path, capsys) -> None:
    """Issue 45 (1, 2, 4): config printed -> run --config with an override on top; the run directory holds
    provenance.json, metrics.csv and TensorBoard events, and its report names the commit."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from descentlab.provenance import END_KEYS, KEYS, run_wall_seconds

    assert main(["config", "smoke", "--preset", "quick", "n_train=200", "n_test=100"]) == 0
    file = tmp_path / "smoke.yaml"
    file.write_text(capsys.readouterr().out)
    args = ["run", "smoke", "--config", str(file), "--out", str(tmp_path / "runs"), "train.log_every=3"]
    assert main([*args, "train.progress=false"]) == 0
    run_dir = Path(capsys.readouterr().out.strip().splitlines()[-1])
    config = json.loads((run_dir / "config.json").read_text())
    assert config["config"]["n_train"] == 200 and config["config"]["train"]["log_every"] == 3
    assert config["config_file"] == str(file)
    record = json.loads((run_dir / "provenance.json").read_text())
    assert tuple(record) == KEYS + END_KEYS  # the start's record, then the end of its one process
    assert run_wall_seconds(run_dir) == record["wall_seconds"] > 0
    assert record["argv"] == ["descentlab", *args, "train.progress=false"]
    assert record["seeds"] == config["config"]["seeds"]
    report = (run_dir / "report.md").read_text()
    code = next(line for line in report.splitlines() if line.startswith("**Code.**"))
    assert (record["commit"] or "commit unknown")[:12] in code
    assert ("uncommitted changes" in code) == bool(record["dirty"])
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    steps = sorted({int(r["step"]) for r in rows})
    total = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["step"]
    assert steps == sorted({*range(3, total + 1, 3), total})  # log steps only
    assert {"loss", "lr", "skipped"} <= {r["name"] for r in rows} and {r["tag"] for r in rows} == {
        "erm-seed0"
    }
    events = EventAccumulator(str(run_dir / "tensorboard" / "erm-seed0"))
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == steps


def test_list_names_each_studys_presets_and_long_says_what_a_run_writes(capsys) -> None:
    from descentlab.experiments import available, get

    assert main(["list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(available())
    for name, line in zip(available(), lines, strict=True):
        presets = line.split("[presets, wall time on 2 cores: ", 1)[1].split("]", 1)[0].split(", ")
        assert line.startswith(name) and [p.split()[0] for p in presets] == list(get(name).presets), line
        assert f"writes: runs/{name}-<date>-<time>/" in line, line
    assert main(["list", "--long"]) == 0
    out = capsys.readouterr().out
    assert "--preset quick: " in out and out.count("writes: RUN_DIR/") == len(available())
    assert "provenance.json" in out and "metrics.csv" in out and "tensorboard/" in out
