"""The claims engine: a study declares its claims once (``CLAIMS: list[ClaimSpec]``); :func:`judge` turns
them and the run's saved arrays into typed :class:`Claim` rows, one per claim, condition and reference.

A claim is judged in one way everywhere:

* the interval is :func:`~descentlab.report.stats.paired_interval`, with the training seed as the unit of
  replication;
* the verdict follows the claim's kind (:func:`~descentlab.report.stats.claim_tests`): directional with a
  smallest effect of interest, sized, parity by equivalence, or untestable here with a reason;
* the verdicts are exclusive and monotone (:func:`~descentlab.report.stats.outcome`): *reproduced*,
  *refuted*, *negligible* (a directional claim whose interval lies wholly between 0 and its smallest effect
  of interest: the direction holds, the size is below interest) and *inconclusive*; widening an interval
  (Holm, a higher level) never turns one into its opposite;
* a one-seed design gets ``one seed: a smoke run, not judged``, never a bare verdict;
* a zero-width interval (every seed gave the same difference) reads ``degenerate: identical seeds`` and is
  not judged: it carries no evidence of variance, only of its absence;
* a non-finite cell is a result, not a hole: the row says ``diverged on k of S seeds`` and the diverged
  cells count against the arm that diverged (each takes the worst finite value of the row on the claim's
  side, so a diverged run is at least as bad as the worst run that finished);
* an exploratory row (a claim outside the paper's stated scope, with the quote of why) is judged, labelled
  exploratory and never reads as a refutation of the paper; like a control it is outside Holm;
* an inconclusive row says how many seeds a run like it would need to detect its declared effect, from
  its own variance and from the 80 % upper bound of its seed standard deviation (the sizing rule of
  :func:`~descentlab.report.stats.size_design`); one whose design could not detect that effect at all
  (minimum detectable effect above the SESOI, or above a parity margin) reads ``underpowered here``;
* a claim whose arrays the run did not save gets ``pending re-run``;
* a claim none of whose arms the run trained (a companion run of a few arms, say) gets ``not in this run``:
  nothing is missing, and another run of the study judges it. A cell function says so by yielding nothing,
  or by raising :class:`NotInRun` with what the run's design lacks (an arm, a sparsity, a tuning round);
* one claim is the study's primary endpoint, judged at level α; every other row is secondary and carries,
  beside its own verdict, the verdict after Holm's adjustment over the study's secondary rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from descentlab.report.stats import (
    UNDERPOWERED,
    ClaimTests,
    Direction,
    Kind,
    PairedInterval,
    claim_tests,
    design_power_shortfall,
    holm,
    outcome,
    paired_interval,
    power_verdict,
    seeds_needed,
)

ONE_SEED = "one seed: a smoke run, not judged"
DEGENERATE = "degenerate: identical seeds"
PENDING = "pending re-run"
NOT_IN_RUN = "not in this run"
NOT_IN_RUN_REASON = (
    "the run trained none of the arms it compares; a run of the study with those arms judges it"
)
UNTESTABLE = "untestable here"
ROLE_ORDER = ("primary", "secondary", "control", "exploratory")
#: What an exploratory row's verdict reads: the engine's outcome in words that do not judge the paper.
EXPLORATORY_WORDS = {
    "reproduced": "exploratory: holds here",
    "refuted": "exploratory: does not hold here",
    "negligible": "exploratory: direction holds, size negligible",
    "inconclusive": "exploratory: inconclusive",
}
VERDICTS = (
    "reproduced",
    "refuted",
    "negligible",
    "inconclusive",
    UNDERPOWERED,
    UNTESTABLE,
    ONE_SEED,
    DEGENERATE,
    PENDING,
    NOT_IN_RUN,
    *EXPLORATORY_WORDS.values(),
)


class MissingArrays(KeyError):
    """Raised by a cell function when the run did not save what it needs (the row is ``pending re-run``)."""


class NotInRun(LookupError):
    """Raised by a cell function when the run's design has no part the claim compares: an arm it did not
    train, a sparsity it did not prune to, a tuning round it skipped. The row is ``not in this run``; unlike
    :class:`MissingArrays`, re-running the same preset would not judge it."""


def require_arm(trained: Sequence[str], arm: str) -> None:
    """Raise :class:`NotInRun` unless ``arm`` is among the arms the run's config asked for."""
    if arm not in trained:
        raise NotInRun(f"the run trained no {arm} arm (it trained {', '.join(trained)})")


@dataclass(frozen=True)
class Cells:
    """One comparison of a claim: the method's and the reference's paired per-cell values.

    Attributes:
        a, b: paired values shaped ``[seeds, ..., examples]`` or ``[seeds]``; the difference is ``a − b``.
        method, reference: what ``a`` and ``b`` are (e.g. ``"horst"``, ``"adamw"``).
        at: the condition of this row (e.g. ``"sparsity 0.9"``); "" when the claim has one condition.
        untestable: why this comparison cannot show the claim (the reference already has the property,
            the statistic sits at its bound, the protocol cannot move it), or None.
        clusters: one label per example (the last axis) when examples come in groups that are not
            independent (passages of one chapter, frames of one clip); the interval then estimates the
            example piece from cluster totals (:func:`~descentlab.report.stats.paired_interval`). None:
            examples are independent.
    """

    a: Any
    b: Any
    method: str
    reference: str
    at: str = ""
    untestable: str | None = None
    clusters: Any = None


CellFunction = Callable[[Mapping[str, np.ndarray]], Iterable[Cells]]


@dataclass(frozen=True)
class ClaimSpec:
    """One claim, declared before the run.

    Attributes:
        name: a short slug, unique in its study.
        description: the claim in plain words, as the paper makes it.
        cells: the saved arrays -> the :class:`Cells` compared (raise :class:`MissingArrays`, or let a
            ``KeyError`` escape, when the run lacks an array).
        metric: the statistic and its units (e.g. ``"test log-perplexity"``).
        kind: ``directional`` (needs ``sesoi``), ``sized`` (needs ``size``), ``parity`` (needs ``margin``)
            or ``untestable`` (needs ``reason``).
        direction: ``greater`` (a > b) or ``less`` (a < b); for parity it is ignored.
        sesoi: the smallest effect of interest, a magnitude in the metric's units.
        size: the claimed size, a magnitude.
        margin: the parity margin.
        reason: why the claim is untestable here.
        paper: the paper's number, as the paper states it (None when the paper gives none).
        source: where the paper states it (table, figure, section).
        primary: the study's one primary endpoint.
        control: a positive control or a simple baseline: it checks that the run can see an effect, it is
            not a claim of the paper, so it is judged unadjusted and outside the secondary rows' Holm family.
        exploratory: for a row outside the paper's stated scope, why (quote the paper's scope, e.g. "the
            paper states Theorem 4.7 for finite p >= 2 and leaves the L∞ limit open"). It is judged
            unadjusted, outside Holm, and its verdict reads as evidence on an open question, never as a
            refutation of the paper.
    """

    name: str
    description: str
    cells: CellFunction
    metric: str
    kind: Kind = "directional"
    direction: Direction = "greater"
    sesoi: float | None = None
    size: float | None = None
    margin: float | None = None
    reason: str | None = None
    paper: str | None = None
    source: str | None = None
    primary: bool = False
    control: bool = False
    exploratory: str | None = None

    def __post_init__(self) -> None:
        needs = {"directional": "sesoi", "sized": "size", "parity": "margin", "untestable": "reason"}
        if self.kind not in needs:
            raise ValueError(f"claim {self.name!r}: kind must be one of {sorted(needs)}, got {self.kind!r}")
        if self.direction not in ("greater", "less"):
            raise ValueError(f"claim {self.name!r}: direction must be 'greater' or 'less'")
        value = getattr(self, needs[self.kind])
        if value is None or (not isinstance(value, str) and not value > 0):
            raise ValueError(f"claim {self.name!r} of kind {self.kind} needs {needs[self.kind]} (> 0)")
        if self.primary and self.kind == "untestable":
            raise ValueError(f"claim {self.name!r}: a primary endpoint must be testable")
        if self.primary and self.control:
            raise ValueError(f"claim {self.name!r}: a control cannot be the primary endpoint")
        if self.exploratory is not None and (self.primary or self.control or not self.exploratory.strip()):
            raise ValueError(
                f"claim {self.name!r}: an exploratory row needs its reason (the paper's scope it lies outside) "
                "and cannot be the primary endpoint or a control"
            )

    @property
    def role(self) -> str:
        if self.primary:
            return "primary"
        if self.control:
            return "control"
        return "exploratory" if self.exploratory is not None else "secondary"

    @property
    def threshold(self) -> float | None:
        """The kind's declared number: the SESOI, the size or the margin."""
        return {"directional": self.sesoi, "sized": self.size, "parity": self.margin}.get(self.kind)


@dataclass
class Claim:
    """One judged row: a claim at one condition against one reference."""

    name: str
    description: str
    role: str  # "primary" | "secondary" | "control" | "exploratory"
    kind: str
    direction: str
    threshold: float | None
    metric: str
    method: str
    reference: str
    at: str
    verdict: str
    reason: str
    holm_verdict: str | None = None
    estimate: float | None = None
    low: float | None = None
    high: float | None = None
    level: float = 0.95
    min_detectable_effect: float | None = None
    seeds: int | None = None
    examples: int | None = None
    a_mean: float | None = None
    b_mean: float | None = None
    p_reproduce: float | None = None
    p_refute: float | None = None
    seeds_needed: int | None = None
    seeds_needed_bounded: int | None = None
    power_shortfall: float | None = None
    seed_share: float | None = None
    pairing: float | None = None
    diverged: dict[str, int] | None = None
    paper: str | None = None
    source: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        extra = out.pop("extra")
        return {**out, **extra}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Claim:
        names = {f.name for f in fields(cls)} - {"extra"}
        missing = [n for n in ("name", "role", "kind", "verdict") if n not in d]
        if missing:
            raise ValueError(
                f"a claim row lacks {missing}; re-judge the run with `descentlab report RUN_DIR`"
            )
        return cls(
            **{k: v for k, v in d.items() if k in names}, extra={k: v for k, v in d.items() if k not in names}
        )

    @property
    def label(self) -> str:
        """The verdict a reader should take: Holm-adjusted for a secondary row."""
        return self.holm_verdict if self.holm_verdict is not None else self.verdict


def engine_rows(rows: Sequence[Mapping[str, Any]]) -> list[Claim] | None:
    """The claims engine's rows from a ``results.json`` ``claims`` list, or None when the rows were written
    before the engine (they carry no ``role``) and stay as written until the run is re-judged."""
    if not all("role" in r for r in rows):
        return None
    return [Claim.from_dict(r) for r in rows]


def verdict_tally(claims: Sequence[Claim]) -> str:
    """``"11 refuted, 6 reproduced"``: how many rows carry each verdict a reader should take, most first."""
    counts: dict[str, int] = {}
    for c in claims:
        counts[c.label] = counts.get(c.label, 0) + 1
    return ", ".join(f"{n} {verdict}" for verdict, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def check_specs(specs: Sequence[ClaimSpec]) -> None:
    """A study's claims: unique names and exactly one primary endpoint."""
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"claim names must be unique in a study, repeated: {dupes}")
    primaries = [s.name for s in specs if s.primary]
    if len(primaries) != 1:
        raise ValueError(f"a study declares exactly one primary endpoint, got {primaries or 'none'}")


def _row(spec: ClaimSpec, cells: Cells | None, verdict: str, reason: str) -> Claim:
    return Claim(
        name=spec.name,
        description=spec.description,
        role=spec.role,
        kind=spec.kind,
        direction=spec.direction,
        threshold=spec.threshold,
        metric=spec.metric,
        method=cells.method if cells else "",
        reference=cells.reference if cells else "",
        at=cells.at if cells else "",
        verdict=verdict,
        reason=reason,
        paper=spec.paper,
        source=spec.source,
    )


def _interval_text(iv: PairedInterval) -> str:
    return (
        f"{iv.mean:+.4g} [{iv.low:+.4g}, {iv.high:+.4g}] over {iv.seeds} seed(s) x {iv.examples} example(s)"
    )


def judge_cells(spec: ClaimSpec, cells: Cells, *, level: float = 0.95) -> tuple[Claim, ClaimTests | None]:
    """One row of ``spec`` on one comparison, with its tests (None when no verdict can be drawn)."""
    row = _row(spec, cells, "", "")
    a, b = np.asarray(cells.a, dtype=np.float64), np.asarray(cells.b, dtype=np.float64)
    untestable = spec.reason if spec.kind == "untestable" else cells.untestable
    diverged_note = ""
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        counted = count_divergence_against(a, b, spec.direction)
        if counted is None:
            row.verdict = UNTESTABLE
            row.reason = "both arms diverged in every cell (no finite value to compare); nothing to judge"
            return row, None
        a, b, row.diverged = counted[0], counted[1], {cells.method: counted[2], cells.reference: counted[3]}
        seeds = a.shape[0]
        diverged_note = (
            "; ".join(f"{arm} diverged on {k} of {seeds} seeds" for arm, k in row.diverged.items() if k)
            + " (each diverged cell counted as the row's worst finite value)"
        )
    if a.shape[:1] == (1,) and a.size == 1:  # one seed, one number: nothing to form an interval from
        row.estimate, row.seeds, row.examples = float(a.item() - b.item()), 1, 1
        row.a_mean, row.b_mean = float(a.item()), float(b.item())
        row.verdict = UNTESTABLE if untestable else ONE_SEED
        row.reason = (
            f"{untestable}; one seed, one value" if untestable else "one seed, one value: no interval"
        )
        return row, None
    iv = paired_interval(a, b, level=level, clusters=cells.clusters)
    row.estimate, row.low, row.high, row.level = iv.mean, iv.low, iv.high, level
    row.min_detectable_effect, row.seeds, row.examples = iv.min_detectable_effect(), iv.seeds, iv.examples
    row.a_mean, row.b_mean = float(a.mean()), float(b.mean())
    # the share of Var(mean) between seeds says which coverage regimes apply (docs/results/README.md)
    row.seed_share = (
        sum(p.variance for p in iv.pieces if p.source == "seeds") / iv.se**2 if iv.se > 0 else None
    )
    row.pairing = pairing_ratio(a, b)
    text = _interval_text(iv) + (f"; {diverged_note}" if diverged_note else "")
    if untestable is not None:
        row.verdict, row.reason = UNTESTABLE, f"{untestable}; {text}"
        return row, None
    if iv.one_seed:
        row.verdict = ONE_SEED
        row.reason = f"{text}: training variance not measured, the interval counts examples only"
        return row, None
    if iv.se == 0.0:
        row.verdict = DEGENERATE
        row.reason = f"{text}: every seed gave the same difference, a zero-width interval is not evidence"
        return row, None
    tests = claim_tests(
        iv, spec.kind, direction=spec.direction, sesoi=spec.sesoi, size=spec.size, margin=spec.margin
    )
    row.p_reproduce, row.p_refute = tests.p_reproduce, tests.p_refute
    verdict = outcome(tests, 1 - level)
    row.power_shortfall = design_power_shortfall(iv, spec.kind, spec.sesoi or spec.margin)
    if verdict == "inconclusive":
        row.seeds_needed = _seeds_to_decide(spec, iv)
        row.seeds_needed_bounded = _seeds_to_decide(spec, iv, sd_confidence=0.8)
    if spec.exploratory is not None:
        row.verdict = EXPLORATORY_WORDS[verdict]
    else:
        row.verdict = power_verdict(verdict, iv, spec.kind, spec.sesoi or spec.margin)
    scope = f"{spec.exploratory}; here: " if spec.exploratory is not None else ""
    row.reason = f"{scope}{text}; {_rule_text(spec, verdict)}{_needed_text(row)}"
    return row, tests


def pairing_ratio(a: np.ndarray, b: np.ndarray) -> float | None:
    """What pairing the arms within a seed bought: the seed variance of the paired difference over what it
    would be if the two arms' runs were independent,

        r = Var_s(ā_s − b̄_s) / (Var_s(ā_s) + Var_s(b̄_s)) = 1 − 2 Cov_s(ā_s, b̄_s) / (Var_s(ā_s) + Var_s(b̄_s)),

    with ``ā_s``, ``b̄_s`` the per-seed means over every other axis. A seed fixes the initialisation, the data
    order and the evaluation examples of both arms; r < 1 is the share of the seed variance left after
    that sharing (r = 1: it bought nothing; r > 1: the arms moved against each other across seeds). None
    with fewer than 2 seeds, or when an arm has no seed variance (a fixed reference such as a win rate of
    one half, where there is nothing to pair)."""
    if a.ndim == 0 or a.shape[0] < 2:
        return None
    a_s, b_s = a.reshape(a.shape[0], -1).mean(axis=1), b.reshape(b.shape[0], -1).mean(axis=1)
    var_a, var_b = float(a_s.var(ddof=1)), float(b_s.var(ddof=1))
    if not (var_a > 0 and var_b > 0):
        return None
    return float((a_s - b_s).var(ddof=1) / (var_a + var_b))


def count_divergence_against(
    a: np.ndarray, b: np.ndarray, direction: str
) -> tuple[np.ndarray, np.ndarray, int, int] | None:
    """Count non-finite cells against the arm that produced them: each becomes the worst finite value of
    the row (the minimum when higher is better, ``direction="greater"``; the maximum when lower is better),
    so a diverged run scores at least as badly as the worst run that finished. Parity rows take their
    declared direction as the better side.

    Returns the filled ``a``, ``b`` and the number of seeds (first axis) on which each arm had a non-finite
    cell, or None when no cell of either arm is finite.
    """
    finite_a, finite_b = np.isfinite(a), np.isfinite(b)
    pool = np.concatenate([a[finite_a].ravel(), b[finite_b].ravel()])
    if pool.size == 0:
        return None
    worst = pool.min() if direction == "greater" else pool.max()
    seeds_a = int((~finite_a).reshape(a.shape[0], -1).any(axis=1).sum()) if a.ndim else int(not finite_a)
    seeds_b = int((~finite_b).reshape(b.shape[0], -1).any(axis=1).sum()) if b.ndim else int(not finite_b)
    return np.where(finite_a, a, worst), np.where(finite_b, b, worst), seeds_a, seeds_b


def _seeds_to_decide(spec: ClaimSpec, iv: PairedInterval, sd_confidence: float | None = None) -> int | None:
    """Seeds for an inconclusive row: where its MDE reaches the declared effect (the SESOI or the parity
    margin), or, for a sized claim, the gap between the estimate and the claimed size. ``sd_confidence``:
    size from that upper bound of the seed standard deviation (see :func:`seeds_needed`)."""
    if spec.kind == "sized":
        assert spec.size is not None
        effect = abs(abs(iv.mean) - spec.size)
    else:
        effect = spec.threshold or 0.0
    return seeds_needed(iv, effect, sd_confidence=sd_confidence)


def is_inconclusive(verdict: str) -> bool:
    """True for the verdicts that decide nothing: inconclusive, underpowered here, and the exploratory
    inconclusive."""
    return verdict.endswith("inconclusive") or verdict == UNDERPOWERED


def _needed_text(row: Claim) -> str:
    if not is_inconclusive(row.verdict):
        return ""
    why = (
        f"; the design detects {row.power_shortfall + (row.threshold or 0):.3g} at 80 % power, above the "
        f"declared {row.threshold:g}"
        if row.verdict == UNDERPOWERED and row.power_shortfall is not None and row.threshold is not None
        else ""
    )
    if row.seeds_needed is None:
        return f"{why}; no number of seeds decides it at these examples (the example piece alone is too wide)"
    bounded = (
        f", {row.seeds_needed_bounded} at the 80 % upper bound of the seed sd (the sizing rule)"
        if row.seeds_needed_bounded is not None
        else ""
    )
    return f"{why}; about {row.seeds_needed} seeds would decide it at 80 % power (plug-in, from this run's variance){bounded}"


def _rule_text(spec: ClaimSpec, verdict: str) -> str:
    side = ">" if spec.direction == "greater" else "<"
    if spec.kind == "directional":
        goal = f"a − b {side} 0, smallest effect of interest {spec.sesoi:g}"
    elif spec.kind == "sized":
        goal = f"|a − b| >= {spec.size:g} on the {spec.direction} side"
    else:
        goal = f"|a − b| <= {spec.margin:g} (90 % CI, TOST)"
    if verdict == "negligible":
        return f"negligible for {goal}: the direction holds, every effect of interest is excluded"
    return f"{verdict} for {goal}"


def judge(
    specs: Sequence[ClaimSpec], arrays: Mapping[str, np.ndarray], *, level: float = 0.95
) -> list[Claim]:
    """Every row of every claim, with Holm-adjusted verdicts on the secondary rows.

    Holm runs over the secondary rows that carry tests, once for the reproduce tests and once for the
    refute tests; ``holm_verdict`` is the verdict read from the adjusted p-values. The primary row and
    the controls keep their unadjusted verdicts (``holm_verdict`` None).
    """
    check_specs(specs)
    alpha = 1 - level
    rows: list[Claim] = []
    tested: list[tuple[Claim, ClaimTests]] = []
    for spec in specs:
        try:
            comparisons = list(spec.cells(arrays))
        except NotInRun as exc:
            rows.append(_row(spec, None, NOT_IN_RUN, f"{exc}; another run of the study judges this claim"))
            continue
        except KeyError as exc:  # MissingArrays included
            rows.append(
                _row(spec, None, PENDING, f"the run did not save {exc}; re-run the study to judge it")
            )
            continue
        if not comparisons:  # the run has none of the arms this claim compares
            rows.append(_row(spec, None, NOT_IN_RUN, NOT_IN_RUN_REASON))
            continue
        if spec.primary and len(comparisons) != 1:
            raise ValueError(
                f"the primary endpoint {spec.name!r} must be one comparison, got {len(comparisons)}"
            )
        for cells in comparisons:
            row, tests = judge_cells(spec, cells, level=level)
            rows.append(row)
            if tests is not None and spec.role == "secondary":
                tested.append((row, tests))
    if tested:
        rep = holm([t.p_reproduce for _, t in tested])
        ref = holm([t.p_refute for _, t in tested])
        for (row, _), p_rep, p_ref in zip(tested, rep, ref, strict=True):
            adjusted = outcome(ClaimTests(p_rep, p_ref), alpha)
            underpowered = adjusted == "inconclusive" and (row.power_shortfall or 0) > 0
            row.holm_verdict = UNDERPOWERED if underpowered else adjusted
    for row in rows:
        if row.role == "secondary" and row.holm_verdict is None:
            row.holm_verdict = row.verdict
    return rows


def _fmt(x: float | None, spec: str = "+.4f") -> str:
    return "" if x is None else format(x, spec)


def verdict_details(c: Claim) -> str:
    """What a row's quoted verdict leaves out: the unadjusted verdict of a secondary row that Holm changed,
    the divergence count, and the seeds an inconclusive row would need."""
    parts = []
    if c.role == "secondary" and c.holm_verdict is not None and c.holm_verdict != c.verdict:
        parts.append(f"unadjusted: {c.verdict}")
    if c.diverged:
        seeds = c.seeds or 0
        parts += [f"{arm} diverged on {k} of {seeds} seeds" for arm, k in c.diverged.items() if k]
    if is_inconclusive(c.label) or is_inconclusive(c.verdict):
        if c.seeds_needed is not None:
            bounded = f", {c.seeds_needed_bounded} at the sd bound" if c.seeds_needed_bounded else ""
            parts.append(f"≈ {c.seeds_needed} seeds to decide{bounded}")
        elif c.estimate is not None and c.low is not None and is_inconclusive(c.verdict):
            parts.append("more seeds alone do not decide it")
    return "; ".join(parts)


def claims_table(claims: Sequence[Claim]) -> dict[str, Any]:
    """One table of every row, the primary first: ``{"title", "columns", "rows"}``. Each row shows one verdict
    to quote (:attr:`Claim.label`: Holm-adjusted for a secondary row); the other goes in the details."""
    ordered = sorted(claims, key=lambda c: ROLE_ORDER.index(c.role))
    rows = [
        [
            f"**{c.name}** (primary)" if c.role == "primary" else c.name + _role_tag(c.role),
            c.at,
            f"{c.method} − {c.reference}" if c.reference else c.method,
            f"{c.kind}"
            + (f" {c.direction}" if c.kind in ("directional", "sized") else "")
            + (f" {c.threshold:g}" if c.threshold is not None else ""),
            "" if c.estimate is None or c.low is None else f"{c.estimate:+.4f} [{c.low:+.4f}, {c.high:+.4f}]",
            _fmt(c.min_detectable_effect, ".3g"),
            "" if c.seeds is None else str(c.seeds),
            c.label,
            verdict_details(c),
            c.paper or "",
        ]
        for c in ordered
    ]
    return {
        "title": "Claims: a − b with its 95 % seed-level interval; the primary endpoint first; the verdict to "
        "quote is Holm-adjusted within the study for secondary rows",
        "columns": [
            "claim",
            "at",
            "a − b",
            "kind",
            "difference [95 % CI]",
            "MDE",
            "seeds",
            "verdict",
            "details",
            "paper",
        ],
        "rows": rows,
    }


def _role_tag(role: str) -> str:
    return {"control": " (control)", "exploratory": " (exploratory)"}.get(role, "")


def claim_notes(claims: Sequence[Claim]) -> list[str]:
    """One sentence per row."""
    notes = []
    for c in sorted(claims, key=lambda c: ROLE_ORDER.index(c.role)):
        where = f" at {c.at}" if c.at else ""
        pair = f" ({c.method} − {c.reference})" if c.reference else ""
        holm_note = f"; Holm-adjusted: {c.holm_verdict}" if c.role == "secondary" else ""
        notes.append(f"{c.role} {c.name}{where}{pair}: {c.description}: {c.verdict}{holm_note} ({c.reason}).")
    return notes
