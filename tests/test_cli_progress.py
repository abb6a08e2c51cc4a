"""One progress-bar style (descentlab.progress): drawn on a terminal; silent on a pipe, a file, a worker."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from descentlab.progress import PROGRESS_ENV, progress_bar, progress_shown


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _draw(total: int = 3, **kwargs) -> None:
    with progress_bar(total, desc="erm-seed0", **kwargs) as bar:
        for _ in range(total):
            bar.update(1)


@pytest.fixture
def stderr(monkeypatch):
    monkeypatch.delenv(PROGRESS_ENV, raising=False)

    def use(stream: io.StringIO) -> io.StringIO:
        monkeypatch.setattr(sys, "stderr", stream)
        return stream

    return use


def test_a_terminal_gets_a_bar_in_the_house_style(stderr) -> None:
    err = stderr(_Terminal())
    _draw(leave=True)
    text = err.getvalue()
    assert "erm-seed0: 100%|" in text and "3/3" in text and "step/s" in text, text


def test_a_pipe_or_file_gets_no_bar(stderr) -> None:
    err = stderr(io.StringIO())  # not a terminal
    assert not progress_shown()
    _draw()
    assert err.getvalue() == ""


def test_the_environment_and_the_caller_switch_it(stderr, monkeypatch) -> None:
    err = stderr(_Terminal())
    _draw(enabled=False)  # e.g. train.progress=false, or a rank other than 0
    monkeypatch.setenv(PROGRESS_ENV, "0")  # a JobRunner worker
    _draw()
    assert err.getvalue() == ""
    plain = stderr(io.StringIO())
    monkeypatch.setenv(PROGRESS_ENV, "1")  # forced on without a terminal
    _draw(leave=True)
    assert "3/3" in plain.getvalue()


def _image_data() -> bool:
    from descentlab.data import available_assets

    assets = available_assets()
    return bool(assets.get("fashion_mnist") or assets.get("mnist_5k"))


@pytest.mark.skipif(not _image_data(), reason="no image dataset installed (run `make setup`)")
def test_a_run_with_stderr_on_a_pipe_prints_no_bar(tmp_path) -> None:
    """Before: a pipe got the training bar's carriage-return redraws (`erm-seed0: 25%|██▌ | 1/4 ...`)."""
    env = {k: v for k, v in os.environ.items() if k != PROGRESS_ENV}
    cmd = [sys.executable, "-m", "descentlab.cli", "run", "smoke", "--out", str(tmp_path)]
    cmd += ["n_train=200", "n_test=100", "train.epochs=1"]  # train.progress stays on: the default
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "erm-seed0" not in proc.stderr and "it/s" not in proc.stderr and "\r" not in proc.stderr, (
        proc.stderr
    )
