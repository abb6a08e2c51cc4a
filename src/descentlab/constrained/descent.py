"""Layer-wise descent constraints (arXiv 2601.17257; docs/methods.md).

A model with layers 1..L is trained as

    min  f_L     s.t.   f_l <= (1 - α_l) f_{l-1},   l = 1..L

where f_l is the batch-mean loss read out at layer l (f_0 at the embedding output). The Lagrangian is
L̂(θ, λ) = f_L + Σ_l λ_l ĝ_l; the primal optimizer descends it, the dual step ascends it in λ (see
:mod:`descentlab.constrained.dual` and :class:`~descentlab.constrained.primal_dual.PrimalDual`).

The violation math is the pure function :func:`descent_violations`; :class:`LayerwiseDescent` keeps the
options, remembers ĝ between ``lagrangian`` and the dual step, and runs the dual cadence.

Noisy ĝ (a sampled readout). With ``CausalLMReadout``'s token subsample, ĝ_l of one step is unbiased for
the batch's g_l with variance σ_l² = (1 - k/N) S_d² / k (:mod:`descentlab.readout.causal_lm`). The dual step
ascends the mean of the W = ``dual_every`` steps' ĝ since the last one, whose variance is σ̄_l² =
Σ_t σ_{l,t}² / W² (≈ σ_l² / W); ``lagrangian(f, estimate=readout.last_estimate)`` sums the σ_{l,t}² of the
window on the device, and :attr:`LayerwiseDescent.dual_standard_error` is the last dual step's σ̄_l.
Clamping λ at 0 turns zero-mean noise into a positive λ on a constraint that holds: for ĝ ~ N(g, σ̄²) with
g = -m < 0, λ_{t+1} = max(0, λ_t + η ĝ_t) is a reflected random walk whose stationary mean is

    E[λ_∞] = Σ_{n≥1} E[(S_n)^+] / n,   S_n ~ N(-n η m, n η² σ̄²)       (Spitzer's identity)
           <= η σ̄² / (2 m)                                     (Kingman's bound; the diffusion limit)

(:func:`clamped_ascent_mean`), while a constraint violated by m grows by η m per dual step. This module
averages ĝ over the window before the dual step rather than choosing k per step: k fixes the shapes and
the cost of the readout (choosing it from the current standard error would need a host read and a
different k every step), while the window costs nothing (ĝ is summed on the device anyway) and divides
σ² by W as a W-fold larger k would. :func:`dual_window` gives the W that brings σ̄_l below a fraction c
of the margin m; then E[λ_∞] <= η c² m / 2 (at c = 1/2 the bound is η m / 8 and Spitzer's value 0.0045 η m,
against η m of growth per dual step on a constraint violated by m; the price is a λ that moves once per W
steps), and one dual step's ĝ has the wrong sign with probability Φ(-1/c) (2.3 % at c = 1/2).
``form="ratio"`` is refused when a sampled ĝ would reach the dual step: the ratio of two sampled means is biased (by about (f_l Var f̂_{l-1} / f_{l-1} - Cov) / f_{l-1}²), and
the difference form states the same constraint for f > 0 with an unbiased ĝ.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from descentlab.constrained.dual import DualVariables, Resilience
from descentlab.errors import CheckpointError, ConfigError, ModelError
from descentlab.logs import LazyLogs

AlphaSpec = float | Sequence[float] | Callable[[int], float]
ConstraintForm = Literal["difference", "ratio"]


def resolve_alpha(alpha: AlphaSpec, num_layers: int) -> Tensor:
    """The step-size schedule α_1..α_L as a float64 tensor [L].

    Args:
        alpha: a constant, one value per layer (L values, layer 1 first), or a callable l -> α_l (l = 1..L).
        num_layers: L.

    Raises:
        ConfigError: a value that is not a number (e.g. the string ``'0.1'``), a value outside [0, 1), or a list
            of the wrong length.
    """
    if callable(alpha):
        values = [_alpha_number(alpha(layer), f"alpha({layer})") for layer in range(1, num_layers + 1)]
    elif isinstance(alpha, (int, float)):
        values = [float(alpha)] * num_layers
    elif isinstance(alpha, (str, bytes)) or not isinstance(alpha, Iterable) or getattr(alpha, "ndim", 1) == 0:
        values = [_alpha_number(alpha, "alpha")] * num_layers  # a numpy/torch scalar; raises for a string
    else:
        values = [_alpha_number(a, f"alpha[{i}]") for i, a in enumerate(alpha)]
        if len(values) != num_layers:
            raise ConfigError(
                f"alpha has {len(values)} values for num_layers={num_layers}; give one per layer (layer 1 "
                "first), a constant, or a callable l -> alpha_l"
            )
    bad = [(i + 1, a) for i, a in enumerate(values) if not 0.0 <= a < 1.0]
    if bad:
        raise ConfigError(f"alpha must lie in [0, 1) at every layer; got (layer, alpha) = {bad[:4]}")
    return torch.tensor(values, dtype=torch.float64)


def _alpha_number(value: object, where: str) -> float:
    """``float(value)`` for a real number; ConfigError naming ``where`` for a string or another non-number."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
        raise ConfigError(
            f"{where} must be a number in [0, 1), a list of numbers or a callable l -> alpha_l; got {value!r} "
            f"(a {type(value).__name__})"
            + (": write alpha=0.1, not alpha='0.1'" if isinstance(value, str) else "")
        )
    return float(value)


def compute_dtype(f: Tensor) -> torch.dtype:
    """The dtype the Lagrangian and ĝ are built in: the wider of ``f``'s and float32."""
    return torch.promote_types(f.dtype, torch.float32)


def dual_window(standard_error: Tensor | float, margin: Tensor | float, fraction: float = 0.5) -> int:
    """The smallest window W (``dual_every``) whose mean ĝ has a standard error <= ``fraction`` · margin.

    W = ⌈(σ / (c m))²⌉, the maximum over layers, for the per-step standard error σ_l of ĝ_l (e.g. the
    logged ``g_se/l``, or ``readout.last_estimate.violation_errors(...)``) and the margin m_l = |g_l| the
    constraint holds or fails by (e.g. α_l f_{l-1}, or the measured |g_l|). NaN entries are skipped.

    Raises:
        ConfigError: a fraction outside (0, 1], or no finite positive margin.
    """
    if not 0.0 < fraction <= 1.0:
        raise ConfigError(f"fraction must lie in (0, 1] (got {fraction})")
    se = torch.as_tensor(standard_error, dtype=torch.float64).reshape(-1).cpu()
    m = torch.as_tensor(margin, dtype=torch.float64).reshape(-1).cpu().abs()
    need = (se / (fraction * m)).square()
    need = need[torch.isfinite(need)]
    if need.numel() == 0:
        raise ConfigError("dual_window needs a finite standard error and a positive margin on some layer")
    return max(1, math.ceil(float(need.max()) - 1e-12))


def clamped_ascent_mean(lr: float, mean: float, sd: float) -> float:
    """E[λ_∞] of the projected dual ascent λ ← max(0, λ + η ĝ) fed ĝ ~ N(mean, sd²) i.i.d., mean < 0.

    Spitzer's identity for the reflected random walk: E[λ_∞] = Σ_{n≥1} E[(S_n)^+] / n with S_n ~ N(n η μ,
    n η² σ²), and E[Y^+] = s φ(μ_Y / s) + μ_Y Φ(μ_Y / s) for Y ~ N(μ_Y, s²). The n-th term falls like
    exp(-n μ² / 2σ²); the sum runs until that factor is below 1e-18. Kingman's bound: at most η σ² / (2|μ|).

    Raises:
        ConfigError: mean >= 0 (a violated constraint: λ grows without bound) or sd < 0.
    """
    if not mean < 0 or sd < 0:
        raise ConfigError(f"clamped_ascent_mean needs mean < 0 and sd >= 0 (got mean={mean}, sd={sd})")
    if sd == 0:
        return 0.0
    ratio = mean / sd
    terms = min(50_000_000, math.ceil(2 * 41.5 / ratio**2) + 1)  # exp(-n r² / 2) < 1e-18 beyond
    n = torch.arange(1, terms + 1, dtype=torch.float64)
    z = n.sqrt() * ratio  # E[S_n] / sd(S_n)
    s = n.sqrt() * lr * sd
    positive = s * torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi) + n * lr * mean * 0.5 * torch.erfc(
        -z / math.sqrt(2)
    )
    return float((positive / n).sum())


def descent_violations(
    f: Tensor,
    alpha: Tensor,
    *,
    form: ConstraintForm = "difference",
    detach_prev: bool = False,
    eps: float = 1e-12,
) -> Tensor:
    """Violations ĝ_1..ĝ_L of the descent constraints from the losses f_0..f_L (<= 0 means met).

    difference (default):  ĝ_l = f_l - (1 - α_l) f_{l-1}
    ratio:                 ĝ_l = f_l / f_{l-1} - (1 - α_l)      (f_{l-1} clamped below at ``eps``)

    Args:
        f: batch-mean losses [L+1], layer 0 first.
        alpha: α_1..α_L [L].
        form: "difference" or "ratio".
        detach_prev: stop gradients through f_{l-1} (the constraint then only pushes layer l down).
        eps: floor of the ratio's denominator.

    Returns:
        ĝ [L], differentiable unless f is not, in the wider of f's dtype and float32: a bf16/fp16 f is
        widened first, so ĝ (a difference of nearby losses) is not rounded to 8 bits of mantissa.
    """
    f = f.to(compute_dtype(f))
    cur, prev = f[1:], f[:-1]
    if detach_prev:
        prev = prev.detach()
    keep = 1.0 - alpha.to(device=f.device, dtype=f.dtype)
    if form == "difference":
        return cur - keep * prev
    return cur / prev.clamp_min(eps) - keep


def profile_constraints(
    profile: Sequence[float],
    *,
    alpha_scale: float = 1.0,
    min_drop: float = 0.0,
    alpha_max: float = 0.5,
    skip_first: bool = True,
) -> tuple[list[int], list[float]]:
    """Constraints a reference model already meets (or nearly): layers and α_l from its loss profile.

    With the reference losses p_0..p_L (e.g. a pretrained model's logit-lens profile on validation data),
    layer l is constrained when the profile descends there by more than ``min_drop`` (relative), and

        α_l = min(alpha_max, alpha_scale · (1 - p_l / p_{l-1}))      (0 on the other layers),

    so at ``alpha_scale = 1`` the reference meets every constraint with equality, below 1 with a margin, and
    above 1 each constraint asks for more descent than the reference has. A profile that rises (SmolLM2's
    logit lens rises by ~6 nats from layer 1 to 17) is left unconstrained there: those constraints would be
    infeasible from the start and only make λ grow.

    Args:
        profile: p_0..p_L (L + 1 values, > 0).
        alpha_scale: the fraction of the reference's own relative drop each constraint asks for.
        min_drop: constrain layer l only when ``1 - p_l / p_{l-1} > min_drop``.
        alpha_max: upper bound of every α_l (< 1).
        skip_first: never constrain layer 1 (its predecessor f_0 reads the raw embedding: with tied
            embeddings it mostly predicts the input token itself, tens of nats).

    Returns:
        (constrained layers, 1-based; α_1..α_L).
    """
    p = [float(v) for v in profile]
    if len(p) < 2 or min(p) <= 0:
        raise ConfigError(f"profile_constraints needs >= 2 positive losses p_0..p_L, got {p[:4]}...")
    if not (alpha_scale > 0 and 0 < alpha_max < 1 and min_drop >= 0):
        raise ConfigError("need alpha_scale > 0, 0 < alpha_max < 1 and min_drop >= 0")
    layers, alphas = [], [0.0] * (len(p) - 1)
    for layer in range(1, len(p)):
        drop = 1.0 - p[layer] / p[layer - 1]
        if (layer == 1 and skip_first) or drop <= min_drop:
            continue
        layers.append(layer)
        alphas[layer - 1] = min(alpha_max, alpha_scale * drop)
    if not layers:
        raise ConfigError("the reference profile descends at no layer (after min_drop); nothing to constrain")
    return layers, alphas


def constraint_mask(num_layers: int, constrain_first: bool, layers: Iterable[int] | None) -> Tensor:
    """Bool [L]: which of the constraints l = 1..L are enforced.

    Args:
        num_layers: L.
        constrain_first: whether layer 1 is held to descend from layer 0.
        layers: the constrained layers (1-based); None for all.
    """
    mask = torch.ones(num_layers, dtype=torch.bool)
    if layers is not None:
        chosen = sorted({int(layer) for layer in layers})
        outside = [layer for layer in chosen if not 1 <= layer <= num_layers]
        if outside:
            raise ConfigError(
                f"layers {outside} are outside 1..{num_layers}; constraint l compares layer l to l-1"
            )
        mask[:] = False
        mask[[layer - 1 for layer in chosen]] = True
    if not constrain_first:
        mask[0] = False
    return mask


_SAMPLED_RATIO = (
    "form='ratio' with a sampled readout: f̂_l / f̂_(l-1) of two sampled means is a biased estimate, so the "
    "dual step would ascend a biased ĝ; use form='difference' (the same constraint for f > 0, unbiased) or "
    "CausalLMReadout(sample_tokens=None)"
)


class LayerwiseDescent:
    """Constraints f_l <= (1 - α_l) f_{l-1} on the per-layer losses, with their multipliers.

    Usage (any loop)::

        constraint = LayerwiseDescent(num_layers=L, alpha=0.1, dual_lr=1e-2)
        opt = PrimalDual(torch.optim.AdamW(model.parameters(), lr=2e-5), constraint)
        loss = constraint.lagrangian(layer_losses(model, batch))   # f_L + Σ λ_l ĝ_l
        loss.backward(); opt.step(); opt.zero_grad()                # primal step, then dual step

    Args:
        num_layers: L; ``lagrangian`` expects L+1 losses.
        alpha: α, a constant, a per-layer list or a callable l -> α_l, each in [0, 1).
        dual_lr: dual step η_λ > 0.
        resilience: a :class:`Resilience` to relax the constraints, or None for hard constraints.
        form: "difference" (default) or "ratio" (f_l / f_{l-1} <= 1 - α_l, of the predecessor papers).
        detach_prev: stop gradients through f_{l-1} in ĝ_l.
        constrain_first: constrain layer 1 against layer 0 (the embedding readout).
        layers: the constrained layers (1-based); None for all.
        dual_every: with ``dual_cadence="step"``, one dual step every k optimizer steps, from the mean ĝ of
            the ``lagrangian`` calls since the last dual step.
        dual_cadence: "step", or "epoch": dual steps only when :meth:`end_epoch` is called.
        max_multiplier: raise ``InfeasibleConstraintError`` once a λ_l exceeds this (None: never).
        divergence_patience: raise once a λ_l has grown for this many dual steps in a row (None: never).
    """

    extragradient = False  # DualProblem: LayerwiseDescent takes plain (not extra-gradient) dual steps

    def __init__(
        self,
        num_layers: int,
        alpha: AlphaSpec,
        dual_lr: float,
        resilience: Resilience | None = None,
        *,
        form: ConstraintForm = "difference",
        detach_prev: bool = False,
        constrain_first: bool = True,
        layers: Iterable[int] | None = None,
        dual_every: int = 1,
        dual_cadence: Literal["step", "epoch"] = "step",
        max_multiplier: float | None = 1e3,
        divergence_patience: int | None = None,
    ) -> None:
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ConfigError(f"num_layers must be a positive int (got {num_layers!r})")
        if not float(dual_lr) > 0:
            raise ConfigError(f"dual_lr must be > 0 (got {dual_lr}); typical values are 1e-3 to 1e-1")
        if form not in ("difference", "ratio"):
            raise ConfigError(f"form must be 'difference' or 'ratio' (got {form!r})")
        if dual_cadence not in ("step", "epoch"):
            raise ConfigError(f"dual_cadence must be 'step' or 'epoch' (got {dual_cadence!r})")
        if not isinstance(dual_every, int) or dual_every < 1:
            raise ConfigError(f"dual_every must be an int >= 1 (got {dual_every!r})")
        if resilience is not None and not isinstance(resilience, Resilience):
            raise ConfigError(f"resilience must be a Resilience or None (got {type(resilience).__name__})")
        if max_multiplier is not None and not max_multiplier > 0:
            raise ConfigError(f"max_multiplier must be > 0 or None (got {max_multiplier})")
        self.num_layers = num_layers
        self.alpha = resolve_alpha(alpha, num_layers)
        self.dual_lr = float(dual_lr)
        self.resilience = resilience
        self.form: ConstraintForm = form
        self.detach_prev = detach_prev
        self.dual_every = dual_every
        self.dual_cadence = dual_cadence
        self.mask = constraint_mask(num_layers, constrain_first, layers)
        if not bool(self.mask.any()):
            raise ConfigError("no layer is constrained; check `layers` and `constrain_first`")
        self.duals = DualVariables(
            num_layers, self.dual_lr, resilience, self.mask, max_multiplier, divergence_patience
        )
        self._index = torch.nonzero(self.mask).flatten()
        self._g_sum = torch.zeros(num_layers, dtype=torch.float64)
        self._n_sum: int | None = None  # targets behind the window's ĝ, when every recorded step said
        self._warned_flat = False  # the flat-profile warning (_flat_while_holding) is shown once
        self._g_count = 0
        # Σ se(ĝ_t)² of the window's recorded steps whose readout stated one, and how many stated it
        self._var_sum = torch.zeros(num_layers, dtype=torch.float64)
        self._var_count = 0
        self._dual_se: Tensor | None = None
        self._steps = 0
        self._last_f: Tensor | None = None
        self._last_g: Tensor | None = None
        self.lagrangian_calls = 0  # PrimalDual warns once when a step comes and this is still 0

    # -- primal side -------------------------------------------------------------------------------------
    def lagrangian(self, f: Tensor, *, record: bool | None = None, estimate: Any = None) -> Tensor:
        """L̂ = f_L + Σ_l λ_l ĝ_l over the constrained layers; remembers ĝ (detached) for the dual step.

        Args:
            f: the L+1 batch-mean losses f_0..f_L as one tensor; f_0 may carry no gradient.
            record: add this ĝ to the dual step's estimate. None: only when gradients are on and f has a
                graph, so evaluation passes under ``torch.no_grad()`` never move λ.
            estimate: what the readout read for this f (``CausalLMReadout.last_estimate``). When given, the
                squared standard errors of a recorded ĝ are summed for the window (on the device), so
                :attr:`dual_standard_error` states the noise of the ĝ the dual step ascends; and a sampled
                read with ``form="ratio"`` is refused (module docs).

        Raises:
            ConfigError: ``form="ratio"`` and a sampled ``estimate`` for a ĝ that would be recorded.

        Returns:
            The scalar Lagrangian, with λ held constant, in the wider of f's dtype and float32 (a bf16 f
            is widened first, so ĝ matches an fp64 computation from the same f to fp32 rounding).
        """
        if not isinstance(f, Tensor) or f.dim() != 1 or f.numel() != self.num_layers + 1:
            got = tuple(f.shape) if isinstance(f, Tensor) else type(f).__name__
            raise ModelError(
                f"lagrangian expects the {self.num_layers + 1} losses f_0..f_L of a model with "
                f"num_layers={self.num_layers}, got shape {got}; build LayerwiseDescent with num_layers = "
                "len(f) - 1"
            )
        self._to(f.device)
        self.lagrangian_calls += 1
        f = f.to(compute_dtype(f))  # a bf16 f is widened: ĝ and L̂ in fp32, gradients still flow to f
        g = descent_violations(f, self.alpha, form=self.form, detach_prev=self.detach_prev)
        lam = self.duals.lam.to(f.dtype)
        loss = f[-1] + (lam[self._index] * g[self._index]).sum()
        g_det = g.detach()
        self._last_f, self._last_g = f.detach(), g_det
        if record is None:
            record = torch.is_grad_enabled() and f.requires_grad
        if record:
            sampled = estimate is not None and getattr(estimate, "sampled", False)
            if sampled and self.form == "ratio":
                raise ConfigError(_SAMPLED_RATIO)
            self._g_sum = self._g_sum + g_det.to(torch.float64)  # a new tensor: pending_state stays valid
            self._g_count += 1
            # the targets this rank's ĝ rests on: the ranks' window means are weighted by them (rank_mean)
            n = getattr(estimate, "n", None)
            first = self._g_count == 1
            if n is None or (self._n_sum is None and not first):
                self._n_sum = None  # a step without its count: the ranks' means are weighted equally
            else:
                self._n_sum = (0 if first else self._n_sum) + int(n)
            if estimate is not None:
                se = estimate.violation_errors(f.detach(), self.alpha, self.form) if sampled else None
                if se is not None:
                    self._var_sum = self._var_sum + se.to(torch.float64).square()
                self._var_count += 1
        return loss

    # -- dual side ---------------------------------------------------------------------------------------
    def dual_step_(self) -> bool:
        """Called once per optimizer step (by ``PrimalDual.step``). Returns whether λ moved.

        With ``dual_cadence="step"`` every ``dual_every``-th call updates λ from the mean ĝ recorded since the
        last update (steps without a recorded ĝ leave λ alone); with "epoch" it only counts steps.
        """
        self._steps += 1
        if self.dual_cadence == "epoch" or self._steps % self.dual_every != 0:
            return False
        return self._flush()

    def end_epoch(self, f: Tensor | None = None) -> bool:
        """Dual step of the "epoch" cadence (also flushes a partial window of the "step" cadence).

        Args:
            f: optional L+1 losses measured on a full pass (e.g. a held-out or training evaluation); when
                given, ĝ is computed from them and the accumulated batch estimates are dropped. Otherwise ĝ is
                the mean over the batches recorded since the last dual step.

        Returns:
            Whether λ moved.
        """
        if f is not None:
            f = f.detach()
            if f.dim() != 1 or f.numel() != self.num_layers + 1:
                raise ModelError(
                    f"end_epoch expects {self.num_layers + 1} losses, got shape {tuple(f.shape)}"
                )
            self._to(f.device)
            g = descent_violations(f, self.alpha, form=self.form)
            self._g_sum = g.to(torch.float64).clone()
            self._g_count = 1
            self._var_sum, self._var_count = torch.zeros_like(self._var_sum), 1  # a full pass: exact
            self._last_f, self._last_g = f, g
        return self._flush()

    def extrapolate_(self) -> None:
        """Not supported: LayerwiseDescent takes plain dual steps (``extragradient`` is False)."""
        raise ConfigError(
            "LayerwiseDescent takes no extra-gradient steps; express the constraint with dl.ConstraintSet("
            "..., extragradient=True) instead"
        )

    def violation_labels(self) -> list[int]:
        """The constrained layers (1-based), one per entry of :meth:`pending_violations` (reads the host)."""
        return [int(k) + 1 for k in self._index.tolist()]

    def pending_violations(self) -> Tensor | None:
        """The sum of the ĝ recorded since the last dual step, over the constrained layers (None: none
        recorded). :class:`PrimalDual` checks it is finite before the primal step, with the gradients."""
        if self._g_count == 0:
            return None
        return self._g_sum[self._index]

    def pending_state(self) -> tuple[Tensor, int, Tensor, int]:
        """What the next dual step would average (the ĝ sum and count, and the window's summed variances),
        to hand back to :meth:`restore_pending_` when a training step is skipped: ``fit`` drops a
        non-finite step's ĝ so the next dual step neither sees nor raises on it. No copy, no host sync."""
        return self._g_sum, self._g_count, self._var_sum, self._var_count, self._n_sum

    def restore_pending_(self, state: tuple) -> None:
        """Forget the ĝ recorded since :meth:`pending_state` returned ``state``."""
        g_sum, count, *var = state
        self._g_sum, self._g_count = g_sum.to(self._g_sum.device), int(count)
        if var:
            self._var_sum, self._var_count = var[0].to(self._var_sum.device), int(var[1])
        else:  # a state from before the variances were kept
            self._var_sum, self._var_count = torch.zeros_like(self._var_sum), 0
        self._n_sum = var[2] if len(var) > 2 else None

    def _flush(self) -> bool:
        if self._g_count == 0:
            return False
        self.duals.update_(self._g_sum / self._g_count, weight=self._n_sum)
        # the window mean's standard error, when every recorded step stated its own (exact reads: 0)
        known = self._var_count == self._g_count
        self._dual_se = self._var_sum.sqrt() / self._g_count if known else None
        self._g_sum = torch.zeros_like(self._g_sum)
        self._g_count = 0
        self._var_sum = torch.zeros_like(self._var_sum)
        self._var_count = 0
        self._n_sum = None
        return True

    def _to(self, device: torch.device) -> None:
        if self._g_sum.device != device:
            self.duals.to_(device)
            self._g_sum = self._g_sum.to(device)
            self._var_sum = self._var_sum.to(device)
            self._index = self._index.to(device)
            self.alpha = self.alpha.to(device)

    # -- inspection --------------------------------------------------------------------------------------
    @property
    def multipliers(self) -> Tensor:
        """λ_1..λ_L (float64 [L]; 0 on unconstrained layers)."""
        return self.duals.lam

    @property
    def slacks(self) -> Tensor | None:
        """u_1..u_L of the resilient relaxation (λ/a for the decay form), or None for hard constraints."""
        return self.duals.slacks

    @property
    def dual_standard_error(self) -> Tensor | None:
        """The standard error of the mean ĝ [L] the last dual step ascended, sqrt(Σ_t se_t²) / W over its
        window of W recorded steps (0 for exact reads), or None: no dual step yet, or a step of the window
        was recorded without the readout's ``estimate``. A device tensor; nothing is read."""
        return self._dual_se

    @property
    def violations(self) -> Tensor | None:
        """ĝ of the last ``lagrangian`` call (detached), or None before the first."""
        return self._last_g

    def log_values(self, estimate: Any = None) -> LazyLogs:
        """Per-layer f̂, ĝ, λ (and u) of the last ``lagrangian`` call, kept on the device until read.

        Keys as :meth:`log_dict`; the first read of any value reads all of them back at once (one host
        read, which also reads the deferred guards and runs :meth:`check_health` when one fired), so a
        training step that only builds its logs never syncs.

        Args:
            estimate: what the readout that gave the last ``lagrangian`` call its f read, e.g.
                ``CausalLMReadout.last_estimate`` (anything with ``sampled``, ``k``, ``n`` and
                ``violation_errors(f, alpha, form)``). When it says ``sampled``, layers 0..L-1 were read on
                k of the N targets, so f_0..f_{L-1} and every ĝ_l (which reads f_{l-1}) are estimates, and
                the keys say so: ``f_sampled/l`` (l < L; ``f/L`` stays, it is exact), ``g_sampled/l``,
                ``g_se/l`` (the standard error of ĝ_l, estimated from the same draw), ``readout/sampled_k``
                and ``readout/n``. None, or an exact read: the plain keys. Once a dual step has ascended a
                window whose standard errors are known, ``dual_g_se/l`` is that window mean's
                (:attr:`dual_standard_error`).
        """
        vectors: dict[str, tuple[Tensor, int]] = {}
        scalars: dict[str, float] = {}
        if self._last_f is not None:
            if estimate is not None and getattr(estimate, "sampled", False):
                # renamed, not only flagged: a curve named f/3 in a dashboard would still read as exact
                last = self.num_layers
                vectors["f_sampled"] = (self._last_f[:-1], 0)
                vectors["f"] = (self._last_f[last:], last)
                vectors["g_sampled"] = (self._last_g, 1)
                # device tensors, read back with the other values at a log step: no host read here
                vectors["g_se"] = (estimate.violation_errors(self._last_f, self.alpha, self.form), 1)
                scalars = {"readout/sampled_k": float(estimate.k), "readout/n": float(estimate.n)}
            else:
                vectors["f"] = (self._last_f, 0)
                vectors["g"] = (self._last_g, 1)
        vectors["lambda"] = (self.duals.lam, 1)
        if self._dual_se is not None:
            vectors["dual_g_se"] = (self._dual_se, 1)
        slacks = self.slacks
        if slacks is not None:
            vectors["u"] = (slacks, 1)
        flag = self.health_flag()
        gaming = self._flat_while_holding()
        if gaming is not None:
            flag = gaming if flag is None else flag | gaming
        return LazyLogs(scalars, vectors, alarm=None if flag is None else (flag, self._on_alarm))

    def _flat_while_holding(self) -> Tensor | None:
        """A device bool: the constraints hold on a profile that only descends at the last layer.

        With the paper's settings (nothing detached, layer 1 constrained), an encoder can meet every
        constraint without making its layers predictive: the Lagrangian's weight on f_0 is −(1−α_1)λ_1 < 0,
        so it pushes f_0 up, and small α lets f_1..f_{L−1} sit near chance a margin below it, while all the
        descent happens at layer L. Flagged when every constrained ĝ_l <= 0 and less than a quarter of the
        descent f_0 − f_L happens before the last layer. None (nothing to check) when ``detach_prev`` is on,
        or no ĝ was recorded.
        """
        if self.detach_prev or self._warned_flat or self._last_f is None or self.num_layers < 2:
            return None
        f, g = self._last_f, self._last_g
        holds = (g[self._index] <= 0).all()
        descent = f[0] - f[-1]
        flat = (descent > 0) & ((f[0] - f[-2]) < 0.25 * descent)
        return holds & flat

    def _on_alarm(self) -> None:
        """After a log read whose alarm fired: the deferred health check, and the flat-profile warning once."""
        self.check_health()
        gaming = self._flat_while_holding()
        if gaming is not None and bool(gaming):  # a read only on this rare path
            self._warned_flat = True
            warnings.warn(
                "LayerwiseDescent: every constraint holds, but the loss profile is flat until the last layer "
                "(less than a quarter of f_0 - f_L is gained before layer L): with nothing detached the "
                "Lagrangian pushes f_0 up (its weight is -(1-α_1)λ_1), so the constraints can be met without "
                "the layers becoming predictive. The studies use detach_prev=True and constrain_first=False; "
                "this warning is shown once",
                RuntimeWarning,
                stacklevel=3,
            )

    def log_dict(self, estimate: Any = None) -> dict[str, float]:
        """Per-layer f̂, ĝ, λ (and u) of the last ``lagrangian`` call: {"f/0": .., "g/1": .., "lambda/1": ..}
        (``f_sampled/l``, ``g_sampled/l`` and ``g_se/l`` instead when ``estimate`` says the readout sampled;
        see :meth:`log_values`).

        Reads the device (once); see :meth:`log_values` for the lazy form a training step should use.
        """
        return dict(self.log_values(estimate))

    # -- deferred guards ---------------------------------------------------------------------------------
    @property
    def defer_checks(self) -> bool:
        """Whether the dual step only records its guards on the device (set by :class:`PrimalDual`, which
        reads them with its one read-back per step) instead of reading them at once."""
        return self.duals.defer_checks

    @defer_checks.setter
    def defer_checks(self, value: bool) -> None:
        self.duals.defer_checks = bool(value)

    def health_flag(self) -> Tensor | None:
        """A device bool, True when a deferred guard of the dual step fired (None: nothing pending)."""
        return self.duals.health_flag()

    def check_health(self) -> None:
        """Read the deferred guards and raise ``NumericalError`` / ``InfeasibleConstraintError`` as the eager
        dual step would (nothing to read when the guards are not deferred or nothing is pending)."""
        self.duals.check_()

    # -- checkpointing -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, object]:
        """λ, u, the pending ĝ window (and its summed variances) and the counters (tensors on CPU; safe for
        ``weights_only`` loads)."""
        return {
            "num_layers": self.num_layers,
            "duals": self.duals.state_dict(),
            "g_sum": self._g_sum.cpu().clone(),
            "n_sum": self._n_sum,
            "g_count": self._g_count,
            "g_var_sum": self._var_sum.cpu().clone(),
            "g_var_count": self._var_count,
            "steps": self._steps,
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore what :meth:`state_dict` saved; the next dual step is the one the saved run would take."""
        if int(state.get("num_layers", -1)) != self.num_layers:
            raise CheckpointError(
                f"constraint state is for num_layers={state.get('num_layers')}, this one has {self.num_layers}; "
                "build LayerwiseDescent with the checkpoint's num_layers"
            )
        self.duals.load_state_dict(state["duals"])
        self._g_sum = state["g_sum"].to(device=self._g_sum.device, dtype=torch.float64).clone()
        self._n_sum = state.get("n_sum")  # absent in a checkpoint from before the weights: equal ranks
        self._g_count = int(state["g_count"])
        var = state.get("g_var_sum")
        if isinstance(var, Tensor):
            self._var_sum = var.to(device=self._var_sum.device, dtype=torch.float64).clone()
            self._var_count = int(state.get("g_var_count", 0))
        else:  # a checkpoint from before the variances were kept
            self._var_sum, self._var_count = torch.zeros_like(self._var_sum), 0
        self._steps = int(state["steps"])

    def __repr__(self) -> str:
        layers = (torch.nonzero(self.mask.cpu()).flatten() + 1).tolist()
        return (
            f"LayerwiseDescent(num_layers={self.num_layers}, form={self.form!r}, dual_lr={self.dual_lr}, "
            f"constrained={layers}, resilience={self.resilience}, cadence={self.dual_cadence!r}"
            f"x{self.dual_every})"
        )
