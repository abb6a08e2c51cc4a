r"""implicit-bias's claims: Theorem 4.7 on its own objects, then HORST's L1 bias and HORST against HAM.

Cells are seeds: each seed draws its own problem, and every method runs on it from w = 0, so the per-seed
values of two methods are paired; each cell is one number per seed (``[seeds]``), an exact function of the
run (the references are closed forms: pinv, linprog). The run saves them in ``arrays/claims.npz``:

* ``theorem_steps`` ``[P]`` and ``theorem_ratio__<m>`` ``[seeds, P]``: Theorem 4.7's run, the normalised L1
  margin over the optimal one (linprog) at P log-spaced steps, for m = ``ngd+mirror_after`` (p = 2) and
  ``sign+mirror_after`` (p = ∞), decaying step;
* ``cls_l1_margin_ratio__<m>``, ``cls_nnz__<m>``, ``reg_l1_ratio__<m>`` ``[seeds]``: the main problems
  (constant step), every method run;
* ``scales_decades`` ``[K]`` and ``scales_l1_margin_ratio__<m>`` ``[K, seeds]``: the heterogeneous-scale study,
  HORST and HAM each at the alpha chosen on validation seeds.

A run without ``arrays/claims.npz`` has every row pending; one that lacks Theorem 4.7's run has those rows
pending.

Primary endpoint: ``theorem-sign-mirror``. Theorem 4.7 says L_p steepest descent (p >= 2) composed with the
hyperbolic mirror map converges in direction to the maximum-L1-margin separator. Of its two objects run
here, sign descent (p = ∞) is the primary: it is the case nearest HORST's base (Adam behaves like sign
descent), and the one the earlier constant-step run left open (0.675 of the optimum, falling); normalised
GD + mirror (p = 2, 0.986 there) is a secondary row. "Converges" is judged at the end of a finite run as a
sized claim: the margin ratio is at least τ = 0.9 (the threshold fixed before the earlier run; a ratio
can only approach 1 from below). ``theorem-sign-mirror-rising`` says whether it is still approaching.

Smallest effects of interest (in each metric's units): 0.01 of the optimal L1 margin between HORST and
HAM (in the earlier run their mean ratios still moved by 0.004 and 0.007 between steps 4,860 and 20,000,
so a gap under 0.01 is within what more steps could change); 0.01 for "still rising" (the same reason); 0.05 of the optimal
margin for HORST against Adam (Adam's ratio varies by about 0.04 between seeds: a smaller gain is not the
L1 bias); 5 non-zeros of 100 coordinates; 0.05 of the minimum L1 norm on regression.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from descentlab.report.claims import CellFunction, Cells, ClaimSpec, MissingArrays

CLAIM_ARRAYS = "arrays/claims.npz"
TAU = 0.9  # "approaches the optimal L1 margin": the fraction fixed before the earlier run
SIGN_MIRROR, NGD_MIRROR = "sign+mirror_after", "ngd+mirror_after"
THEOREM = "HORST paper, Theorem 4.7 (L_p steepest descent, p >= 2, composed with the hyperbolic mirror map)"
RATIO = "normalised L1 margin / optimal L1 margin (linprog)"


def _get(arrays: Mapping[str, np.ndarray], key: str, *, per_seed: bool = True) -> np.ndarray:
    """``arrays[key]``; a per-seed array (seeds on its last axis, or its first for the theorem's paths) needs
    two seeds: one per-seed number per arm has no spread to judge (and nothing else to vary), so a one-seed
    run's rows wait for a run with more seeds."""
    if key not in arrays:
        raise MissingArrays(key)
    value = np.asarray(arrays[key], dtype=np.float64)
    if not np.isfinite(value).all():
        raise MissingArrays(f"finite values of {key} (a run overflowed)")
    seeds = value.shape[0] if key.startswith("theorem_ratio") else value.shape[-1]
    if per_seed and seeds < 2:
        raise MissingArrays(
            f"{key} over at least two seeds (this run has one: training variance not measured)"
        )
    return value


def reaches(method: str, key: str, at: str = "") -> CellFunction:
    """Cells of "``method``'s L1 margin ratio is at least τ" (a sized claim): its per-seed ratio against 0.
    ``key`` names a ``[seeds]`` array, or ``theorem_ratio__<m>`` whose last recorded step is taken."""

    def cells(arrays: Mapping[str, np.ndarray]) -> list[Cells]:
        value = _get(arrays, key)
        final = value[:, -1] if value.ndim == 2 else value
        return [Cells(final, np.zeros_like(final), method, "0", at)]

    return cells


def sign_mirror_rising(arrays: Mapping[str, np.ndarray]) -> list[Cells]:
    """sign + mirror's ratio at the last step against the recorded step nearest a tenth of the run."""
    steps = _get(arrays, "theorem_steps", per_seed=False)
    ratio = _get(arrays, f"theorem_ratio__{SIGN_MIRROR}")
    tenth = int(np.argmin(np.abs(np.log(steps) - np.log(steps[-1] / 10))))
    end, mid = f"step {int(steps[-1])}", f"step {int(steps[tenth])}"
    return [Cells(ratio[:, -1], ratio[:, tenth], f"{SIGN_MIRROR} at {end}", f"at {mid}")]


def paired(metric: str, a: str, b: str) -> CellFunction:
    """Cells of ``a − b`` on the main problems' per-seed ``metric``."""

    def cells(arrays: Mapping[str, np.ndarray]) -> list[Cells]:
        return [Cells(_get(arrays, f"{metric}__{a}"), _get(arrays, f"{metric}__{b}"), a, b)]

    return cells


def scales(where: str, against: str | None) -> CellFunction:
    """Cells on the heterogeneous-scale study: HORST − ``against`` (or HORST's ratio against 0 for a sized
    claim when None) at the equal-scale problem (``"equal"``: 0 decades), every spread > 0 (``"spread"``)
    or every spread (``"all"``)."""

    def cells(arrays: Mapping[str, np.ndarray]) -> list[Cells]:
        decades = _get(arrays, "scales_decades", per_seed=False)
        horst = _get(arrays, "scales_l1_margin_ratio__horst")
        other = _get(arrays, f"scales_l1_margin_ratio__{against}") if against else np.zeros_like(horst)
        keep = {"equal": decades == 0, "spread": decades > 0, "all": decades >= 0}[where]
        if not keep.any():
            raise MissingArrays(f"the scale study at {where} scales (decades {decades.tolist()})")
        return [
            Cells(horst[i], other[i], "horst", against or "0", f"{decades[i]:g} decades")
            for i in np.flatnonzero(keep)
        ]

    return cells


CLAIMS: list[ClaimSpec] = [
    ClaimSpec(
        name="theorem-sign-mirror",
        description="Theorem 4.7 with p = ∞: sign descent composed with the hyperbolic mirror step (decaying "
        "step) reaches at least τ = 0.9 of the optimal L1 margin on separable data",
        cells=reaches(SIGN_MIRROR, f"theorem_ratio__{SIGN_MIRROR}", "end of the decaying-step run"),
        metric=RATIO,
        kind="sized",
        size=TAU,
        paper="converges in direction to the max-L1-margin separator (ratio -> 1)",
        source=THEOREM,
        primary=True,
    ),
    ClaimSpec(
        name="theorem-ngd-mirror",
        description="Theorem 4.7 with p = 2: normalised GD composed with the hyperbolic mirror step (decaying "
        "step) reaches at least τ = 0.9 of the optimal L1 margin",
        cells=reaches(NGD_MIRROR, f"theorem_ratio__{NGD_MIRROR}", "end of the decaying-step run"),
        metric=RATIO,
        kind="sized",
        size=TAU,
        paper="converges in direction to the max-L1-margin separator (ratio -> 1)",
        source=THEOREM,
    ),
    ClaimSpec(
        name="theorem-sign-mirror-rising",
        description="sign descent + mirror is still approaching the optimum: its ratio at the last step "
        "exceeds its ratio a decade of steps earlier",
        cells=sign_mirror_rising,
        metric=RATIO,
        sesoi=0.01,
        paper="convergence implies the ratio rises towards 1",
        source=THEOREM,
    ),
    ClaimSpec(
        name="horst-l1-direction",
        description="HORST (Adam + mirror step, constant step) reaches at least τ = 0.9 of the optimal L1 "
        "margin; Adam is not an L_p steepest descent, so this is HORST's row, not the theorem's",
        cells=reaches("horst", "cls_l1_margin_ratio__horst"),
        metric=RATIO,
        kind="sized",
        size=TAU,
        source="the HORST paper's reading of Theorem 4.7 for its optimizer",
    ),
    ClaimSpec(
        name="horst-l1-vs-adam",
        description="HORST's L1 margin exceeds Adam's (separable classification)",
        cells=paired("cls_l1_margin_ratio", "horst", "adam"),
        metric=RATIO,
        sesoi=0.05,
        source="the HORST paper: the mirror step replaces Adam's L∞ bias by an L1 bias",
    ),
    ClaimSpec(
        name="horst-sparser-than-adam",
        description="HORST's separator has fewer non-zeros than Adam's",
        cells=paired("cls_nnz", "horst", "adam"),
        metric="non-zeros of the separator (|w_i| > 1e-3 max|w|), of 100",
        direction="less",
        sesoi=5.0,
    ),
    ClaimSpec(
        name="horst-min-l1-regression",
        description="HORST's interpolant has a smaller ||w||_1 / min L1 than Adam's (under-determined least "
        "squares from 0)",
        cells=paired("reg_l1_ratio", "horst", "adam"),
        metric="||w||_1 / minimum L1 norm of an interpolant (linprog)",
        direction="less",
        sesoi=0.05,
    ),
    ClaimSpec(
        name="horst-vs-ham-equal-scales",
        description="HORST's L1 margin exceeds HAM's on the problem with equal column scales, each at the "
        "alpha chosen on validation seeds",
        cells=scales("equal", "ham"),
        metric=RATIO,
        sesoi=0.01,
        source="the HORST paper's ordering of HORST over HAM",
    ),
    ClaimSpec(
        name="horst-vs-ham-spread",
        description="HORST's L1 margin exceeds HAM's when the column scales spread over 1-4 decades",
        cells=scales("spread", "ham"),
        metric=RATIO,
        sesoi=0.01,
        source="the HORST paper's ordering of HORST over HAM",
    ),
    ClaimSpec(
        name="horst-l1-direction-scales",
        description="HORST reaches at least τ = 0.9 of the optimal L1 margin at every spread of column scales",
        cells=scales("all", None),
        metric=RATIO,
        kind="sized",
        size=TAU,
    ),
]
