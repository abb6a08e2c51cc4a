"""The statistics every comparison uses: mean ± std over repeats, a paired bootstrap CI, a verdict.

Paired bootstrap. Two methods evaluated on the same cells (seed s, noise draw d, example e) give paired
differences ``δ[s, d, e] = a[s, d, e] - b[s, d, e]``; the estimate is their mean ``δ̄``. Seeds, draws and
examples are crossed (every seed's model sees the same examples under the same draw seeds), so each
bootstrap replicate resamples every axis independently with replacement (Owen's "pigeonhole" bootstrap):
with multinomial counts ``w^S, w^D, w^E`` over the axes,

    δ̄* = Σ_{s,d,e} w^S_s w^D_d w^E_e δ[s, d, e] / (S·D·E),

and the CI is the percentile interval of ``δ̄*`` over ``n_boot`` replicates. With one axis (examples only)
this is the ordinary paired bootstrap. Resampling every axis counts each source of variation (test
examples, training seeds, noise draws) once; when the cells are independent it counts the cell noise
more than once, so the interval is conservative (coverage at or above the nominal level), never liberal.
An axis of length 1 contributes nothing.

Verdict. A claim says the difference lies on one side of 0 (``direction="greater"``: a > b, ``"less"``:
a < b), optionally by at least ``claimed_size``:

* reproduced: the CI lies on the claimed side of 0 and does not lie entirely short of the claimed size;
* refuted: the CI lies on the other side of 0 (0 excluded), or lies entirely short of the claimed size
  (the claimed size is excluded, whether or not the CI also excludes 0);
* inconclusive: otherwise, the CI contains 0. The run could then only have detected effects of at least
  the minimum detectable effect ``MDE = h · (z_{1-α/2} + z_{power}) / z_{1-α/2}`` with ``h`` the CI
  half-width: a true difference of MDE gives a CI excluding 0 with probability ``power`` (0.8) when the
  estimate is normal with standard error ``h / z_{1-α/2}``; ``MDE ≈ 1.43 h`` at 95 %.
"""

from __future__ import annotations

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
    """Percentile CI of ``mean(a - b)``, resampling every axis of the paired cells (see module docs).

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


Outcome = Literal["reproduced", "refuted", "inconclusive"]


@dataclass(frozen=True)
class Verdict:
    """``outcome`` of a claim; ``min_detectable_effect`` is set when it is inconclusive."""

    outcome: Outcome
    reason: str
    min_detectable_effect: float | None = None

    def __str__(self) -> str:
        return self.outcome


def verdict(
    ci: BootstrapCI, direction: Literal["greater", "less"], claimed_size: float | None = None
) -> Verdict:
    """Reproduced / refuted / inconclusive for the claim "the difference is ``direction`` than 0".

    Args:
        ci: the interval of the difference (first method minus second).
        direction: ``"greater"`` when the claim is a > b, ``"less"`` when it is a < b.
        claimed_size: the claimed magnitude of the difference (> 0, in the metric's units), or None.
    """
    if direction not in ("greater", "less"):
        raise ValueError(f"direction must be 'greater' or 'less', got {direction!r}")
    if claimed_size is not None and claimed_size <= 0:
        raise ValueError(f"claimed_size is a magnitude and must be > 0, got {claimed_size}")
    sign = 1.0 if direction == "greater" else -1.0
    # in claim units: positive = the claimed side
    low, high = sorted((sign * ci.low, sign * ci.high))
    interval = f"the CI [{ci.low:.4g}, {ci.high:.4g}]"
    if high < 0:
        return Verdict("refuted", f"{interval} lies on the other side of 0")
    if claimed_size is not None and high < claimed_size:
        return Verdict("refuted", f"{interval} excludes the claimed size {claimed_size:g}")
    if low > 0:
        return Verdict("reproduced", f"{interval} lies on the claimed side of 0")
    mde = ci.min_detectable_effect()
    return Verdict("inconclusive", f"{interval} contains 0; the run detects effects >= {mde:.4g}", mde)


def parity_verdict(ci: BootstrapCI, target: float = 0.0) -> Verdict:
    """For a claim of *equality* ("the difference is ``target``", e.g. a 50 % win rate at γ = 0):
    reproduced when the CI contains ``target``, refuted when it excludes it. The CI's half-width says how
    close to ``target`` the run pins the value (a wide CI reproduces parity cheaply: read it with the row)."""
    interval = f"the CI [{ci.low:.4g}, {ci.high:.4g}]"
    if ci.low <= target <= ci.high:
        return Verdict("reproduced", f"{interval} contains {target:g} (half-width {ci.half_width:.3g})")
    return Verdict("refuted", f"{interval} excludes {target:g}")


def claim_row(
    ci: BootstrapCI, direction: Literal["greater", "less"], means: tuple[float, float]
) -> dict[str, Any]:
    """The JSON fields every claim row shares: the CI of a − b, the two means and the verdict.

    Args:
        ci: the paired interval of a − b.
        direction: the claimed side ("greater": a > b).
        means: the means of a's and b's cells.
    """
    v = verdict(ci, direction)
    return {
        "direction": direction,
        "estimate": ci.mean,
        "ci": [ci.low, ci.high],
        "shape": list(ci.shape),
        "a_mean": means[0],
        "b_mean": means[1],
        "verdict": v.outcome,
        "reason": v.reason,
        "min_detectable_effect": ci.min_detectable_effect(),
    }
