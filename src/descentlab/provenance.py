"""Provenance of a run: which code, on which machine, with which packages, started when and how.

Every run directory gets ``provenance.json`` when the run starts, written atomically, so a results page can
say which code produced it. Its keys, always all of them::

    commit        full sha of the descentlab source tree's HEAD, or null (not a git checkout, see below)
    dirty         true when the checkout differs from HEAD: tracked changes, or untracked files git does
                  not ignore (``git status --porcelain``); false when commit is null
    diff_sha256   sha256 (hex) of the bytes of ``git diff HEAD`` (tracked changes only; an untracked file
                  is in ``dirty`` but not in the diff), or null when commit is null
    started_at    ISO-8601 UTC with seconds, e.g. "2025-01-31T12:00:00+00:00"
    argv          the command line, e.g. ["descentlab", "run", "smoke", "--preset", "quick"]
    python        e.g. "3.11.7"
    packages      {"torch", "transformers", "numpy", "scipy", "descentlab": version or null}
    hardware      {"cpu": model string, "gpu": name of CUDA device 0 or null}
    threads       torch.get_num_threads()
    seeds         the config's ``seeds`` list ([seed] for a config with one ``seed``; [] without either)

Git is read by subprocess from the folder that holds this package, and only when git tracks the package's
``__init__.py`` there: a package installed into a virtual environment that happens to sit inside some other checkout is not
attributed to that checkout's HEAD. Outside a checkout the commit comes from the install record pip keeps
for a ``pip install git+URL@REV`` (PEP 610 ``direct_url.json``, clean by construction), else it is null and
:func:`describe_code` says "commit unknown (not run from a git checkout)". Nothing here raises for a
missing git, a missing package or an unreadable ``/proc/cpuinfo``: provenance never stops a run.

A resumed run keeps the ``provenance.json`` of its start and gets ``provenance-resume-<k>.json`` (same
keys) for its k-th resume, so a run continued on other code is visible (:func:`read_resumes`).

When a process of the run ends (done, interrupted or failed), its record gains two more keys
(:func:`record_segment_end`)::

    ended_at      ISO-8601 UTC with seconds
    wall_seconds  the seconds this process ran the study, from prepare to its end

and :func:`run_wall_seconds` sums them over the start and every resume: the run's measured cost, which
``descentlab list`` and the sizing of a study (hours on this machine per seed) read.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata
import json
import platform
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from descentlab.io import save_json

__all__ = [
    "END_KEYS",
    "FILENAME",
    "collect_provenance",
    "describe_code",
    "git_state",
    "read_provenance",
    "read_resumes",
    "record_segment_end",
    "run_wall_seconds",
    "write_provenance",
]

FILENAME = "provenance.json"
PACKAGES = ("torch", "transformers", "numpy", "scipy", "descentlab")
# the file's schema, in order; another tool (the preregistration check) reads commit and started_at
KEYS = (
    "commit",
    "dirty",
    "diff_sha256",
    "started_at",
    "argv",
    "python",
    "packages",
    "hardware",
    "threads",
    "seeds",
)
#: the keys :func:`record_segment_end` adds when the process ends
END_KEYS = ("ended_at", "wall_seconds")
_GIT_TIMEOUT_S = 10.0  # a hung git (a network file system, a lock) must not hold a run's start for long


def _git(folder: Path, *args: str) -> subprocess.CompletedProcess[bytes] | None:
    """``git -C folder args`` with its output as bytes; None when git is missing or hangs."""
    try:
        return subprocess.run(
            # --no-optional-locks: reading must not take index.lock from a git command the user runs
            ["git", "--no-optional-locks", "-C", str(folder), "-c", "core.quotepath=off", *args],
            capture_output=True,
            timeout=_GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None


def git_state(source: Path | str | None = None) -> tuple[str | None, bool, str | None]:
    """``(commit, dirty, diff_sha256)`` of the checkout holding ``source`` (default: this package).

    ``(None, False, None)`` when ``source`` is not a file tracked by a git checkout, or git is missing.
    """
    # the package's __init__.py: tracked in any checkout of it (a new module may not be committed yet)
    here = Path(source) if source is not None else Path(__file__).with_name("__init__.py")
    folder = here if here.is_dir() else here.parent
    probe = here.name if here.is_file() else "."
    # --error-unmatch fails for an untracked or ignored path: a site-packages copy inside another checkout
    tracked = _git(folder, "ls-files", "--error-unmatch", "--", probe)
    if tracked is None or tracked.returncode != 0:
        return None, False, None
    head = _git(folder, "rev-parse", "--verify", "HEAD")
    if head is None or head.returncode != 0:  # a fresh repository without a commit
        return None, False, None
    commit = head.stdout.decode().strip()
    status = _git(folder, "status", "--porcelain")
    diff = _git(folder, "diff", "HEAD", "--no-ext-diff", "--no-color", "--binary")
    if status is None or diff is None or status.returncode != 0 or diff.returncode != 0:
        return commit, True, None  # state unknown: call it dirty rather than vouch for a clean tree
    return commit, bool(status.stdout.strip()), hashlib.sha256(diff.stdout).hexdigest()


def _installed_commit() -> str | None:
    """The commit pip recorded for a ``pip install git+URL@REV`` of descentlab (PEP 610), else None."""
    try:
        text = importlib.metadata.distribution("descentlab").read_text("direct_url.json")
        commit = json.loads(text or "{}").get("vcs_info", {}).get("commit_id")
    except (importlib.metadata.PackageNotFoundError, ValueError, AttributeError):
        return None
    return commit if isinstance(commit, str) and commit else None


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        if package == "descentlab":  # a source tree on sys.path that was never installed
            from descentlab import __version__

            return __version__
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")) and ":" in line:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _gpu_name() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    try:
        return torch.cuda.get_device_name(0)
    except (RuntimeError, AssertionError):  # a driver that lists a device but cannot open it
        return None


def _seeds(config: Mapping[str, Any] | None) -> list[int]:
    if not config:
        return []
    seeds = config.get("seeds")
    if isinstance(seeds, list | tuple):
        return [int(s) for s in seeds]
    seed = config.get("seed")
    return [int(seed)] if isinstance(seed, int) and not isinstance(seed, bool) else []


def collect_provenance(
    *,
    argv: Sequence[str] | None = None,
    config: Mapping[str, Any] | None = None,
    source: Path | str | None = None,
    started_at: _dt.datetime | None = None,
) -> dict[str, Any]:
    """The provenance record (module docstring) of a run starting now.

    Args:
        argv: the command line; default ``sys.argv``.
        config: the resolved config as a plain dict; its ``seeds`` (or ``seed``) become ``seeds``.
        source: a file of the code whose git state is recorded; default this package.
        started_at: the start time (default now); a naive datetime is taken as UTC.
    """
    import torch

    commit, dirty, diff_sha = git_state(source)
    if commit is None and source is None:
        commit = _installed_commit()
    when = started_at or _dt.datetime.now(_dt.timezone.utc)
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.timezone.utc)
    record = {
        "commit": commit,
        "dirty": dirty,
        "diff_sha256": diff_sha,
        "started_at": when.astimezone(_dt.timezone.utc).isoformat(timespec="seconds"),
        "argv": [str(a) for a in (sys.argv if argv is None else argv)],
        "python": platform.python_version(),
        "packages": {name: _version(name) for name in PACKAGES},
        "hardware": {"cpu": _cpu_model(), "gpu": _gpu_name()},
        "threads": torch.get_num_threads(),
        "seeds": _seeds(config),
    }
    return record


def write_provenance(
    run_dir: Path | str,
    *,
    argv: Sequence[str] | None = None,
    config: Mapping[str, Any] | None = None,
    source: Path | str | None = None,
) -> Path:
    """Write the record of a run starting now into ``run_dir``, atomically, and return the file's path.

    ``provenance.json`` when the run has none yet; a resume of a run that has one gets the next free
    ``provenance-resume-<k>.json`` instead, so the record of the run's start is never overwritten.
    """
    run_dir = Path(run_dir)
    record = collect_provenance(argv=argv, config=config, source=source)
    path = run_dir / FILENAME
    if path.exists():
        k = 1 + len(read_resumes(run_dir))
        path = run_dir / f"provenance-resume-{k}.json"
    save_json(path, record)
    return path


def _read(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def read_provenance(run_dir: Path | str) -> dict[str, Any] | None:
    """The ``provenance.json`` of ``run_dir`` as a dict; None when it has none (a run from before
    provenance existed) or the file is not a JSON object."""
    return _read(Path(run_dir) / FILENAME)


def read_resumes(run_dir: Path | str) -> list[dict[str, Any]]:
    """The records of the run's resumes, in order (``provenance-resume-1.json``, ``-2``, ...)."""
    records = []
    k = 1
    while (record := _read(Path(run_dir) / f"provenance-resume-{k}.json")) is not None:
        records.append(record)
        k += 1
    return records


def _code_phrase(record: Mapping[str, Any]) -> str:
    commit = record.get("commit")
    if not commit:
        return "commit unknown (not run from a git checkout)"
    if record.get("dirty"):
        diff = record.get("diff_sha256")
        tail = f", diff sha256 `{diff[:12]}`" if diff else ""
        return f"commit `{commit[:12]}` **with uncommitted changes** (dirty tree{tail})"
    return f"commit `{commit[:12]}` (clean tree)"


def describe_code(run_dir: Path | str) -> str | None:
    """One Markdown sentence on the code that produced the run, for its report; None without provenance.

    A dirty tree is said in bold, and so is a resume on other code than the run's start.
    """
    record = read_provenance(run_dir)
    if record is None:
        return None
    text = f"**Code.** descentlab {_code_phrase(record)}, started {record.get('started_at', '?')}"
    same = (record.get("commit"), record.get("dirty"), record.get("diff_sha256"))
    for k, resume in enumerate(read_resumes(run_dir), start=1):
        if (resume.get("commit"), resume.get("dirty"), resume.get("diff_sha256")) != same:
            text += f"; **resume {k} ran other code**: {_code_phrase(resume)}"
    return text + "."


def _segment_files(run_dir: Path) -> list[Path]:
    """The record files of the run's processes, in order: the start, then each resume."""
    files = [run_dir / FILENAME]
    k = 1
    while (run_dir / f"provenance-resume-{k}.json").is_file():
        files.append(run_dir / f"provenance-resume-{k}.json")
        k += 1
    return [f for f in files if f.is_file()]


def record_segment_end(run_dir: Path | str, wall_seconds: float) -> Path | None:
    """Add ``ended_at`` and ``wall_seconds`` to the record of the process now ending (the newest record
    file), atomically; None when the run has no record. Never raises for an unreadable record: provenance
    never stops a run."""
    files = _segment_files(Path(run_dir))
    if not files:
        return None
    record = _read(files[-1])
    if record is None:
        return None
    record["ended_at"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    record["wall_seconds"] = round(float(wall_seconds), 1)
    save_json(files[-1], record)
    return files[-1]


def run_wall_seconds(run_dir: Path | str) -> float | None:
    """The run's wall time: the sum of ``wall_seconds`` over its start and its resumes; None when a
    process of the run recorded none (it predates the field, or it was killed before its end)."""
    total = 0.0
    files = _segment_files(Path(run_dir))
    for f in files:
        record = _read(f)
        seconds = None if record is None else record.get("wall_seconds")
        if not isinstance(seconds, int | float):
            return None
        total += float(seconds)
    return total if files else None
