""" "Declared before the run" is a fact read from git: the rules on a repository made here, and every committed
run's ``preregistration.json`` recomputed from this clone's history."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from descentlab.report import preregistration as prereg

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"

CLAIMS_V1 = """
from descentlab.report.claims import ClaimSpec
MAIN = "main-claim"
CLAIMS = [ClaimSpec(name="other", description="d", cells=None, metric="m", sesoi=0.1)]
"""
CLAIMS_V2 = """
from descentlab.report.claims import ClaimSpec
MAIN = "main-claim"
CLAIMS = [ClaimSpec(name=MAIN, description="d", cells=None, metric="m", sesoi=0.1, primary=True)]
"""


def test_declares_primary_reads_literals_constants_and_helper_calls() -> None:
    assert prereg.declares_primary(CLAIMS_V2, "main-claim")
    assert not prereg.declares_primary(CLAIMS_V1, "main-claim")
    assert prereg.declares_primary('CLAIMS = [_ppl("x", "d", cells, primary=True)]', "x")
    assert not prereg.declares_primary('CLAIMS = [_ppl("x", "d", cells, primary=False)]', "x")
    assert not prereg.declares_primary("def broken(:", "x")
    # a name built at import time is read by running the module
    built = 'from descentlab.report.claims import ClaimSpec\nCLAIMS = [ClaimSpec(name=f"lp{4}", description="d", cells=None, metric="m", sesoi=0.1, primary=True)]'
    assert prereg.declares_primary(built, "lp4", package="descentlab.report")
    assert not prereg.declares_primary(built, "lp3", package="descentlab.report")
    assert not prereg.declares_primary(
        built.replace("ClaimSpec(", "Missing("), "lp4", package="descentlab.report"
    )


def _git(repo: Path, *args: str, date: str | None = None) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    if date:
        env |= {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    import os

    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env={**os.environ, **env}
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _run(repo: Path, name: str, commit: str | None, started: str | None) -> Path:
    run = repo / "docs" / "results" / name
    run.mkdir(parents=True)
    rows = [{"name": "main-claim", "role": "primary", "kind": "directional", "verdict": "reproduced"}]
    (run / "results.json").write_text(json.dumps({"experiment": "toy", "claims": rows}))
    if commit or started:
        (run / "provenance.json").write_text(json.dumps({"commit": commit, "started_at": started}))
    return run


def test_before_after_and_unknown_on_a_repository_made_here(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    module = repo / "src" / "descentlab" / "experiments" / "toy" / "claims.py"
    module.parent.mkdir(parents=True)
    _git(repo.parent, "init", "-q", str(repo))
    module.write_text(CLAIMS_V1)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "claims without the primary", date="2026-12-01T10:00:00+00:00")
    early = _git(repo, "rev-parse", "HEAD")
    module.write_text(CLAIMS_V2)
    _git(repo, "commit", "-qam", "declare the primary", date="2026-12-01T12:00:00+00:00")
    declared = _git(repo, "rev-parse", "HEAD")
    # renamed later: the history is followed through the move
    moved = module.parent.parent / "toy2"
    _git(repo, "mv", str(module.parent), str(moved))
    _git(repo, "commit", "-qm", "move", date="2026-12-01T13:00:00+00:00")
    (moved.parent / "toy").mkdir()
    _git(repo, "mv", str(moved / "claims.py"), str(module))
    _git(repo, "commit", "-qm", "move back", date="2026-12-01T13:30:00+00:00")

    before = prereg.check_run(repo, _run(repo, "a", declared, "2026-12-01T14:00:00+00:00"))
    assert before is not None and before.status == "declared before the run"
    assert before.declared_commit == declared
    # run from the commit before the declaration: its code did not hold it
    after = prereg.check_run(repo, _run(repo, "b", early, "2026-12-01T11:00:00+00:00"))
    assert after is not None and after.status == "declared after the run (post hoc)"
    # a run recorded by time only, started before the declaration
    late = prereg.check_run(repo, _run(repo, "c", None, "2026-12-01T11:30:00+00:00"))
    assert late is not None and late.status.endswith("(post hoc)")
    unknown = prereg.check_run(repo, _run(repo, "d", None, None))
    assert unknown is not None and unknown.status == "unknown"


@pytest.mark.skipif(not prereg.has_history(ROOT), reason="needs a clone with its full git history")
def test_every_committed_preregistration_matches_git() -> None:
    judged = 0
    for run in prereg.runs(RESULTS):
        fresh = prereg.check_run(ROOT, run)
        expected = None if fresh is None else fresh.to_dict()
        assert prereg.read(run) == expected, (
            f"{run.relative_to(RESULTS)}: stale; run python -m descentlab.report.preregistration docs/results"
        )
        judged += fresh is not None
    assert judged >= 7  # every study's main run judges its primary, companions too


def test_every_committed_run_records_its_start_and_commit() -> None:
    for run in prereg.runs(RESULTS):
        provenance = json.loads((run / "provenance.json").read_text())
        assert provenance["commit"] and provenance["started_at"], run
