"""robust-sparse's claims: is a model trained under the descent constraints still more robust once pruned,
and does HORST make one-shot pruning cheaper?

This study is ours (neither paper makes it), so there is no paper number to quote: each claim states the
hypothesis the design was built to test.

Cells. The run's cell store (:mod:`descentlab.study.cells`) holds ``correct/<method>/<s>``, method m's
0/1 correctness ``[seed, draw, γ, example]`` after one-shot pruning to sparsity s (``0``: dense), with the
sparsities as the design's conditions and the γ grid in ``extra["gammas"]`` (0 first); runs made before
the store are read by ``legacy.py``. Every method sees the same test reviews under the same noise and
shares the training seeds, so cells pair across methods. With Γ = {γ >= 1}:

* robust accuracy of a cell: its mean over Γ, ``[seed, draw, example]`` (the draws are averaged into the
  cell by the interval);
* clean correctness: γ = 0, draw 0, ``[seed, example]`` (every draw of γ = 0 is the same input);
* damage of pruning to s: clean(s) − clean(0), per (seed, example).

Primary endpoint: ``robust-sparsest``, constrained-horst − erm-horst robust accuracy at the highest sparsity
the run prunes to. The question the study asks is "robust *and* sparse at once", so the endpoint is the
sparsest model the design makes; the 50 % level, where the earlier run's point estimate peaked, was seen
only after that run and is a secondary row like every other level.

Smallest effect of interest: 0.01 accuracy (one point, 8 of 800 reviews) for every directional claim. A
robustness gain below one point is not worth the constraint's cost (a readout per layer and a dual step),
and it is about a sixth of what the positive control gains (0.06-0.09 in the earlier run); a pruning
damage saved below one point is within the spread of one-shot magnitude pruning itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.experiments.robust_sparse.legacy import legacy_store
from descentlab.report.claims import CellFunction, Cells, ClaimSpec, MissingArrays
from descentlab.report.fidelity import Deviation, Fidelity, NotTested, lagrangian, percent, seeds
from descentlab.study.cells import CellStore

CORRECT = "correct"  # the store's metric: correctness [seed, draw, γ, example] per (method, sparsity)

ERM_HORST, CON_HORST = "erm-horst", "constrained-horst"
ERM_ADAMW, CON_ADAMW = "erm-adamw", "constrained-adamw"
NOISE_HORST = "erm-noise-horst"

SESOI = 0.01  # accuracy (module docs)
ROBUST_METRIC = "test accuracy under Gaussian embedding noise, mean over γ >= 1"


def claim_arrays(run_dir: Path) -> CellStore | dict[str, Any]:
    """The run's cell store; a run made before the store is read by :func:`legacy.legacy_store`; {} when
    the run saved neither (every claim pends)."""
    return CellStore.load(run_dir) or legacy_store(run_dir) or {}


def _store(arrays: Mapping[str, Any]) -> CellStore:
    if not isinstance(arrays, CellStore):
        raise MissingArrays("the cell store (arrays/cells.npz and arrays/design.json)")
    return arrays


def levels(store: Mapping[str, Any]) -> list[float]:
    """The requested sparsities of the run's design, ascending (0 first)."""
    found = sorted(_store(store).conditions(numeric=True))
    if not found:
        raise MissingArrays("the per-review correctness (the design lists no sparsity)")
    return found


def gammas(store: CellStore) -> list[float]:
    if "gammas" not in store.design.extra:
        raise MissingArrays("gammas (the γ grid of the design record)")
    return list(store.design.extra["gammas"])


def robust_cells(correct: np.ndarray, gammas: Sequence[float] | np.ndarray) -> np.ndarray:
    """Mean correctness over γ >= 1: ``[seed, draw, γ, example]`` -> ``[seed, draw, example]``."""
    noisy = [g for g, gamma in enumerate(gammas) if gamma >= 1.0]
    if not noisy:
        raise ValueError(f"the γ grid {list(gammas)} has no level >= 1 to average robust accuracy over")
    return np.asarray(correct, dtype=np.float64)[:, :, noisy, :].mean(axis=2)


def clean_cells(correct: np.ndarray) -> np.ndarray:
    """Clean correctness ``[seed, example]`` (γ = 0 is the first level; every draw of it is the same input)."""
    return np.asarray(correct, dtype=np.float64)[:, 0, 0, :]


def _damage(store: CellStore, method: str, s: float) -> np.ndarray:
    return clean_cells(store.get(CORRECT, method, s)) - clean_cells(store.get(CORRECT, method, 0.0))


def _at(s: float) -> str:
    return f"sparsity {s:g}"


def robust_pair(a: str, b: str, where: str) -> CellFunction:
    """Cells of ``a − b`` robust accuracy at the sparsest level (``"top"``) or at every other (``"rest"``),
    or at every level (``"all"``)."""

    def cells(arrays: Mapping[str, Any]) -> list[Cells]:
        store, found = _store(arrays), levels(arrays)
        grid = gammas(store)
        chosen = {"top": found[-1:], "rest": found[:-1], "all": found}[where]
        return [
            store.compare(CORRECT, a, b, s, label=_at(s), reduce=lambda c: robust_cells(c, grid))
            for s in chosen
        ]

    return cells


def prunable_cells(arrays: Mapping[str, Any]) -> list[Cells]:
    """Damage of erm-horst − damage of erm-adamw at every pruned level (clean accuracy)."""
    store = _store(arrays)
    return [
        Cells(_damage(store, ERM_HORST, s), _damage(store, ERM_ADAMW, s), ERM_HORST, ERM_ADAMW, _at(s))
        for s in levels(store)[1:]
    ]


def control_pruning_cells(arrays: Mapping[str, Any]) -> list[Cells]:
    """erm-adamw's clean accuracy at the sparsest level against its dense model."""
    store = _store(arrays)
    top = levels(store)[-1]
    a = clean_cells(store.get(CORRECT, ERM_ADAMW, top))
    b = clean_cells(store.get(CORRECT, ERM_ADAMW, 0.0))
    return [Cells(a, b, f"{ERM_ADAMW} at {top:g}", f"{ERM_ADAMW} dense", _at(top))]


CLAIMS: list[ClaimSpec] = [
    ClaimSpec(
        name="robust-sparsest",
        description="after one-shot pruning to the highest sparsity, the model trained under the descent "
        "constraints with HORST is more accurate under embedding noise (γ >= 1) than ERM with HORST",
        cells=robust_pair(CON_HORST, ERM_HORST, "top"),
        metric=ROBUST_METRIC,
        sesoi=SESOI,
        source="this study's hypothesis (the constrained paper claims robustness dense; HORST's, sparsity)",
        primary=True,
    ),
    ClaimSpec(
        name="robust",
        description="constrained HORST is more accurate under noise than ERM HORST, at the other sparsities",
        cells=robust_pair(CON_HORST, ERM_HORST, "rest"),
        metric=ROBUST_METRIC,
        sesoi=SESOI,
    ),
    ClaimSpec(
        name="robust-adamw",
        description="the same with AdamW as the primal optimizer (separates the constraint from HORST)",
        cells=robust_pair(CON_ADAMW, ERM_ADAMW, "all"),
        metric=ROBUST_METRIC,
        sesoi=SESOI,
    ),
    ClaimSpec(
        name="robust-and-sparse",
        description="constrained HORST is more accurate under noise than ERM with AdamW, the baseline a "
        "practitioner starts from",
        cells=robust_pair(CON_HORST, ERM_ADAMW, "all"),
        metric=ROBUST_METRIC,
        sesoi=SESOI,
    ),
    ClaimSpec(
        name="prunable",
        description="HORST's L1 bias makes one-shot pruning cheaper: ERM HORST loses less clean accuracy "
        "from its dense model than ERM AdamW (damage = clean(s) − clean(0))",
        cells=prunable_cells,
        metric="clean test accuracy lost to pruning (a negative number; greater = less lost)",
        sesoi=SESOI,
        source="the HORST paper's motivation (an L1 bias for sparse training); not a number it states here",
    ),
    ClaimSpec(
        name="control-noise",
        control=True,
        description="positive control of robustness: ERM trained on Gaussian embedding noise (γ_train = 1) is "
        "more accurate under noise than ERM; a run that cannot see this cannot see the primary",
        cells=robust_pair(NOISE_HORST, ERM_HORST, "all"),
        metric=ROBUST_METRIC,
        sesoi=SESOI,
    ),
    ClaimSpec(
        name="control-pruning",
        control=True,
        description="positive control of pruning: pruning AdamW's model to the highest sparsity costs clean "
        "accuracy, the loss that 'prunable' would recover",
        cells=control_pruning_cells,
        metric="clean test accuracy",
        direction="less",
        sesoi=SESOI,
    ),
]

# ---- against the papers: neither runs this combination, so each setting is set beside the nearest one --


def _constraint(c) -> str:
    label = next(m for m in c.methods if m.startswith("constrained"))
    return lagrangian(c.method_configs()[label].constraint)


DEVIATIONS = [
    Deviation("combination", "not run by either paper", lambda c: f"{', '.join(c.methods)}"),
    Deviation(
        "model and data",
        "constrained paper: DistilBERT / RoBERTa on IMDb, MNLI",
        lambda c: (
            f"{c.model}, {c.pooling} pooling; {c.data.name}, {c.data.n_train:,} training, {c.data.n_eval:,} test examples"
        ),
        "constrained paper, contribution 3",
    ),
    Deviation(
        "Lagrangian",
        "f_L + Σ_{l=1..L} λ_l (f_l − (1 − α_l) f_{l−1}), primal-dual",
        _constraint,
        "constrained paper, method",
    ),
    Deviation(
        "primal optimizer",
        "constrained paper: stochastic gradient descent on the Lagrangian",
        lambda c: f"{c.method.optimizer.name} α = {c.method.optimizer.alpha:g}, lr {c.method.optimizer.lr:g}",
        "constrained paper, Algorithm 1",
    ),
    Deviation(
        "pruning",
        "HORST paper: one-shot layer-wise magnitude pruning (GPT-2)",
        lambda c: f"one-shot, {c.pruning.scope}-wise, at {percent(c.pruning.sparsities)}",
        "HORST paper, language model results",
    ),
    Deviation(
        "noise",
        "Gaussian, uniform, discrete embedding noise, level γ",
        lambda c: (
            f"{', '.join(c.evaluation.kinds)} at γ ∈ {{{', '.join(f'{g:g}' for g in c.evaluation.gammas)}}} × embedding RMS"
        ),
    ),
    Deviation("seeds", "not stated", lambda c: seeds(c.seeds)),
]

NOT_TESTED: list[NotTested] = []

FIDELITY = Fidelity(DEVIATIONS, NOT_TESTED)
