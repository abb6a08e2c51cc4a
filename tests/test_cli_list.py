"""`descentlab list`: each study's presets with the wall time its committed result page states."""

from __future__ import annotations

import json
import re
from datetime import datetime

import pytest

from descentlab.cli import main
from descentlab.report import wall_times
from descentlab.report.wall_times import (
    default_results_dir,
    format_duration,
    measured_wall_times,
    wall_time_on_page,
)

RESULTS = default_results_dir()
CLOCK = r"(\d{1,2}):(\d{2})(?::(\d{2}))?"


def _committed_runs() -> list[tuple[str, str]]:
    """(study, run folder) of every committed run with a provenance.json (History's earlier/ aside)."""
    runs = []
    for page in sorted(RESULTS.glob("*.md")):
        study = RESULTS / page.stem
        for run in [study, *(d for d in sorted(study.glob("*")) if d.is_dir() and d.name != "earlier")]:
            if (run / "provenance.json").is_file():
                runs.append((page.stem, run.name))
    return runs


@pytest.mark.skipif(not RESULTS.is_dir(), reason="no docs/results in this tree")
def test_every_committed_run_gets_the_wall_time_its_page_states() -> None:
    measured = measured_wall_times()
    runs = _committed_runs()
    assert len(runs) >= 7
    assert sum(len(v) for v in measured.values()) == len(runs), (runs, measured)
    for study, presets in measured.items():
        for preset, wall in presets.items():
            if wall.source.endswith("provenance.json"):  # recorded by the run: the page must agree with it
                on_page = wall_time_on_page(
                    (RESULTS / f"{study}.md").read_text(), datetime.fromisoformat(wall.started_at)
                )
                assert on_page is not None and abs(on_page[0] - wall.seconds) <= 60, (study, preset, wall)
                continue
            page, line = wall.source.rsplit(":", 1)
            text = (RESULTS / page).read_text().splitlines()[int(line) - 1]
            start = datetime.fromisoformat(wall.started_at)
            match = re.search(rf"{start:%H:%M}(?::\d\d)?\s*[–-]\s*{CLOCK}", text)
            assert match is not None, (study, preset, text)
            # the page's two figures agree: its stated duration and its clock range (a minute's rounding)
            end = int(match.group(1)) * 3600 + int(match.group(2)) * 60 + int(match.group(3) or 0)
            begin = start.hour * 3600 + start.minute * 60 + (start.second if match.group(3) else 0)
            assert abs((end - begin) % 86_400 - wall.seconds) <= 60, (study, preset, wall, text)
            assert 60 <= wall.seconds <= 4 * 3600


def test_a_page_is_read_by_the_runs_start() -> None:
    started = datetime.fromisoformat("2026-12-01T23:33:34+00:00")
    page = (
        "## Command\n\nThe pilot took 4 min 27 s at 21:00–21:05.\n\n"
        "> One run, 1–2 December, 23:33:34–00:20:11 UTC, at commit c8a5a29.\n\n"
        "- **Wall time: 46 min 37 s**, elsewhere.\n"
    )
    assert wall_time_on_page(page, started) == (46 * 60 + 37, 5)  # across midnight, from the range
    page = "x\n\nOne run, **1 h 01 min 49 s**, 23:33:34–00:35:30 UTC; 5 min 04 s per job.\n"
    assert wall_time_on_page(page, started) == (3709, 3)  # the stated duration nearest the range
    assert wall_time_on_page("23:34–23:50 and 22:33–23:00", started) is None
    assert format_duration(3709) == "1 h 01 min 49 s" and format_duration(2852) == "47 min 32 s"


def test_list_shows_each_preset_with_its_measured_wall_time_or_unmeasured(capsys) -> None:
    from descentlab.experiments import available, get

    measured = measured_wall_times()
    assert main(["list"]) == 0
    lines = dict(line.split(maxsplit=1) for line in capsys.readouterr().out.strip().splitlines())
    assert list(lines) == available()
    for name, line in lines.items():
        for preset in get(name).presets:
            wall = measured.get(name, {}).get(preset)
            expected = format_duration(wall.seconds) if wall else "unmeasured"
            assert re.search(rf"[ ,]{re.escape(preset)} {expected}[,\]]", line), (preset, expected, line)
    if RESULTS.is_dir():
        assert "full unmeasured" not in lines["implicit-bias"]
        assert "metrics.csv" in lines["implicit-bias"] and "arrays/" in lines["implicit-bias"]
    assert "quick unmeasured, full unmeasured" in lines["smoke"]


def test_without_result_pages_every_preset_is_unmeasured(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(wall_times, "default_results_dir", lambda: tmp_path)
    assert measured_wall_times() == {}
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert re.findall(r"\d+ min \d+ s", out) == [] and out.count("unmeasured") >= 8


def test_a_run_without_its_time_on_the_page_stays_unmeasured(tmp_path) -> None:
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "provenance.json").write_text(json.dumps({"started_at": "2026-12-02T09:08:51+00:00"}))
    (tmp_path / "toy.md").write_text("## Command\n\nIt ran on 2 December (no clock times given).\n")
    assert measured_wall_times(tmp_path) == {}
    (tmp_path / "toy.md").write_text("## Command\n\n**One run, 50 min 10 s**, 09:08:51–09:59:01 UTC.\n")
    (tmp_path / "toy" / "full-x").mkdir()  # a companion without a provenance.json: not a measured run
    got = measured_wall_times(tmp_path)
    assert (
        list(got) == ["toy"]
        and got["toy"]["full"].seconds == 3010
        and got["toy"]["full"].source == "toy.md:3"
    )
