"""The statistics every comparison uses: mean ± std over repeats, the seed-level paired interval that every
verdict rests on, the verdict rules and Holm's adjustment.

* :func:`paired_interval` is the interval of a mean paired difference with the training seed as the unit
  of replication (seeds and examples crossed); its docstring has the equation and its simulated coverage.
* :func:`claim_tests` and :func:`outcome` are the verdict rules (directional with a smallest effect of
  interest, sized, parity by equivalence) as p-values dual to the interval; :func:`holm` adjusts them.
* :func:`paired_bootstrap` is the pigeonhole percentile bootstrap (every axis resampled) that verdicts used
  before. It is kept for the coverage comparison and for summaries over examples; it is not a verdict's
  interval: with few seeds it behaves like [min, max] of the per-seed differences and covers about 0.77
  at 3 seeds when seeds dominate the variance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Literal

import numpy as np
import torch

Impl = Literal["torch", "numpy"]


def mean_std(values: Sequence[float] | Any, *, ddof: int = 1, impl: Impl = "torch") -> tuple[float, float]:
    """Mean and standard deviation of repeats in float64; the std is 0 when there are ``<= ddof`` values.

    ``ddof=1`` (the default) is the sample std every experiment's ``mean_std`` used; ``ddof=0`` is the
    population std (numpy's default, used by the text-robustness tables). ``impl`` picks the float64
    summation: torch (sparse-vit, sparse-lm, video-denoising) or numpy (implicit-bias); they can differ in
    the last bit, so a port keeps the one it had.
    """
    if impl == "torch":
        t = torch.as_tensor(values, dtype=torch.float64)
        return float(t.mean()), float(t.std(correction=ddof)) if len(t) > ddof else 0.0
    arr = np.asarray(values, dtype=float)
    return float(arr.mean()), float(arr.std(ddof=ddof)) if len(arr) > ddof else 0.0


def column_mean_std(
    rows: Sequence[Sequence[float]] | Any, *, ddof: int = 1, impl: Impl = "torch"
) -> tuple[list[float], list[float]]:
    """Column-wise :func:`mean_std` of a ``[repeats, points]`` table (e.g. one curve per seed)."""
    if impl == "torch":
        t = torch.as_tensor(rows, dtype=torch.float64)
        std = t.std(0, correction=ddof) if t.shape[0] > ddof else torch.zeros(t.shape[1], dtype=torch.float64)
        return t.mean(0).tolist(), std.tolist()
    arr = np.asarray(rows, dtype=float)
    std_np = arr.std(0, ddof=ddof) if arr.shape[0] > ddof else np.zeros(arr.shape[1])
    return arr.mean(0).tolist(), std_np.tolist()


@dataclass(frozen=True)
class BootstrapCI:
    """A percentile bootstrap interval for a mean paired difference.

    Attributes:
        mean: the observed mean difference.
        low, high: the interval's ends.
        n: the number of paired cells (product of ``shape``).
        shape: the (seeds, draws, examples)-like shape that was resampled.
        level: the confidence level.
    """

    mean: float
    low: float
    high: float
    n: int
    shape: tuple[int, ...]
    level: float = 0.95

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def min_detectable_effect(self, power: float = 0.8) -> float:
        """The smallest true difference this run detects with probability ``power`` (see module docs)."""
        z = NormalDist().inv_cdf
        z_level = z(0.5 + self.level / 2)
        return self.half_width * (z_level + z(power)) / z_level


def paired_bootstrap(
    a: Any, b: Any, *, n_boot: int = 2000, level: float = 0.95, seed: int = 0
) -> BootstrapCI:
    """Percentile CI of ``mean(a - b)``, resampling every axis of the paired cells (Owen's pigeonhole
    bootstrap: with multinomial counts ``w^S, w^D, w^E`` over the axes, a replicate's mean is
    ``Σ w^S_s w^D_d w^E_e δ[s, d, e] / (S·D·E)``; the CI is the percentile interval of the replicates).
    Not a verdict's interval: see :func:`paired_interval`.

    Args:
        a, b: the two methods' per-cell values, the same shape, e.g. ``[seeds, draws, examples]``,
            ``[seeds, examples]`` or ``[examples]``; cell ``i`` of ``a`` is paired with cell ``i`` of ``b``.
        n_boot: bootstrap replicates.
        level: confidence level of the interval.
        seed: seed of the resampling (the CI is a deterministic function of the data and the seed).
    """
    diff = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if diff.ndim == 0 or diff.size == 0:
        raise ValueError(f"paired_bootstrap needs at least one paired cell per axis, got shape {diff.shape}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    # replicate r's mean is the multilinear form of the per-axis resampling counts with δ: contract the
    # last axis first, keeping the replicate axis, so memory stays O(n_boot · cells / last axis)
    weights = [rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot).astype(np.float64) for n in diff.shape]
    acc = np.tensordot(diff, weights[-1], axes=([diff.ndim - 1], [1]))  # [..., n_boot]
    for axis in range(diff.ndim - 2, -1, -1):
        acc = np.einsum("...ib,bi->...b", acc, weights[axis])
    replicates = acc / diff.size
    tail = (1 - level) / 2
    low, high = np.quantile(replicates, [tail, 1 - tail])
    return BootstrapCI(
        mean=float(diff.mean()),
        low=float(low),
        high=float(high),
        n=int(diff.size),
        shape=diff.shape,
        level=level,
    )


# --- the seed-level interval every verdict uses -------------------------------------------------------


@dataclass(frozen=True)
class VariancePiece:
    """One independently estimated piece of ``Var(δ̄)``: its estimate and its degrees of freedom."""

    variance: float
    df: float
    source: str


@dataclass(frozen=True)
class PairedInterval:
    """The seed-level interval of a mean paired difference (see :func:`paired_interval`).

    Attributes:
        mean: the observed mean difference ``δ̄``.
        pieces: the estimated pieces of ``Var(δ̄)``, each with its own degrees of freedom.
        seeds: the number of training seeds (the first axis of the cells).
        examples: the number of examples (the last axis; 1 when the cells are per-seed scalars).
        shape: the shape of the paired cells.
        level: the confidence level of ``low`` / ``high``.
    """

    mean: float
    pieces: tuple[VariancePiece, ...]
    seeds: int
    examples: int
    shape: tuple[int, ...]
    level: float = 0.95

    @property
    def one_seed(self) -> bool:
        """True when training variance was not measured: a verdict cannot rest on it."""
        return self.seeds < 2

    @property
    def se(self) -> float:
        """The standard error ``√Σ v_k``."""
        return math.sqrt(sum(p.variance for p in self.pieces))

    def half_width_at(self, level: float) -> float:
        """``√Σ_k t²_{(1+level)/2, ν_k} · v_k``: each piece widened by the quantile of its own df."""
        if not 0 < level < 1:
            raise ValueError(f"level must be in (0, 1), got {level}")
        q = 0.5 + level / 2
        return math.sqrt(sum(_t_ppf(q, p.df) ** 2 * p.variance for p in self.pieces))

    @property
    def half_width(self) -> float:
        return self.half_width_at(self.level)

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    def interval(self, level: float) -> tuple[float, float]:
        h = self.half_width_at(level)
        return self.mean - h, self.mean + h

    def min_detectable_effect(self, power: float = 0.8) -> float:
        """``√Σ_k (t_{(1+level)/2, ν_k} + t_{power, ν_k})² · v_k``.

        With one piece this is the textbook ``(t_{1−α/2} + t_{power}) · SE``: a true difference of this
        size gives an interval that excludes 0 with probability ``power``. At S = 3 seeds and a
        seed-dominated design it is about 6.2 SE.
        """
        q = 0.5 + self.level / 2
        return math.sqrt(sum((_t_ppf(q, p.df) + _t_ppf(power, p.df)) ** 2 * p.variance for p in self.pieces))

    def p_beyond(self, value: float, side: Literal["above", "below"]) -> float:
        """One-sided p-value of "the difference is ``side`` ``value``", dual to the interval.

        It is the ``p`` for which the one-sided ``1 − p`` bound sits at ``value``: the interval at level
        ``1 − 2p`` has its end there. ``p < (1 − level) / 2`` exactly when the interval excludes ``value``
        on the other side.
        """
        gap = self.mean - value if side == "above" else value - self.mean
        if self.se == 0.0:
            return 0.0 if gap > 0 else 1.0
        if gap <= 0:
            return 1.0 - self._one_sided(-gap)
        return self._one_sided(gap)

    def _one_sided(self, gap: float) -> float:
        # the one-sided p is monotone in the half-width; solve h(1 − 2p) = gap on p in (0, 1/2)
        from scipy.optimize import brentq

        def excess(p: float) -> float:
            return self.half_width_at(1 - 2 * p) - gap

        lo, hi = 1e-15, 0.5 - 1e-12
        if excess(lo) <= 0:
            return lo
        if excess(hi) >= 0:  # the gap is within rounding of 0
            return 0.5
        return float(brentq(excess, lo, hi, xtol=1e-12))

    def to_dict(self) -> dict[str, Any]:
        return {
            "mean": self.mean,
            "low": self.low,
            "high": self.high,
            "level": self.level,
            "se": self.se,
            "seeds": self.seeds,
            "examples": self.examples,
            "shape": list(self.shape),
            "pieces": [{"source": p.source, "variance": p.variance, "df": p.df} for p in self.pieces],
            "min_detectable_effect": self.min_detectable_effect(),
        }


def _t_ppf(q: float, df: float) -> float:
    from scipy.stats import t

    return float(t.ppf(q, df)) if math.isfinite(df) else NormalDist().inv_cdf(q)


def paired_interval(a: Any, b: Any, *, level: float = 0.95, clusters: Any = None) -> PairedInterval:
    """The interval of ``mean(a − b)`` with the training seed as the unit of replication.

    Cells. ``a`` and ``b`` are paired per-cell values shaped ``[seeds, ..., examples]`` (or ``[seeds]`` for
    per-seed scalars such as a perplexity); middle axes (noise draws, γ levels) are averaged into the
    cell. Seeds and examples are crossed: every seed's model is evaluated on the same examples. The
    differences ``δ[s, e] = μ + S_s + E_e + R_se`` have a seed effect (σ²_S), an example effect shared by
    every seed (σ²_E) and a cell residual (σ²_R), so

        Var(δ̄) = σ²_S / S + σ²_E / E + σ²_R / (S·E).

    Estimate (two-way ANOVA without replication). With mean squares ``MS_S`` (df S − 1), ``MS_E``
    (df E − 1) and ``MS_R`` (df (S − 1)(E − 1)), ``E[MS_S] = σ²_R + E σ²_S`` and ``E[MS_E] = σ²_R + S σ²_E``,
    so ``Var(δ̄)`` is estimated by two pieces,

        v_S = MS_S / (S·E)               (df S − 1: seeds and residual),
        v_E = max(MS_E − MS_R, 0) / (S·E) (df E − 1: the example effect shared by all seeds).

    Interval. ``δ̄ ± √(t²_{S−1} v_S + t²_{E−1} v_E)``, each piece widened by the t quantile of its own df
    (a root-sum-of-squares of per-piece half-widths, in the spirit of Graybill and Wang's modified
    large-sample method). Where seeds dominate it is the t-interval on per-seed means with S − 1 df; where
    examples dominate it is the paired t-interval over examples. A Satterthwaite df for the sum was
    liberal at S = 3 (its fractional df near 2 shrinks t_{0.975} from 4.30), so it is not used.

    Coverage, simulated (scripts/interval_coverage.py, 20,000 designs per row, Monte-Carlo sd 0.0015;
    docs/results/README.md has the table, tests/report/test_paired_interval.py checks it) at
    S ∈ {3, 5, 10}, E ∈ {200, 1000}: 0.951–0.954 when seeds dominate; 0.949–0.974 when examples dominate
    or both matter (conservative at 3–5 seeds: the residual rides in ``v_S`` with S − 1 df); 0.958–0.964
    with t₃ seed and residual terms. It under-covers where the t quantile's assumptions break: 0.82–0.84
    with lognormal seed effects, 0.895–0.939 when one run in ten is shifted by 5 sd, and 0.60–0.69 with
    examples in clusters of 10 sharing half their variance, which ``clusters`` restores to 0.949–0.958.
    The pigeonhole bootstrap it replaces covered 0.745–0.762 at S = 3 when seeds dominate.

    Clustered examples (``clusters``). When examples come in clusters that share an effect (paragraphs of
    one speech, frames of one video), ``v_E`` above assumes them independent and is too small by the design
    effect ``1 + (m − 1)ρ``. Given a cluster label per example, the example piece is estimated from the K
    cluster means of the seed-averaged differences ``δ̄_{·e}``,

        c̄_k = (1/n_k) Σ_{e ∈ k} δ̄_{·e},   v_C = K/(K − 1) · Σ_k (n_k/E)² (c̄_k − δ̄)²,
        v_E = max(v_C − MS_R/(S·E), 0)      (df K − 1),

    ``v_C`` being the cluster-robust variance of ``δ̄`` over clusters, less the residual that ``v_S``
    already carries (exact for equal cluster sizes; one label per example gives the ``v_E`` above). The
    seed piece is unchanged. With one seed ``v_E = v_C``.

    One seed (S = 1): training variance is not measured; the interval is the paired t over examples and
    ``one_seed`` is set, so that no verdict is drawn from it.

    Args:
        a, b: the two arms' per-cell values, the same shape; the first axis is the training seed.
        level: the confidence level of ``low`` / ``high``.
        clusters: optional cluster label per example (length E, the last axis; any hashable labels), at
            least two distinct ones.

    Raises:
        ValueError: when the shapes differ, a value is not finite, there is nothing to vary, or the
            cluster labels do not fit the examples.
    """
    a_arr, b_arr = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a_arr.shape != b_arr.shape:
        raise ValueError(
            f"paired_interval needs paired cells of one shape, got {a_arr.shape} and {b_arr.shape}"
        )
    diff = a_arr - b_arr
    if diff.ndim == 0 or diff.size == 0:
        raise ValueError(f"paired_interval needs cells shaped [seeds, ..., examples], got shape {diff.shape}")
    if not np.isfinite(diff).all():
        raise ValueError("paired_interval got a non-finite cell value; fix the run's saved arrays first")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    # per-seed scalars become [seeds, 1]; middle axes (draws, γ levels) are averaged into the cell
    table = diff[:, None] if diff.ndim == 1 else diff.reshape(diff.shape[0], -1, diff.shape[-1]).mean(axis=1)
    n_seeds, n_examples = table.shape
    if n_seeds * n_examples < 2:
        raise ValueError(f"paired_interval needs at least two seeds or two examples, got shape {diff.shape}")
    grand = float(table.mean())
    seed_means, example_means = table.mean(axis=1), table.mean(axis=0)
    cells = n_seeds * n_examples
    cluster_v: tuple[float, int] | None = None
    if clusters is not None:
        labels = np.asarray(clusters)
        if labels.shape != (n_examples,):
            raise ValueError(
                f"paired_interval needs one cluster label per example ({n_examples}), got shape {labels.shape}"
            )
        _, index, sizes = np.unique(labels, return_inverse=True, return_counts=True)
        n_clusters = len(sizes)
        if n_clusters < 2:
            raise ValueError("paired_interval needs at least two clusters to estimate the example piece")
        cluster_means = np.bincount(index, weights=example_means) / sizes
        weights = sizes / n_examples
        v_c = n_clusters / (n_clusters - 1) * float((weights**2 * (cluster_means - grand) ** 2).sum())
        cluster_v = (v_c, n_clusters - 1)
    pieces: list[VariancePiece] = []
    if n_seeds > 1:
        ms_seed = n_examples * float(((seed_means - grand) ** 2).sum()) / (n_seeds - 1)
        pieces.append(VariancePiece(ms_seed / cells, n_seeds - 1, "seeds"))
        if n_examples > 1:
            resid = table - seed_means[:, None] - example_means[None, :] + grand
            ms_resid = float((resid**2).sum()) / ((n_seeds - 1) * (n_examples - 1))
            if cluster_v is not None:
                # the residual is already in v_S; what is left of v_C is the effect clusters share
                v_e = max(cluster_v[0] - ms_resid / cells, 0.0)
                pieces.append(VariancePiece(v_e, cluster_v[1], "example clusters"))
            else:
                ms_example = n_seeds * float(((example_means - grand) ** 2).sum()) / (n_examples - 1)
                pieces.append(
                    VariancePiece(max(ms_example - ms_resid, 0.0) / cells, n_examples - 1, "examples")
                )
    elif cluster_v is not None:
        pieces.append(VariancePiece(cluster_v[0], cluster_v[1], "example clusters (one seed)"))
    else:
        ms_example = float(((example_means - grand) ** 2).sum()) / (n_examples - 1)
        pieces.append(VariancePiece(ms_example / n_examples, n_examples - 1, "examples (one seed)"))
    return PairedInterval(grand, tuple(pieces), n_seeds, n_examples, tuple(diff.shape), level)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values: ``p̃_(i) = max_{j ≤ i} min(1, (m − j + 1) p_(j))``.

    Rejecting where ``p̃ < α`` controls the family-wise error rate at α for any dependence.
    """
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    m = len(p_values)
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


# --- verdict rules ------------------------------------------------------------------------------------

Kind = Literal["directional", "sized", "parity", "untestable"]
Direction = Literal["greater", "less"]


@dataclass(frozen=True)
class ClaimTests:
    """The two tests behind a verdict, each as a p-value compared with ``α = 1 − level``.

    ``p_reproduce`` tests the claim (reproduced when ``< α``); ``p_refute`` tests that every effect of
    interest is excluded (refuted when ``< α``). Both are dual to the intervals of the verdict table, so
    the verdict read from them equals the one read from the CI, and Holm's adjustment applies to them.
    """

    p_reproduce: float
    p_refute: float


def claim_tests(
    iv: PairedInterval,
    kind: Kind,
    *,
    direction: Direction = "greater",
    sesoi: float | None = None,
    size: float | None = None,
    margin: float | None = None,
) -> ClaimTests:
    """The p-values of the verdict rules (α = 1 − ``iv.level``; δ = the difference, in claim units
    ``x = δ`` for "greater" and ``x = −δ`` for "less"):

    * directional, smallest effect of interest ``sesoi``: reproduced when the CI of x lies above 0
      (``p = 2 P(x ≤ 0)``), refuted when it lies below ``sesoi`` (every effect of interest excluded);
    * sized ``size``: reproduced when the CI of x lies at or above ``size``, refuted when below it;
    * parity ``margin``: reproduced by equivalence, the (1 − 2α) CI inside ``[−m, m]`` (TOST:
      ``p = max`` of the two one-sided p-values), refuted when the (1 − α) CI lies wholly outside.
    """
    if kind == "untestable":
        raise ValueError("an untestable claim has no test")
    if direction not in ("greater", "less"):
        raise ValueError(f"direction must be 'greater' or 'less', got {direction!r}")
    up, down = ("above", "below") if direction == "greater" else ("below", "above")
    sign = 1.0 if direction == "greater" else -1.0
    if kind == "directional":
        if sesoi is None or sesoi <= 0:
            raise ValueError(f"a directional claim needs a smallest effect of interest > 0, got {sesoi}")
        return ClaimTests(
            min(1.0, 2 * iv.p_beyond(0.0, up)),  # type: ignore[arg-type]
            min(1.0, 2 * iv.p_beyond(sign * sesoi, down)),  # type: ignore[arg-type]
        )
    if kind == "sized":
        if size is None or size <= 0:
            raise ValueError(f"a sized claim needs a claimed size > 0 (a magnitude), got {size}")
        return ClaimTests(
            min(1.0, 2 * iv.p_beyond(sign * size, up)),  # type: ignore[arg-type]
            min(1.0, 2 * iv.p_beyond(sign * size, down)),  # type: ignore[arg-type]
        )
    if kind == "parity":
        if margin is None or margin <= 0:
            raise ValueError(f"a parity claim needs a margin > 0, got {margin}")
        tost = max(iv.p_beyond(-margin, "above"), iv.p_beyond(margin, "below"))
        outside = min(iv.p_beyond(margin, "above"), iv.p_beyond(-margin, "below"))
        return ClaimTests(min(1.0, tost), min(1.0, 2 * outside))
    raise ValueError(f"kind must be directional, sized, parity or untestable, got {kind!r}")


Outcome = Literal["reproduced", "refuted", "negligible", "inconclusive"]

#: The verdicts in order of information, most first. ``negligible`` says two things at once (the direction
#: holds and every effect of interest is excluded); ``reproduced`` and ``refuted`` say one each;
#: ``inconclusive`` says nothing. Widening an interval can only move a verdict down this order, along
#: :data:`WIDENING`, never to its opposite.
OUTCOME_ORDER: tuple[Outcome, ...] = ("negligible", "reproduced", "refuted", "inconclusive")

#: The moves a wider interval allows (Holm's adjustment, a higher level): each verdict to itself or to a
#: verdict that keeps a part of what it said. ``reproduced`` and ``refuted`` never reach each other.
WIDENING: dict[str, frozenset[str]] = {
    "negligible": frozenset({"negligible", "reproduced", "refuted", "inconclusive"}),
    "reproduced": frozenset({"reproduced", "inconclusive"}),
    "refuted": frozenset({"refuted", "inconclusive"}),
    "inconclusive": frozenset({"inconclusive"}),
}


def outcome(tests: ClaimTests, alpha: float) -> Outcome:
    """The verdict read from the two tests at level ``α``, exclusive and monotone.

    ====================  ====================  ==============
    ``p_reproduce < α``    ``p_refute < α``     verdict
    ====================  ====================  ==============
    yes                   yes                   negligible
    yes                   no                    reproduced
    no                    yes                   refuted
    no                    no                    inconclusive
    ====================  ====================  ==============

    Both tests pass only for a directional claim whose interval lies wholly between 0 and the smallest
    effect of interest: the direction holds and the size is below interest (``negligible``). Reading that
    case as ``reproduced`` was not monotone: Holm's larger p-values could then leave only the refute test
    standing and turn a "reproduced" row into "refuted". With four outcomes each test maps to one part of
    the verdict, and larger p-values can only drop parts (:data:`WIDENING`). For sized and parity claims
    the two tests exclude each other, so ``negligible`` never occurs.
    """
    reproduce, refute = tests.p_reproduce < alpha, tests.p_refute < alpha
    if reproduce and refute:
        return "negligible"
    if reproduce:
        return "reproduced"
    if refute:
        return "refuted"
    return "inconclusive"


def seeds_needed(
    iv: PairedInterval,
    effect: float,
    *,
    power: float = 0.8,
    max_seeds: int = 10_000,
    sd_confidence: float | None = None,
) -> int | None:
    """The training seeds at which a design like ``iv``'s detects a true difference of ``effect`` with
    probability ``power`` (its MDE falls to ``|effect|``), keeping its examples and its estimated variance.

    With ``S'`` seeds the seed piece scales as ``v_S · S / S'`` with df ``S' − 1``; the example piece is
    shared by every seed and does not shrink with seeds, so when it alone exceeds the effect no number of
    seeds suffices and the answer is None. The answer is the smallest ``S' >= 2`` with

        √((t_{(1+level)/2, S'−1} + t_{power, S'−1})² · v_S · S / S' + (t_{·, ν_E} + t_{power, ν_E})² · v_E) <= |effect|.

    With ``sd_confidence`` None it uses the run's own variance estimate: a plug-in figure. With
    ``sd_confidence = c`` the seed piece is first raised to the one-sided ``c`` upper bound of its standard
    deviation (:func:`sd_upper_bound`, ``v_S · (s_U / s)²``): the sizing rule of :func:`size_design`, which
    does not flatter a design sized from a few pilot seeds.
    """
    if effect == 0 or not math.isfinite(effect):
        return None
    q = 0.5 + iv.level / 2
    target = abs(effect)
    inflation = 1.0 if sd_confidence is None else sd_upper_bound(1.0, iv.seeds, confidence=sd_confidence) ** 2

    def mde(n: int) -> float:
        total = 0.0
        for p in iv.pieces:
            if p.source == "seeds":
                total += (
                    (_t_ppf(q, n - 1) + _t_ppf(power, n - 1)) ** 2 * p.variance * inflation * iv.seeds / n
                )
            else:
                total += (_t_ppf(q, p.df) + _t_ppf(power, p.df)) ** 2 * p.variance
        return math.sqrt(total)

    if mde(max_seeds) > target:
        return None
    lo, hi = 2, max_seeds
    if mde(lo) <= target:
        return lo
    while hi - lo > 1:  # the MDE falls monotonically in n
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if mde(mid) <= target else (mid, hi)
    return hi


def sd_upper_bound(sd: float, n: int, *, confidence: float = 0.8) -> float:
    """The one-sided ``confidence`` upper bound of a standard deviation estimated from ``n`` values:
    ``s · √((n − 1) / χ²_{1−confidence, n−1})``. At n = 3 and 80 % it is about 2.1 s: a pilot of three seeds
    sizes a study honestly only with this bound, not with its point estimate."""
    from scipy.stats import chi2

    if n < 2:
        raise ValueError(f"a standard deviation needs at least two values, got n = {n}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return sd * math.sqrt((n - 1) / float(chi2.ppf(1 - confidence, n - 1)))


#: The verdict of an inconclusive row whose design could not detect its declared effect: its minimum
#: detectable effect (80 % power) exceeds the smallest effect of interest (a parity claim: its equivalence
#: MDE exceeds the margin). It is a kind of *inconclusive*, and says why and what would decide it.
UNDERPOWERED = "underpowered here"


def equivalence_mde(iv: PairedInterval, power: float = 0.8) -> float:
    """The smallest parity margin the design shows at ``power`` when the true difference is 0: TOST at
    level α = 1 − ``iv.level`` needs the two one-sided ``1 − α`` bounds inside ``±margin``, so

        margin_min = √Σ_k (t_{1−α, ν_k} + t_{(1+power)/2, ν_k})² · v_k.
    """
    alpha = 1 - iv.level
    return math.sqrt(
        sum((_t_ppf(1 - alpha, p.df) + _t_ppf(0.5 + power / 2, p.df)) ** 2 * p.variance for p in iv.pieces)
    )


def design_power_shortfall(iv: PairedInterval, kind: str, effect: float | None) -> float | None:
    """How far the design's detectable effect exceeds the declared one (> 0: underpowered), or None where
    the notion does not apply (a sized claim, no declared effect, one seed)."""
    if effect is None or iv.one_seed or iv.se == 0.0:
        return None
    if kind == "directional":
        return iv.min_detectable_effect() - abs(effect)
    if kind == "parity":
        return equivalence_mde(iv) - abs(effect)
    return None


def power_verdict(verdict: str, iv: PairedInterval, kind: str, effect: float | None) -> str:
    """``verdict``, or :data:`UNDERPOWERED` when it is *inconclusive* and the design could not have decided
    it (:func:`design_power_shortfall` > 0).

    The label only refines *inconclusive*, so the rules of :data:`WIDENING` still hold with
    ``underpowered here`` read as inconclusive: a wider interval raises the MDE and never turns the row into
    a decided verdict, let alone its opposite.
    """
    if verdict != "inconclusive":
        return verdict
    shortfall = design_power_shortfall(iv, kind, effect)
    return UNDERPOWERED if shortfall is not None and shortfall > 0 else verdict


@dataclass(frozen=True)
class DesignSize:
    """What a design like ``iv``'s would need to detect ``effect``.

    Attributes:
        plug_in: seeds from the run's own seed variance (:func:`seeds_needed`); None when no number of seeds
            suffices at these examples.
        bounded: seeds from the 80 % upper bound of the seed standard deviation, the sizing rule.
        hours_here: ``bounded`` × the run's measured seconds per seed, in hours, when those were given.
        seconds_per_seed: the measured cost per seed the hours come from.
    """

    plug_in: int | None
    bounded: int | None
    hours_here: float | None
    seconds_per_seed: float | None


def size_design(
    iv: PairedInterval,
    effect: float,
    *,
    seconds_per_seed: float | None = None,
    power: float = 0.8,
    sd_confidence: float = 0.8,
) -> DesignSize:
    """The sizing rule: size a design from a pilot (or an earlier run) ``iv`` with the one-sided
    ``sd_confidence`` upper bound of its seed standard deviation, keeping the example piece, at ``power``.

    A pilot of S seeds underestimates the seed sd often: its 80 % upper bound is ≈ 2.1 s at S = 3 and
    1.45 s at S = 5. ``hours_here`` is ``bounded · seconds_per_seed / 3600``, the cost model of this
    machine: a run's wall time over its seeds (tuning and evaluation included) scales with its seeds.
    """
    plug_in = seeds_needed(iv, effect, power=power)
    bounded = seeds_needed(iv, effect, power=power, sd_confidence=sd_confidence) if iv.seeds >= 2 else None
    hours = None
    if bounded is not None and seconds_per_seed is not None:
        hours = bounded * seconds_per_seed / 3600
    return DesignSize(plug_in, bounded, hours, seconds_per_seed)
