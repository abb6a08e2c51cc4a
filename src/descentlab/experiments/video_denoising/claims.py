"""What the video-denoising study judges: the constrained paper's claims on video denoising, with their
controls, each a comparison of training seeds.

The paper states its video claims without a number: trained at noise σ_train and tested at γ·σ_train, an
unrolled transformer trained with layer-wise descent constraints has a lower RMSE than ERM at high test
noise, degrades more gracefully, keeps its in-distribution RMSE, and its per-layer loss falls monotonically.

Statistics. Every claim is read off pooled quantities per training seed s, over the N test sequences n
(every sequence has the same number of pixels):

* RMSE: ``r_s(γ) = sqrt(mean_n mse_s(γ, n))`` of the final estimate, the RMSE of the tables;
* RMSE at γ > 1: the mean of ``r_s(γ)`` over the γ levels above 1;
* graceful degradation: the mean over γ > 1 of the pooled ratio ``r_s(γ) / r_s(1)`` (the per-sequence
  ratio is heavy-tailed: a sequence with a tiny RMSE at γ = 1 has a huge one);
* monotone descent: the rise ``Σ_{l=1..L} max(0, M_s(l) − M_s(l−1))`` of the pooled per-layer MSE
  ``M_s(l) = mean_n mse_s(1, l, n)`` at γ = 1 (0 for a monotone profile).

Cells. A statistic ``T_s = f(x̄_s)`` of per-seed means enters as its linearised per-sequence values

    t_{s,n} = T_s + ∇f(x̄_s) · (x_{s,n} − x̄_s),

whose mean over n is ``T_s`` exactly. The cells are ``[seeds, sequences]``: the seed means are the pooled
per-seed statistics (so :func:`~descentlab.report.stats.paired_interval`'s seed piece is the t-interval over
per-seed pooled differences) and the spread over sequences is the delta-method share of the test set. A
one-seed run (the ``budget`` preset) gets "one seed: a smoke run, not judged".

Power. What was declared before the committed runs is restated on docs/results/video-denoising.md
("Declared before the run"): for ``full`` (UT, 16,000 steps, seeds 100-102, tuning seed 1000), from the
``full-2000`` pilot's per-seed sd 0.00099, an MDE of 0.0035 RMSE with 3 seeds; for ``full-dust-same-lr``, from
``full-dust``'s interval, sd 0.00072 and MDE 0.0026. DUST (``full-dust``, secondary rows) had sd 0.0018 in the
pilot: MDE 0.0065.

The cell store. ``mse/<arm>``: the final estimate's MSE of every test sequence, ``[seeds, G, N]`` over the
run's γ levels (the design's ``extra["gammas"]``) and its N test sequences; ``layer_mse/<arm>``: every
layer's estimate's MSE at γ = 1, ``[seeds, L+1, N]`` (learned methods only); ``rmse/<arm>``: the pooled
test RMSE per seed, ``[seeds, G]``. An arm is a learned method ``<architecture>-<label>``, a classical
baseline, or a point of the budget curve :func:`budget_name` (first evaluation seed only: ``[1, ...]``). The
design record's ``extra`` holds ``gammas``, ``methods`` (the learned arms, in report order), ``baselines``
and ``budget_steps``. Runs made before the store are read by :mod:`.legacy`; those that saved only the pooled
RMSE per seed (``rmse``) give cells ``[seeds, 1]``, the seed t-interval alone, and no per-layer row.

``FIDELITY`` (end of the module): what the presets change against the paper's video experiments, and which
of its claims no row judges (rendered into docs/results/video-denoising.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.experiments.video_denoising.config import ARCHITECTURES, LAYER_MSE, MSE, RMSE, budget_name
from descentlab.experiments.video_denoising.legacy import legacy_store
from descentlab.report.claims import CellFunction, Cells, ClaimSpec, MissingArrays, NotInRun
from descentlab.report.fidelity import Deviation, Fidelity, NotTested, lagrangian, seeds
from descentlab.study.cells import CellStore, load_store, require_store

Stat = Callable[[np.ndarray, int, list[int]], np.ndarray]  # (RMSE cells [S, G, N], i(γ=1), i(γ>1)) -> [S, N]

CONSTRAINED = ("constrained", "resilient")  # the paper's method (hard constraints) and its relaxation
ID_MARGIN = 0.01  # in-distribution: RMSE at γ = 1 at most 1 % above ERM's (non-inferiority)
SOURCE = (
    "the paper's video-denoising results (CUHK Avenue, UCSD, ShanghaiTech; RMSE at test noise gamma >= 1); "
    "no number is given"
)


# --- the cells ------------------------------------------------------------------------------------------


def claim_arrays(run_dir: Path) -> CellStore | dict[str, Any]:
    """:func:`~descentlab.study.cells.load_store` with :func:`.legacy.legacy_store` for older runs."""
    return load_store(run_dir, legacy_store)


def _gammas(store: CellStore) -> tuple[int, list[int]]:
    """(index of γ = 1, indices of γ > 1)."""
    gammas = store.design.extra["gammas"]
    return gammas.index(1.0), [i for i, g in enumerate(gammas) if g > 1.0]


def linearised_rmse(mse: np.ndarray) -> np.ndarray:
    """Linearised pooled RMSE of per-sequence MSE ``[..., N]``: ``r + (mse_n − M) / (2 r)`` with
    ``M = mean_n mse_n`` and ``r = sqrt(M)``; its mean over n is ``r``."""
    mse = np.asarray(mse, dtype=np.float64)
    mean = mse.mean(-1, keepdims=True)
    r = np.sqrt(mean)
    return r + (mse - mean) / (2 * np.where(r > 0, r, 1.0))


def _ood(p: np.ndarray, one: int, ood: list[int]) -> np.ndarray:
    return p[:, ood].mean(1)


def _id(p: np.ndarray, one: int, ood: list[int]) -> np.ndarray:
    return p[:, one]


def _ratio(p: np.ndarray, one: int, ood: list[int]) -> np.ndarray:
    """Linearised pooled ratio ``r(γ) / r(1)`` averaged over γ > 1 of RMSE cells ``p`` ``[S, G, N]``: with
    ``r = mean_n p``, ``p(γ) / r(1) − R (p(1) − r(1)) / r(1)`` where ``R = r(γ) / r(1)``."""
    r = p.mean(-1, keepdims=True)
    r1 = r[:, one : one + 1]
    return (p[:, ood] / r1 - r[:, ood] / r1 * (p[:, one : one + 1] - r1) / r1).mean(1)


def _rmse_metric(store: CellStore, *names: str) -> str:
    """``mse`` when every one of ``names`` saved its per-sequence errors, else ``rmse`` (pooled per seed);
    MissingArrays for the first that saved neither."""
    for name in names:
        if not _saved(store, name):
            raise MissingArrays(f"the test errors of {name}")
    return MSE if all(f"{MSE}/{name}" in store for name in names) else RMSE


def _as_rmse(metric: str, values: np.ndarray) -> np.ndarray:
    """RMSE cells ``[S, G, N]`` of ``metric``'s array: linearised from ``mse``, or ``rmse``'s ``[S, G, 1]``."""
    return linearised_rmse(values) if metric == MSE else np.asarray(values, dtype=np.float64)[..., None]


def _compare(store: CellStore, stat: Stat, a: str, b: str, at: str = "") -> Cells:
    """``stat`` of ``a``'s and ``b``'s RMSE cells, paired (:meth:`CellStore.compare`)."""
    metric, gammas = _rmse_metric(store, a, b), _gammas(store)
    return store.compare(
        metric, a, b, label=at, reduce=lambda values: stat(_as_rmse(metric, values), *gammas)
    )


def rmse_cells(store: CellStore, name: str) -> np.ndarray:
    """Linearised pooled RMSE ``[seeds, G, N]`` of ``name`` (:func:`linearised_rmse` of its ``mse``);
    ``[seeds, G, 1]`` pooled values when only those were saved."""
    metric = _rmse_metric(store, name)
    return _as_rmse(metric, store.get(metric, name))


def _stat(stat: Stat, store: CellStore, name: str) -> np.ndarray:
    return stat(rmse_cells(store, name), *_gammas(store))


ood_rmse = partial(_stat, _ood)  # RMSE averaged over γ > 1, [seeds, N]
ratio_cells = partial(_stat, _ratio)  # the pooled ratio r(γ)/r(1) averaged over γ > 1, [seeds, N]


def layer_rise(mse: np.ndarray) -> np.ndarray:
    """Linearised rise of the pooled per-layer MSE ``[S, L+1, N]``, ``[S, N]``: ``rise + Σ_l w_l
    (mse_{l,n} − M_l)`` with ``w_l = 1[M_l > M_{l−1}] − 1[M_{l+1} > M_l]``, the rise's gradient in ``M``."""
    mse = np.asarray(mse, dtype=np.float64)
    mean = mse.mean(-1)  # [S, L+1]
    up = np.diff(mean, axis=1) > 0  # [S, L]
    rise = np.where(up, np.diff(mean, axis=1), 0.0).sum(1)
    weight = np.zeros_like(mean)
    weight[:, 1:] += up
    weight[:, :-1] -= up
    return rise[:, None] + np.einsum("sl,sln->sn", weight, mse - mean[..., None])


def rise_cells(store: CellStore, name: str) -> np.ndarray:
    """:func:`layer_rise` of ``name``'s per-layer test MSE at γ = 1."""
    if f"{LAYER_MSE}/{name}" not in store:
        raise MissingArrays(f"the per-layer test errors of {name} per seed")
    return layer_rise(store.get(LAYER_MSE, name))


# --- the comparisons ------------------------------------------------------------------------------------


def _pairs(store: CellStore, labels: tuple[str, ...], reference: str = "erm") -> Iterator[tuple[str, str]]:
    """(method, reference) of every architecture where the run trained both, in a fixed order."""
    trained = set(store.design.extra["methods"])
    for label in labels:
        for arch in ARCHITECTURES:
            method, ref = f"{arch}-{label}", f"{arch}-{reference}"
            if method in trained and ref in trained:
                yield method, ref


def _lower_ood_primary(arrays: Any) -> list[Cells]:
    store = require_store(arrays)
    trained = store.design.extra["methods"]
    if not {"ut-constrained", "ut-erm"} <= set(trained):
        raise NotInRun(f"the run trained no ut-constrained and ut-erm pair (it trained {', '.join(trained)})")
    return [_compare(store, _ood, "ut-constrained", "ut-erm")]


def _each(stat: Stat, labels: tuple[str, ...], shift: float = 0.0, skip: str = "") -> CellFunction:
    """``stat`` of every trained ``<arch>-<label>`` against ERM of its architecture (but ``skip``), against
    ``(1 + shift)`` times ERM's with a margin."""

    def cells(arrays: Any) -> list[Cells]:
        store = require_store(arrays)
        return [_margin(_compare(store, stat, m, e), shift) for m, e in _pairs(store, labels) if m != skip]

    return cells


def _margin(cells: Cells, shift: float) -> Cells:
    """``cells`` against ``(1 + shift)`` times its reference (a non-inferiority margin; none at 0)."""
    if not shift:
        return cells
    return replace(cells, b=(1 + shift) * cells.b, reference=f"{1 + shift:g} x {cells.reference}")


def _monotone(arrays: Any) -> list[Cells]:
    store = require_store(arrays)
    out = []
    for m, e in _pairs(store, CONSTRAINED):
        cells = Cells(rise_cells(store, m), rise_cells(store, e), m, e)
        why = (
            f"{e}'s pooled per-layer MSE already falls at every layer in every seed: its rise sits at the "
            "bound 0, which no method can go below"
        )
        out.append(replace(cells, untestable=why if np.all(cells.b.mean(1) == 0) else None))
    return out


def _beats_classical(arrays: Any) -> list[Cells]:
    """Against the classical baseline of lowest mean test RMSE over the row's γ (chosen on the test set,
    which only makes the reference stronger)."""
    store = require_store(arrays)
    baselines = store.design.extra["baselines"]
    if not baselines:
        return []
    out = []
    for at, stat in (("gamma = 1", _id), ("gamma > 1", _ood)):
        best = min(baselines, key=lambda b, stat=stat: float(_stat(stat, store, b).mean()))
        out += [_compare(store, stat, m, best, at) for m, _ in _pairs(store, ("erm", "constrained"))]
    return out


def _saved(store: CellStore, name: str) -> bool:
    return f"{MSE}/{name}" in store or f"{RMSE}/{name}" in store


def _budget(stat: Stat, shift: float = 0.0):
    def cells(arrays: Any) -> list[Cells]:
        store = require_store(arrays)
        out = []
        for n in store.design.extra["budget_steps"]:
            for m, e in _pairs(store, ("constrained",)):
                mb, eb = budget_name(m, n), budget_name(e, n)
                if not (_saved(store, mb) and _saved(store, eb)):
                    continue  # a long run that diverged has no point on the curve
                out.append(_margin(_compare(store, stat, mb, eb, f"{n} steps"), shift))
        return out

    return cells


# --- the claims -----------------------------------------------------------------------------------------

# SESOIs, in the metric's units:
# - RMSE 0.002: about 2 % of ERM's RMSE at gamma > 1 (0.06-0.16 at the committed budget), 0.17 dB of PSNR;
#   denoising results treat differences under 0.1-0.2 dB as noise. Seed-to-seed sd of UT-ERM: 0.001-0.005.
# - ratio 0.05: 2 % of ERM's mean ratio RMSE(gamma)/RMSE(1) over gamma > 1 (about 2.5 for UT-ERM).
# - non-inferiority at gamma = 1: the cells compare with 1.01 x ERM; 0.0003 RMSE is that 1 % margin at
#   ERM's RMSE (0.03-0.04), so "refuted" means the model is shown to be worse than ERM itself.
# - rise 5e-4 MSE: under a tenth of UT-ERM's rise at gamma = 1 (0.0062) and a third of its last layer's
#   MSE (0.0017); a smaller rise does not change whether a profile reads as descending.
RMSE_SESOI = 0.002
RATIO_SESOI = 0.05
ID_SESOI = 0.0003
RISE_SESOI = 5e-4

CLAIMS: list[ClaimSpec] = [
    ClaimSpec(
        name="lower-rmse-ood",
        description="UT trained with layer-wise descent constraints has a lower test RMSE than ERM at high "
        "test noise (the paper: gamma >= 1; judged on the mean over gamma > 1, gamma = 1 being the training "
        "noise, judged by in-distribution)",
        cells=_lower_ood_primary,
        metric="pooled test RMSE per seed, mean over gamma > 1",
        direction="less",
        sesoi=RMSE_SESOI,
        source=SOURCE,
        primary=True,
    ),
    ClaimSpec(
        name="lower-rmse-ood-variants",
        description="the same for DUST, and for the resilient relaxation of either architecture",
        cells=_each(_ood, CONSTRAINED, skip="ut-constrained"),
        metric="pooled test RMSE per seed, mean over gamma > 1",
        direction="less",
        sesoi=RMSE_SESOI,
        source=SOURCE,
    ),
    ClaimSpec(
        name="graceful",
        description="the constrained model degrades more gracefully: RMSE(gamma)/RMSE(1) grows more slowly "
        "than ERM's",
        cells=_each(_ratio, CONSTRAINED),
        metric="pooled RMSE(gamma)/RMSE(1) per seed, mean over gamma > 1",
        direction="less",
        sesoi=RATIO_SESOI,
        source=SOURCE,
    ),
    ClaimSpec(
        name="in-distribution",
        description="the constrained model keeps its in-distribution RMSE: at gamma = 1 at most 1 % above "
        "ERM's",
        cells=_each(_id, CONSTRAINED, ID_MARGIN),
        metric="pooled test RMSE per seed at gamma = 1, against 1.01 x ERM's",
        direction="less",
        sesoi=ID_SESOI,
        source=SOURCE,
    ),
    ClaimSpec(
        name="monotone",
        description="the constrained model's per-layer test MSE rises less than ERM's (a monotone profile "
        "has no rise)",
        cells=_monotone,
        metric="rise of the pooled per-layer test MSE at gamma = 1",
        direction="less",
        sesoi=RISE_SESOI,
        source="the paper's claim that constrained models' per-layer loss falls monotonically and ERM's "
        "need not; no number for video",
    ),
    ClaimSpec(
        name="positive-control",
        description="ERM trained on noise levels across [0, 3] x sigma_train (blind) has a lower RMSE at "
        "gamma > 1 than ERM: the test can detect a robustness effect",
        cells=_each(_ood, ("blind",)),
        metric="pooled test RMSE per seed, mean over gamma > 1",
        direction="less",
        sesoi=RMSE_SESOI,
        control=True,
    ),
    ClaimSpec(
        name="positive-control-graceful",
        description="blind ERM degrades more gracefully than ERM: the graceful test can detect it",
        cells=_each(_ratio, ("blind",)),
        metric="pooled RMSE(gamma)/RMSE(1) per seed, mean over gamma > 1",
        direction="less",
        sesoi=RATIO_SESOI,
        control=True,
    ),
    ClaimSpec(
        name="beats-classical",
        description="the learned model has a lower RMSE than the strongest classical denoiser (tuned on "
        "validation at sigma_train, like the learned models)",
        cells=_beats_classical,
        metric="pooled test RMSE per seed (gamma = 1, or mean over gamma > 1)",
        direction="less",
        sesoi=RMSE_SESOI,
        control=True,
    ),
    ClaimSpec(
        name="budget-lower-rmse-ood",
        description="the constrained model's lower RMSE at gamma > 1 holds against ERM trained for as long",
        cells=_budget(_ood),
        metric="pooled test RMSE per seed, mean over gamma > 1",
        direction="less",
        sesoi=RMSE_SESOI,
        source=SOURCE,
    ),
    ClaimSpec(
        name="budget-in-distribution",
        description="the constrained model's RMSE at gamma = 1 stays within 1 % of ERM trained for as long",
        cells=_budget(_id, ID_MARGIN),
        metric="pooled test RMSE per seed at gamma = 1, against 1.01 x ERM's",
        direction="less",
        sesoi=ID_SESOI,
        source=SOURCE,
    ),
]

# --- fidelity to the paper ----------------------------------------------------------------------------

VIDEO = "video denoising results"


def _data(c) -> str:
    d = c.data
    return (
        f"{d.video} ({d.split} split), {d.size} px, clips of {d.num_frames} frames; "
        f"noise σ_train = {d.sigma_train:g}"
    )


def _models(c) -> str:
    m = c.model
    return f"{', '.join(a.upper() for a in c.architectures)}: depth {m.depth}, width {m.width}"


def _levels(c) -> str:
    above = [g for g in c.gammas if g > 1.0]
    return (
        f"γ ∈ {{{', '.join(f'{g:g}' for g in c.gammas)}}}; the robustness rows average γ ∈ "
        f"{{{', '.join(f'{g:g}' for g in above)}}} (γ > 1); γ = 1, the training noise, is the in-distribution row"
    )


def _constraint(c) -> str:
    arch = c.architectures[0]
    alphas = ", ".join(f"{a.upper()} α = {c.alpha[a]:g}" for a in c.architectures)
    return f"{lagrangian(c.method_config(arch, 'constrained').constraint)}; {alphas}"


DEVIATIONS = [
    Deviation("data", "CUHK Avenue, UCSD, ShanghaiTech", _data, "contribution 4"),
    Deviation("models", "DUST and UT (sizes not stated)", _models, "experiments"),
    Deviation("test noise levels", "RMSE at high test perturbation levels, γ ≥ 1.0", _levels, VIDEO),
    Deviation(
        "Lagrangian",
        "f_L + Σ_{l=1..L} λ_l (f_l − (1 − α_l) f_{l−1}), primal-dual (Algorithm 1)",
        _constraint,
        "Lagrangian of the method section",
    ),
    Deviation(
        "in-distribution tolerance",
        "degradation “often < 0.3 %”",
        lambda c: f"RMSE at γ = 1 at most {100 * ID_MARGIN:g} % above ERM's (non-inferiority)",
        "trade-offs",
    ),
    Deviation(
        "training",
        "not stated",
        lambda c: (
            f"{c.train.max_steps:,} steps at batch {c.train.batch_size}, {c.method.optimizer.name} lr from {c.lr_grid} on validation"
        ),
    ),
    Deviation("seeds", "not stated", lambda c: seeds(c.seeds, c.tune_seed)),
]

NOT_TESTED = [
    NotTested(
        "constrained models consistently achieved lower RMSE under high test perturbation levels (γ ≥ 1.0) across datasets and architectures",
        "the rows judge one data set (a surveillance clip offline; UCSD Ped2 in the `paper` preset) and average γ > 1; γ = 1 is the training noise and is judged as non-inferiority, not as a gain.",
        "the `paper` preset on each of the three data sets, with a row at γ = 1 on lower RMSE.",
        VIDEO,
    ),
    NotTested(
        "constrained models show smooth, monotone per-layer loss decreases",
        "the monotone row is relative (the constrained rise is below ERM's); no row asks whether the constrained profile itself never rises.",
        "a sized row on the constrained model's own rise at γ = 1 from the saved per-layer errors, with a declared margin.",
        "experimental results, monotone descent",
    ),
    NotTested(
        "the descent properties are maintained under distribution shift (Theorem 4)",
        "the per-layer profile is judged at the training noise (γ = 1) only.",
        "the per-layer errors at γ > 1 (a noise shift) and a row on their rise, constrained against ERM.",
        "contribution 2, Theorem 4",
    ),
]

FIDELITY = Fidelity(DEVIATIONS, NOT_TESTED)
