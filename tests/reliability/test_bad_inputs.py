"""Every bad input gives one clear message (exit code 2 on the command line) and loses nothing."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from descentlab.cli import main

from .cases import CLI_CASES, LIBRARY_CASES, CliCase, LibraryCase


@pytest.mark.parametrize("case", LIBRARY_CASES, ids=lambda c: c.name)
def test_library_case(case: LibraryCase) -> None:
    with pytest.raises(case.error) as info:
        case.call()
    message = str(info.value)
    assert case.needle in message, message
    assert "\n" not in message.strip(), "one message, one line"


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file()
    }


def run_cli(case: CliCase, out: Path) -> int:
    has_out = "--out" in case.args
    args = (
        [*case.args[:2], "--out", str(out), *case.args[2:]]
        if case.args[0] == "run" and not has_out
        else case.args
    )
    try:
        return main(args)
    except SystemExit as exc:  # argparse's own usage errors
        return int(exc.code)


@pytest.mark.parametrize("case", CLI_CASES, ids=lambda c: c.name)
def test_cli_case(case: CliCase, tmp_path: Path, capsys, monkeypatch) -> None:
    for key, value in case.env.items():
        monkeypatch.setenv(key, value)
    other = tmp_path / "smoke-19990101-000000"  # another run in the same folder must stay untouched
    other.mkdir()
    (other / "config.yaml").write_text("n_train: 1\n")
    (other / "results.json").write_text("{}\n")
    before = _snapshot(other)

    assert run_cli(case, tmp_path) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("descentlab: error")]
    assert len(err) == 1 and case.needle in err[0], err
    assert _snapshot(other) == before
    made = [p for p in tmp_path.iterdir() if p != other]
    if case.makes_run_dir:
        (run_dir,) = made
        assert '"failed"' in (run_dir / "status.json").read_text()
        assert (run_dir / "config.yaml").is_file()
    else:
        assert made == [], "a config error must not create a run directory"
