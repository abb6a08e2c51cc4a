"""Fidelity to the paper: what a study's presets change from the paper's setting, and what it does not test.

Each study declares, once, in ``experiments/<study>/fidelity.py``:

* ``DEVIATIONS``: a list of :class:`Deviation`, one setting each (model, data, judge, tolerance, Lagrangian
  form, steps, prunable set, sparsity, seeds, ...). The paper's column is text; the preset's column is a
  function of the resolved config, so it cannot drift from what the preset runs.
* ``NOT_TESTED``: a list of :class:`NotTested`, the paper's claims that no row of the study judges, each
  with the reason and what would test it.

This module renders both into a Markdown section and places it in a page between two HTML-comment markers,
just before the page's "History" section (or at its end). It knows no study: the caller (the experiment
layer, the experiments package's ``fidelity`` module) resolves the presets and passes the declarations in, because
report/ never imports experiments/ (tests/test_layering.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from descentlab.report.tables import markdown_table

BEGIN = "<!-- fidelity:begin -->"
END = "<!-- fidelity:end -->"
HEADING = "## Deviations from the paper"
NOT_TESTED_HEADING = "## Not tested here"


@dataclass(frozen=True)
class Deviation:
    """One setting where a preset may differ from the paper.

    Attributes:
        setting: what is compared (e.g. "model", "Lagrangian").
        paper: what the paper uses or says, in words; "not stated" where it says nothing.
        preset: the resolved config -> what the preset uses, in words (computed, never typed).
        source: where the paper states it (a section or result); "" where the paper states nothing.
    """

    setting: str
    paper: str
    preset: Callable[[Any], str]
    source: str = ""


@dataclass(frozen=True)
class NotTested:
    """A claim of the paper that no row of the study judges.

    Attributes:
        claim: the claim, quoted from the paper (its words, translated where the paper's text we hold is not
            in English).
        reason: why this study does not judge it.
        would_test: what run or row would judge it.
        source: where the paper makes the claim.
    """

    claim: str
    reason: str
    would_test: str
    source: str = ""


@dataclass(frozen=True)
class Fidelity:
    """A study's declarations: its deviations and the claims it does not test."""

    deviations: Sequence[Deviation] = field(default_factory=list)
    not_tested: Sequence[NotTested] = field(default_factory=list)


def _cell(text: str) -> str:
    # a pipe inside a cell would split the Markdown row
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(fidelity: Fidelity, configs: Mapping[str, Any], command: str = "") -> str:
    """The generated section (markers included). ``configs``: preset name -> its resolved config, in the
    order of the table's columns (``full`` first)."""
    presets = list(configs)
    columns = ["setting", "paper", *[f"this preset ({name})" for name in presets]]
    rows = [
        [
            _cell(d.setting),
            _cell(d.paper + (f" ({d.source})" if d.source else "")),
            *[_cell(d.preset(configs[name])) for name in presets],
        ]
        for d in fidelity.deviations
    ]
    lines = [
        BEGIN,
        "<!-- generated from the study's FIDELITY (claims.py) and its presets"
        + (f" by `{command}`" if command else "")
        + "; do not edit by hand -->",
        "",
        HEADING,
        "",
        "Each preset column is computed from the preset's resolved config; the paper column says what the "
        'paper states ("not stated" where it says nothing).',
        "",
        markdown_table(columns, rows) if rows else "No deviation declared.",
        "",
        NOT_TESTED_HEADING,
        "",
    ]
    if fidelity.not_tested:
        for item in fidelity.not_tested:
            where = f" ({item.source})" if item.source else ""
            lines.append(
                f"- “{item.claim}”{where}. *Why not here:* {item.reason} *What would test it:* "
                f"{item.would_test}"
            )
    else:
        lines.append("Every claim of the paper in this study's scope has a row.")
    lines += ["", END]
    return "\n".join(lines)


_SECTION = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.DOTALL)
_HISTORY = re.compile(r"^## History\b.*$", re.MULTILINE)


def place(page: str, section: str) -> str:
    """``page`` with ``section`` between the markers: replaced where the markers are, else inserted just
    before the "## History" heading, else appended. Nothing else of the page changes."""
    if _SECTION.search(page):
        # a function replacement, so backslashes in the section are not read as group references
        return _SECTION.sub(lambda _: section, page, count=1)
    history = _HISTORY.search(page)
    if history is not None:
        return page[: history.start()] + section + "\n\n" + page[history.start() :]
    return page.rstrip("\n") + "\n\n" + section + "\n"


def extract(page: str) -> str | None:
    """The generated section of ``page`` (markers included), None when it has none."""
    match = _SECTION.search(page)
    return match.group(0) if match else None


# --- formatters the studies share (the presets' constraint configs are read by attribute) -----------------


def lagrangian(constraint: Any) -> str:
    """How a constraint config's Lagrangian differs from the paper's f_L + Σ_{l=1..L} λ_l (f_l − (1 − α_l)
    f_{l−1}), every layer, nothing detached (None: no constraint)."""
    if constraint is None:
        return "no constraint"
    prev = "sg(f_{l−1})" if constraint.detach_prev else "f_{l−1}"
    term = f"f_l / {prev} − (1 − α_l)" if constraint.form == "ratio" else f"f_l − (1 − α_l) {prev}"
    if constraint.layers is not None:
        layers = "layers " + ", ".join(str(x) for x in constraint.layers)
    elif constraint.constrain_first:
        layers = "l = 1..L"
    else:
        layers = "l = 2..L (layer 1 unconstrained)"
    parts = [f"f_L + Σ λ_l ({term}), {layers}"]
    if constraint.detach_prev:
        parts.append("f_{l−1} detached (sg)")
    if constraint.form == "ratio":
        parts.append("ratio form")
    if constraint.resilient:
        parts.append(f"resilient (slack penalty {constraint.penalty:g})")
    if constraint.max_multiplier is not None:
        parts.append(f"stops if a λ exceeds {constraint.max_multiplier:g}")
    exact = (
        constraint.form == "difference"
        and not constraint.detach_prev
        and constraint.constrain_first
        and constraint.layers is None
    )
    parts.append("as the paper writes it" if exact else "not the paper's form as written")
    return "; ".join(parts)


def seeds(values: Sequence[int], tune_seed: int | None = None) -> str:
    """``n seeds (a–b)``, plus the tuning seed when there is one."""
    values = list(values)
    span = f"{values[0]}–{values[-1]}" if len(values) > 1 else f"{values[0]}"
    text = f"{len(values)} evaluation seed{'s' if len(values) != 1 else ''} ({span})"
    return text + (f", tuning seed {tune_seed}" if tune_seed is not None else "")


def percent(values: Sequence[float]) -> str:
    """Sparsities as ``70 / 80 / 90 %``."""
    return " / ".join(f"{100 * v:g}" for v in values) + " %"
