"""docs/paper-scale.md is generated from the ``paper`` presets: the committed page must be what the presets
give today, and every package a preset needs must be in the ``paper`` extra of pyproject.toml."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from descentlab.experiments import paper_scale

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "paper-scale.md"


def paper_extra() -> set[str]:
    """The distribution names of pyproject's ``paper`` extra."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["paper"]
    return {re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].lower() for req in extra}


def test_the_committed_page_is_what_the_presets_generate(tmp_path) -> None:
    assert PAGE.read_text() == paper_scale.render(), (
        "docs/paper-scale.md is stale: python -m descentlab.experiments.paper_scale docs/paper-scale.md"
    )
    # --check says so too, and writes nothing
    stale = tmp_path / "paper-scale.md"
    stale.write_text(PAGE.read_text().replace("(5)", "(1)"))
    assert paper_scale.main([str(stale), "--check"]) == 1 and "(1)" in stale.read_text()
    assert paper_scale.main([str(stale)]) == 0 and paper_scale.main([str(stale), "--check"]) == 0


def test_the_page_reads_each_preset() -> None:
    # one value of each study's section, from its config, so a section cannot show another study's preset
    for study in paper_scale.STUDIES:
        cfg = paper_scale.paper_config(study)
        part = paper_scale.section(study)
        assert part.startswith(f"## {study}\n")
        assert f"| evaluation seeds | {cfg.seeds} ({len(cfg.seeds)}) |" in part
        assert f"| tuning seed | {cfg.tune_seed} " in part and cfg.tune_seed not in cfg.seeds
        assert all(f"`{m}`" in part for m in cfg.methods)


@pytest.mark.parametrize("study", paper_scale.STUDIES)
def test_every_package_a_paper_preset_needs_is_in_the_paper_extra(study: str) -> None:
    wanted = paper_scale.needs(study, paper_scale.paper_config(study))
    assert {name.lower() for name in wanted} <= paper_extra(), (study, wanted)
