"""The "Deviations from the paper" and "Not tested here" sections of every result page, generated.

Each study declares its deviations and untested claims once, in ``experiments/<study>/claims.py``
(``FIDELITY``, a :class:`~descentlab.report.fidelity.Fidelity`); this module resolves the study's presets
(``full``, and ``paper`` where the study has one), renders the section with
:func:`descentlab.report.fidelity.render` and writes it into ``docs/results/<study>.md`` between the
fidelity markers. The lookup lives here, on the experiment side, because report/ never imports
experiments/ (tests/test_layering.py). A test regenerates every page and fails when one is stale::

    python -m descentlab.experiments.fidelity docs/results
"""

from __future__ import annotations

import sys
from pathlib import Path

from descentlab.config import resolve_config
from descentlab.experiments import REGISTRY, get
from descentlab.io import atomic_write_text
from descentlab.report.fidelity import Fidelity, place, render

COMMAND = "python -m descentlab.experiments.fidelity docs/results"
# the columns of the deviations table, in order, where the study has the preset
COLUMNS = ("full", "paper")


def declarations(name: str) -> Fidelity | None:
    """The study's ``FIDELITY`` (None when it declares none, e.g. the smoke study)."""
    return get(name).declared("FIDELITY", "claims")  # a one-file study declares none


def preset_configs(name: str) -> dict[str, object]:
    """Preset name -> resolved config, for the presets of ``COLUMNS`` the study has."""
    exp = get(name)
    presets = exp.presets
    return {p: resolve_config(exp.config_cls, preset=p, presets=presets) for p in COLUMNS if p in presets}


def section(name: str) -> str | None:
    """The generated section of study ``name`` (None when it declares no fidelity)."""
    fidelity = declarations(name)
    if fidelity is None:
        return None
    return render(fidelity, preset_configs(name), command=COMMAND)


def pages(results_dir: Path | str) -> dict[Path, str]:
    """Every result page of a study with declarations -> its text with the section regenerated."""
    results_dir = Path(results_dir)
    out = {}
    for name in REGISTRY:
        page = results_dir / f"{name}.md"
        if not page.is_file():
            continue
        text = section(name)
        if text is not None:
            out[page] = place(page.read_text(), text)
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    results_dir = Path(args[0] if args else "docs/results")
    for page, text in pages(results_dir).items():
        if page.read_text() != text:
            atomic_write_text(page, text)
        print(page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
