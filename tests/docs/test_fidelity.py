"""Every result page carries its generated "Deviations from the paper" and "Not tested here" sections, and
they are not stale (regenerated from each study's fidelity.py and its presets)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from descentlab.experiments import REGISTRY
from descentlab.experiments.fidelity import COMMAND, declarations, pages, preset_configs
from descentlab.report.fidelity import (
    BEGIN,
    END,
    Deviation,
    Fidelity,
    NotTested,
    extract,
    lagrangian,
    place,
    render,
)

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
STUDIES = sorted(p.stem for p in RESULTS.glob("*.md") if p.stem != "README")


def test_every_committed_page_is_up_to_date() -> None:
    stale = [p.name for p, text in pages(RESULTS).items() if p.read_text() != text]
    assert stale == [], f"stale fidelity sections in {stale}: run `{COMMAND}`"


@pytest.mark.parametrize("study", STUDIES)
def test_every_page_declares_its_deviations_before_its_history(study: str) -> None:
    assert study in REGISTRY
    fidelity = declarations(study)
    assert fidelity is not None and fidelity.deviations, f"{study} declares no fidelity.py FIDELITY"
    page = (RESULTS / f"{study}.md").read_text()
    section = extract(page)
    assert (
        section is not None and "## Deviations from the paper" in section and "## Not tested here" in section
    )
    history = page.find("\n## History")
    assert history == -1 or page.find(BEGIN) < history, "the section goes just before History"
    for item in fidelity.not_tested:
        assert item.claim and item.reason and item.would_test


def test_the_preset_column_is_computed_from_the_config() -> None:
    # text-robustness: full runs MiniLM, paper RoBERTa; the table reads each from the resolved config
    configs = preset_configs("text-robustness")
    assert list(configs) == ["full", "paper"]
    text = render(declarations("text-robustness"), configs)
    row = next(line for line in text.splitlines() if line.startswith("| model |"))
    assert f"| {configs['full'].model}," in row and f"| {configs['paper'].model}," in row
    configs["full"].model = "distilbert-base"
    changed = render(declarations("text-robustness"), configs)
    assert "| distilbert-base," in changed and changed != text


@dataclass
class _Constraint:
    form: str = "difference"
    detach_prev: bool = False
    constrain_first: bool = True
    layers: list[int] | None = None
    resilient: bool = False
    penalty: float = 1.0
    max_multiplier: float | None = None


def test_the_lagrangian_says_when_it_is_the_papers_form() -> None:
    assert lagrangian(_Constraint()).endswith("as the paper writes it")
    assert lagrangian(_Constraint(detach_prev=True)).endswith("not the paper's form as written")
    assert lagrangian(_Constraint(form="ratio")).endswith("not the paper's form as written")
    assert "layer 1 unconstrained" in lagrangian(_Constraint(constrain_first=False))
    assert lagrangian(None) == "no constraint"


def test_place_inserts_before_history_then_replaces_in_place() -> None:
    fid = Fidelity(
        [Deviation("model", "big | model", lambda c: c["model"], "Table 1")], [NotTested("q", "r", "w")]
    )
    page = "# study\n\n## Verdict\n\ntext\n\n## History\n\nold\n"
    first = place(page, render(fid, {"full": {"model": "small"}}))
    assert first.index(BEGIN) < first.index("## History") and first.count(BEGIN) == 1
    assert "big \\| model (Table 1)" in first and "| small |" in first  # a pipe cannot split a cell
    assert "“q”. *Why not here:* r *What would test it:* w" in first
    second = place(first, render(fid, {"full": {"model": "tiny"}}))
    assert (
        second.count(BEGIN) == 1 and second.count(END) == 1 and "| tiny |" in second and "small" not in second
    )
    assert second.replace(extract(second), "") == first.replace(extract(first), "")  # nothing else changed
    assert place(second, extract(second)) == second
    no_history = place("# study\n\ntext\n", render(fid, {"full": {"model": "x"}}))
    assert no_history.startswith("# study\n\ntext\n\n" + BEGIN) and no_history.endswith(END + "\n")
