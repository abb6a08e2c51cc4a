"""Issue 45 (2): what `descentlab config` prints feeds back through --config, for every study and preset,
and an unknown key gets one line with the nearest valid keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from descentlab.cli import main
from descentlab.config import (
    config_keys,
    config_to_dict,
    config_to_yaml,
    resolve_config,
    unknown_key_message,
)
from descentlab.errors import ConfigError
from descentlab.experiments import available, get

CASES = [(name, preset) for name in available() for preset in [None, *get(name).presets]]


@pytest.mark.parametrize(("name", "preset"), CASES, ids=[f"{n}-{p}" for n, p in CASES])
def test_printed_config_fed_back_reproduces_itself(name, preset, tmp_path, capsys) -> None:
    exp = get(name)
    assert main(["config", name, *(["--preset", preset] if preset else [])]) == 0
    printed = capsys.readouterr().out
    file = tmp_path / "cfg.yaml"
    file.write_text(printed)
    again = resolve_config(exp.config_cls, presets=exp.presets, config_file=file)
    want = resolve_config(exp.config_cls, preset=preset, presets=exp.presets)
    assert config_to_dict(again) == config_to_dict(want)
    assert main(["config", name, "--config", str(file)]) == 0
    assert capsys.readouterr().out == printed  # and it prints itself again, byte for byte


def test_overrides_apply_on_top_of_the_file_and_the_file_on_top_of_the_preset(tmp_path) -> None:
    exp = get("smoke")
    file = tmp_path / "cfg.yaml"
    file.write_text("n_train: 123\ntrain:\n  epochs: 4\n")
    cfg = resolve_config(
        exp.config_cls,
        preset="quick",
        presets=exp.presets,
        config_file=file,
        overrides=["train.epochs=2"],
    )
    assert cfg.n_train == 123 and cfg.train.epochs == 2
    assert cfg.n_test == exp.presets["quick"]["n_test"]  # a key the file leaves out keeps the preset's


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("train.epoch", "train.epochs"),
        ("epochs", "train.epochs"),
        ("trian.epochs", "train.epochs"),
        ("method.optimizer.learning_rate", None),
        ("data.n_trian", "data.n_train"),
    ],
)
def test_a_typo_gets_one_short_line_naming_the_nearest_keys(typo, meant) -> None:
    exp = get("text-robustness")
    valid = config_keys(exp.config_cls)
    assert len(", ".join(valid)) > 2000  # the list the message used to print
    message = unknown_key_message(typo, valid)
    assert "\n" not in message and len(message) < 300, message
    if meant is not None:
        assert "did you mean" in message and repr(meant) in message.split("did you mean", 1)[1], message
    with pytest.raises(ConfigError) as info:
        resolve_config(exp.config_cls, overrides=[f"{typo}=1"])
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("train:\n  epoch: 2\n", "did you mean 'train.epochs'"),
        ("n_trian: 5\n", "did you mean 'n_train'"),
        ("train: [1, 2\n", "is not valid YAML at line"),
        ("- 1\n- 2\n", "must hold a mapping"),
        ("train:\n  epochs: two\n", "train.epochs"),
    ],
)
def test_a_bad_config_file_exits_2_with_one_line(text, needle, tmp_path, capsys) -> None:
    file = tmp_path / "bad.yaml"
    file.write_text(text)
    runs = tmp_path / "runs"
    assert main(["run", "smoke", "--config", str(file), "--out", str(runs)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and len(err[0]) < 400, err
    assert not runs.exists() or not any(runs.iterdir()), "a config error must not create a run directory"


def test_a_missing_config_file_exits_2(tmp_path: Path, capsys) -> None:
    assert main(["config", "smoke", "--config", str(tmp_path / "nope.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot read config file" in err[0] and "nope.yaml" in err[0], err


def test_resume_refuses_a_config_file(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(config_to_yaml(resolve_config(get("smoke").config_cls)))
    file = tmp_path / "cfg.yaml"
    file.write_text("n_train: 5\n")
    assert main(["run", "smoke", "--config", str(file), f"resume={run}"]) == 2
    assert "--config" in capsys.readouterr().err
