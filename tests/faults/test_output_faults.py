"""An existing output folder that nobody may write to, root included: exit 2 with one line, nothing written.

tests/test_cli.py's chmod-based case is skipped where the tests run as root (root writes through a
read-only mode); sysfs refuses a new folder to every user, so this case runs everywhere on Linux.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from descentlab.cli import main

SYSFS = Path("/sys")


@pytest.mark.skipif(sys.platform != "linux" or not SYSFS.is_dir(), reason="needs Linux's sysfs at /sys")
def test_an_existing_unwritable_out_exits_2_with_one_line_even_as_root(capsys) -> None:
    before = sorted(p.name for p in SYSFS.iterdir())
    assert main(["run", "smoke", "--out", str(SYSFS), "n_train=10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"descentlab: error: cannot create a run directory under {SYSFS}:")
    assert "pass --out a writable folder" in err[0]
    assert sorted(p.name for p in SYSFS.iterdir()) == before
