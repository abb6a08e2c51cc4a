"""implicit-bias's config: the three synthetic problems, Theorem 4.7's own run, the heterogeneous-scale
study and the presets. The primary endpoint is declared in ``claims.py`` (``theorem-lp4-mirror``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from descentlab.errors import ConfigError
from descentlab.study.cells import Design

# the optimizer geometries a run can name (``jobs.make_optimizer`` builds each)
METHODS = (
    "gd", "sign", "coordinate", "adam", "hyperbolic_md", "horst", "ham", "ngd+mirror_after",
    "sign+mirror_after", "gd+mirror_before", "sign+mirror_before", "adam+mirror_before",
)  # fmt: skip
# Theorem 4.7's objects at finite p > 2: L_p steepest descent, then the mirror step (name -> p)
LP_GEOMETRIES = {"lp3+mirror_after": 3.0, "lp4+mirror_after": 4.0, "lp8+mirror_after": 8.0}
SCALE_METHODS = ("adam", "horst", "ham", "ngd+mirror_after", "sign+mirror_after")
# Theorem 4.7's objects in order of p: 2, 3, 4, 8 (the paper's finite p >= 2), then inf (outside its scope)
THEOREM_METHODS = ("ngd+mirror_after", *LP_GEOMETRIES, "sign+mirror_after")


@dataclass
class ProblemConfig:
    """One synthetic problem: ``n`` examples in ``d`` dimensions, a ``support``-sparse planted solution.

    ``lr`` is every method's step size; None (regression only) gives each method its stable step from the
    Hessian (:func:`~descentlab.experiments.implicit_bias.jobs.regression_lr`).
    """

    n: int
    d: int
    support: int
    steps: int
    lr: float | None = None


@dataclass
class TheoremConfig:
    """Theorem 4.7's own objects on the classification problem (one draw per evaluation seed): L_p steepest
    descent composed with the hyperbolic mirror step (M∘S, strength ``alpha``, clamp 5) at p = 2, 3, 4, 8
    and ∞, at the decaying step ``lr_k = lr / sqrt(k)``; the L1 margin over the optimum is recorded at
    ``points`` log-spaced steps.

    ``lr = 0.3``: the mirror step grows |w_j| by at most exp(alpha Σ_k lr_k) ≈ exp(2 alpha lr sqrt(steps))
    = exp(190) at 10^5 steps, the growth the constant-step classification run reaches (exp(0.01 · 20,000)),
    well inside float64 (exp(709)). ``methods = []`` skips it.
    """

    methods: list[str] = field(default_factory=lambda: list(THEOREM_METHODS))
    steps: int = 100_000
    lr: float = 0.3
    alpha: float = 1.0
    points: int = 60


@dataclass
class ScalesConfig:
    """The heterogeneous-scale classification (``jobs.py`` docs): one problem per spread in ``decades``.

    ``horst_alphas`` / ``ham_alphas``: the grids (of equal size) each method's alpha is chosen from per
    spread, by the mean L1 margin ratio on ``validation_seeds`` (a run that overflows scores -inf). The
    controls keep ``horst_alpha``. ``methods = []`` skips the study.
    """

    n: int = 40
    d: int = 100
    support: int = 3
    steps: int = 10000
    lr: float = 1e-2
    decades: list[float] = field(default_factory=lambda: [0.0, 1.0, 2.0, 3.0, 4.0])
    methods: list[str] = field(default_factory=lambda: list(SCALE_METHODS))
    horst_alphas: list[float] = field(default_factory=lambda: [0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0])
    ham_alphas: list[float] = field(default_factory=lambda: [0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0])
    validation_seeds: list[int] = field(default_factory=lambda: [100, 101])


@dataclass
class ImplicitBiasConfig:
    """Top-level keys; ``seeds`` are the evaluation seeds of every problem (one problem draw per seed)."""

    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    regression: ProblemConfig = field(
        default_factory=lambda: ProblemConfig(n=20, d=60, support=4, steps=10000)
    )
    classification: ProblemConfig = field(
        default_factory=lambda: ProblemConfig(n=40, d=100, support=3, steps=5000, lr=1e-2)
    )
    theorem: TheoremConfig = field(default_factory=TheoremConfig)
    horst_alpha: float = 1.0
    # HAM's own default (200) assumes tiny per-weight gradients; here |grad| ~ 1 and lr * 200 * |g| hits the
    # clamp every step and overflows, so HAM gets HORST's alpha: raw gradient vs Adam update, same strength.
    ham_alpha: float = 1.0
    gamma: float = 1e-6  # width of the hyperbolic potential (mirror_before, dual)
    nnz_rel_tol: float = 1e-3  # |w_i| > tol * max|w| counts as a non-zero
    curve_points: int = 8
    scales: ScalesConfig = field(default_factory=ScalesConfig)

    def __post_init__(self) -> None:
        if unknown := sorted(set(self.methods) - set(METHODS)):
            raise ConfigError(f"unknown methods {unknown}; choose from {list(METHODS)}")
        if self.regression.n >= self.regression.d or self.classification.n >= self.classification.d:
            raise ConfigError("implicit bias needs n < d (under-determined / many separators)")
        if not self.seeds:
            raise ConfigError("seeds must list at least one seed")
        th = self.theorem
        if sorted(set(th.methods) - set(THEOREM_METHODS)):
            raise ConfigError(f"theorem.methods: choose from {list(THEOREM_METHODS)}, got {th.methods}")
        if th.methods and (th.steps < 10 or not th.lr > 0 or not th.alpha > 0 or th.points < 2):
            raise ConfigError("theorem needs steps >= 10, lr > 0, alpha > 0 and points >= 2")
        sc = self.scales
        if sorted(set(sc.methods) - set(SCALE_METHODS)):
            raise ConfigError(f"scales.methods: choose from {list(SCALE_METHODS)}, got {sc.methods}")
        if sc.methods and (sc.n >= sc.d or not sc.decades or not sc.validation_seeds):
            raise ConfigError("scales needs n < d, at least one spread in decades and one validation seed")
        if set(sc.validation_seeds) & set(self.seeds):
            raise ConfigError("scales.validation_seeds must be disjoint from the evaluation seeds")
        if not sc.horst_alphas or not sc.ham_alphas:
            raise ConfigError("scales.horst_alphas and scales.ham_alphas must list at least one alpha")
        if self.classification.lr is None:
            raise ConfigError("classification.lr must be set (e.g. 1e-2): no Hessian fixes its step size")


CONFIG = ImplicitBiasConfig  # the nested ProblemConfig / TheoremConfig / ScalesConfig are parts of it

PRESETS = {
    "quick": {"seeds": [0], "regression.steps": 8000, "classification.steps": 5000, "scales.steps": 5000,
              "scales.decades": [0.0, 2.0, 4.0], "scales.validation_seeds": [100], "theorem.steps": 20000},
    # 20 evaluation seeds (HORST against HAM on equal scales needs >= 20; Theorem 4.7's run >= 10), validation
    # seeds 100-101 apart; about 40 min on the shared 2 cores. The primary endpoint and its sizing from the
    # pilot below are declared in claims.py (theorem-lp4-mirror, pilot_sizing).
    "full": {"seeds": list(range(20)), "regression.steps": 30000, "classification.steps": 20000},
    # the sizing pilot of Theorem 4.7's objects alone (claims.py), on seeds apart from every other run's
    "pilot": {"seeds": [204, 205, 206, 207], "methods": [], "scales.methods": []},
}  # fmt: skip


def design(cfg: ImplicitBiasConfig) -> Design:
    """The design record of a run of ``cfg`` (:mod:`descentlab.study.cells`): one value per seed; the run
    adds the steps it recorded Theorem 4.7's objects at to ``extra["theorem"]``."""
    arms = tuple(dict.fromkeys([*cfg.methods, *cfg.theorem.methods, *cfg.scales.methods]))
    decades = tuple(cfg.scales.decades) if cfg.scales.methods else ()
    extra = {"theorem": {"methods": list(cfg.theorem.methods)}} if cfg.theorem.methods else {}
    return Design(arms, decades, tuple(cfg.seeds), 1, extra)
