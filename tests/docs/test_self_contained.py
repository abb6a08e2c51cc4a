"""The repository's docs and docstrings stand alone: no references to notes that are not in the repository.

README.md, docs/, src/ and examples/ may cite a file of the repository, a paper (by its arXiv id) or state
the fact itself, never a METHODS.md / DESIGN.md section or an issue-tracker number.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCOPE = ("README.md", "docs", "src", "examples")
SUFFIXES = {".md", ".py", ".json", ".yaml", ".yml", ".toml", ".txt", ".cff", ".c", ".rst"}
# "METHODS.md", "METHODS §2.3", "DESIGN.md", "issue 18", "Issue #14"; not the identifier METHODS = (...)
OUTSIDE = re.compile(r"\b(?:METHODS|DESIGN)(?:\.md\b|\s*§)|\b[Ii]ssues?\s*#?\d+")


def _files() -> list[Path]:
    out: list[Path] = []
    for name in SCOPE:
        path = ROOT / name
        if path.is_file():
            out.append(path)
        elif path.is_dir():
            out.extend(p for p in sorted(path.rglob("*")) if p.is_file() and p.suffix in SUFFIXES)
    return out


def _hits(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    return [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}"
        for n, line in enumerate(text.splitlines(), 1)
        if OUTSIDE.search(line)
    ]


def test_the_pattern_catches_what_it_should() -> None:
    for bad in ("see METHODS.md §1.4", "(METHODS §2.3)", "the shape of DESIGN.md", "issue 18", "Issue #14"):
        assert OUTSIDE.search(bad), bad
    for fine in ("METHODS = GEOMETRIES", "docs/methods.md", "CONSTRAINED_METHODS", "issues are welcome"):
        assert not OUTSIDE.search(fine), fine


def test_docs_and_sources_cite_nothing_outside_the_repository() -> None:
    files = _files()
    assert any(p.name == "README.md" for p in files) and any(p.suffix == ".py" for p in files)
    hits = [h for p in files for h in _hits(p)]
    assert not hits, "cite a repository file, a paper (arXiv id) or state the fact:\n" + "\n".join(hits)


def test_methods_page_is_linked_and_cites_both_papers() -> None:
    methods = (ROOT / "docs" / "methods.md").read_text(encoding="utf-8")
    assert "(docs/methods.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
    assert "arXiv 2601.17257" in methods and "arXiv 2605.21104" in methods
    # every repository path it names exists (relative to the root, src/descentlab or a named package)
    named = set(re.findall(r"`((?:[\w-]+/)*[\w-]+\.(?:py|md))`", methods))
    packages = [ROOT, ROOT / "src" / "descentlab"] + [
        p for p in (ROOT / "src" / "descentlab").iterdir() if p.is_dir()
    ]
    missing = sorted(n for n in named if not any((base / n).is_file() for base in packages))
    assert not missing, f"docs/methods.md names files that do not exist: {missing}"
