"""Issue 33 (14): the command line tells a newcomer what it has: descriptions, version, resolved configs."""

from __future__ import annotations

import importlib.metadata

import pytest
import yaml

from descentlab.cli import build_parser, main
from descentlab.experiments import available


def test_list_gives_each_experiment_a_one_line_description(capsys) -> None:
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[0] for line in lines] == available()
    for line in lines:
        name, description = line.split(maxsplit=1)
        assert len(description) > 20, line
        assert "``" not in description and not description.startswith(f"{name}:")
    smoke = next(line for line in lines if line.startswith("smoke "))
    assert "MLP" in smoke


def test_version_prints_the_installed_version(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"descentlab {importlib.metadata.version('descentlab')}"


@pytest.mark.parametrize("command", [None, "list", "config", "run", "report", "demo", "reproduce"])
def test_help_has_no_rest_markup(command, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"] if command is None else [command, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "usage: descentlab" in out and "`" not in out


def test_config_prints_the_resolved_yaml_with_preset_and_overrides(capsys) -> None:
    assert main(["config", "smoke", "--preset", "quick", "train.epochs=3", "method.optimizer.lr=0.01"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["train"]["epochs"] == 3 and cfg["method"]["optimizer"]["lr"] == 0.01
    assert main(["config", "smoke"]) == 0
    default = yaml.safe_load(capsys.readouterr().out)
    assert default["train"]["epochs"] != 3 or default["method"]["optimizer"]["lr"] != 0.01
    assert "config" in build_parser().format_help()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["config", "no-such-experiment"], "unknown experiment"),
        (["config", "smoke", "--preset", "nope"], "unknown preset"),
        (["config", "smoke", "bogus=1"], "unknown config key 'bogus'"),
        (["config", "smoke", "train.epochs=two"], "train.epochs"),
        (["config", "smoke", "--bogus"], "unrecognized arguments"),
    ],
)
def test_config_bad_input_exits_2_with_one_line(args, needle, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        raise SystemExit(main(args))
    assert info.value.code == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("usage:")]
    assert len(err) == 1 and needle in err[0], err


def test_list_into_a_closed_pipe_is_quiet() -> None:
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from descentlab.cli import main; sys.exit(main(['list']))"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # the reader leaves before the first line, as `| head -0` does
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()
