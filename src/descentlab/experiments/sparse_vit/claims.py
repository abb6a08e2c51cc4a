"""sparse-vit's claims, declared before the run, and the cells the claims engine judges them on.

Cells (``arrays/claims.npz``, written by the run):

* ``correct/<method>/<p>``: ``c[s, n] ∈ {0, 1}``, whether method's model of training seed s, trained with
  AC/DC at sparsity p, classifies test image n correctly (``[seeds, images]``); ``correct/<dense>/dense``
  the dense reference's, ``correct/<method>/paper-like`` the paper-like arm's (block Linears only).
* ``frac_below/<method>/<p>``, ``kurtosis/<method>/<p>``: per prunable tensor t of seed s (``[seeds,
  tensors]``), the fraction of its entries with ``|w| <`` the threshold and its excess kurtosis, read when
  the final pruning sees the weights (the end of the last decompressed phase). Each tensor counts once,
  whatever its size.
* ``sparsities``, ``claim_sparsity``, ``paper_like_sparsity``: the levels; ``prune``: the run's prunable set
  (``all``: every Linear/Conv weight; ``blocks``: the block Linears), ``all`` when the run saved none.

A run whose prunable set is the block Linears (the ``full-paper-like`` preset, tuned in that setting) is
the paper-like arm itself: its cells at ``paper_like_sparsity`` judge ``paper-like``, every other row names
the set, and the primary endpoint (every Linear/Conv prunable) is not in it, the reason naming both sets.

A difference of accuracies is ``mean(c_a − c_b)`` over the cells; its interval is the seed-level one of the
engine (:func:`~descentlab.report.stats.paired_interval`). Accuracies are fractions: 0.01 is one point.

Smallest effects of interest. Accuracy: 1 point (0.01). The paper reports +8 points for HORST over AdamW
(DeiT-base, 90 %) and +10 over HAM (DeiT-small, 90 %); a gain under 1 point would not carry its claim of a
large sparse-accuracy advantage, and it is about twice the seed-to-seed sd of one method's accuracy here
(0.1–0.6 points at 98–99 % in the committed run). Weight shape: 0.01 of the weights below the threshold (one percentage point),
and 3 units of excess kurtosis (the distance from a Gaussian to a Laplace, a change of shape class).

Power, declared before the full run. The pilot is the earlier protocol's full run (seeds 0-2, the same
model, data, budget and prunable set, apart from the tuning seed 1000 and the evaluation seeds 100-107):
at 99 % its per-seed test accuracies had sd 0.23 points (AdamW) and 0.55 (HORST). Its per-seed pairs were
not saved, so the sd of the paired difference is taken as if the two were independent, √(0.23² + 0.55²) =
0.60 points. With the full preset's 8 evaluation seeds the seed-level minimum detectable effect (80 %
power, 95 % t interval) is 2.365 · 0.60 / √8 · (1.96 + 0.84) / 1.96 = 0.71 points, under the 1-point
smallest effect of interest: the run can reproduce a 1-point gain, and refute one only if the true
difference is near 0. The earlier run's means differed by +1.03 points.

Power of the paper-like run (``full-paper-like``: block Linears at 90 %, 6 fresh seeds 200-205), declared
before it. The pilot is the earlier protocol's run on the same prunable set (commit cf00da3, seeds 0-2, the
same model, data and budget, tuned on seed 0): at 90 % its per-seed test accuracies had sd 0.157 points
(AdamW), 0.136 (HORST) and 0.318 (HAM). Taken as independent, the paired sd of HORST − AdamW is 0.21 points
and of HORST − HAM 0.35, so with 6 seeds the MDE is 2.571 · 0.21 / √6 · 2.80 / 1.96 = 0.31 points (HORST −
AdamW, the arm's headline row) and 0.52 (HORST − HAM): both under the 1-point smallest effect of interest,
so each row can be reproduced or refuted. That pilot's means differed by +0.09 (HORST − AdamW) and −0.60
(HORST − HAM) points, and AC/DC cost AdamW 0.8 points against its dense model: the regime control is
expected to fail at 3 points here, which is what the ``full`` preset's prunable set was chosen to avoid.

Power of the levels run (``full-levels``: 98, 99 and 99.5 %, AdamW and HORST at ``full``'s choices, 6 fresh
seeds 300-305), declared before it. The pilot is the ``full`` run: its 8 per-seed differences HORST −
AdamW at 99 % had sd 0.71 points, taken for every level (the other levels have no seed-level pilot). With 6
seeds the MDE is 2.571 · 0.71 / √6 · 2.80 / 1.96 = 1.06 points, at the 1-point smallest effect of interest:
a row can be refuted when its estimate sits near 0 or below, and a 1-point gain is detected with a little
under 80 % power. ``full``'s means differed by −0.44 at 99 %; the earlier protocol's (3 seeds, every
method at AdamW's lr 4e-3) by +0.61 at 98 % and +1.13 at 99.5 %.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np

from descentlab.io import load_arrays
from descentlab.report.claims import Cells, ClaimSpec, NotInRun, require_arm

PAPER_SOURCE = "HORST paper, experiments (DeiT on ImageNet with AC/DC)"
ACCURACY_SESOI = 0.01  # 1 point (module docs)
Arrays = Mapping[str, np.ndarray]


def claim_arrays(run_dir: Path) -> dict[str, np.ndarray]:
    """The run's ``arrays/claims.npz``; the levels (``sparsities``, ``claim_sparsity``,
    ``paper_like_sparsity``) and the prunable set (``acdc.prune``) from its config when the run saved none,
    so a missing cell is named; the design (``methods``, the ``dense`` arm, ``paper_like_seeds``) from its
    config, so a claim on an arm the run never had is ``not in this run`` rather than pending."""
    run_dir = Path(run_dir)
    path = run_dir / "arrays" / "claims.npz"
    out = load_arrays(path) if path.is_file() else {}
    results = run_dir / "results.json"
    cfg = json.loads(results.read_text()).get("config", {}) if results.is_file() else {}
    for name in ("sparsities", "claim_sparsity", "paper_like_sparsity"):
        if name not in out and name in cfg:
            out[name] = np.asarray(cfg[name], dtype=np.float64)
    if "prune" not in out and "prune" in cfg.get("acdc", {}):
        out["prune"] = np.asarray(cfg["acdc"]["prune"])
    if "methods" in cfg:
        out["design/methods"] = np.asarray(cfg["methods"])
    if "dense" in cfg:
        out["design/dense"] = np.asarray(cfg["dense"] or "")
    if "paper_like_seeds" in cfg:
        out["design/paper_like_seeds"] = np.asarray(cfg["paper_like_seeds"], dtype=np.int64)
    return out


def _trained(arrays: Arrays, method: str) -> None:
    """``method`` must be an arm of the run's config (a run without the record is taken to have had it:
    its missing cells pend)."""
    if "design/methods" in arrays:
        require_arm(arrays["design/methods"].tolist(), method)


def key(kind: str, method: str, at: float | str) -> str:
    """The name of one cell array: ``kind/method/at`` (``at`` a sparsity, ``dense`` or ``paper-like``)."""
    return f"{kind}/{method}/{at if isinstance(at, str) else format(float(at), 'g')}"


def _level(arrays: Arrays, name: str) -> float:
    return float(arrays[name])


# the prunable sets in words (``acdc.prune``), for the reason a claim's set is not the run's
_SETS = {"all": "every Linear/Conv weight", "blocks": "the block Linears only"}


def _prunable(arrays: Arrays) -> str:
    """The run's prunable set: ``all`` (every Linear/Conv weight) or ``blocks`` (the block Linears)."""
    return str(arrays["prune"]) if "prune" in arrays else "all"


def _pct(arrays: Arrays, p: float) -> str:
    """A row's level, naming the prunable set when it is the block Linears."""
    where = "block Linears, " if _prunable(arrays) == "blocks" else ""
    return f"{where}sparsity {100 * p:g} %"


def horst_adamw(arrays: Arrays) -> Iterator[Cells]:
    """HORST against AdamW at the claim sparsity, every Linear/Conv prunable; a run over another prunable
    set trained the right arms on the wrong weights, so it is not in this run, naming both sets."""
    if (prune := _prunable(arrays)) != "all":
        raise NotInRun(
            f"the run's prunable set is {_SETS.get(prune, prune)} (acdc.prune={prune}); the primary compares "
            f"AC/DC over {_SETS['all']} (acdc.prune=all)"
        )
    at = _level(arrays, "claim_sparsity")
    a, b = arrays[key("correct", "horst", at)], arrays[key("correct", "adamw", at)]
    yield Cells(a, b, "horst", "adamw", _pct(arrays, at))


def horst_adamw_levels(arrays: Arrays) -> Iterator[Cells]:
    """HORST against AdamW at every other sparsity."""
    at = _level(arrays, "claim_sparsity")
    levels = [float(p) for p in np.atleast_1d(arrays["sparsities"]) if float(p) != at]
    cells = [(arrays[key("correct", "horst", p)], arrays[key("correct", "adamw", p)], p) for p in levels]
    for a, b, p in cells:
        yield Cells(a, b, "horst", "adamw", _pct(arrays, p))


def horst_ham(arrays: Arrays) -> Iterator[Cells]:
    _trained(arrays, "ham")
    at = _level(arrays, "claim_sparsity")
    yield Cells(
        arrays[key("correct", "horst", at)],
        arrays[key("correct", "ham", at)],
        "horst",
        "ham",
        _pct(arrays, at),
    )


def paper_like(arrays: Arrays) -> Iterator[Cells]:
    """HORST against AdamW in the paper-like arm (block Linears only): the ``paper_like_seeds`` side arm's
    cells, or in a run whose prunable set is the block Linears, its cells at ``paper_like_sparsity``."""
    at = _level(arrays, "paper_like_sparsity")
    arm = "paper-like" if _prunable(arrays) != "blocks" else at
    if (
        arm == "paper-like"
        and "design/paper_like_seeds" in arrays
        and not arrays["design/paper_like_seeds"].size
    ):
        raise NotInRun(
            "the run had no paper-like arm (no paper_like_seeds, and every Linear/Conv was prunable)"
        )
    a, b = arrays[key("correct", "horst", arm)], arrays[key("correct", "adamw", arm)]
    yield Cells(a, b, "horst", "adamw", f"block Linears, sparsity {100 * at:g} %")


def regime(arrays: Arrays) -> Iterator[Cells]:
    """The dense AdamW against AdamW with AC/DC at every sparsity (same seeds, same test images)."""
    if "design/dense" in arrays and str(arrays["design/dense"]) != "adamw":
        raise NotInRun("the run trained no dense AdamW arm (dense is not adamw in its config)")
    dense = arrays[key("correct", "adamw", "dense")]
    levels = [float(p) for p in np.atleast_1d(arrays["sparsities"])]
    cells = [(arrays[key("correct", "adamw", p)], p) for p in levels]
    for b, p in cells:
        yield Cells(dense, b, "adamw (dense)", "adamw", _pct(arrays, p))


def _shape(stat: str):
    def cells(arrays: Arrays) -> Iterator[Cells]:
        at = _level(arrays, "claim_sparsity")
        a, b = arrays[key(stat, "horst", at)], arrays[key(stat, "adamw", at)]
        yield Cells(a, b, "horst", "adamw", f"{_pct(arrays, at)}, before the final pruning")

    cells.__doc__ = f"HORST's per-tensor {stat} against AdamW's, at the claim sparsity."
    return cells


CLAIMS: list[ClaimSpec] = [
    ClaimSpec(
        name="horst-adamw",
        description="HORST with AC/DC is more accurate than AdamW with AC/DC at the extreme sparsity, every "
        "Linear/Conv weight prunable",
        cells=horst_adamw,
        metric="test accuracy (fraction)",
        direction="greater",
        sesoi=ACCURACY_SESOI,
        paper="DeiT-base, 90 %: HORST 76.83 vs AdamW 68.86 (+7.97 points)",
        source=PAPER_SOURCE,
        primary=True,
    ),
    ClaimSpec(
        name="horst-adamw-levels",
        description="HORST with AC/DC is more accurate than AdamW with AC/DC at the other sparsities",
        cells=horst_adamw_levels,
        metric="test accuracy (fraction)",
        direction="greater",
        sesoi=ACCURACY_SESOI,
        paper="HORST above AdamW at 70, 80 and 90 %, most at 80-90 %",
        source=PAPER_SOURCE,
    ),
    ClaimSpec(
        name="horst-ham",
        description="HORST with AC/DC is more accurate than HAM with AC/DC",
        cells=horst_ham,
        metric="test accuracy (fraction)",
        direction="greater",
        sesoi=ACCURACY_SESOI,
        paper="DeiT-small, 90 %: HORST 70.5 vs HAM 60.06 (+10.44 points)",
        source=PAPER_SOURCE,
    ),
    ClaimSpec(
        name="paper-like",
        description="in a paper-like setting (AC/DC over the block Linears at the paper's 90 %), HORST is "
        "more accurate than AdamW",
        cells=paper_like,
        metric="test accuracy (fraction)",
        direction="greater",
        sesoi=ACCURACY_SESOI,
        paper="DeiT-base, 90 %: HORST 76.83 vs AdamW 68.86 (+7.97 points)",
        source=PAPER_SOURCE,
    ),
    ClaimSpec(
        name="regime",
        control=True,
        description="positive control: AC/DC costs AdamW at least 3 points against its dense model, so a "
        "better sparse optimizer has something to recover",
        cells=regime,
        metric="test accuracy (fraction)",
        kind="sized",
        direction="greater",
        size=0.03,
    ),
    ClaimSpec(
        name="horst-peaked",
        description="more of HORST's prunable weights lie near 0 (|w| below the threshold) than AdamW's",
        cells=_shape("frac_below"),
        metric="fraction of a tensor's weights with |w| < threshold",
        direction="greater",
        sesoi=0.01,
        paper="HORST's weight distribution sharply peaked at 0, AdamW's broad, near Gaussian (no number)",
        source="HORST paper, weight-distribution figures",
    ),
    ClaimSpec(
        name="horst-heavy-tailed",
        description="HORST's prunable weights have a larger excess kurtosis (sharper peak, heavier tails) "
        "than AdamW's",
        cells=_shape("kurtosis"),
        metric="excess kurtosis of a tensor's weights",
        direction="greater",
        sesoi=3.0,
        paper="HORST's weight distribution sharply peaked at 0, AdamW's broad, near Gaussian (no number)",
        source="HORST paper, weight-distribution figures",
    ),
]
