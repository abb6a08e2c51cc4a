"""Issue 45 (1): provenance.json records which code, packages, machine and command made a run."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import platform
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from descentlab.provenance import (
    KEYS,
    collect_provenance,
    describe_code,
    git_state,
    read_provenance,
    read_resumes,
    record_segment_end,
    run_wall_seconds,
    write_provenance,
)

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(repo: Path, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git checkout holding one tracked file, committed."""
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q")
    (root / "code.py").write_text("x = 1\n")
    _git(root, "add", "code.py")
    _git(root, "commit", "-q", "-m", "first")
    return root


def test_the_record_has_exactly_the_promised_keys_and_values() -> None:
    record = collect_provenance(argv=["descentlab", "run", "smoke"], config={"seeds": [3, 4], "n": 1})
    assert tuple(record) == KEYS
    assert record["argv"] == ["descentlab", "run", "smoke"]
    assert record["python"] == platform.python_version()
    assert record["seeds"] == [3, 4]
    assert record["threads"] == torch.get_num_threads()
    assert set(record["packages"]) == {"torch", "transformers", "numpy", "scipy", "descentlab"}
    assert record["packages"]["torch"] == torch.__version__
    assert isinstance(record["hardware"]["cpu"], str) and record["hardware"]["cpu"]
    assert record["hardware"]["gpu"] == (torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    started = dt.datetime.fromisoformat(record["started_at"])
    assert started.utcoffset() == dt.timedelta(0) and started.microsecond == 0
    assert abs((dt.datetime.now(dt.timezone.utc) - started).total_seconds()) < 60
    json.dumps(record, allow_nan=False)  # plain JSON, as the file holds it


def test_seeds_come_from_a_single_seed_or_are_empty() -> None:
    assert collect_provenance(argv=[], config={"seed": 7})["seeds"] == [7]
    assert collect_provenance(argv=[], config={"n": 1})["seeds"] == []
    assert collect_provenance(argv=[])["seeds"] == []


@needs_git
def test_this_checkout_gives_its_head_commit() -> None:
    root = Path(__file__).resolve().parents[1]
    if subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True).returncode != 0:
        pytest.skip("the tests do not run from a git checkout")
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    commit, dirty, diff = git_state()
    assert commit == head.stdout.strip() and len(commit) == 40
    assert isinstance(dirty, bool) and diff is not None and len(diff) == 64


@needs_git
def test_a_clean_then_dirty_checkout(repo: Path) -> None:
    head = _git(repo, "rev-parse", "HEAD").strip()
    empty = hashlib.sha256(b"").hexdigest()
    assert git_state(repo / "code.py") == (head, False, empty)
    (repo / "code.py").write_text("x = 2\n")
    diff = subprocess.run(
        ["git", "-C", str(repo), "diff", "HEAD", "--no-ext-diff", "--no-color", "--binary"],
        capture_output=True,
        check=True,
    ).stdout
    assert git_state(repo / "code.py") == (head, True, hashlib.sha256(diff).hexdigest())
    record = collect_provenance(argv=[], source=repo / "code.py")
    assert record["commit"] == head and record["dirty"] is True


@needs_git
def test_an_untracked_file_makes_the_tree_dirty_but_is_not_in_the_diff(repo: Path) -> None:
    (repo / "new.py").write_text("y = 1\n")
    _, dirty, diff = git_state(repo / "code.py")
    assert dirty is True and diff == hashlib.sha256(b"").hexdigest()


@needs_git
def test_a_file_git_does_not_track_is_not_attributed_to_the_checkout_around_it(repo: Path) -> None:
    """A package installed into a venv inside some checkout: that checkout's HEAD is not its commit."""
    (repo / ".gitignore").write_text("venv/\n")
    installed = repo / "venv" / "site" / "pkg.py"
    installed.parent.mkdir(parents=True)
    installed.write_text("z = 1\n")
    assert git_state(installed) == (None, False, None)


def test_outside_a_checkout_the_commit_is_null_and_the_report_says_so(tmp_path: Path) -> None:
    outside = tmp_path / "plain.py"
    outside.write_text("")
    assert git_state(outside) == (None, False, None)
    record = collect_provenance(argv=[], source=outside)
    assert record["commit"] is None and record["dirty"] is False and record["diff_sha256"] is None
    run = tmp_path / "run"
    write_provenance(run, argv=["x"], source=outside)
    assert "commit unknown (not run from a git checkout)" in describe_code(run)


def test_a_missing_git_gives_a_null_commit_without_raising(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no git on it
    assert git_state() == (None, False, None)


@needs_git
def test_write_keeps_the_start_record_and_adds_one_per_resume(repo: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert read_provenance(run) is None and describe_code(run) is None
    first = write_provenance(run, argv=["a"], config={"seeds": [0]}, source=repo / "code.py")
    assert first.name == "provenance.json"
    head = _git(repo, "rev-parse", "HEAD").strip()
    assert f"commit `{head[:12]}` (clean tree)" in describe_code(run)
    (repo / "code.py").write_text("x = 3\n")
    second = write_provenance(run, argv=["b"], source=repo / "code.py")
    assert second.name == "provenance-resume-1.json"
    assert read_provenance(run)["argv"] == ["a"]  # the start's record is never overwritten
    assert [r["argv"] for r in read_resumes(run)] == [["b"]]
    assert "**resume 1 ran other code**" in describe_code(run) and "uncommitted changes" in describe_code(run)
    assert not list(run.glob(".*.tmp"))  # written through a temporary file, renamed into place


def test_a_corrupt_file_reads_as_no_provenance(tmp_path: Path) -> None:
    (tmp_path / "provenance.json").write_text("{not json")
    assert read_provenance(tmp_path) is None and describe_code(tmp_path) is None


@needs_git
def test_the_report_shows_the_commit_and_a_dirty_tree(repo: Path, tmp_path: Path) -> None:
    from descentlab.report.build import write_report

    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"experiment": "toy", "methods": {}}))
    assert "**Code.**" not in write_report(run).read_text()  # a run from before provenance: no line
    (repo / "code.py").write_text("x = 4\n")
    write_provenance(run, argv=[], source=repo / "code.py")
    head = _git(repo, "rev-parse", "HEAD").strip()
    report = write_report(run).read_text()
    assert f"**Code.** descentlab commit `{head[:12]}` **with uncommitted changes**" in report


def test_the_wall_time_sums_the_start_and_every_resume(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert record_segment_end(run, 1.0) is None and run_wall_seconds(run) is None
    write_provenance(run, argv=["a"])
    assert run_wall_seconds(run) is None  # started, not ended: no measured cost yet
    record_segment_end(run, 12.34)
    assert run_wall_seconds(run) == pytest.approx(12.3)
    write_provenance(run, argv=["b"])  # a resume whose process was killed records no end
    assert run_wall_seconds(run) is None
    record_segment_end(run, 30.0)
    assert run_wall_seconds(run) == pytest.approx(42.3)
    assert read_provenance(run)["wall_seconds"] == pytest.approx(12.3)  # the start's record keeps its own
