r"""One parameter vector trained by a named optimizer geometry, its gradient given in closed form.

The geometries of the implicit-bias study, each a real optimizer of
:mod:`descentlab.optim`: the steepest operators of :func:`~descentlab.optim.compose.compose` (gd, sign /
linf, coordinate, adam, normalised GD), the hyperbolic mirror map composed with them in either order, exact
hyperbolic mirror descent (``dual``), and HORST / HAM built from an
:class:`~descentlab.optim.config.OptimizerConfig` over the raw tensor (mirror step on it, no weight decay,
HAM's beta = 0). Theorem 4.7's finite-p objects ``lp<p>+mirror_after`` (:data:`LP_GEOMETRIES`) are L_p
steepest descent (:func:`~descentlab.optim.compose.lp_update`) composed with the same mirror step
(:class:`LpMirrorAfter`). ``train`` steps the vector with ``w.grad`` set by a gradient function, so a run
costs one closed-form gradient and one optimizer step per iteration.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from descentlab.errors import NumericalError
from descentlab.optim.compose import HyperbolicMirror, LpMirrorAfter, compose
from descentlab.optim.config import OptimizerConfig, build_optimizer

GEOMETRIES = (
    "gd", "sign", "coordinate", "adam", "hyperbolic_md", "horst", "ham", "ngd+mirror_after",
    "sign+mirror_after", "gd+mirror_before", "sign+mirror_before", "adam+mirror_before",
)  # fmt: skip
# Theorem 4.7's objects at finite p > 2: L_p steepest descent, then the mirror step (name -> p). The
# decaying-step theorem run uses them beside ngd+mirror_after (p = 2) and sign+mirror_after (p = inf).
LP_GEOMETRIES = {"lp3+mirror_after": 3.0, "lp4+mirror_after": 4.0, "lp8+mirror_after": 8.0}


def make_geometry(
    name: str, w: Tensor, lr: float, *, regression: bool, horst_alpha: float, ham_alpha: float, gamma: float
) -> torch.optim.Optimizer:
    """The optimizer called ``name`` over ``w``; in regression "sign" is L_inf steepest descent scaled by
    ||g||_1 (plain sign steps never settle on an interpolant), and ``lp<p>`` likewise L_p steepest descent
    scaled by ||g||_q (:data:`LP_GEOMETRIES`).

    ``horst_alpha`` drives HORST and the mirror_after compositions (clamp 5), ``ham_alpha`` HAM, ``gamma``
    the width of the hyperbolic potential of mirror_before and dual (their alpha is 1).
    """
    sign = "linf" if regression else "sign"
    after = HyperbolicMirror(alpha=horst_alpha, exp_clamp=5.0)
    before = HyperbolicMirror(alpha=1.0, gamma=gamma)
    table: dict[str, Callable[[], torch.optim.Optimizer]] = {
        "gd": lambda: compose([w], "gd", lr=lr),
        "sign": lambda: compose([w], sign, lr=lr),
        "coordinate": lambda: compose([w], "coordinate", lr=lr),
        "adam": lambda: compose([w], "adam", lr=lr),
        "hyperbolic_md": lambda: compose([w], "gd", before, "dual", lr=lr, mirror_tensors=True),
        "gd+mirror_before": lambda: compose([w], "gd", before, "mirror_before", lr=lr, mirror_tensors=True),
        "horst": lambda: build_optimizer(
            OptimizerConfig("horst", lr=lr, weight_decay=0.0, alpha=horst_alpha, mirror="all"), [w]
        ),
        "ham": lambda: build_optimizer(
            OptimizerConfig("ham", lr=lr, weight_decay=0.0, alpha=ham_alpha, beta=0.0, mirror="all"), [w]
        ),
        "ngd+mirror_after": lambda: compose([w], "normalized_gd", after, lr=lr, mirror_tensors=True),
        "sign+mirror_after": lambda: compose([w], sign, after, lr=lr, mirror_tensors=True),
        **{
            lp: lambda p=p: LpMirrorAfter([w], lr=lr, p=p, mirror=after, dual_scaled=regression)
            for lp, p in LP_GEOMETRIES.items()
        },
        "sign+mirror_before": lambda: compose([w], sign, before, "mirror_before", lr=lr, mirror_tensors=True),
        "adam+mirror_before": lambda: compose(
            [w], "adam", before, "mirror_before", lr=lr, mirror_tensors=True
        ),
    }
    return table[name]()


def regression_lr(name: str, x: Tensor) -> float:
    """Stable step sizes from the Hessian H = X^T X / n; Adam-like methods use a fixed small step."""
    h = x.T @ x / x.shape[0]
    smooth = float(torch.linalg.eigvalsh(h).max())
    if name in ("sign", "sign+mirror_after", "sign+mirror_before"):
        return 1.0 / float(h.abs().sum())  # smoothness w.r.t. L_inf
    if name == "coordinate":
        return 0.1 / float(h.diagonal().max())
    if name in ("adam", "horst", "ham", "adam+mirror_before", "ngd+mirror_after"):
        return 1e-3
    if name == "hyperbolic_md":  # w' ~ w - lr sqrt(w^2 + gamma^2) g: the curvature grows with |w|
        return 0.5 / smooth
    if name == "gd+mirror_before":  # its explicit (first-order) step is less stable than the exact dual one
        return 0.25 / smooth
    return 1.0 / smooth


def train(
    w0: Tensor, grad_fn: Callable[[Tensor], Tensor], make: Callable[[Tensor], torch.optim.Optimizer],
    steps: int, record: list[int], lr_at: Callable[[int], float] | None = None,
) -> tuple[Tensor, dict[int, Tensor]]:  # fmt: skip
    """Run ``steps`` optimizer steps from ``w0``; return the final w and snapshots at the steps in ``record``.

    ``lr_at(k)`` (when given) is the learning rate of step k = 1..steps, set on every param group before
    the step (a decaying step); otherwise the optimizer keeps the lr it was made with.
    """
    w = torch.nn.Parameter(w0.clone())
    opt = make(w)
    snaps = {0: w0.clone()} if 0 in record else {}
    with torch.no_grad():
        for k in range(1, steps + 1):
            if lr_at is not None:
                for group in opt.param_groups:
                    group["lr"] = lr_at(k)
            w.grad = grad_fn(w.detach())
            opt.step()
            if k in record:
                snaps[k] = w.detach().clone()
    if not torch.isfinite(w).all():
        raise NumericalError("an iterate became non-finite; lower the learning rate or the number of steps")
    return w.detach(), snaps


def log_grid(steps: int, points: int) -> list[int]:
    """About ``points`` steps spread evenly in log scale over 1..steps (duplicates merged)."""
    return sorted({max(1, round(steps ** (i / (points - 1)))) for i in range(points)})


__all__ = [
    "GEOMETRIES",
    "LP_GEOMETRIES",
    "LpMirrorAfter",
    "log_grid",
    "make_geometry",
    "regression_lr",
    "train",
]
