"""text-robustness's claims: does training under layer-wise descent constraints make a fine-tuned encoder
keep its accuracy under embedding noise, without costing clean accuracy, and with a per-layer loss that
descends?

The paper's comparison is the constrained model against the unconstrained (ERM) one. Ours is against the
**matched control** ``erm-readout``: the same objective code path, seeds and readout as the constrained
model, with every multiplier frozen at λ ≡ 0. The readout path alone changes training (the head's dropout
runs once per layer, so the random-number stream differs from ERM's), and in the earlier run that change
alone gained as much over ERM under uniform noise as the constraints did. Only the difference from the
control is an effect of the multipliers.

Cells: the run's cell store, ``correct/<method>/<kind>`` (0/1 correctness ``[seed, draw, γ, example]``)
and ``loss/<method>`` (the clean per-review loss at every layer ``[seed, L+1, example]``), under a design
record whose conditions are the noise kinds and whose ``extra`` holds the γ grid and, when ERM trained on
the tuning seed, its mean per-layer validation loss (``erm_val_profile``); older runs are read by
:mod:`.legacy`. Every method sees the same test reviews under the same noise (keyed by content) and shares
the training seeds, so a cell of one method pairs with the same cell of another. With Γ = {γ >= 1}:

* robust correctness of a method under one noise kind: its 0/1 correctness averaged over Γ,
  ``[seed, draw, example]`` (the interval averages the draws into the cell);
* clean correctness: γ = 0, draw 0, ``[seed, example]`` (every draw of γ = 0 is the same input);
* rise of a seed's per-layer test-loss profile p (the test mean at layers 0..L):
  ``R(p) = Σ_{l=1..L} max(0, p_l − p_{l−1})``, 0 for a profile that never rises. Its cells are each
  review's share of it, ``[seed, example]`` (:func:`layer_rise`), whose mean per seed is exactly R.

Primary endpoint: ``graceful-gaussian``, constrained − ``erm-readout`` accuracy under Gaussian noise, mean
over γ >= 1. ``graceful``, ``clean-parity`` and ``monotone`` are the secondary claims (Holm-adjusted
together); the positive control, the null control and the deep-supervision baseline are controls, judged
unadjusted. Accuracy against the local-DP ε, when a run evaluates it, is drawn (:mod:`.report`) but not
judged: it is no claim of the paper, and the full preset does not evaluate it.

``FIDELITY`` (end of the module): what the presets change against the paper's text experiments, and which
of its claims no row judges (rendered into docs/results/text-robustness.md).

Power: declared before the full run from the earlier run's pilot; docs/results/text-robustness.md ("Power,
declared before the run") gives both and what the run's own spread turned out to be.

Smallest effects of interest (the units are the metric's):

* 0.01 accuracy (one point) for every accuracy-under-noise claim: a gain below one point is not worth the
  constraint's cost (a readout at every layer and a dual step) and is about a sixth of what the positive
  control, training on noise, gained over ERM in the earlier run (0.057–0.066 for Gaussian, uniform and
  discrete noise). The null control's parity margin is the same point: a control that moves accuracy by
  less than the smallest effect of interest is neutral.
* 0.003 accuracy (0.3 points) for clean parity: the paper's own margin.
* 0.01 nats for the summed rise of the per-layer loss: a rise below that is a kink smaller than 1.5 % of
  the chance-level loss ln 2, not the spike the paper shows for ERM. The claim is untestable whenever
  ERM's own rise is already below it (ERM is then monotone or nearly so): the rise is bounded below by
  0, so the constrained model cannot beat ERM by an effect of interest. It is also untestable whenever
  ERM's per-layer *validation* loss profile (the tuning seed's, the ``alpha_from=erm`` reference) is already
  monotone, p_l <= p_{l−1} for every l: there is no spike for the constraint to remove.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from descentlab.experiments.text_robustness.config import CONTROL, CORRECT, ERM, LOSS
from descentlab.experiments.text_robustness.legacy import legacy_store
from descentlab.report.claims import CellFunction, Cells, ClaimSpec, MissingArrays, NotInRun
from descentlab.report.fidelity import Deviation, Fidelity, NotTested, lagrangian, seeds
from descentlab.study.cells import CellStore, load_store, require_store

CONSTRAINED, RESILIENT = "constrained", "resilient"
DEEP, NOISE = "deep-supervision", "erm-noise"  # the simple baseline; the positive control
CONSTRAINED_METHODS = (CONSTRAINED, RESILIENT)

ACCURACY_SESOI = 0.01  # accuracy (module docs)
CLEAN_MARGIN = 0.003  # accuracy: the paper's "often < 0.3 %"
RISE_SESOI = 0.01  # nats of summed per-layer rise (module docs)

PAPER = "arXiv 2601.17257 (layer-wise descent constraints)"
ROBUST_METRIC = "test accuracy under embedding noise, mean over γ >= 1"


def claim_arrays(run_dir: Path) -> CellStore | dict:
    """The run's cell store (:func:`~descentlab.study.cells.load_store`; older runs: :mod:`.legacy`)."""
    return load_store(run_dir, legacy_store)


def gammas(arrays: Mapping[str, np.ndarray]) -> list[float]:
    return list(require_store(arrays).design.extra["gammas"])


def trained(arrays: Mapping[str, np.ndarray], methods: tuple[str, ...]) -> list[str]:
    """Those of ``methods`` the run trained (its design has them), in the order given."""
    arms = require_store(arrays).design.arms
    return [m for m in methods if m in arms]


def kinds(arrays: Mapping[str, np.ndarray]) -> list[str]:
    """The noise kinds the run evaluated every method under (the design's conditions)."""
    return require_store(arrays).conditions()


def correctness(arrays: Mapping[str, np.ndarray], method: str, kind: str) -> np.ndarray:
    """0/1 correctness ``[seed, draw, γ, example]``."""
    return np.asarray(require_store(arrays).get(CORRECT, method, kind), dtype=np.float64)


def robust(arrays: Mapping[str, np.ndarray], method: str, kind: str) -> np.ndarray:
    """Correctness averaged over γ >= 1: ``[seed, draw, example]``."""
    noisy = [g for g, gamma in enumerate(gammas(arrays)) if gamma >= 1.0]
    if not noisy:
        raise MissingArrays("a noise level γ >= 1 (the run's γ grid has none)")
    return correctness(arrays, method, kind)[:, :, noisy, :].mean(axis=2)


def clean(arrays: Mapping[str, np.ndarray], method: str) -> np.ndarray:
    """Clean correctness ``[seed, example]`` (γ = 0, draw 0)."""
    found = kinds(arrays)
    if not found:
        raise MissingArrays(f"{method}'s correctness (the run evaluated no noise kind)")
    return correctness(arrays, method, found[0])[:, 0, gammas(arrays).index(0.0), :]


def rise(profile: np.ndarray) -> np.ndarray:
    """``Σ_l max(0, p_l − p_{l−1})`` along the last axis (layers)."""
    return np.clip(np.diff(profile, axis=-1), 0.0, None).sum(-1)


def layer_rise(arrays: Mapping[str, np.ndarray], method: str) -> np.ndarray:
    """Each review's share of its seed's rise, ``[seed, example]``: with L⁺_s the layers where seed s's
    test-mean profile rises, ``r[s, e] = Σ_{l ∈ L⁺_s} (loss[s, l, e] − loss[s, l−1, e])``, whose mean over
    the reviews is exactly ``R`` of that seed's profile."""
    loss = np.asarray(require_store(arrays).get(LOSS, method), dtype=np.float64)
    steps = np.diff(loss, axis=1)  # [seed, L, example]
    rising = steps.mean(axis=-1) > 0  # [seed, L]
    return (steps * rising[:, :, None]).sum(axis=1)


def _primary(arrays: Mapping[str, np.ndarray]) -> list[Cells]:
    if CONTROL not in trained(arrays, (CONTROL,)):
        raise NotInRun(f"the run trained no matched λ ≡ 0 control arm {CONTROL!r}")
    a, b = robust(arrays, CONSTRAINED, "gaussian"), robust(arrays, CONTROL, "gaussian")
    return [Cells(a, b, CONSTRAINED, CONTROL, at="gaussian, γ >= 1")]


def _graceful(arrays: Mapping[str, np.ndarray]) -> list[Cells]:
    return [
        Cells(robust(arrays, m, kind), robust(arrays, CONTROL, kind), m, CONTROL, at=f"{kind}, γ >= 1")
        for m in trained(arrays, CONSTRAINED_METHODS)
        for kind in kinds(arrays)
        if (m, kind) != (CONSTRAINED, "gaussian")  # the primary endpoint
    ]


def _clean_parity(arrays: Mapping[str, np.ndarray]) -> list[Cells]:
    methods = trained(arrays, CONSTRAINED_METHODS)
    references = trained(arrays, (CONTROL, ERM))
    if methods and not references:
        raise NotInRun(f"the run trained no reference arm ({CONTROL!r} or {ERM!r})")
    return [Cells(clean(arrays, m), clean(arrays, r), m, r, at="clean") for m in methods for r in references]


def _monotone(arrays: Mapping[str, np.ndarray]) -> list[Cells]:
    rows = []
    for m in trained(arrays, CONSTRAINED_METHODS):
        a, b = layer_rise(arrays, m), layer_rise(arrays, ERM)
        erm_rise = b.mean(axis=-1)  # per seed
        untestable = None
        val_profile = require_store(arrays).design.extra.get("erm_val_profile")
        if val_profile is not None and bool(np.all(np.diff(np.asarray(val_profile, dtype=np.float64)) <= 0)):
            untestable = (
                "ERM's per-layer validation loss (tuning seed) is already monotone (non-increasing over "
                f"layers 0..{len(val_profile) - 1}): there is no rise for the constraint to remove"
            )
        elif erm_rise.mean() < RISE_SESOI:
            untestable = (
                f"ERM's per-layer test loss already rises by only {erm_rise.mean():.4g} nats (mean over "
                f"seeds; {int((erm_rise <= 1e-12).sum())} of {erm_rise.size} seeds never rise), below the "
                f"smallest effect of interest {RISE_SESOI:g}: the rise is bounded below by 0, so no drop of "
                "interest can show"
            )
        rows.append(Cells(a, b, m, ERM, at="clean per-layer test loss", untestable=untestable))
    return rows


def _per_kind(method: str, reference: str) -> CellFunction:
    """``method`` − ``reference`` robust accuracy under every kind the run evaluated ``method`` under."""

    def cells(arrays: Mapping[str, np.ndarray]) -> list[Cells]:
        if not trained(arrays, (method,)):
            return []
        return [
            Cells(
                robust(arrays, method, k), robust(arrays, reference, k), method, reference, at=f"{k}, γ >= 1"
            )
            for k in kinds(arrays)
        ]

    return cells


def _baseline(arrays: Mapping[str, np.ndarray]) -> list[Cells]:
    if not trained(arrays, (CONSTRAINED,)):
        return []
    if not trained(arrays, (DEEP,)):
        raise NotInRun(f"the run trained no {DEEP} arm")
    a, b = robust(arrays, CONSTRAINED, "gaussian"), robust(arrays, DEEP, "gaussian")
    return [Cells(a, b, CONSTRAINED, DEEP, at="gaussian, γ >= 1")]


GRACEFUL_PAPER = (
    "degrades more gracefully as γ grows: 'significantly higher accuracy under high noise levels' (RoBERTa "
    "on IMDb); no number given"
)
GRACEFUL_SOURCE = f"{PAPER}, text classification: accuracy against γ under Gaussian, uniform, discrete noise"

CLAIMS: list[ClaimSpec] = [
    ClaimSpec(
        name="graceful-gaussian",
        description="under Gaussian noise on the token embeddings, the constrained model keeps more accuracy "
        "at γ >= 1 than its matched control (same readout path and seeds, λ ≡ 0)",
        cells=_primary,
        metric=f"{ROBUST_METRIC} (Gaussian)",
        direction="greater",
        sesoi=ACCURACY_SESOI,
        paper=GRACEFUL_PAPER,
        source=GRACEFUL_SOURCE,
        primary=True,
    ),
    ClaimSpec(
        name="graceful",
        description="under each other noise kind (and for the resilient relaxation, every kind), the "
        "constrained model keeps more accuracy at γ >= 1 than the matched λ ≡ 0 control",
        cells=_graceful,
        metric=ROBUST_METRIC,
        direction="greater",
        sesoi=ACCURACY_SESOI,
        paper=GRACEFUL_PAPER,
        source=GRACEFUL_SOURCE,
    ),
    ClaimSpec(
        name="versus-erm",
        description="under each noise kind, the constrained model keeps more accuracy at γ >= 1 than the "
        "unconstrained baseline (ERM), the paper's own comparison",
        cells=_per_kind(CONSTRAINED, ERM),
        metric=ROBUST_METRIC,
        direction="greater",
        sesoi=ACCURACY_SESOI,
        paper=GRACEFUL_PAPER,
        source=f"{PAPER}, text classification: constrained models against the unconstrained baselines",
    ),
    ClaimSpec(
        name="clean-parity",
        description="clean test accuracy stays within 0.3 points of the reference's (ERM, the paper's "
        "comparison, and the matched control)",
        cells=_clean_parity,
        metric="clean test accuracy",
        kind="parity",
        margin=CLEAN_MARGIN,
        paper="in-distribution degradation 'often < 0.3 %'",
        source=f"{PAPER}, in-distribution accuracy of the text models",
    ),
    ClaimSpec(
        name="monotone",
        description="the constrained model's per-layer test loss rises less than ERM's (ERM's spikes)",
        cells=_monotone,
        metric="summed rise of the per-layer clean test loss, per seed (nats)",
        direction="less",
        sesoi=RISE_SESOI,
        paper="constrained: monotone per-layer loss; ERM: not (RoBERTa spikes at layer 19)",
        source=f"{PAPER}, per-layer loss of the text models",
    ),
    ClaimSpec(
        name="positive-control",
        description="training on Gaussian embedding noise (γ_train = 1) keeps more accuracy at γ >= 1 than "
        "ERM: the run can detect a robustness gain",
        cells=_per_kind(NOISE, ERM),
        metric=ROBUST_METRIC,
        direction="greater",
        sesoi=ACCURACY_SESOI,
        control=True,
    ),
    ClaimSpec(
        name="null-control",
        description="the matched λ ≡ 0 control is neutral: its accuracy at γ >= 1 is within one point of "
        "ERM's",
        cells=_per_kind(CONTROL, ERM),
        metric=ROBUST_METRIC,
        kind="parity",
        margin=ACCURACY_SESOI,
        control=True,
    ),
    ClaimSpec(
        name="beats-deep-supervision",
        description="the multipliers beat the simple baseline with fixed equal per-layer weights (deep "
        "supervision) under Gaussian noise at γ >= 1",
        cells=_baseline,
        metric=f"{ROBUST_METRIC} (Gaussian)",
        direction="greater",
        sesoi=ACCURACY_SESOI,
        control=True,
    ),
]

# --- fidelity to the paper ----------------------------------------------------------------------------

TEXT = "text classification experiments"


def _data(c) -> str:
    train = "all" if c.data.n_train is None else f"{c.data.n_train:,}"
    shift = f"; shift sets {', '.join(c.data.shift)}" if c.data.shift else "; no shifted test set"
    return (
        f"{c.data.name}: {train} training, {c.data.n_eval:,} test examples, {c.data.max_length} tokens{shift}"
    )


def _constraint(c) -> str:
    labels = [m for m in c.methods if m in ("constrained", "resilient")]
    method = c.resolved_methods()[labels[0]] if labels else None
    return lagrangian(method.constraint if method is not None else None)


def _alpha(c) -> str:
    cands = c.selection.candidates.get("constrained", [])
    shown = ", ".join(repr(x) if x else f"'' (α = {c.method.constraint.alpha:g})" for x in cands)
    return f"chosen on validation among {shown}"


def _binding(c) -> str:
    if c.selection.min_binding is None:
        return "not required: a candidate whose λ never rises can be chosen"
    return (
        f"preferred (time-average Σλ over the second half > {c.selection.min_binding:g}), but when no "
        "candidate binds the rule chooses among all, so a constraint that never binds can be kept"
    )


def _reference(c) -> str:
    frozen = ", ".join(c.frozen_zero) or "none"
    return (
        f"the primary compares with the matched λ ≡ 0 control ({frozen}), which isolates the multipliers; "
        "the secondary row versus-erm makes the paper's comparison with ERM"
    )


DEVIATIONS = [
    Deviation(
        "model",
        "pretrained DistilBERT and RoBERTa (size not stated)",
        lambda c: f"{c.model}, {c.pooling} pooling",
        "experiments",
    ),
    Deviation("data", "IMDb and MNLI", _data, "contribution 3"),
    Deviation(
        "perturbations",
        "Gaussian, uniform and discrete noise on the token embeddings, level γ (formula not stated)",
        lambda c: (
            f"{', '.join(c.evaluation.kinds)} at γ ∈ {{{', '.join(f'{g:g}' for g in c.evaluation.gammas)}}} × embedding RMS, {c.evaluation.draws} draws"
        ),
        TEXT,
    ),
    Deviation(
        "Lagrangian",
        "f_L + Σ_{l=1..L} λ_l (f_l − (1 − α_l) f_{l−1}), primal-dual (Algorithm 1)",
        _constraint,
        "Lagrangian of the method section",
    ),
    Deviation("α_l", "a step-size schedule (values not stated)", _alpha),
    Deviation("constraint must bind", "not stated", _binding),
    Deviation("robustness comparator", "the unconstrained model (ERM)", _reference, TEXT),
    Deviation(
        "in-distribution tolerance",
        "degradation “often < 0.3 %”",
        lambda c: "clean accuracy within 0.3 points (parity, 90 % interval)",
        "trade-offs",
    ),
    Deviation(
        "training",
        "not stated",
        lambda c: (
            f"{c.train.epochs} epochs, batch {c.train.batch_size * c.train.grad_accum_steps}, {c.method.optimizer.name} lr {c.method.optimizer.lr:g}"
        ),
    ),
    Deviation("seeds", "not stated", lambda c: seeds(c.seeds, c.tune_seed)),
]

NOT_TESTED = [
    NotTested(
        "improved out-of-distribution generalisation (MNLI, tested on text unlike the training text)",
        "the full preset has no shifted test set (`data.shift` is empty); only the `paper` preset names MNLI, and its mismatched set only when `data.shift=[mnli@validation_mismatched]` is given.",
        "the `paper` preset on MNLI with `data.shift=[mnli@validation_mismatched]` and a row on the shifted accuracy.",
        "summary; contribution 3",
    ),
    NotTested(
        "the descent properties are maintained under distribution shift (Theorem 4)",
        "no row reads the per-layer profile on shifted data; the profile is judged on the clean test set only.",
        "the per-layer test loss on a shifted set (MNLI mismatched) and a row on its rise, constrained against ERM.",
        "contribution 2, Theorem 4",
    ),
    NotTested(
        "constrained models show smooth, monotone per-layer loss decreases",
        "the monotone row is relative (the constrained rise is below ERM's); no row asks whether the constrained profile itself never rises.",
        'a sized row on the constrained model\'s own rise, with a declared margin (the rise is ≥ 0, so "exactly 0" needs a margin).',
        "experimental results, monotone descent",
    ),
    NotTested(
        "a spike at layer 19 in RoBERTa",
        "no preset runs a 24-layer RoBERTa through its own head; MiniLM has 6 layers.",
        "the `paper` preset with `model=roberta-large` (the paper does not state the RoBERTa size) and its layer-loss figure.",
        "experimental results, monotone descent",
    ),
]

FIDELITY = Fidelity(DEVIATIONS, NOT_TESTED)
