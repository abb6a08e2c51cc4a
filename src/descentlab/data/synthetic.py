r"""Synthetic problems with exact references, for the implicit-bias study (docs/horst.md).

Three float64 problems, each with a closed-form gradient and a reference computed exactly:

* under-determined least squares, X [n, d] Gaussian, y = X w* with a ``support``-sparse w* (n < d): the
  min-L2 interpolant (pinv) and the minimum L1 / L_inf norms over interpolants (linear programs);
* linearly separable classification: rows z_i = y_i x_i, y = sign(<x, teacher>) of a sparse teacher; the
  optimal margins  max_{||w||_p <= 1} min_i <z_i, w> = 1 / min{||w||_p : Z w >= 1}  for p = 1, inf;
* the same classification with heterogeneous column scales, z_ij = y_i x_ij s_j (below).

Heterogeneous scales. Column j is multiplied by s_j = 10^{kappa (r_j - 1/2)}, where r_j is a random
permutation of the midpoints (k + 1/2)/d, k = 0..d-1: the scales are evenly spread in log10 over kappa
decades (max/min = 10^{kappa (d-1)/d}), with the same x, labels and teacher as the homogeneous problem of
the same seed (kappa = 0 gives it back exactly). The labels do not depend on s, so the scales change only
the geometry: the gradient of any loss of the margins Zw is

    g_j = s_j gamma_j,   gamma_j = sum_i l'(<z_i, w>) y_i x_ij,

a factor s_j times a scale-free part. An optimizer whose update is invariant under g_j -> c_j g_j (sign
descent; Adam, for sqrt(v_hat) >> eps) moves every coordinate at the same rate whatever its scale, while
the L1-optimal separator (the LP below) puts its mass on the columns that buy the most margin per unit of
L1 norm, the large-s_j ones. This is the problem on which HORST's and HAM's mirror steps differ (see
:mod:`descentlab.experiments.implicit_bias`).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.optimize import linprog
from torch import Tensor

from descentlab.errors import NumericalError


def make_regression(n: int, d: int, support: int, seed: int) -> tuple[Tensor, Tensor]:
    """Gaussian design X [n, d] and y = X w* with a ``support``-sparse w* (float64)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    w = torch.zeros(d, dtype=torch.float64)
    w[:support] = 2 * torch.randn(support, generator=gen, dtype=torch.float64)
    return x, x @ w


def make_classification(n: int, d: int, support: int, seed: int) -> Tensor:
    """Rows z_i = y_i x_i, labels y = sign(<x, w*>) of a ``support``-sparse teacher (float64)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    teacher = torch.zeros(d, dtype=torch.float64)
    teacher[:support] = 1.0
    return torch.sign(x @ teacher)[:, None] * x


def column_scales(d: int, decades: float, seed: int) -> Tensor:
    """s_j = 10^{decades (r_j - 1/2)}, r a random permutation of the midpoints (k + 1/2)/d (module docs)."""
    gen = torch.Generator().manual_seed(seed + 7919)  # its own stream: the data of seed stay the same
    mid = (torch.randperm(d, generator=gen).to(torch.float64) + 0.5) / d
    return 10.0 ** (decades * (mid - 0.5))


def upper_half(d: int, seed: int) -> Tensor:
    """The d/2 columns of largest scale (by rank, so the same columns at every spread; a random half at 0)."""
    return column_scales(d, 1.0, seed) > 1.0


def make_heterogeneous_classification(
    n: int, d: int, support: int, seed: int, decades: float
) -> tuple[Tensor, Tensor]:
    """The separable problem of :func:`make_classification` with columns scaled by :func:`column_scales`.

    Returns:
        ``(z, s)``: the rows z_i = y_i x_i * s and the column scales s.
    """
    s = column_scales(d, decades, seed)
    return make_classification(n, d, support, seed) * s, s


def lp_min_norm(
    a_eq: np.ndarray | None, b_eq: np.ndarray | None, a_ge: np.ndarray | None, p: str
) -> tuple[float, np.ndarray]:
    """min ||w||_p (p in {"l1", "linf"}) s.t. a_eq w = b_eq, a_ge w >= 1, as a linear program (HiGHS).

    L1: w = w+ - w-, both >= 0, minimise sum(w+ + w-). L_inf: variables (w, t), |w_i| <= t, minimise t.

    Returns:
        ``(value, w)``: the optimal norm and a minimiser.
    """
    d = (a_eq if a_eq is not None else a_ge).shape[1]
    if p == "l1":
        c, lift = np.ones(2 * d), lambda a: np.hstack([a, -a])
        bounds: list = [(0, None)] * (2 * d)
    else:
        c, lift = np.r_[np.zeros(d), 1.0], lambda a: np.hstack([a, np.zeros((a.shape[0], 1))])
        bounds = [(None, None)] * d + [(0, None)]
    a_ub, b_ub = [], []
    if p == "linf":
        eye = np.eye(d)
        a_ub += [np.hstack([eye, -np.ones((d, 1))]), np.hstack([-eye, -np.ones((d, 1))])]
        b_ub += [np.zeros(2 * d)]
    if a_ge is not None:
        a_ub.append(-lift(a_ge))
        b_ub.append(-np.ones(a_ge.shape[0]))
    res = linprog(
        c,
        A_ub=np.vstack(a_ub) if a_ub else None,
        b_ub=np.concatenate(b_ub) if b_ub else None,
        A_eq=lift(a_eq) if a_eq is not None else None,
        b_eq=b_eq,
        bounds=bounds,
        method="highs",
    )
    if res.status != 0:
        raise NumericalError(f"linprog failed ({res.message}); try another seed or a larger d")
    w = res.x[:d] - res.x[d:] if p == "l1" else res.x[:d]
    return float(res.fun), w


def regression_references(x: Tensor, y: Tensor) -> dict[str, float | Tensor]:
    """The min-L2 interpolant (pinv) and the minimum L1 and L_inf norms of interpolants."""
    w_l2 = torch.linalg.pinv(x) @ y
    xn, yn = x.numpy(), y.numpy()
    return {
        "w_l2": w_l2,
        "l2": float(w_l2.norm()),
        "l1": lp_min_norm(xn, yn, None, "l1")[0],
        "linf": lp_min_norm(xn, yn, None, "linf")[0],
    }


def optimal_margins(z: Tensor) -> dict[str, float]:
    """max_{||w||_p <= 1} min_i <z_i, w> = 1 / min{||w||_p : z w >= 1}, for p = 1 and inf."""
    return {p: 1.0 / lp_min_norm(None, None, z.numpy(), p)[0] for p in ("l1", "linf")}


def l1_max_margin_separator(z: Tensor) -> Tensor:
    """A maximiser of the normalised L1 margin: argmin{||w||_1 : z w >= 1} (any positive multiple works)."""
    return torch.from_numpy(lp_min_norm(None, None, z.numpy(), "l1")[1])


def regression_grad(w: Tensor, x: Tensor, y: Tensor) -> Tensor:
    """Gradient of ||Xw - y||^2 / (2n)."""
    return x.T @ (x @ w - y) / x.shape[0]


def classification_grad(w: Tensor, z: Tensor) -> Tensor:
    """Gradient of log(mean_i exp(-<z_i, w>)): the exponential loss's gradient divided by the loss.

    The division keeps the scale-invariant direction and avoids underflow as margins grow; the steepest
    operators that normalise (sign, Adam, normalised GD) are unaffected by it.
    """
    return -(torch.softmax(-(z @ w), dim=0) @ z)


def normalized_margin(w: Tensor, z: Tensor, p: float) -> float:
    """min_i <z_i, w> / ||w||_p (0 at w = 0)."""
    norm = float(torch.linalg.vector_norm(w, ord=p))
    return float((z @ w).min()) / norm if norm > 0 else 0.0


def count_nonzeros(w: Tensor, rel_tol: float) -> int:
    """The number of |w_i| > rel_tol * max|w|."""
    top = float(w.abs().max())
    return int((w.abs() > rel_tol * top).sum()) if top > 0 else 0


def l1_share(w: Tensor, mask: Tensor) -> float:
    """The fraction of ||w||_1 on the coordinates of ``mask`` (nan at w = 0)."""
    total = float(w.abs().sum())
    return float(w.abs()[mask].sum()) / total if total > 0 else math.nan


def separator_metrics(
    w: Tensor | None, z: Tensor, best: dict[str, float], large: Tensor, tol: float
) -> dict[str, float]:
    """L1 / L_inf margins of ``w`` over the optima ``best`` (:func:`optimal_margins`), its non-zeros and its
    L1 share on the ``large`` columns; all nan when ``w`` is None (a run that overflowed)."""
    if w is None:
        return dict.fromkeys(("l1_margin_ratio", "linf_margin_ratio", "nnz", "large_share"), math.nan)
    return {
        "l1_margin_ratio": normalized_margin(w, z, 1) / best["l1"],
        "linf_margin_ratio": normalized_margin(w, z, math.inf) / best["linf"],
        "nnz": count_nonzeros(w, tol),
        "large_share": l1_share(w, large),
    }


__all__ = [
    "classification_grad", "column_scales", "count_nonzeros", "l1_max_margin_separator", "l1_share",
    "lp_min_norm", "make_classification", "make_heterogeneous_classification", "make_regression",
    "normalized_margin", "optimal_margins", "regression_grad", "regression_references", "separator_metrics",
    "upper_half",
]  # fmt: skip
