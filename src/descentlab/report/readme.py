"""``docs/results/README.md``: every committed study's verdicts, generated from its ``results.json``.

The page is a pure function of the committed files (``<study>/results.json`` for every ``<study>.md`` page,
and ``coverage.json``), so a test regenerates it and fails when the committed page is stale:

    python -m descentlab.report.readme docs/results      # rewrite docs/results/README.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from descentlab.io import atomic_write_text
from descentlab.report.claims import PENDING, Claim, claims_table, engine_rows, verdict_tally
from descentlab.report.preregistration import read as read_preregistration
from descentlab.report.tables import markdown_table

HOW_TO_READ = """\
## How to read a verdict

- **The unit of replication is the training seed.** A row's interval is the seed-level 95 % interval of
  a − b (`descentlab.report.stats.paired_interval`): seeds and test examples are crossed, and the
  interval carries the variance between training runs as well as the variance between examples.
- **Four verdicts, exclusive and monotone.**
  - *reproduced*: the interval lies beyond 0 on the claimed side and does not exclude the smallest effect
    of interest (a sized claim: beyond the claimed size; parity: the 90 % interval lies inside the margin,
    an equivalence test);
  - *refuted*: the interval excludes every effect of interest (short of the declared smallest effect of
    interest on the claimed side; a sized claim: short of the size; parity: wholly outside the margin);
  - *negligible*: a directional claim whose interval lies wholly between 0 and its smallest effect of
    interest: the direction holds, and the size is below interest;
  - *inconclusive*: none of these; the details column says about how many seeds a run like it would need
    (a plug-in figure from the run's own variance, then the sizing rule's figure from the 80 % upper bound
    of its seed standard deviation), and the MDE column the smallest effect the run detects with 80 % power;
  - *underpowered here*: an inconclusive row whose design could not have decided it: its MDE exceeds the
    smallest effect of interest (a parity row: its equivalence MDE exceeds the margin). It is not evidence
    either way; the sizing table below says what would decide it and what that costs on this machine.

  Widening an interval (Holm's adjustment, a higher level) only moves a verdict toward less information
  (negligible to reproduced, refuted or inconclusive; reproduced or refuted to inconclusive), never to its
  opposite; property-based tests hold the engine to that.
- **Rows that are not judged.** *one seed: a smoke run, not judged* (training variance not measured);
  *degenerate: identical seeds* (a zero-width interval carries no evidence); *untestable here* (the
  reference already has the property, the statistic sits at its bound, or the protocol cannot move it; the
  row says why); *pending re-run* (the run did not save the arrays the claim needs); *not in this run* (the
  run's design lacks an arm, a sparsity or a tuning round the claim compares, and names it).
- **A diverged run is a result.** A non-finite cell counts against the arm that produced it (it takes the
  row's worst finite value) and the row says "diverged on k of S seeds".
- **Primary, secondary, control, exploratory.** Each study has one primary endpoint, judged at α = 0.05.
  The verdict column is the one to quote: Holm-adjusted over the study's secondary rows for a secondary
  row, whose unadjusted verdict is in the details column. Controls (positive controls, null controls, the
  simple baselines a person of the field tries first) are judged unadjusted: they show whether the run
  could see an effect. An *exploratory* row tests something outside the paper's stated scope (it quotes
  the scope): its verdict reads "holds here" or "does not hold here", and it never refutes the paper.
- **Declared before the run is checked, not asserted.** For each run's primary, the first commit of the
  study's claims module that declares it, and the commit and start time of the run
  (`<run>/provenance.json`), are compared (`python -m descentlab.report.preregistration docs/results`
  writes `<run>/preregistration.json`). A primary declared after its run reads *post hoc*.
"""

#: Which paper each study tests; robust-sparse tests a hypothesis neither paper states.
PAPERS = {
    "HORST (composing optimizer geometries for sparse transformers)": (
        "implicit-bias",
        "sparse-lm",
        "sparse-vit",
    ),
    "Constrained learning of unrolled transformers (layer-wise descent constraints)": (
        "text-robustness",
        "video-denoising",
        "llm-robustness",
    ),
    "Neither paper: constrained robustness of a pruned model (this project's hypothesis)": ("robust-sparse",),
}


def _interval(c: Claim) -> str:
    if c.estimate is None or c.low is None or c.high is None:
        return ""
    return f"{c.estimate:+.4g} [{c.low:+.4g}, {c.high:+.4g}]"


def _preregistered(run_dir: Path) -> str:
    facts = read_preregistration(run_dir)
    if facts is None:
        return ""
    if facts["status"] == "declared before the run":
        return "declared before the run"
    return (
        "post hoc: declared after the run"
        if facts["status"].endswith("(post hoc)")
        else "declaration unchecked"
    )


def _primary_sentence(run_dir: Path, results: dict[str, Any], label: str) -> str | None:
    """One plain sentence of a run's primary, or None when the run does not judge it (a companion run
    of other arms says so on its page)."""
    claims = engine_rows(results.get("claims", [])) or []
    primary = next((c for c in claims if c.role == "primary"), None)
    if primary is None or primary.estimate is None:
        return None
    model = (results.get("protocol") or {}).get("model")
    scale = f"{model}, " if isinstance(model, str) and model else ""
    where = f" ({primary.at})" if primary.at else ""
    prereg = _preregistered(run_dir)
    verdict = f"{primary.label}, {prereg}" if prereg.startswith("post hoc") else primary.label
    return (
        f"{label} ({scale}{primary.seeds} seeds): {primary.description}{where}: **{verdict}**, "
        f"{primary.method} − {primary.reference} = {_interval(primary)} in {primary.metric}."
    )


def bottom_line(results_dir: Path) -> list[str]:
    """The index's opening: per paper, one plain sentence per study from its primary (and its declared
    companion runs), then how its controls fared. Every number comes from the committed rows."""
    lines = [
        "## Bottom line",
        "",
        "Every study here runs far below the papers' scale (2 CPU cores); read each verdict as what holds at "
        "the scale named in its sentence.",
        "",
    ]
    for paper, studies in PAPERS.items():
        sentences: list[str] = []
        controls: list[Claim] = []
        for study in studies:
            body = results_dir / study / "results.json"
            if not body.is_file():
                continue
            results = json.loads(body.read_text())
            sentence = _primary_sentence(body.parent, results, f"`{study}`")
            if sentence:
                sentences.append(sentence)
            rows = engine_rows(results.get("claims", [])) or []
            controls += [c for c in rows if c.role == "control"]
            sentences += [
                f"`{study}`, exploratory ({c.reason.split('; here: ')[0]}): {c.description}"
                f"{f' ({c.at})' if c.at else ''}: **{c.label.removeprefix('exploratory: ')}**, "
                f"{c.method} − {c.reference} = {_interval(c)}."
                for c in rows
                if c.role == "exploratory" and c.estimate is not None and c.low is not None
            ]
            for companion in companion_runs(results_dir / study):
                extra = _primary_sentence(
                    companion.parent,
                    json.loads(companion.read_text()),
                    f"its companion run `{companion.parent.name}`",
                )
                if extra:
                    sentences.append(extra)
        if not sentences:
            continue
        judged = [c for c in controls if c.label in ("reproduced", "refuted", "negligible", "inconclusive")]
        control_text = (
            f"Controls and simple baselines in the main runs ({len(judged)} judged rows): "
            f"{verdict_tally(judged)}. A positive control should read reproduced and a null control (parity) "
            "should not read refuted; each page names its controls and what each one showed."
            if judged
            else "The main runs judge no control rows."
        )
        lines += [f"**{paper}.**", "", *(f"- {s}" for s in sentences), f"- {control_text}", ""]
    return lines


def coverage_section(coverage: dict[str, Any]) -> list[str]:
    """The simulated coverage table per regime, with a note where the interval under-covers or is wider
    than needed, the cluster-labelled interval beside clustered rows and the old bootstrap beside Gaussian
    ones."""

    def cell(value: float | None) -> str:
        return "—" if value is None else f"{value:.3f}"

    rows = [
        [
            r["regime"],
            str(r["seeds"]),
            str(r["examples"]),
            f"{r['seed_share']:.2f}",
            cell(r["seed_level"]),
            cell(r.get("seed_level_clusters")),
            cell(r.get("pigeonhole")),
            r.get("note", ""),
        ]
        for r in coverage["rows"]
    ]
    reps = coverage["reps"]
    regimes = "; ".join(
        f"{name}: {'/'.join(f'{v:g}' for v in spec['sd'])}, {spec['description']}"
        for name, spec in coverage["regimes"].items()
    )
    return [
        "## Why the interval is at the level of seeds: simulated coverage",
        "",
        "Crossed designs (seeds × examples) with a random true difference planted in each simulated design. "
        f"Regimes, with the seed / example / residual standard deviations: {regimes}. The share of Var(mean) "
        f"between seeds is given per row. Coverage of the 95 % interval over {reps['seed_level']:,} designs "
        f"(Monte-Carlo sd {coverage['mc_sd']:.4f}; a row more than 3 sd from 0.95 is marked in its note); "
        "the cluster-labelled interval (`paired_interval(..., clusters=...)`) on clustered rows; the old "
        f"pigeonhole bootstrap on Gaussian rows only ({reps['pigeonhole']:,} designs, 500 replicates each). "
        "Where the interval under-covers, the note says what a study does about it. "
        f"Command: `{coverage['command']}` ({coverage['wall_seconds']} s on one shared core).",
        "",
        markdown_table(
            [
                "regime",
                "seeds",
                "examples",
                "seed share",
                "seed-level interval",
                "with cluster labels",
                "pigeonhole bootstrap (old)",
                "note",
            ],
            rows,
        ),
        "",
    ]


def regimes_of_primaries(results_dir: Path) -> list[str]:
    """Which coverage regime each study's primary is in: its share of Var(mean) between seeds, and what
    that means for the regimes where the interval under-covers."""
    rows = []
    for body in sorted(results_dir.glob("*/results.json")):
        claims = engine_rows(json.loads(body.read_text()).get("claims", [])) or []
        primary = next((c for c in claims if c.role == "primary" and c.seed_share is not None), None)
        if primary is None:
            continue
        share = primary.seed_share
        regime = (
            "seed-dominated: the seed-level regimes apply (skewed seeds or one bad seed can under-cover; "
            "read the per-seed differences on the page)"
            if share >= 0.8
            else "example-dominated: clustered examples would under-cover unless labelled (clusters=)"
            if share <= 0.2
            else "mixed: both kinds of regime apply in part"
        )
        rows.append(
            [
                body.parent.name,
                primary.name,
                str(primary.seeds),
                str(primary.examples),
                f"{share:.2f}",
                regime,
            ]
        )
    if not rows:
        return []
    return [
        "Where each study's primary sits (its share of Var(mean) between seeds, from its committed row):",
        "",
        markdown_table(["study", "primary", "seeds", "examples", "seed share", "regime"], rows),
        "",
        "Grouped examples: video-denoising's test sequences are cut from one video and llm-robustness's 80 "
        "held-out passages from one author's novels, so neither example axis is independent. video-denoising's "
        "primary is seed-dominated, so its example piece, where grouping would enter, barely counts. "
        "llm-robustness's is mixed, so its passages are labelled with their chapter of Persuasion (23 chapters over 80 "
        "passages, written by the study's `clusters` module from its own config) and its intervals are computed with "
        "`clusters=`: every interval of its two runs widened slightly, and no verdict changed.",
        "",
    ]


def sizing_section(results_dir: Path) -> list[str]:
    """Each main run's primary against its declared effect: the MDE the run reached, the seeds a design
    like it needs (plug-in and the sizing rule), and the hours that costs here, from the run's own wall time
    per seed (``provenance.json``'s ``wall_seconds``: tuning included, spread over its evaluation seeds)."""
    from descentlab.provenance import run_wall_seconds
    from descentlab.report.claims import is_inconclusive

    rows = []
    commands = []
    for body in sorted(results_dir.glob("*/results.json")):
        results = json.loads(body.read_text())
        claims = engine_rows(results.get("claims", [])) or []
        primary = next((c for c in claims if c.role == "primary" and c.seeds), None)
        if primary is None:
            continue
        wall = run_wall_seconds(body.parent)
        per_seed = None if wall is None else wall / primary.seeds
        need = primary.seeds_needed_bounded
        if not is_inconclusive(primary.label):
            verdict_need, hours, fits = "decided at this design", "—", "—"
        elif need is None:
            verdict_need, hours, fits = "no number of seeds at these examples", "—", "no"
        else:
            verdict_need = f"{primary.seeds_needed} plug-in, **{need}** at the sd bound"
            h = None if per_seed is None else need * per_seed / 3600
            config = results.get("config") or {}
            used = [*(config.get("seeds") or [0]), *([config["tune_seed"]] if "tune_seed" in config else [])]
            first = max(int(x) for x in used) + 1  # fresh seeds: after the run's own and its tuning seed
            commands.append(
                f"- `{body.parent.name}`: `descentlab run {body.parent.name} --preset full "
                f'seeds="[$(seq -s, {first} {first + need - 1})]" launcher=slurm --out runs`'
            )
            hours = "unmeasured" if h is None else f"{h:,.1f}"
            fits = "—" if h is None else ("yes" if h <= 6 else "no")
        rows.append(
            [
                body.parent.name,
                primary.name,
                primary.label,
                str(primary.seeds),
                _fmt_effect(primary.min_detectable_effect),
                _fmt_effect(primary.threshold),
                verdict_need,
                "unmeasured" if per_seed is None else f"{per_seed / 60:.1f}",
                hours,
                fits,
            ]
        )
    if not rows:
        return []
    return [
        "## Sizing: what each primary would need",
        "",
        "The sizing rule (`descentlab.report.stats.size_design`): the seeds at which a design like the run's "
        "detects the declared effect with 80 % power, keeping its examples and its example piece of the "
        "variance, with the seed standard deviation raised to its 80 % upper confidence bound (a few seeds "
        "understate it: the bound is 2.1× the estimate at 3 seeds, 1.45× at 5). The plug-in figure uses the "
        "run's own estimate. Hours here: the run's measured wall time per evaluation seed (tuning included) "
        "× the seeds the rule asks for, on this 2-core machine; a design that fits in about 6 hours can be "
        "run here. No GPU has been lent to this project, so no GPU time is measured: "
        "[../paper-scale.md](../paper-scale.md) gives each paper preset's GPU-hours as an estimate from a "
        "stated FLOP cost model (`make gpu-check` would measure one step to calibrate it).",
        "",
        markdown_table(
            [
                "study",
                "primary",
                "verdict",
                "seeds run",
                "MDE",
                "declared effect",
                "seeds needed",
                "min per seed here",
                "hours here",
                "fits 6 h here",
            ],
            rows,
        ),
        "",
        *(
            [
                "The sized design of each underpowered primary, on a cluster (`launcher=slurm`, with "
                "`launcher.partition=...` and `launcher.gpus_per_job=...` as the cluster needs; "
                "docs/paper-scale.md): the same preset with the seeds the rule asks for, all fresh.",
                "",
                *commands,
                "",
            ]
            if commands
            else []
        ),
    ]


def variance_cuts_section(results_dir: Path) -> list[str]:
    """What the design cuts bought each primary, measured from its committed cells: pairing the arms
    within a seed (``Claim.pairing``), and the most that more test examples could buy (the seed share of
    Var(mean): with unlimited examples only the seed piece is left, so the MDE falls at most to
    ``MDE · √(seed share)``)."""
    rows = []
    for body in sorted(results_dir.glob("*/results.json")):
        claims = engine_rows(json.loads(body.read_text()).get("claims", [])) or []
        primary = next((c for c in claims if c.role == "primary" and c.seed_share is not None), None)
        if primary is None or primary.pairing is None:
            continue
        mde = primary.min_detectable_effect
        floor = None if mde is None else mde * primary.seed_share**0.5
        rows.append(
            [
                body.parent.name,
                primary.name,
                f"{primary.pairing:.2f}",
                f"{100 * (1 - primary.pairing):.0f} %",
                f"{primary.seed_share:.2f}",
                _fmt_effect(mde),
                _fmt_effect(floor),
                _fmt_effect(primary.threshold),
            ]
        )
    if not rows:
        return []
    return [
        "### What the design cuts bought, measured",
        "",
        "Every study pairs its arms within a seed: one seed fixes the initialisation, the data order and the "
        "evaluation examples of every arm (the pruning studies prune by magnitude, which needs no calibration "
        "batch to share). *Pairing* is the seed variance of the primary's per-seed difference over what it "
        "would be with independent runs per arm (`descentlab.report.claims.pairing_ratio`, from the committed "
        "cells): below 1, sharing cancelled that part of the spread. More test examples shrink only the "
        "example piece of Var(mean): the *MDE floor* is what the same seeds would detect with unlimited "
        "examples, MDE · √(seed share). Where the floor is still above the declared effect, only more seeds "
        "help. A negative cut means the arms moved against each other across seeds; from 3 to 8 seeds the "
        "ratio is itself a noisy estimate.",
        "",
        markdown_table(
            [
                "study",
                "primary",
                "pairing",
                "variance cut",
                "seed share",
                "MDE",
                "MDE floor",
                "declared effect",
            ],
            rows,
        ),
        "",
    ]


def _fmt_effect(x: float | None) -> str:
    return "—" if x is None else f"{x:.3g}"


def study_section(
    name: str, results: dict[str, Any], preset: str = "full", run_dir: Path | None = None
) -> list[str]:
    """One run of a study: its primary verdict, then every row. ``preset`` other than ``full``: a companion
    run of the study (its folder under the study's is named after that preset), titled by it."""
    raw = results.get("claims", [])
    title = name if preset == "full" else f"{name}, companion run `{preset}`"
    lines = [
        f"{'##' if preset == 'full' else '###'} {title}",
        "",
        f"Page: [{name}.md]({name}.md). Command: `descentlab run {name} --preset {preset}`.",
    ]
    claims = engine_rows(raw)
    if not claims:
        return [*lines, "", f"No rows from the claims engine yet: {PENDING}.", ""]
    primary = next(c for c in claims if c.role == "primary")
    estimate = (
        ""
        if primary.estimate is None
        else f": {primary.estimate:+.4g} [{primary.low:+.4g}, {primary.high:+.4g}]"
    )
    prereg = read_preregistration(run_dir) if run_dir is not None else None
    declared = ""
    if prereg is not None:
        declared = (
            f" Preregistration: **{prereg['status']}** ({prereg['why']})."
            if prereg["status"] != "declared before the run"
            else f" Preregistration: declared before the run ({prereg['why']})."
        )
    post_hoc = prereg is not None and prereg["status"].endswith("(post hoc)")
    metrics = sorted({c.metric for c in claims if c.estimate is not None})
    lines += [
        "",
        f"**Primary endpoint: {primary.name}** ({primary.description}; {primary.metric}){estimate}: "
        f"**{primary.label}{', post hoc' if post_hoc else ''}**.{declared}",
        "",
        "Units of a − b: " + "; ".join(metrics) + "." if metrics else "",
        "",
    ]
    table = claims_table(claims)
    return [
        *lines,
        f"{len(claims)} rows: {verdict_tally(claims)}.",
        "",
        markdown_table(table["columns"], table["rows"]),
        "",
    ]


def companion_runs(study_dir: Path) -> list[Path]:
    """The ``results.json`` of a study's companion runs: ``<study>/<preset>/results.json``, one folder per
    further committed preset (e.g. a second architecture's run). ``earlier/`` holds the History's runs and is
    not one."""
    if not study_dir.is_dir():
        return []
    return sorted(
        d / "results.json"
        for d in study_dir.iterdir()
        if d.name != "earlier" and (d / "results.json").is_file()
    )


def results_index(results_dir: Path | str) -> str:
    """The text of ``docs/results/README.md`` from the committed files under ``results_dir``."""
    results_dir = Path(results_dir)
    lines = [
        "# Results: every study's verdicts",
        "",
        "Generated by `python -m descentlab.report.readme docs/results` from each study's committed "
        "`results.json`; do not edit by hand. Each study's page gives its protocol, its command, its wall "
        "time, its figures and the history of its earlier protocols.",
        "",
        *bottom_line(results_dir),
        HOW_TO_READ,
    ]
    coverage = results_dir / "coverage.json"
    if coverage.is_file():
        lines += coverage_section(json.loads(coverage.read_text()))
        lines += regimes_of_primaries(results_dir)
    lines += sizing_section(results_dir)
    lines += variance_cuts_section(results_dir)
    for page in sorted(results_dir.glob("*.md")):
        if page.stem == "README":
            continue
        body = results_dir / page.stem / "results.json"
        if body.is_file():
            lines += study_section(page.stem, json.loads(body.read_text()), run_dir=body.parent)
        for companion in companion_runs(results_dir / page.stem):
            lines += study_section(
                page.stem,
                json.loads(companion.read_text()),
                preset=companion.parent.name,
                run_dir=companion.parent,
            )
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    results_dir = Path(args[0] if args else "docs/results")
    atomic_write_text(results_dir / "README.md", results_index(results_dir))
    print(results_dir / "README.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
