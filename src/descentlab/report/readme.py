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
from descentlab.report.claims import PENDING, claims_table, engine_rows, verdict_tally
from descentlab.report.tables import markdown_table

HOW_TO_READ = """\
## How to read a verdict

- **The unit of replication is the training seed.** A row's interval is the seed-level 95 % interval of
  a − b (`descentlab.report.stats.paired_interval`): seeds and test examples are crossed, and the
  interval carries the variance between training runs as well as the variance between examples. A
  design with one training seed reads "one seed: training variance not measured" and is not judged.
- **Four verdicts.**
  - *reproduced*: the interval lies beyond 0 on the claimed side (a sized claim: beyond the claimed size;
    parity: the 90 % interval lies inside the margin, an equivalence test);
  - *refuted*: the interval excludes every effect of interest (beyond the declared smallest effect of
    interest on the claimed side; a sized claim: short of the size; parity: wholly outside the margin);
  - *inconclusive*: neither; the MDE column says the smallest effect the run detects with 80 % power;
  - *untestable here*: the run cannot show the claim (the reference already has the property, the
    statistic sits at its bound, or the protocol cannot move it); the row says why.
- **Primary and secondary.** Each study declares one primary endpoint, with its smallest effect of
  interest, in its committed config before the run. Every other row is secondary: its "Holm" column is
  the verdict after Holm's adjustment over the study's secondary rows, and that is the one to quote.
  Controls (positive controls, null controls, the simple baselines a person of the field tries first) are
  judged unadjusted: they show whether the run could see an effect, and a study that loses to a baseline
  says so.
- **Pending re-run.** A committed run that did not save the per-seed arrays a claim needs is not re-judged
  from its old summary: its row says "pending re-run".
- **Not in this run.** A run whose design lacks what a claim compares (an arm it did not train, a sparsity
  it did not prune to, a tuning round it skipped; a companion run of a few arms, say) says "not in this
  run" and names what it lacks: nothing is missing, and another run of the study judges the claim.
"""


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


def study_section(name: str, results: dict[str, Any], preset: str = "full") -> list[str]:
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
    lines += [
        "",
        f"**Primary endpoint: {primary.name}** ({primary.description}; {primary.metric}){estimate}: "
        f"**{primary.verdict}**.",
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
        HOW_TO_READ,
    ]
    coverage = results_dir / "coverage.json"
    if coverage.is_file():
        lines += coverage_section(json.loads(coverage.read_text()))
    for page in sorted(results_dir.glob("*.md")):
        if page.stem == "README":
            continue
        body = results_dir / page.stem / "results.json"
        if body.is_file():
            lines += study_section(page.stem, json.loads(body.read_text()))
        for companion in companion_runs(results_dir / page.stem):
            lines += study_section(page.stem, json.loads(companion.read_text()), preset=companion.parent.name)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    results_dir = Path(args[0] if args else "docs/results")
    atomic_write_text(results_dir / "README.md", results_index(results_dir))
    print(results_dir / "README.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
