"""llm-robustness's claims: does a fine-tune under the descent constraints keep clean parity with ERM and win
head to head under embedding noise?

The paper fine-tuned Llama 3.1 8B with and without the layer-wise descent constraints and judged the two
head to head on AlpacaEval: a 50 % win rate of the constrained model at γ = 0 and 69.93 % at γ = 1.5 (its
LLM fine-tuning results). Its noise formula is not public.

Cells (the run's :class:`~descentlab.study.cells.CellStore`, keyed ``metric/arm/condition``):

* ``win/<arm>/<condition>``: ``[seeds, draws, examples]``, the judged outcome of ``<arm>`` against ERM of
  the same evaluation seed on each held-out example and noise draw: 1 (lower NLL of the reference
  continuation), 0, or 1/2 for a tie. ERM's own is 1/2 on every cell, so a claim compares ``win/<arm>``
  with ``win/erm``: ``a − b`` is the win rate minus 50 %, with the engine's seed-level interval.
* ``win/erm (another seed)/<condition>``: the null control, ERM on seed s_i against ERM on s_{i+1 mod S}
  (two seeds or more).
* ``level/erm/<condition>`` and ``perplexity_ratio/erm/<condition>`` (``[seeds]``): the condition's noise
  level and ERM's held-out perplexity there over its clean perplexity.

Runs saved before the store (``arrays/claims.npz``, or only win / tie / loss counts) are read by
:mod:`.legacy`; the passages' chapters (``arrays/clusters.npz``, :mod:`.clusters`) join either.

The null control. Two ERM fine-tunes from different seeds differ consistently over the examples, so a win
rate judged over examples alone calls a mere re-seed an effect (the committed one-seed run's re-seeded ERM
"won" 71.5–76.5 % under noise). ERM against ERM of another evaluation seed is judged as a parity claim: its
interval is the spread between ERM seeds, against which every method's win rate is read. With two seeds
the two shifted pairs are complements (w and 1 − w), so its estimate is 50 % by construction and only its
interval speaks.

Conditions: ``clean``; ``<kind>-x<r>``, the level where ERM's validation perplexity grows ×r (found by
bisection on ERM's tuning-seed fine-tune); ``<kind>@<level>``, a fixed level (NEFTune's α = 1.5, the
paper's γ read on NEFTune's scale: untestable here, see :data:`PAPER_REASON`).

Primary endpoint: ``noisy-win``, ``hard`` − ERM win rate at the gaussian ×3 level. The paper's claim is a
win rate under noise, so the endpoint is a win rate. Gaussian noise is the paper's first noise family, and
×3 is the middle of the grid: noise the model clearly feels (perplexity triples) without drowning the text
(×10). ``hard`` is the constrained method the paper describes; ``resilient`` is our relaxation and a
secondary row.

Power of the ``full`` and ``full-seeds`` runs: declared before each run (the pilot's per-seed spread, the
MDE), and restated with the observed figures, on docs/results/llm-robustness.md ("Power, declared before
the run" and "Declared before the run").

Smallest effect of interest and parity margin: 0.05, five points of win rate. A win rate of 55 % means a
net preference on 10 % of the examples; less is not worth a fine-tune that costs 1.6× ERM's step time. It is
a quarter of the paper's noisy gain (19.93 points), so a parity band of ±5 points cannot hide an effect of
the paper's size.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.experiments.llm_robustness.clusters import CLUSTER_FILE, CLUSTER_KEY
from descentlab.experiments.llm_robustness.config import (
    BASELINE,
    LEVEL,
    MARGIN,
    NULL,
    PERPLEXITY_RATIO,
    POSITIVE,
    WIN,
)
from descentlab.experiments.llm_robustness.legacy import legacy_store, store_from_arrays
from descentlab.io import load_arrays
from descentlab.report.claims import Cells, ClaimSpec, MissingArrays, NotInRun
from descentlab.report.fidelity import Deviation, Fidelity, NotTested, lagrangian, seeds
from descentlab.study.cells import CELLS_FILE, CellStore, cell_key, load_store

CONSTRAINED = ("hard", "resilient")
PRIMARY_METHOD, PRIMARY_CONDITION = "hard", "gaussian-x3"

PAPER_WIN_RATE = {0.0: 0.50, 1.5: 0.6993}  # Llama 3.1 8B, AlpacaEval, constrained vs unconstrained
PAPER_KIND = "neftune"  # the scale the paper's γ = 1.5 is read on here (its own scale is not public)
PAPER_CONDITION = f"{PAPER_KIND}@1.5"

SESOI = 0.05  # win rate (module docs); the parity margin MARGIN is the config's selection margin too
# Why the paper's γ = 1.5 read as NEFTune's α is no test here (the claim's kind is untestable).
PAPER_REASON = (
    "the paper's noise formula is not public, so its γ = 1.5 has no counterpart here; read as NEFTune's α "
    "(uniform noise of half-width α/√(n·d)), 1.5 is noise of std 0.03-0.04 σ_E on SmolLM2's 40-64-token "
    "examples and left ERM's held-out perplexity ×1.0008 in the committed one-seed run (×3 needs α ≈ 30): "
    "the noise changes nothing, so the win rate there restates the clean comparison (the clean-parity rows)"
)

WIN_METRIC = "head-to-head win rate against ERM − 1/2 (likelihood judge, ties 1/2)"
SOURCE = "experimental results, LLM fine-tuning (Llama 3.1 8B, AlpacaEval, head to head)"


def _derived(condition: str) -> tuple[str, float] | None:
    """(kind, ratio) of a ``<kind>-x<ratio>`` condition; None for any other."""
    kind, sep, ratio = condition.rpartition("-x")
    try:
        return (kind, float(ratio)) if sep and kind else None
    except ValueError:
        return None


def _store(arrays: Mapping[str, Any]) -> CellStore:
    """The cell store the claims read: ``arrays`` itself, or an old run's arrays read by :mod:`.legacy`;
    a run that saved nothing has every claim pending."""
    if isinstance(arrays, CellStore):
        return arrays
    if not arrays:
        raise MissingArrays(CELLS_FILE)
    return store_from_arrays(arrays)


def _optional(store: CellStore, metric: str, condition: str) -> np.ndarray | None:
    """ERM's ``metric`` at ``condition`` when the run saved it, else None."""
    key = cell_key(metric, BASELINE, condition)
    return store[key] if key in store else None  # noqa: SIM401 (CellStore.get takes metric, arm, condition)


def _label(store: CellStore, condition: str) -> str:
    """The row's ``at``: the condition in words, with its level when the run saved it."""
    level = _optional(store, LEVEL, condition)
    lv = "" if level is None else f"{float(np.ravel(level)[0]):.4g}"
    derived = _derived(condition)
    if condition == "clean":
        return "clean"
    if derived is not None:
        kind, ratio = derived
        return f"{kind}, ERM perplexity ×{ratio:g}" + (f" (level {lv})" if lv else "")
    kind, _, level_text = condition.partition("@")
    return f"{kind} at the fixed level {level_text}"


def _against_erm(store: CellStore, arm: str, condition: str) -> Cells:
    """``arm``'s outcomes against ERM of the same seed, beside ERM's own (1/2 on every cell), with the
    passages' chapters when the run has them."""
    cells = store.compare(WIN, arm, BASELINE, condition, label=_label(store, condition))
    return replace(cells, clusters=_clusters(store, cells.a))


def _clusters(store: CellStore, cells: np.ndarray) -> np.ndarray | None:
    """The chapter of each held-out passage (:mod:`.clusters`) when the run has them for these cells."""
    chapters = store[CLUSTER_KEY] if CLUSTER_KEY in store else None  # noqa: SIM401 (a flat key, not a cell)
    return chapters if chapters is not None and chapters.shape == cells.shape[-1:] else None


def _noisy_conditions(store: CellStore, arm: str) -> list[str]:
    """The ``<kind>-x<r>`` conditions the run judged ``arm`` at, by kind then ratio."""
    prefix = f"{WIN}/{arm}/"
    found = [k[len(prefix) :] for k in store if k.startswith(prefix)]
    noisy = sorted((d, c) for c in found if (d := _derived(c)) is not None)
    if not noisy:
        raise MissingArrays(f"{prefix}<kind>-x<ratio>")
    return [c for _, c in noisy]


def _present(store: CellStore, arms: tuple[str, ...], condition: str) -> list[str]:
    """The ``arms`` the run judged at ``condition`` (a preset may run only some): NotInRun when it trained
    none of them, MissingArrays when it saved none."""
    trained = [m for m in arms if m in store.design.arms]
    if not trained:
        raise NotInRun(f"the run trained no {' or '.join(arms)} arm")
    found = [m for m in trained if cell_key(WIN, m, condition) in store]
    if not found:
        raise MissingArrays(cell_key(WIN, trained[0], condition))
    return found


def primary_cells(arrays: Mapping[str, Any]) -> Iterator[Cells]:
    yield _against_erm(_store(arrays), PRIMARY_METHOD, PRIMARY_CONDITION)


def noisy_cells(arrays: Mapping[str, Any]) -> Iterator[Cells]:
    """Every constrained method at every ERM-derived level, the primary comparison excepted."""
    store = _store(arrays)
    for method in _present(store, CONSTRAINED, "clean"):
        for condition in _noisy_conditions(store, method):
            if (method, condition) != (PRIMARY_METHOD, PRIMARY_CONDITION):
                yield _against_erm(store, method, condition)


def clean_cells(arrays: Mapping[str, Any]) -> Iterator[Cells]:
    store = _store(arrays)
    for method in _present(store, CONSTRAINED, "clean"):
        yield _against_erm(store, method, "clean")


def paper_level_cells(arrays: Mapping[str, Any]) -> Iterator[Cells]:
    """The constrained methods at NEFTune's α = 1.5 (untestable here: :data:`PAPER_REASON`); the row keeps
    the interval measured there, and ERM's perplexity growth at that level in its ``at``."""
    store = _store(arrays)
    growth = _optional(store, PERPLEXITY_RATIO, PAPER_CONDITION)
    for method in _present(store, CONSTRAINED, PAPER_CONDITION):
        c = _against_erm(store, method, PAPER_CONDITION)
        if growth is not None:
            c = replace(c, at=f"{c.at}, ERM perplexity ×{float(np.mean(growth)):.4f} there")
        yield c


def positive_cells(arrays: Mapping[str, Any]) -> Iterator[Cells]:
    store = _store(arrays)
    if POSITIVE not in store.design.arms:
        raise NotInRun(f"the run trained no {POSITIVE} arm")
    for condition in _noisy_conditions(store, POSITIVE):
        yield _against_erm(store, POSITIVE, condition)


def null_cells(arrays: Mapping[str, Any]) -> Iterator[Cells]:
    """ERM on seed s_i against ERM on seed s_{i+1 mod S}, clean and at every ERM-derived level."""
    store = _store(arrays)
    if NULL not in store.design.arms:
        raise NotInRun("the null control needs two evaluation seeds or more")
    for condition in ["clean", *_noisy_conditions(store, NULL)]:
        yield _against_erm(store, NULL, condition)


_win_claim = partial(ClaimSpec, metric=WIN_METRIC)  # every row is a win rate against ERM

CLAIMS: list[ClaimSpec] = [
    _win_claim(
        name="noisy-win",
        description="under embedding noise the constrained fine-tune wins head to head against ERM "
        "(hard constraints, gaussian noise where ERM's perplexity triples)",
        cells=primary_cells,
        direction="greater",
        sesoi=SESOI,
        paper="69.93 % at γ = 1.5",
        source=SOURCE,
        primary=True,
    ),
    _win_claim(
        name="noisy-win-levels",
        description="the constrained fine-tunes win against ERM at every level where ERM's perplexity grew "
        "×1.5 to ×10",
        cells=noisy_cells,
        direction="greater",
        sesoi=SESOI,
        paper="69.93 % at γ = 1.5",
        source=SOURCE,
    ),
    _win_claim(
        name="clean-parity",
        description="without noise the constrained fine-tune is at parity with ERM (win rate 50 %)",
        cells=clean_cells,
        kind="parity",
        margin=MARGIN,
        paper="50 % at γ = 0",
        source=SOURCE,
    ),
    _win_claim(
        name="paper-gamma-1.5",
        description="at the paper's γ = 1.5, read on NEFTune's scale, the constrained fine-tune wins at least "
        "the paper's 69.93 %",
        cells=paper_level_cells,
        kind="untestable",
        reason=PAPER_REASON,
        paper="69.93 % at γ = 1.5",
        source=SOURCE,
    ),
    _win_claim(
        name="positive-control",
        control=True,
        description="control: ERM trained on NEFTune noise beats ERM under noise (the protocol can see a "
        "robustness gain)",
        cells=positive_cells,
        direction="greater",
        sesoi=SESOI,
    ),
    _win_claim(
        name="null-control",
        control=True,
        description="control: ERM on one evaluation seed is at parity with ERM on the next, clean and under "
        "noise (the spread between ERM seeds every win rate is read against)",
        cells=null_cells,
        kind="parity",
        margin=MARGIN,
    ),
]


def claim_arrays(run_dir: Path) -> CellStore | dict[str, Any]:
    """The run's cell store (an older run's arrays: :func:`.legacy.legacy_store`; {} when it saved none),
    with the passages' chapters (``arrays/clusters.npz``) when the run has them."""
    store, clusters = load_store(run_dir, legacy_store), Path(run_dir) / CLUSTER_FILE
    if store and clusters.is_file():
        return CellStore(store.design, {**store, **load_arrays(clusters)})
    return store


# -- fidelity: what the presets change against the paper's LLM fine-tuning experiment, and which of its claims
# no row judges (rendered into docs/results/llm-robustness.md by descentlab.experiments.fidelity)

LLM = "LLM fine-tuning results"


def _model(c) -> str:
    name = c.model.name
    # Meta's Llama repositories on the Hugging Face hub are gated: a licence must be accepted first
    gated = " (gated on the hub: accept Meta's licence first)" if name.startswith("meta-llama/") else ""
    return f"{name}{gated}"


def _data(c) -> str:
    d = c.data
    if d.source == "alpaca":
        held = d.eval_path or f"{d.n_eval} prompts held out of {d.path}"
        return f"fine-tuned on Alpaca ({d.path}); evaluated on {held}"
    return (
        f"{d.source}: {d.n_train:,} windows of {d.seq_len} tokens; {d.n_eval} held-out passages "
        f"({d.prompt_tokens} prompt + {d.continuation_tokens} continuation tokens)"
    )


def _judge(c) -> str:
    judge = "likelihood judge (lower reference NLL wins) of record"
    if c.generative.model:
        return f"{judge}; generate-then-judge by {c.generative.model} on {', '.join(c.generative.conditions)}"
    return f"{judge}; no generative judge (generative.model unset)"


def _noise(c) -> str:
    ratios = ", ".join(f"×{r:g}" for r in c.grid.ratios)
    return (
        f"{', '.join(c.grid.kinds)} at the levels where ERM's validation perplexity grows {ratios}; "
        "the paper's γ = 1.5 read on NEFTune's scale"
    )


def _constraint(c) -> str:
    hard = c.method_config("hard")
    cands = ", ".join(repr(x) for x in c.candidates("hard"))
    return (
        f"{lagrangian(hard.constraint)}; only layers where the pretrained profile descends "
        f"({c.constraints.select}); α_l a fraction of that descent, chosen among {cands}"
    )


DEVIATIONS = [
    Deviation("model", "Llama 3.1 8B (base or instruct not stated)", _model, LLM),
    Deviation("data", "AlpacaEval (its prompts; training data not stated)", _data, LLM),
    Deviation("judge", "AlpacaEval head to head against the unconstrained model", _judge, LLM),
    Deviation("noise", "γ = 1.5 (formula not stated)", _noise, LLM),
    Deviation(
        "Lagrangian",
        "f_L + Σ_{l=1..L} λ_l (f_l − (1 − α_l) f_{l−1}), primal-dual (Algorithm 1)",
        _constraint,
        "Lagrangian of the method section",
    ),
    Deviation(
        "clean parity",
        "50 % win rate without noise",
        lambda c: "win rate within 5 points of 50 % (parity, 90 % interval)",
        LLM,
    ),
    Deviation(
        "training",
        "not stated",
        lambda c: (
            f"{c.train.max_steps:,} steps at batch {c.train.batch_size * c.train.grad_accum_steps}, {c.method.optimizer.name} lr {c.method.optimizer.lr:g}"
        ),
    ),
    Deviation("seeds", "not stated", lambda c: seeds(c.seeds, c.tune_seed)),
]

NOT_TESTED = [
    NotTested(
        "69.93 % win rate with γ = 1.5",
        "the size is not comparable: the paper's noise formula is not public, so γ = 1.5 here is a level on another scale (NEFTune's), read against a 135 M model judged by likelihood, not Llama 3.1 8B judged by AlpacaEval; the paper-gamma-1.5 row asks it only on that scale.",
        "the `paper` preset on Llama 3.1 8B with AlpacaEval's 805 prompts (`data.eval_path`) and its judge, at the paper's noise formula once it is public.",
        LLM,
    ),
    NotTested(
        "the primal-dual training is efficient and does not slow training much",
        "no row of this study judges it; benchmarks/constrained_overhead.py times a constrained step against an ERM "
        "step against its own targets, outside the claims engine.",
        "a row on that benchmark's time ratio at the paper's model size, with a declared tolerance.",
        "method (the cost of the primal-dual scheme)",
    ),
]

FIDELITY = Fidelity(DEVIATIONS, NOT_TESTED)
