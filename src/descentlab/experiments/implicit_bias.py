"""implicit-bias: which norm each optimizer geometry implicitly favours (METHODS.md section 2.2).

Two synthetic float64 problems with exact references:

* under-determined least squares from w = 0 (n < d): GD should reach the pseudo-inverse (min-L2) solution,
  L_inf steepest descent ("sign", dual-norm scaled so it settles) a near-min-L_inf one, greedy coordinate
  descent and hyperbolic mirror descent near-min-L1 ones; minimum L1 / L_inf norms come from ``linprog``;
* linearly separable classification with the exponential loss: the normalised margins
  min_i y_i <x_i, w> / ||w||_p against the optimal L1 and L_inf margins (``linprog``), and the number of
  non-zeros. HORST (mirror after Adam) should approach the optimal L1 margin; Adam sits near the L_inf one.

Every method is a real optimizer from :mod:`descentlab.optim` stepping one parameter vector whose gradient
is set in closed form: HORST and HAM are built from an :class:`~descentlab.optim.config.OptimizerConfig`
over the raw tensor (mirror step on it, no weight decay); the other geometries (steepest operators x the
hyperbolic mirror map, either order) are ``compose(...)`` directly, as they do not fit a model-level config.
Figures (trajectories, margin paths, final weights of the first seed) are drawn by
:mod:`descentlab.report.implicit_bias` from arrays this run saves under ``arrays/``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.optimize import linprog
from torch import Tensor

from descentlab.config import config_to_dict
from descentlab.errors import ConfigError, NumericalError
from descentlab.optim.compose import HyperbolicMirror, compose
from descentlab.optim.config import OptimizerConfig, build_optimizer
from descentlab.report.results import Curve, MethodResult, Results
from descentlab.report.stats import column_mean_std, mean_std
from descentlab.train.rundir import RunDir

METHODS = (
    "gd", "sign", "coordinate", "adam", "hyperbolic_md", "horst", "ham", "ngd+mirror_after",
    "sign+mirror_after", "gd+mirror_before", "sign+mirror_before", "adam+mirror_before",
)  # fmt: skip


@dataclass
class ProblemConfig:
    """One synthetic problem: ``n`` examples in ``d`` dimensions, a ``support``-sparse planted solution.

    ``lr`` is every method's step size; None (regression only) gives each method its stable step from the
    Hessian (:func:`regression_lr`).
    """

    n: int
    d: int
    support: int
    steps: int
    lr: float | None = None


@dataclass
class ImplicitBiasConfig:
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    regression: ProblemConfig = field(
        default_factory=lambda: ProblemConfig(n=20, d=60, support=4, steps=10000)
    )
    classification: ProblemConfig = field(
        default_factory=lambda: ProblemConfig(n=40, d=100, support=3, steps=5000, lr=1e-2)
    )
    horst_alpha: float = 1.0
    # HAM's own default (200) assumes tiny per-weight gradients; here |grad| ~ 1 and lr * 200 * |g| hits the
    # clamp every step and overflows, so HAM gets HORST's alpha: raw gradient vs Adam update, same strength.
    ham_alpha: float = 1.0
    gamma: float = 1e-6  # width of the hyperbolic potential (mirror_before, dual)
    nnz_rel_tol: float = 1e-3  # |w_i| > tol * max|w| counts as a non-zero
    curve_points: int = 8

    def __post_init__(self) -> None:
        unknown = sorted(set(self.methods) - set(METHODS))
        if unknown:
            raise ConfigError(f"unknown methods {unknown}; choose from {list(METHODS)}")
        if self.regression.n >= self.regression.d or self.classification.n >= self.classification.d:
            raise ConfigError("implicit bias needs n < d (under-determined / many separators)")
        if not self.seeds:
            raise ConfigError("seeds must list at least one seed")
        if self.classification.lr is None:
            raise ConfigError("classification.lr must be set (e.g. 1e-2): no Hessian fixes its step size")


CONFIG = ImplicitBiasConfig  # the nested ProblemConfigs are parts of it

PRESETS = {
    "quick": {"seeds": [0], "regression.steps": 8000, "classification.steps": 5000},
    "full": {"seeds": [0, 1, 2, 3, 4], "regression.steps": 30000, "classification.steps": 20000},
}


# ---- problems and exact references --------------------------------------------------------------------


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


def _lp_min_norm(a_eq: np.ndarray | None, b_eq: np.ndarray | None, a_ge: np.ndarray | None, p: str) -> float:
    """min ||w||_p (p in {"l1", "linf"}) s.t. a_eq w = b_eq, a_ge w >= 1, as a linear program."""
    d = (a_eq if a_eq is not None else a_ge).shape[1]
    if p == "l1":  # w = w+ - w-, both >= 0
        c, lift = np.ones(2 * d), lambda a: np.hstack([a, -a])
        bounds: list = [(0, None)] * (2 * d)
    else:  # variables (w, t): |w_i| <= t
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
    return float(res.fun)


def regression_references(x: Tensor, y: Tensor) -> dict[str, float | Tensor]:
    """The min-L2 interpolant (pinv) and the minimum L1 and L_inf norms of interpolants."""
    w_l2 = torch.linalg.pinv(x) @ y
    xn, yn = x.numpy(), y.numpy()
    return {
        "w_l2": w_l2,
        "l2": float(w_l2.norm()),
        "l1": _lp_min_norm(xn, yn, None, "l1"),
        "linf": _lp_min_norm(xn, yn, None, "linf"),
    }


def optimal_margins(z: Tensor) -> dict[str, float]:
    """max_{||w||_p <= 1} min_i <z_i, w> = 1 / min{||w||_p : z w >= 1}, for p = 1 and inf."""
    return {p: 1.0 / _lp_min_norm(None, None, z.numpy(), p) for p in ("l1", "linf")}


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
    norm = float(torch.linalg.vector_norm(w, ord=p))
    return float((z @ w).min()) / norm if norm > 0 else 0.0


def count_nonzeros(w: Tensor, rel_tol: float) -> int:
    top = float(w.abs().max())
    return int((w.abs() > rel_tol * top).sum()) if top > 0 else 0


# ---- methods ------------------------------------------------------------------------------------------


def make_optimizer(
    name: str, w: Tensor, lr: float, cfg: ImplicitBiasConfig, *, regression: bool
) -> torch.optim.Optimizer:
    """The optimizer called ``name``; in regression "sign" is L_inf steepest descent scaled by ||g||_1."""
    sign = "linf" if regression else "sign"
    after = HyperbolicMirror(alpha=cfg.horst_alpha, exp_clamp=5.0)
    before = HyperbolicMirror(alpha=1.0, gamma=cfg.gamma)
    table: dict[str, Callable[[], torch.optim.Optimizer]] = {
        "gd": lambda: compose([w], "gd", lr=lr),
        "sign": lambda: compose([w], sign, lr=lr),
        "coordinate": lambda: compose([w], "coordinate", lr=lr),
        "adam": lambda: compose([w], "adam", lr=lr),
        "hyperbolic_md": lambda: compose([w], "gd", before, "dual", lr=lr, mirror_tensors=True),
        "gd+mirror_before": lambda: compose([w], "gd", before, "mirror_before", lr=lr, mirror_tensors=True),
        "horst": lambda: build_optimizer(
            OptimizerConfig("horst", lr=lr, weight_decay=0.0, alpha=cfg.horst_alpha, mirror="all"), [w]
        ),
        "ham": lambda: build_optimizer(
            OptimizerConfig("ham", lr=lr, weight_decay=0.0, alpha=cfg.ham_alpha, beta=0.0, mirror="all"), [w]
        ),
        "ngd+mirror_after": lambda: compose([w], "normalized_gd", after, lr=lr, mirror_tensors=True),
        "sign+mirror_after": lambda: compose([w], sign, after, lr=lr, mirror_tensors=True),
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
    steps: int, record: list[int],
) -> tuple[Tensor, dict[int, Tensor]]:  # fmt: skip
    """Run ``steps`` optimizer steps from ``w0``; return the final w and snapshots at the steps in ``record``."""
    w = torch.nn.Parameter(w0.clone())
    opt = make(w)
    snaps = {0: w0.clone()} if 0 in record else {}
    with torch.no_grad():
        for k in range(1, steps + 1):
            w.grad = grad_fn(w.detach())
            opt.step()
            if k in record:
                snaps[k] = w.detach().clone()
    if not torch.isfinite(w).all():
        raise NumericalError("an iterate became non-finite; lower the learning rate or the number of steps")
    return w.detach(), snaps


def log_grid(steps: int, points: int) -> list[int]:
    return sorted({max(1, round(steps ** (i / (points - 1)))) for i in range(points)})


# ---- the experiment -----------------------------------------------------------------------------------


def run(cfg: ImplicitBiasConfig, run: RunDir) -> dict:
    rc, cc = cfg.regression, cfg.classification
    reg_grid, cls_grid = log_grid(rc.steps, cfg.curve_points), log_grid(cc.steps, cfg.curve_points)
    traj_grid, margin_grid = log_grid(rc.steps, 60), log_grid(cc.steps, 60)
    per: dict[str, dict[str, list]] = {m: {} for m in cfg.methods}
    trajectories: dict[str, Tensor] = {}  # first seed: [recorded steps, d] regression iterates
    final_cls: dict[str, Tensor] = {}
    margin_paths: dict[str, list[float]] = {}

    for seed in cfg.seeds:
        x, y = make_regression(rc.n, rc.d, rc.support, seed)
        ref = regression_references(x, y)
        z = make_classification(cc.n, cc.d, cc.support, seed)
        opt_margin = optimal_margins(z)
        for name in cfg.methods:
            rec = per[name]
            # regression from w = 0
            lr = rc.lr if rc.lr is not None else regression_lr(name, x)
            w, snaps = train(
                torch.zeros(rc.d, dtype=torch.float64),
                lambda v, x=x, y=y: regression_grad(v, x, y),
                lambda p, name=name, lr=lr: make_optimizer(name, p, lr, cfg, regression=True),
                rc.steps,
                sorted(set(reg_grid) | set(traj_grid)),
            )
            if seed == cfg.seeds[0]:
                trajectories[name] = torch.stack([snaps[k] for k in sorted(snaps)])
            for key, val in (
                ("reg_l2_ratio", float(w.norm()) / ref["l2"]),
                ("reg_l1_ratio", float(w.abs().sum()) / ref["l1"]),
                ("reg_linf_ratio", float(w.abs().max()) / ref["linf"]),
                ("reg_dist_pinv", float((w - ref["w_l2"]).abs().max())),
                ("reg_residual", float((x @ w - y).abs().max())),
                ("reg_nnz", count_nonzeros(w, cfg.nnz_rel_tol)),
            ):
                rec.setdefault(key, []).append(val)
            rec.setdefault("reg_l1_curve", []).append(
                [float(snaps[k].abs().sum()) / ref["l1"] for k in reg_grid]
            )
            # classification from w = 0
            w, snaps = train(
                torch.zeros(cc.d, dtype=torch.float64),
                lambda v, z=z: classification_grad(v, z),
                lambda p, name=name: make_optimizer(name, p, cc.lr, cfg, regression=False),
                cc.steps,
                sorted(set(cls_grid) | set(margin_grid)),
            )
            if seed == cfg.seeds[0]:
                final_cls[name] = w
                margin_paths[name] = [
                    normalized_margin(snaps[k], z, 1) / opt_margin["l1"] for k in margin_grid
                ]
            for key, val in (
                ("cls_l1_margin_ratio", normalized_margin(w, z, 1) / opt_margin["l1"]),
                ("cls_linf_margin_ratio", normalized_margin(w, z, math.inf) / opt_margin["linf"]),
                ("cls_nnz", count_nonzeros(w, cfg.nnz_rel_tol)),
            ):
                rec.setdefault(key, []).append(val)
            rec.setdefault("cls_margin_curve", []).append(
                [normalized_margin(snaps[k], z, 1) / opt_margin["l1"] for k in cls_grid]
            )
            run.log(seed=seed, method=name, **{k: v[-1] for k, v in rec.items() if not k.endswith("curve")})

    methods = {}
    for name, rec in per.items():
        metrics = {k: mean_std(v, impl="numpy")[0] for k, v in rec.items() if not k.endswith("curve")}
        curves = {}
        for key, grid, metric in (
            ("reg_l1_curve", reg_grid, "||w||_1 / min L1 (regression)"),
            ("cls_margin_curve", cls_grid, "L1 margin / optimal (classification)"),
        ):
            mean, std = column_mean_std(rec[key], impl="numpy")
            curves[key.replace("_curve", "")] = Curve("step", grid, metric, mean, std)
        methods[name] = MethodResult(metrics=metrics, curves=curves)

    def cell(name: str, key: str, digits: int = 3) -> str:
        mean, std = mean_std(per[name][key], impl="numpy")
        return f"{mean:.{digits}g} ± {std:.2g}" if len(cfg.seeds) > 1 else f"{mean:.{digits}g}"

    tables = [
        {
            "title": "Regression (from w = 0): norms of the interpolant found, relative to the exact minima",
            "columns": ["method", "||w||2 / pinv", "||w||1 / min L1", "||w||inf / min Linf", "max residual",
                        "max |w - pinv|", "non-zeros"],
            "rows": [[m, cell(m, "reg_l2_ratio", 4), cell(m, "reg_l1_ratio", 4), cell(m, "reg_linf_ratio", 4),
                      cell(m, "reg_residual", 2), cell(m, "reg_dist_pinv", 2), cell(m, "reg_nnz")]
                     for m in cfg.methods],
        },
        {
            "title": "Separable classification: normalised margins relative to the optimal margins (linprog)",
            "columns": ["method", "L1 margin / optimal", "Linf margin / optimal", "non-zeros"],
            "rows": [[m, cell(m, "cls_l1_margin_ratio", 4), cell(m, "cls_linf_margin_ratio", 4),
                      cell(m, "cls_nnz")] for m in cfg.methods],
        },
    ]  # fmt: skip
    # figure data of the first seed, drawn by report/implicit_bias.py
    record = sorted(set(reg_grid) | set(traj_grid))
    run.save_arrays("arrays/trajectories.npz", steps=np.asarray(record), **_numpy(trajectories))
    run.save_arrays("arrays/margins.npz", steps=np.asarray(margin_grid), **_numpy(margin_paths))
    run.save_arrays("arrays/final-weights.npz", **_numpy(final_cls))
    return Results(
        experiment="implicit-bias",
        config=config_to_dict(cfg),
        protocol={
            "regression": f"n={rc.n}, d={rc.d}, {rc.support}-sparse planted solution, squared loss, w0 = 0, "
            f"{rc.steps} steps; 'sign' = L_inf steepest descent scaled by ||g||_1",
            "classification": f"n={cc.n}, d={cc.d}, labels of a {cc.support}-sparse teacher, exponential loss "
            f"(gradient of its log), w0 = 0, {cc.steps} steps, lr={cc.lr}",
            "references": "pinv (min L2); scipy linprog/HiGHS (min L1 / L_inf interpolants, optimal margins)",
            "seeds": list(cfg.seeds),
            "dtype": "float64",
            "horst_alpha": cfg.horst_alpha,
            "ham_alpha": cfg.ham_alpha,
            "gamma": cfg.gamma,
            "nnz": f"|w_i| > {cfg.nnz_rel_tol} max|w|",
        },
        methods=methods,
        tables=tables,
        notes=[
            "Every number is a mean over seeds (± std across seeds when there is more than one seed).",
            "HORST's L1 bias shows on classification; on regression it behaves like Adam (METHODS.md 2.2).",
        ],
    ).to_dict()


def _numpy(arrays: dict[str, Tensor | list[float]]) -> dict[str, np.ndarray]:
    return {name: np.asarray(a.numpy() if isinstance(a, Tensor) else a) for name, a in arrays.items()}
