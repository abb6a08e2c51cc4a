"""The measured wall time of each committed run: its ``provenance.json`` (``wall_seconds``, recorded by every
run since the field exists), else the result page under ``docs/results``.

Each committed run (``docs/results/<study>/`` for the ``full`` preset, ``<study>/<preset>/`` for a
companion run; ``earlier/`` holds History and is skipped) has a ``provenance.json`` whose ``started_at`` is
the run's start, and the study's page ``docs/results/<study>.md`` says when it ran and how long it took, in
words: ``18:22:19–19:09:48 UTC: **47 min 32 s** wall time``. A run's wall time is found on the page by its
start: the first clock range ``HH:MM[:SS]–HH:MM[:SS]`` that begins at ``started_at`` (to the minute); the
duration written in the same paragraph, nearest to that range, is taken (the page's measured figure, e.g.
``/usr/bin/time``), else the range's own length. A run whose page gives no such range is unmeasured.

These times were taken on the reference machine: 2 shared CPU cores, as each page says.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from descentlab.provenance import run_wall_seconds

__all__ = ["WallTime", "default_results_dir", "format_duration", "measured_wall_times", "wall_time_on_page"]

_CLOCK = r"(\d{1,2}):(\d{2})(?::(\d{2}))?"
_RANGE = re.compile(_CLOCK + r"\s*[–-]\s*" + _CLOCK)
_DURATION = re.compile(r"(?:(\d+) h )?(\d+) min(?: (\d+) s)?")


@dataclass(frozen=True)
class WallTime:
    """``seconds`` of one run of ``preset``, started at ``started_at``; ``source``: where it was read."""

    preset: str
    seconds: int
    started_at: str
    source: str


def default_results_dir() -> Path:
    """``docs/results`` of the source tree this package runs from (absent in an installed wheel)."""
    return Path(__file__).resolve().parents[3] / "docs" / "results"


def format_duration(seconds: int) -> str:
    """``2852`` -> ``47 min 32 s``; ``3709`` -> ``1 h 01 min 49 s`` (the pages' own style)."""
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min {secs:02d} s"
    return f"{minutes} min {secs:02d} s"


def _seconds(match: re.Match[str], first: int) -> int:
    h, m, s = match.group(first), match.group(first + 1), match.group(first + 2)
    return int(h) * 3600 + int(m) * 60 + int(s or 0)


def _gap(a: re.Match[str], b: re.Match[str]) -> int:
    """Characters between two matches of one paragraph (0 when they touch)."""
    return max(a.start() - b.end(), b.start() - a.end(), 0)


def wall_time_on_page(page: str, started: datetime) -> tuple[int, int] | None:
    """``(seconds, line number)`` of the run that started at ``started`` (UTC), from the page's text; None
    when the page gives no clock range beginning then."""
    offset = 0
    for paragraph in re.split(r"\n\s*\n", page):
        for match in _RANGE.finditer(paragraph):
            begin = _seconds(match, 1)
            if begin // 60 != started.hour * 60 + started.minute:
                continue
            line = page.count("\n", 0, page.index(paragraph, offset) + match.start()) + 1
            durations = list(_DURATION.finditer(paragraph))
            if durations:
                nearest = min(durations, key=lambda d: _gap(d, match))
                hours, minutes, secs = (int(g or 0) for g in nearest.groups())
                return hours * 3600 + minutes * 60 + secs, line
            return (_seconds(match, 4) - begin) % 86_400, line
        offset = page.index(paragraph, offset) + len(paragraph)
    return None


def _preset(run_dir: Path, study_dir: Path, provenance: dict) -> str:
    argv = provenance.get("argv") or []
    if "--preset" in argv[:-1]:
        return str(argv[argv.index("--preset") + 1])
    return "full" if run_dir == study_dir else run_dir.name


def measured_wall_times(results_dir: Path | str | None = None) -> dict[str, dict[str, WallTime]]:
    """``study -> preset -> WallTime`` for every committed run whose page states its wall time."""
    results_dir = Path(results_dir) if results_dir is not None else default_results_dir()
    out: dict[str, dict[str, WallTime]] = {}
    if not results_dir.is_dir():
        return out
    for page_path in sorted(results_dir.glob("*.md")):
        study_dir = results_dir / page_path.stem
        if not study_dir.is_dir():
            continue
        page = page_path.read_text(encoding="utf-8")
        runs = [study_dir, *(d for d in sorted(study_dir.iterdir()) if d.is_dir() and d.name != "earlier")]
        for run_dir in runs:
            try:
                provenance = json.loads((run_dir / "provenance.json").read_text())
                started = datetime.fromisoformat(provenance["started_at"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            preset = _preset(run_dir, study_dir, provenance)
            recorded = run_wall_seconds(run_dir)
            if recorded is not None:  # the run's own record (provenance.json), preferred to the page's words
                out.setdefault(page_path.stem, {})[preset] = WallTime(
                    preset, round(recorded), provenance["started_at"], f"{run_dir.name}/provenance.json"
                )
                continue
            found = wall_time_on_page(page, started)
            if found is None:
                continue
            seconds, line = found
            out.setdefault(page_path.stem, {})[preset] = WallTime(
                preset, seconds, provenance["started_at"], f"{page_path.name}:{line}"
            )
    return out
