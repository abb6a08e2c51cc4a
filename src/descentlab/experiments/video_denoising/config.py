"""The config of the video-denoising study: its methods (one base ``MethodConfig`` edited by a spec per
label), grids, controls and presets. What the study judges, and its one primary endpoint (UT's constrained
minus ERM test RMSE at gamma > 1), is declared in :mod:`.claims`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from descentlab.constrained.config import DescentConfig
from descentlab.data.video_data import VideoDataConfig
from descentlab.errors import ConfigError
from descentlab.evaluation.video_baselines import BASELINES
from descentlab.models.denoisers import UnrolledConfig
from descentlab.optim.config import OptimizerConfig
from descentlab.study.cells import Design
from descentlab.study.tuning_rules import check_equal_budgets, check_tune_seed
from descentlab.train.loop import TrainConfig
from descentlab.train.recipe import MethodConfig, with_overrides

# "deep-supervision" is a control: the mean of the per-layer losses f_1..f_L, i.e. the same per-layer signal
# as the constrained objective with fixed, equal weights instead of multipliers. "blind" is ERM on a range of
# noise levels (see `blind`).
SPECS = {
    "erm": "",
    "constrained": "objective=constrained",
    "resilient": "objective=constrained constraint.resilient=true",
    "deep-supervision": "objective=deep-supervision",
    "blind": "",
}
# the frozen-λ control: label -> the constrained label whose final multipliers it holds fixed
FROZEN = {"frozen-lambda": "constrained"}


def _base_method() -> MethodConfig:
    return MethodConfig(
        optimizer=OptimizerConfig(lr=3e-3, weight_decay=0.0, decay="all", schedule="cosine"),
        constraint=DescentConfig(
            dual_lr=0.05,
            # MSE shrinks by orders of magnitude across layers: the ratio form is scale-free
            form="ratio",
            # Without it the constraint raises f_0 (UT's f_0 grew 6x in 20 steps in a pilot): f_0 has weight
            # -(1 - α) λ_1 in the Lagrangian. Detached, every constraint only pushes its own layer down.
            detach_prev=True,
            constrain_first=True,
            penalty=1.0,  # resilient methods only
            slack_lr=None,  # 1/penalty
        ),
    )


ARCHITECTURES = ("ut", "dust")
MSE, LAYER_MSE, RMSE = "mse", "layer_mse", "rmse"  # the cell store's metrics (module docs)


def arch_of(method: str) -> str:
    """``ut`` of ``ut-erm``."""
    return method.split("-", 1)[0]


def label_of(method: str) -> str:
    """``erm`` of ``ut-erm``."""
    return method.split("-", 1)[1]


def budget_name(method: str, steps: int) -> str:
    """The arm of ``method`` retrained for ``steps`` (a point of the budget curve)."""
    return f"{method}@{int(steps)}"


def cell_design(
    *,
    methods: Sequence[str],
    baselines: Sequence[str],
    gammas: Sequence[float],
    seeds: Sequence[int],
    budget_steps: Sequence[int] = (),
    budget_arms: Sequence[str] = (),
    examples: int | None = None,
) -> Design:
    """The design record: every learned method, baseline and budget point is an arm."""
    extra = {"gammas": [float(g) for g in gammas], "methods": list(methods), "baselines": list(baselines)}
    extra["budget_steps"] = sorted(int(s) for s in budget_steps)
    return Design((*methods, *baselines, *budget_arms), seeds=tuple(seeds), examples=examples, extra=extra)


@dataclass
class VideoDenoisingConfig:
    data: VideoDataConfig = field(default_factory=VideoDataConfig)
    model: UnrolledConfig = field(default_factory=UnrolledConfig)
    method: MethodConfig = field(default_factory=_base_method)  # the base every method's spec edits
    specs: dict[str, str] = field(default_factory=lambda: dict(SPECS))  # label -> MethodConfig overrides
    # the labels of `specs` and `frozen` to train, in order
    methods: list[str] = field(default_factory=lambda: [*SPECS, *FROZEN])
    # label -> [γ_low, γ_high]: ERM trained on σ ~ U(γ_low, γ_high)·σ_train per example (positive control)
    blind: dict[str, list[float]] = field(default_factory=lambda: {"blind": [0.0, 3.0]})
    # label -> the constrained label whose final λ (same architecture and seed) it holds fixed
    frozen: dict[str, str] = field(default_factory=lambda: dict(FROZEN))
    lr_grid: list[float] = field(default_factory=lambda: [1e-3, 3e-3])  # the constrained methods' lrs
    constraint_grid: list[str] = field(  # crossed with lr_grid for constrained methods
        default_factory=lambda: ["constraint.dual_lr=0.05", "constraint.dual_lr=0.5"]
    )
    # the candidates of a method without a constraint (ERM and its controls): one per lr, as many as the
    # constrained methods' lr_grid x constraint_grid, so that every method gets the same tuning budget
    unconstrained_lr_grid: list[float] = field(default_factory=lambda: [3e-4, 1e-3, 3e-3, 1e-2])
    # label -> its own candidates (override specs), replacing lr_grid x constraint_grid for that label
    grid: dict[str, list[str]] = field(default_factory=dict)
    val_every: int = 50  # steps between validation points
    # Has ERM converged? Its chosen setting retrains (first seed) for this many times the steps, the cosine
    # schedule stretched to match; the gain in validation RMSE is reported (report.py). 0: off.
    budget_check: float = 2.0
    # Is a gain over ERM a budget effect? These labels retrain (first seed, the setting each chose) at each of
    # these step budgets, each compared with ERM of the same budget (claims.py, budget-*). []: off.
    budget_curve: list[int] = field(default_factory=list)
    budget_labels: list[str] = field(default_factory=lambda: ["erm", "constrained"])
    baselines: list[str] = field(default_factory=lambda: list(BASELINES))
    baseline_grid: dict[str, dict[str, list]] = field(default_factory=dict)  # name -> replaces grid entries
    # α per architecture. DUST starts as ISTA from x̂_0 = 0, whose layers already cut the MSE by ~50 % each,
    # so α = 0.1 never binds there; UT starts at x̂_0 ≈ y, and (1 - α)^L must stay above f_L / f_0 ≈ 0.4.
    alpha: dict[str, float] = field(default_factory=lambda: {"ut": 0.1, "dust": 0.5})
    architectures: list[str] = field(default_factory=lambda: list(ARCHITECTURES))
    seeds: list[int] = field(default_factory=lambda: [0])  # the evaluation seeds, every one reported
    # every grid of more than one candidate trains from this seed, never an evaluation seed (study.tuning)
    tune_seed: int = 1000
    gammas: list[float] = field(default_factory=lambda: [0.5, 1.0, 1.5, 2.0, 3.0])
    eval_batch_size: int = 250
    # Tiny models gain nothing from intra-op threads, and on a shared machine extra threads slow every step
    # many-fold (measured: 0.13 s vs 3.3 s per step with 2 threads on a loaded 2-core machine). 0: torch default.
    torch_threads: int = 1
    workers: int = 1  # jobs run in this many spawned processes (1: inline); results do not depend on it
    train: TrainConfig = field(
        default_factory=lambda: TrainConfig(max_steps=400, batch_size=64, log_every=25, progress=False)
    )

    def __post_init__(self) -> None:
        bad = [a for a in self.architectures if a not in ARCHITECTURES]
        if bad or not self.architectures:
            raise ConfigError(f"unknown or empty architectures {bad}; choose from {list(ARCHITECTURES)}")
        missing = [a for a in self.architectures if a not in self.alpha]
        if missing:
            raise ConfigError(f"alpha has no value for {missing}; set alpha.<arch>=0.1")
        known = [*self.specs, *self.frozen]
        unknown = [m for m in self.labels if m not in known]
        if unknown or not self.labels or "erm" not in self.labels:
            raise ConfigError(
                f"methods {unknown or self.labels} must name entries of specs or frozen {known}, "
                "erm included (every claim compares with it)"
            )
        for label, source in self.frozen.items():
            if label in self.labels and (source not in self.labels or source in self.frozen):
                raise ConfigError(f"frozen.{label}={source!r} must name a trained constrained label")
        if self.budget_check < 0 or 0 < self.budget_check <= 1:
            raise ConfigError(f"budget_check must be 0 (off) or > 1, got {self.budget_check}")
        if not self.lr_grid or not self.constraint_grid or not self.unconstrained_lr_grid:
            raise ConfigError(
                "lr_grid, constraint_grid and unconstrained_lr_grid need an entry each (constraint_grid: [''])"
            )
        for arch in self.architectures:  # a bad spec or α fails here, before any run directory is made
            for label in self.trained_labels:
                for spec in self.candidates(label):
                    with_overrides(self.method_config(arch, label), spec)
            for label, source in self.frozen.items():
                if label in self.labels and not self.method_config(arch, source).constrained:
                    raise ConfigError(f"frozen.{label}: {source!r} is not a constrained method")
        if not self.seeds or 1.0 not in self.gammas or not any(g > 1.0 for g in self.gammas):
            raise ConfigError("need a seed, and gammas with 1.0 and a value above it, e.g. gammas=[1.0,2.0]")
        if self.data.crop % self.model.patch_size:
            raise ConfigError(f"data.crop={self.data.crop} must be a multiple of model.patch_size")
        if not self.data.val_frac > 0:
            raise ConfigError("data.val_frac must be > 0: every setting is chosen on validation")
        if bad := [k for k, v in self.grid.items() if k not in self.trained_labels or not v]:
            raise ConfigError(f"grid.{bad[0]}: needs a trained label of methods and at least one candidate")
        if any(len(self.candidates(label)) > 1 for label in self.trained_labels):  # tuning is on
            check_equal_budgets(self.compared_grids)
        check_tune_seed(self.tune_seed, self.seeds)
        if self.budget_curve and (
            "erm" not in self.budget_labels
            or not set(self.budget_labels) <= set(self.trained_labels)
            or min(self.budget_curve) < 1
        ):
            raise ConfigError(
                f"budget_labels={self.budget_labels} must include erm and name trained labels of methods, "
                f"and budget_curve={self.budget_curve} positive step counts"
            )
        if unknown_b := [b for b in self.baselines if b not in BASELINES]:
            raise ConfigError(f"unknown baselines {unknown_b}; choose from {list(BASELINES)}")

    @property
    def labels(self) -> list[str]:
        return list(self.methods)

    @property
    def compared_grids(self) -> dict[str, list[str]]:
        """label -> candidates of every trained method a claim compares, the grids that must be of equal size.

        The blind positive controls are left out: a control tuned over fewer candidates than ERM is
        handicapped against it, so a positive control that still wins shows the run can see an effect."""
        return {label: self.candidates(label) for label in self.trained_labels if label not in self.blind}

    @property
    def trained_labels(self) -> list[str]:
        """The labels with their own grid search (the frozen controls take their source's setting)."""
        return [label for label in self.labels if label not in self.frozen]

    def method_config(self, arch: str, label: str) -> MethodConfig:
        """The base method with this architecture's α, edited by the label's spec."""
        base = replace(self.method, constraint=replace(self.method.constraint, alpha=self.alpha[arch]))
        return with_overrides(base, self.specs[label])

    def candidates(self, label: str) -> list[str]:
        """The grid of ``label``: override specs applied after its method spec, in grid order."""
        if label in self.grid:
            return list(self.grid[label])
        if not with_overrides(self.method, self.specs[label]).constrained:
            return [f"optimizer.lr={lr:g}" for lr in self.unconstrained_lr_grid]
        return [f"optimizer.lr={lr:g} {c}".strip() for lr in self.lr_grid for c in self.constraint_grid]


CONFIG = VideoDenoisingConfig

# What the two 16,000-step runs (presets "full" and "full-dust") share: ERM, the hard constraint and the blind
# positive control, 3 fresh evaluation seeds, tuned on tune_seed 1000 over the dual lrs 0.05 and 0.5.
CONVERGED = {
    "methods": ["erm", "constrained", "blind"],
    "seeds": [100, 101, 102],
    "tune_seed": 1000,
    "model.depth": 4,
    "train.max_steps": 16000,
    "constraint_grid": ["constraint.dual_lr=0.05", "constraint.dual_lr=0.5"],
    "grid": {"blind": ["optimizer.lr=3e-3"]},
    "budget_check": 0,
    "workers": 2,
    "val_every": 1000,
}

PRESETS = {
    "quick": {
        "data.size": 72,
        "data.n_train": 2000,
        "data.n_val": 200,
        "data.n_test": 300,
        "model.depth": 4,
        "model.num_atoms": 144,
        "train.max_steps": 150,
        "train.batch_size": 32,
        "lr_grid": [3e-3],
        "constraint_grid": ["constraint.dual_lr=0.05"],
        "unconstrained_lr_grid": [3e-3],
        "baseline_grid": {"nl-means": {"h": [0.1]}, "gaussian": {"sigma_t": [0.5, 1.0]}},
        "budget_check": 0,
    },
    # The declared run (claims.py, "Power"): UT only, at 16,000 steps, the budget the 2,000-step run's budget
    # curve reached without ERM converging (a 2 % per doubling budget does not fit the hour). 4 candidates per
    # compared method on tune_seed 1000 at that budget: the hard constraint 2 lrs x 2 dual lrs, ERM 4 lrs
    # spanning them; the blind positive control one (ERM's earlier choice; fewer candidates only handicap it).
    # 3 fresh evaluation seeds. 17 training jobs of about 5 min on one core, 2 workers: about 50 min.
    "full": {
        **CONVERGED,
        "architectures": ["ut"],
        "lr_grid": [3e-3, 1e-2],
        "unconstrained_lr_grid": [1e-3, 3e-3, 6e-3, 1e-2],
    },
    # The same protocol for DUST (secondary rows), the study's second run of the hour: a DUST step costs about
    # 1.6 UT steps, so 2 candidates per compared method (the hard constraint's lr 3e-3, its earlier choice, x 2
    # dual lrs; ERM 2 lrs), 13 training jobs of about 8 min: about 55 min.
    "full-dust": {
        **CONVERGED,
        "architectures": ["dust"],
        "lr_grid": [3e-3],
        "unconstrained_lr_grid": [3e-3, 1e-2],
    },
    # Is DUST's gain at gamma > 1 the lr? full-dust's hard constraint trained at lr 3e-3 and ERM at its chosen
    # 1e-2, and on the tuning seed ERM at 3e-3 matched the constraint there. Both at lr 3e-3 (the constraint
    # with its chosen dual lr 0.05), on full-dust's evaluation seeds 100-102, so the constrained runs repeat
    # that run's and ERM's are the arm it lacked; one candidate each (nothing tuned), no baselines or
    # control: 6 jobs of about 9 min, about 28 min on 2 idle cores. Power in claims.py.
    "full-dust-same-lr": {
        **CONVERGED,
        "architectures": ["dust"],
        "methods": ["erm", "constrained"],
        "lr_grid": [3e-3],
        "constraint_grid": ["constraint.dual_lr=0.05"],
        "unconstrained_lr_grid": [3e-3],
        "grid": {},
        "baselines": [],
    },
    # The 2,000-step protocol (History on the results page): both architectures, every method and control,
    # 3 evaluation seeds, ERM's convergence checked at 4,000 steps, with equal grids on tune_seed (the
    # History's run predates those: it tuned 4 lrs x 2 dual lrs on seed 0, also an evaluation seed).
    "full-2000": {
        "seeds": [0, 1, 2],
        "model.depth": 4,
        "train.max_steps": 2000,
        "lr_grid": [3e-3, 1e-2],
        "unconstrained_lr_grid": [1e-3, 3e-3, 1e-2, 3e-2],
        "workers": 2,
        "val_every": 100,
    },
    # Is the constrained model's gain a budget effect? ERM and the hard constraints at 2,000 (where the lr is
    # chosen, between the full run's choices) and then 4,000 to 16,000 steps; first seed, no baselines.
    "budget": {
        "seeds": [0],
        "model.depth": 4,
        "train.max_steps": 2000,
        "methods": ["erm", "constrained"],
        "lr_grid": [3e-3, 1e-2],
        "constraint_grid": ["constraint.dual_lr=0.5"],
        "unconstrained_lr_grid": [3e-3, 1e-2],
        "budget_check": 0,
        "budget_curve": [4000, 8000, 16000],
        "baselines": [],
        "workers": 2,
        "val_every": 200,
    },
    # The paper's datasets on one GPU (docs/paper-scale.md): UCSD Ped2 as its release unpacks under ./data
    # (data.video= a UCSD Ped1 / Ped2, CUHK Avenue or ShanghaiTech folder), trained on its training clips and
    # tested on its testing clips; 240-pixel-high frames cut into 8-frame 16x16 sequences, UT and DUST of
    # depth 8 and width 128, 16,000 steps of 256 sequences in bf16, the full run's equal grids on tune_seed,
    # 5 evaluation seeds, ERM's convergence checked at twice the steps (budget_check).
    "paper": {
        "data.video": "data/UCSD_Anomaly_Dataset.v1p2/UCSDped2",
        "data.split": "release",
        "data.size": 240,
        "data.num_frames": 8,
        "data.crop": 16,
        "data.time_stride": 4,
        "data.val_frac": 0.1,
        "data.n_train": None,
        "data.n_val": 5000,
        "data.n_test": 20000,
        "model.patch_size": 16,
        "model.depth": 8,
        "model.width": 128,
        "model.num_atoms": 256,
        "seeds": [0, 1, 2, 3, 4],
        "train.max_steps": 16000,
        "train.batch_size": 256,
        "train.mixed_precision": "bf16",
        "train.checkpoint_every": 2000,
        "lr_grid": [1e-3, 3e-3],
        "unconstrained_lr_grid": [3e-4, 1e-3, 3e-3, 1e-2],
        "val_every": 500,
        "eval_batch_size": 1024,
        "torch_threads": 0,
        "workers": 1,
    },
}


def design(cfg: VideoDenoisingConfig) -> Design:
    """The design record of a run of ``cfg`` (:func:`cell_design`); a budget-curve point is each of
    ``budget_labels`` per architecture at the base budget and at each of ``budget_curve``. The number of
    test sequences is left to the run (``data.n_test`` only caps it)."""
    methods = [f"{arch}-{label}" for arch in cfg.architectures for label in cfg.labels]
    steps: list[int] = []
    if cfg.budget_curve:
        if cfg.train.max_steps is None:
            raise ConfigError(
                "budget_curve needs train.max_steps: the curve's base point is named by its steps"
            )
        steps = sorted({int(cfg.train.max_steps), *cfg.budget_curve})
    points = [f"{arch}-{label}" for arch in cfg.architectures for label in cfg.budget_labels if steps]
    return cell_design(
        methods=methods,
        baselines=list(cfg.baselines),
        gammas=cfg.gammas,
        seeds=cfg.seeds,
        budget_steps=steps,
        budget_arms=[budget_name(arm, n) for arm in points for n in steps],
    )
