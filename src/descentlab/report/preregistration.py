"""Was a study's primary endpoint declared before its run? A fact read from git, not a sentence.

For each committed run (``docs/results/<study>/`` and its companions ``<study>/<preset>/``):

* **the declaration**: the first commit, in the history of the study's claims module
  (``src/descentlab/experiments/<study>/claims.py``, followed through renames), whose source declares a
  claim of the primary's name with ``primary=True``. The module is parsed (``ast``), never imported, so a
  commit whose code no longer runs is still read;
* **the run**: its start time and commit, from the run directory's ``provenance.json`` (written by every
  run since provenance was recorded; for the runs before that it was reconstructed from the page's
  Command section, and says so in its ``source`` field).

The run was *declared before* when the declaration commit is an ancestor of (or is) the commit the run ran
from, so the run's own code held the declaration, and it was committed before the run started. It is
*post hoc* when the declaration commit is not in the run's history or came after the run started, and
*unknown* when the run records neither commit nor start. The facts are written to
``<run>/preregistration.json`` by

    python -m descentlab.report.preregistration docs/results

and the results index and pages read them from there; a test recomputes them from git where the clone
has the history, and fails when a committed file is stale.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from descentlab.io import atomic_write_text

FILE = "preregistration.json"
Status = Literal["declared before the run", "declared after the run (post hoc)", "unknown"]


@dataclass(frozen=True)
class Preregistration:
    """The facts behind "declared before the run" for one run's primary endpoint."""

    primary: str
    claims_module: str
    declared_commit: str | None
    declared_at: str | None
    run_commit: str | None
    run_started_at: str | None
    run_source: str
    status: Status
    why: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def has_history(repo: Path) -> bool:
    """True when ``repo`` is a git checkout with its full history (not shallow)."""
    try:
        return _git(repo, "rev-parse", "--is-shallow-repository") == "false"
    except (subprocess.CalledProcessError, FileNotFoundError):
        return False


def declares_primary(source: str, name: str, package: str | None = None) -> bool:
    """Whether module ``source`` declares a claim called ``name`` with ``primary=True``: a call with the
    keyword ``primary=True`` whose ``name=`` keyword, or first positional argument, is the string ``name``
    (a literal, or a module-level constant bound to one). When such a call's name is built at import time
    (a helper formatting it), the module is executed as a module of ``package`` and its ``CLAIMS`` read."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name)
    }

    def text(node: ast.expr) -> object:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return constants.get(node.id)
        return None

    unresolved = False
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        flag = keywords.get("primary")
        if not (isinstance(flag, ast.Constant) and flag.value is True):
            continue
        named = keywords.get("name", node.args[0] if node.args else None)
        value = text(named) if named is not None else None
        if value == name:
            return True
        unresolved |= not isinstance(value, str)
    # a name built at import time (an f-string in a helper): run the module and read its CLAIMS
    return unresolved and name in _primaries_by_running(source, package)


def _primaries_by_running(source: str, package: str | None) -> set[str]:
    """The names of the primary claims of ``source``'s ``CLAIMS``, by executing it as a module of
    ``package`` (its relative imports resolve to the installed package's current modules). Empty when it
    does not run: a declaration that cannot be read is not counted."""
    namespace: dict[str, Any] = {"__name__": f"{package}._preregistration_probe", "__package__": package}
    try:
        # the repository's own code at a past commit, read to see what it declared
        exec(compile(source, "<claims at a past commit>", "exec"), namespace)
        return {spec.name for spec in namespace.get("CLAIMS", []) if getattr(spec, "primary", False)}
    except Exception:  # old code that no longer runs declares nothing we can read
        return set()


def first_declaration(repo: Path, module: str, name: str) -> tuple[str, str] | None:
    """``(commit, committer time ISO-8601)`` of the first commit whose ``module`` declares ``name`` as the
    primary, following renames; None when no commit does."""
    # newest first: git's --follow does not combine with --reverse (it stops at the first rename)
    log = _git(repo, "log", "--follow", "--format=%H %cI", "--name-only", "--", module)
    history: list[tuple[str, str, str]] = []
    commit = when = ""
    for line in log.splitlines():
        parts = line.split()
        if len(parts) == 2 and len(parts[0]) == 40:
            commit, when = parts
        elif line.strip() and commit:
            history.append((commit, when, line.strip()))
    for commit, when, path in reversed(history):
        try:
            source = _git(repo, "show", f"{commit}:{path}")
        except subprocess.CalledProcessError:
            continue
        if declares_primary(source, name, package=_package_of(path)):
            return commit, when
    return None


def _package_of(path: str) -> str | None:
    """The package of a module path under ``src/``: ``src/<pkg>/<sub>/<study>/claims.py`` -> ``<pkg>.<sub>.<study>``."""
    parts = Path(path).with_suffix("").parts
    return ".".join(parts[1:-1]) if parts and parts[0] == "src" else None


def _is_ancestor(repo: Path, ancestor: str, commit: str) -> bool | None:
    try:
        full = _git(repo, "rev-parse", "--verify", f"{commit}^{{commit}}")
    except subprocess.CalledProcessError:
        return None
    done = subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", ancestor, full])
    return done.returncode == 0


def _time(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


def check_run(repo: Path, run_dir: Path) -> Preregistration | None:
    """The preregistration facts of the run in ``run_dir`` (None when its results judge no primary)."""
    results = json.loads((run_dir / "results.json").read_text())
    # a run that does not judge its primary (a companion of other arms, a run before the claim existed)
    # has nothing whose declaration to check
    primaries = [
        c["name"]
        for c in results.get("claims", [])
        if c.get("role") == "primary" and c.get("verdict") not in ("not in this run", "pending re-run")
    ]
    if not primaries:
        return None
    name = primaries[0]
    module = f"src/descentlab/experiments/{results['experiment'].replace('-', '_')}/claims.py"
    provenance_path = run_dir / "provenance.json"
    provenance = json.loads(provenance_path.read_text()) if provenance_path.is_file() else {}
    run_commit, started = provenance.get("commit"), provenance.get("started_at")
    source = provenance.get("source", "provenance.json, written by the run") if provenance else "none"
    declared = first_declaration(repo, module, name)
    if declared is None:
        status: Status = "declared after the run (post hoc)"
        why = f"no commit of {module} declares {name!r} as the primary"
        return Preregistration(name, module, None, None, run_commit, started, source, status, why)
    commit, when = declared
    ancestor = _is_ancestor(repo, commit, run_commit) if run_commit else None
    if started is not None and _time(when) > _time(started):
        status, why = "declared after the run (post hoc)", f"declared {when}, after the run started {started}"
    elif ancestor is False:
        status, why = (
            "declared after the run (post hoc)",
            f"the run's commit {run_commit[:9]} does not contain the declaration {commit[:9]}",
        )
    elif ancestor is True:
        status = "declared before the run"
        why = f"the run's commit {run_commit[:9]} contains the declaration {commit[:9]} ({when})" + (
            f", committed before the run started ({started})" if started else ""
        )
    elif started is not None:
        status, why = "declared before the run", f"declared {when}, before the run started {started}"
    else:
        status, why = "unknown", "the run records neither its commit nor its start time"
    return Preregistration(name, module, commit, when, run_commit, started, source, status, why)


def runs(results_root: Path) -> list[Path]:
    """Every committed run that judges a primary: the studies' main runs and their companions (runs kept
    as history under ``earlier/`` are not checked: their primaries were superseded)."""
    found = []
    for path in sorted(results_root.glob("*/results.json")) + sorted(results_root.glob("*/*/results.json")):
        if "earlier" in path.relative_to(results_root).parts:
            continue
        found.append(path.parent)
    return found


def read(run_dir: Path) -> dict[str, Any] | None:
    """The committed facts of ``run_dir`` (None when it has none)."""
    path = run_dir / FILE
    return json.loads(path.read_text()) if path.is_file() else None


def write_all(results_root: Path, repo: Path) -> list[Path]:
    """Recompute and write every run's ``preregistration.json``; returns the files written."""
    written = []
    for run_dir in runs(results_root):
        facts = check_run(repo, run_dir)
        if facts is None:
            (run_dir / FILE).unlink(missing_ok=True)
            continue
        atomic_write_text(run_dir / FILE, json.dumps(facts.to_dict(), indent=2) + "\n")
        written.append(run_dir / FILE)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m descentlab.report.preregistration docs/results", file=sys.stderr)
        return 2
    root = Path(args[0])
    repo = Path(_git(root, "rev-parse", "--show-toplevel"))
    if not has_history(repo):
        print("preregistration: needs a clone with its full git history", file=sys.stderr)
        return 2
    for path in write_all(root, repo):
        facts = json.loads(path.read_text())
        print(f"{path.parent.relative_to(root)}: {facts['primary']}: {facts['status']} ({facts['why']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
