"""The API reference (pdoc, scripts/build_api.py; `make docs`) builds offline and has no broken reference."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build_api.py"
pytest.importorskip("pdoc", reason="pdoc is in the dev extra (make setup installs it)")


def _script():
    spec = importlib.util.spec_from_file_location("build_api", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env() -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("api")
    # the script refuses every non-local socket connection before it imports anything: the build is offline
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    return out, proc


def test_builds_offline_with_no_broken_reference(built) -> None:
    out, proc = built
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " 0 broken" in proc.stdout, proc.stdout + proc.stderr
    assert (out / "index.html").is_file()
    assert (out / "descentlab.html").is_file()
    for sub in _script().PUBLIC_SUBPACKAGES:  # every subpackage the script documents has its page
        assert (out / "descentlab" / f"{sub}.html").is_file(), sub
    assert not (out / "descentlab" / "experiments.html").exists()


def test_every_public_name_has_an_entry(built) -> None:
    import descentlab

    out, _ = built
    page = _script()._Page()
    page.feed((out / "descentlab.html").read_text(encoding="utf-8"))
    missing = [name for name in descentlab.__all__ if name not in page.ids]
    assert not missing, missing


def test_internal_links_are_checked_independently(built) -> None:
    """Re-check the built pages here (not only the script's own verdict): every internal link resolves."""
    out, _ = built
    api = _script()
    assert api.check(out) == []
    pages = sorted(out.rglob("*.html"))
    hrefs = 0
    for path in pages:
        page = api._Page()
        page.feed(path.read_text(encoding="utf-8"))
        hrefs += len(page.hrefs)
    assert len(pages) > 50 and hrefs > 1000  # the check saw a real reference, not an empty folder


def test_check_finds_broken_references(tmp_path: Path) -> None:
    api = _script()
    (tmp_path / "descentlab").mkdir()
    (tmp_path / "descentlab" / "optim.html").write_text('<section id="HORST"></section>')
    (tmp_path / "descentlab.html").write_text(
        '<a href="descentlab/optim.html#HORST">ok</a> <a href="#nowhere">anchor</a>'
        '<a href="descentlab/gone.html">page</a> <a href="descentlab/optim.html#HAM">anchor2</a>'
        '<a href="https://example.org/x">external</a>'
        "<code>descentlab.optim.HORST</code> <code>descentlab.optim.NoSuchThing()</code>"
        '<section id="HORST"></section>'
    )
    problems = "\n".join(api.check(tmp_path))
    assert "#nowhere" in problems and "gone.html" in problems and "optim.html#HAM" in problems
    assert "descentlab.optim.NoSuchThing" in problems and "descentlab.optim.HORST," not in problems
    assert "example.org" not in problems
    assert "no entry for descentlab.__all__ name PrimalDual" in problems  # only HORST has an entry here


def test_role_check(monkeypatch: pytest.MonkeyPatch) -> None:
    api = _script()
    good = ":func:`~descentlab.optim.config.build_optimizer`, :class:`HORST`, :mod:`.ham`, :meth:`HORST.step`"
    assert all(api._role_resolves(t, "descentlab.optim.horst", False) for t in api._ROLE.findall(good))
    assert not api._role_resolves("descentlab.optim.config.no_such", "descentlab.optim.horst", False)
    assert not api._role_resolves(".no_such_module", "descentlab.optim", True)


def test_network_is_refused_during_the_build() -> None:
    code = (
        "import importlib.util, socket, sys\n"
        f"spec = importlib.util.spec_from_file_location('b', {str(SCRIPT)!r})\n"
        "b = importlib.util.module_from_spec(spec); spec.loader.exec_module(b); b.block_network()\n"
        "try:\n    socket.create_connection(('192.0.2.1', 80), timeout=1)\n"
        "except OSError as e:\n    sys.exit(0 if 'network access during the API build' in str(e) else 1)\n"
        "sys.exit(1)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], env=_env(), timeout=60).returncode == 0
