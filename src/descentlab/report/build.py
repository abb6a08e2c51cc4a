"""``report.md`` for one run, and one combined report over several runs.

The report is a pure function of ``results.json`` and the training curves in ``metrics.csv``:
``descentlab report RUN_DIR`` rebuilds it at any time. Tables are also written as CSV under ``tables/`` for
people who want to re-plot.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from descentlab.errors import ConfigError
from descentlab.io import atomic_write_text
from descentlab.provenance import describe_code
from descentlab.report.claims import Claim, claim_notes, claims_table, engine_rows, verdict_tally
from descentlab.report.curves import plot_training_curves
from descentlab.report.figures import plot_curves, plot_layer_loss
from descentlab.report.tables import (
    csv_table,
    curve_names,
    curve_table,
    layer_loss_table,
    markdown_table,
    metrics_table,
)


def load_results(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / "results.json"
    if not Path(run_dir).is_dir():
        raise ConfigError(
            f"{run_dir} is not a directory; pass the run directory that `descentlab run` printed"
        )
    if not path.is_file():
        raise ConfigError(f"{run_dir} has no results.json (the run did not finish); nothing to report")
    return json.loads(path.read_text())


FigureFunction = Callable[[dict[str, Any], Path], list[dict[str, Any]]]


def judged_claims(results: dict[str, Any]) -> list[Claim]:
    """The claims engine's rows of a ``results.json`` (rows written before the engine are not its rows)."""
    return engine_rows(results.get("claims", [])) or []


# presets sized to show an effect: full, paper, and a study's declared companion runs (full-<name>); a
# search (moonshot-search*) trains on tuning seeds to choose, not to judge; every other preset is a smoke run
EVIDENCE_PRESETS = ("full", "paper")
SMOKE_BANNER = (
    "> **A smoke run, not evidence.** The `{preset}` preset checks that the pipeline runs end to end; its "
    "seeds and steps are too few for its verdicts to mean anything. Verdicts come from the `full` preset."
)
SEARCH_BANNER = (
    "> **A search, not evidence.** The `{preset}` preset trains on tuning seeds to choose a setting by the "
    "rule declared in its config; its verdicts judge nothing. A setting it finds is judged on fresh seeds."
)


def preset_banner(preset: str | None) -> str | None:
    """The banner a report of ``preset`` opens with: None for a run sized to show an effect."""
    preset = preset or "default"
    if preset in EVIDENCE_PRESETS or preset.startswith("full-"):
        return None
    return (SEARCH_BANNER if preset.startswith("moonshot-search") else SMOKE_BANNER).format(preset=preset)


def _section(
    results: dict[str, Any],
    run_dir: Path,
    heading: str,
    link_prefix: str = "",
    figures_fn: FigureFunction | None = None,
) -> list[str]:
    """Markdown lines for one run; figures are made in the run directory, linked relative to the report."""
    methods = results.get("methods", {})
    name = results.get("experiment", run_dir.name)
    lines = [f"{heading} {name}", ""]
    config = run_dir / "config.json"  # written by the runner; a folder without it is not a run of ours
    preset = json.loads(config.read_text()).get("preset") if config.is_file() else "full"
    banner = preset_banner(preset)
    if banner is not None:
        lines += [banner, ""]
    code = describe_code(run_dir)  # which commit, and whether the tree was dirty (provenance.json)
    if code is not None:
        lines += [code, ""]
    claims = judged_claims(results)
    primary = [c for c in claims if c.role == "primary"]
    if primary:
        lines += [f"**Primary endpoint.** {claim_notes(primary)[0]}", ""]
    if claims:
        lines += [
            f"**All {len(claims)} claim rows** (secondary rows Holm-adjusted, controls unadjusted): "
            f"{verdict_tally(claims)}. "
            "The claims table below gives each row's interval and the smallest effect it could detect.",
            "",
        ]
    summary_figure_at = len(lines)  # the study's headline figure goes here once it is drawn
    if results.get("protocol"):
        lines += ["**Protocol**", "", *(f"- {k}: {v}" for k, v in results["protocol"].items()), ""]
    tables_dir = run_dir / "tables"
    tables_dir.mkdir(exist_ok=True)

    def table(title: str, columns: list[str], rows: list[list[Any]], slug: str) -> None:
        if not rows:
            return
        atomic_write_text(tables_dir / f"{slug}.csv", csv_table(columns, rows))
        lines.extend([f"**{title}**", "", markdown_table(columns, rows), ""])

    if claims:
        t = claims_table(claims)
        table(t["title"], t["columns"], t["rows"], "claims")
    table("Metrics", *metrics_table(methods), "metrics")
    for curve in curve_names(methods):
        columns, rows, caption = curve_table(methods, curve)
        table(f"{curve}: {caption}", columns, rows, f"curve-{curve.replace('@', '-')}")
    table("Loss read out at each layer (test set)", *layer_loss_table(methods), "layer-loss")
    sparsity_rows = [
        [m, *[f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in b["sparsity"].items()]]
        for m, b in methods.items()
        if b.get("sparsity")
    ]
    if sparsity_rows:
        width = max(len(r) for r in sparsity_rows)
        table(
            "Sparsity",
            ["method", *[""] * (width - 1)],
            [r + [""] * (width - len(r)) for r in sparsity_rows],
            "sparsity",
        )
    for i, extra in enumerate(results.get("tables", [])):
        table(extra["title"], list(extra["columns"]), [list(r) for r in extra["rows"]], f"extra-{i}")

    figures: list[tuple[str, str]] = []
    (run_dir / "figures").mkdir(exist_ok=True)
    if plot_curves(methods, run_dir / "figures" / "curves.png", title=name):
        figures.append(("figures/curves.png", "Metric against perturbation level or sparsity, mean ± std"))
    if plot_layer_loss(methods, run_dir / "figures" / "layer-loss.png", title=name):
        figures.append(("figures/layer-loss.png", "Loss read out at each layer"))
    training = plot_training_curves(run_dir, title=name)  # from metrics.csv, when the run logged curves
    if training is not None:
        figures.append(training)
    # figures the run wrote itself, then those the experiment's figure module (re)draws from saved data
    own = figures_fn(results, run_dir) if figures_fn is not None else []
    generic = len(figures)
    for f in [*results.get("figures", []), *own]:
        if f["path"] not in (p for p, _ in figures):
            figures.append((f["path"], f.get("caption", "")))
    if figures:  # the study's first own figure leads the report, else the generic curves
        path, caption = figures.pop(generic if len(figures) > generic else 0)
        lines[summary_figure_at:summary_figure_at] = [
            f"![{caption}]({link_prefix}{path})",
            f"*{caption}*",
            "",
        ]
    for path, caption in figures:
        lines.extend([f"![{caption}]({link_prefix}{path})", f"*{caption}*", ""])
    notes = [*results.get("notes", []), *claim_notes(claims)]
    lines.extend(f"- {note}" for note in notes)
    if notes:
        lines.append("")
    return lines


def write_report(run_dir: Path | str, *, figures: FigureFunction | None = None) -> Path:
    """(Re)build ``<run_dir>/report.md`` from its ``results.json``; ``figures(results, run_dir)`` draws the
    study's own figures from saved data (the app layer passes the study's ``figures.figures``)."""
    run_dir = Path(run_dir)
    results = load_results(run_dir)
    lines = _section(results, run_dir, "#", figures_fn=figures)
    lines += [
        "",
        "Resolved config: `config.yaml`. Raw numbers: `results.json`. Training log: `metrics.jsonl`; its "
        "curves: `metrics.csv` (and `tensorboard --logdir tensorboard` when event files were written). "
        "Provenance (commit, packages, hardware, argv): `provenance.json`.",
        "",
    ]
    path = run_dir / "report.md"
    atomic_write_text(path, "\n".join(lines))
    return path


def write_combined_report(
    path: Path | str,
    run_dirs: Sequence[Path],
    title: str = "descentlab report",
    figures: Callable[[str], FigureFunction | None] | None = None,
) -> Path:
    """One Markdown file gathering several runs' sections, with figure links relative to it."""
    path = Path(path)
    lines = [f"# {title}", ""]
    for run_dir in run_dirs:
        run_dir = Path(run_dir)
        # relative links keep the report readable when the runs folder is moved or shared
        prefix = os.path.relpath(run_dir.resolve(), path.parent.resolve()) + "/"
        results = load_results(run_dir)
        own = figures(str(results.get("experiment", ""))) if figures is not None else None
        lines += _section(results, run_dir, "##", link_prefix=prefix, figures_fn=own)
        lines += [f"Run directory: `{run_dir}`", ""]
    atomic_write_text(path, "\n".join(lines))
    return path
