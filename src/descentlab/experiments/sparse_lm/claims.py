"""The sparse-lm claims: paired bootstrap CIs over (seed, test block), an OLS at equal dense perplexity, checks.

Cells. ``n_M[s, p, b]`` is the mean next-token NLL (nats per token, i.e. log-perplexity) of test block b
under method M's model of seed s, pruned one-shot layer-wise to sparsity ``p`` (p = 0: dense). A seed fixes
the initialisation and the data order for every optimizer and every model sees the same test blocks, so
two methods' cells are paired and :func:`~descentlab.report.stats.paired_bootstrap` resamples seeds and
blocks. Differences are in log-perplexity: ``Δ = n_H - n_A < 0`` means HORST (H) is better than AdamW (A);
``exp(Δ)`` is the perplexity ratio. M is HAM, ``lo`` / ``hi`` the low and high claim sparsities (50 / 90 %).

1. ``seed-spread`` (a check, not a bootstrap): for every method, ``(max_s P_s - min_s P_s) / mean_s P_s <=
   spread`` with ``P_s`` the dense *validation* perplexity of seed s: the runs are trained long enough for
   the seeds to agree.
2. ``control`` (the positive control): ``n_A[hi] - n_A[lo] > 0``: the run sees that pruning AdamW's model to
   ``hi`` costs more than to ``lo``; its CI width says how finely the paired design resolves damage.
3. ``horst-beats-adamw`` at every p (dense included): ``n_H[p] - n_A[p] < 0``.
4. ``horst-beats-ham`` at ``hi``: ``n_H[hi] - n_M[hi] < 0``; ``horst-beats-l2`` at ``hi`` likewise against
   the AdamW-with-strong-weight-decay baseline, when it ran.
5. ``gap-widens``: ``(n_H - n_A)[hi] - (n_H - n_A)[lo] < 0``.
6. ``damage`` at every p > 0, HORST against AdamW at matched models (each against its own dense model):
   ``(n_H[p] - n_H[0]) - (n_A[p] - n_A[0]) < 0``.
7. ``damage-ols`` at every p > 0, at equal dense perplexity: over every trained run r (the tuning grid
   included), ``D_r = β_0 + β_1 L_r + γ_H 1[r is HORST] + γ_M 1[r is HAM] + ε_r`` with ``D_r`` the run's
   pruning damage (mean over test blocks of ``n[p] - n[0]``) and ``L_r`` its dense test log-perplexity;
   ``γ_H < 0`` is claimed. The interval is the OLS t-interval ``γ̂ ± t_{0.975, n-k} · se`` (se from
   ``σ̂² (XᵀX)⁻¹``, homoscedastic), held in a :class:`BootstrapCI` so :func:`verdict` reads it.
8. ``horst-peaked`` / ``horst-heavy-tailed``: per block matrix of the trained dense model, the fraction of
   entries with ``|w| < threshold`` / the excess kurtosis, HORST minus AdamW ``> 0``, cells (seeds x tensors).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats as sps

from descentlab.report.stats import BootstrapCI, claim_row, paired_bootstrap

Job = Mapping[str, Any]  # one training run's result (see experiments._sparse_lm_jobs.train_and_prune)

DESCRIPTIONS = {
    "control": "pruning AdamW's model to {hi:.0%} costs more log-ppl than to {lo:.0%} (positive control)",
    "horst-beats-adamw": "HORST's test log-ppl below AdamW's after pruning (same seed, same blocks)",
    "horst-beats-ham": "HORST's test log-ppl below HAM's after pruning",
    "horst-beats-l2": "HORST's test log-ppl below AdamW with strong weight decay (L2 shrink) after pruning",
    "gap-widens": "the HORST - AdamW log-ppl gap at {hi:.0%} below the gap at {lo:.0%}",
    "damage": "HORST's pruning damage (own dense model as reference) below AdamW's",
    "damage-ols": "HORST's damage below AdamW's at equal dense log-ppl (OLS over all runs, indicator)",
    "horst-peaked": "more of HORST's block weights below the threshold than AdamW's (per matrix)",
    "horst-heavy-tailed": "HORST's block matrices have a larger excess kurtosis than AdamW's",
}


def relative_spread(values: Sequence[float]) -> float:
    """``(max - min) / mean``: 0 for one value."""
    v = np.asarray(values, dtype=np.float64)
    return float((v.max() - v.min()) / v.mean())


def seed_spread_checks(finals: Mapping[str, Sequence[Job]], limit: float) -> list[dict[str, Any]]:
    """Claim 1 per method: the relative spread of the dense validation perplexity over seeds, against ``limit``."""
    rows = []
    for label, jobs in finals.items():
        ppl = [math.exp(j["val_nll"][0]) for j in jobs]
        spread = relative_spread(ppl)
        rows.append(
            {
                "claim": "seed-spread",
                "method": label,
                "dense_val_ppl": ppl,
                "spread": spread,
                "limit": limit,
                "verdict": "untested (one seed)" if len(ppl) < 2 else "met" if spread <= limit else "not met",
                "reason": f"(max - min) / mean over {len(ppl)} seeds = {100 * spread:.2f} % "
                f"(limit {100 * limit:g} %)",
            }
        )
    return rows


def ols_indicator(
    damage: Sequence[float],
    dense: Sequence[float],
    groups: Sequence[str],
    reference: str,
    level: float = 0.95,
) -> dict[str, Any]:
    """OLS of ``damage`` on ``[1, dense, 1[group = g] for g != reference]`` (claim 7 of the module docs).

    Returns ``coef`` / ``se`` / ``ci`` by regressor name (``intercept``, ``dense``, then each group), ``n``,
    ``dof`` and ``r2``. Raises ValueError when the design is rank-deficient or leaves no residual dof.
    """
    y = np.asarray(damage, dtype=np.float64)
    others = [g for g in dict.fromkeys(groups) if g != reference]
    names = ["intercept", "dense", *others]
    x = np.column_stack(
        [np.ones_like(y), np.asarray(dense, dtype=np.float64)]
        + [np.asarray([g == o for g in groups], dtype=np.float64) for o in others]
    )
    n, k = x.shape
    if np.linalg.matrix_rank(x) < k or n <= k:
        raise ValueError(f"the damage regression needs a full-rank design with n > k, got n={n}, k={k}")
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ beta
    sigma2 = float(resid @ resid) / (n - k)
    se = np.sqrt(np.diag(sigma2 * np.linalg.inv(x.T @ x)))
    t = float(sps.t.ppf(0.5 + level / 2, n - k))
    r2 = 1.0 - float(resid @ resid) / float(((y - y.mean()) ** 2).sum()) if n > 1 else math.nan
    return {
        "coef": dict(zip(names, beta.tolist(), strict=True)),
        "se": dict(zip(names, se.tolist(), strict=True)),
        "ci": {m: [b - t * s, b + t * s] for m, b, s in zip(names, beta.tolist(), se.tolist(), strict=True)},
        "n": n,
        "dof": n - k,
        "r2": r2,
        "level": level,
    }


def _row(claim: str, p: float, a: str, b: str, ci: BootstrapCI, means: tuple[float, float], cells: str, **kw):
    direction = kw.pop("direction", "less")
    return {
        "claim": claim,
        "sparsity": p,
        "a": a,
        "b": b,
        "metric": kw.pop("metric", "log_ppl"),
        "cells": cells,
        "description": DESCRIPTIONS[claim].format(**kw),
        **claim_row(ci, direction, means),
    }


def evaluate_claims(
    cells: Mapping[str, np.ndarray],
    xs: Sequence[float],
    *,
    lo: float,
    hi: float,
    n_boot: int,
    runs: Sequence[Job] = (),
    shapes: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """Claims 2-8 of the module docs for the methods present.

    Args:
        cells: label -> ``[seeds, levels, blocks]`` test NLLs (``levels`` as ``xs``; xs[0] = 0 = dense);
            the labels ``adamw``, ``horst``, ``ham`` and ``adamw-l2`` are the ones the claims name.
        xs: the sparsity of each level.
        lo, hi: the low and high claim sparsities (both in ``xs``).
        n_boot: bootstrap replicates.
        runs: every trained run (the OLS sample): ``optimizer`` and ``test_nll`` (mean per level).
        shapes: label -> per-seed ``tensor_shape_stats`` of the dense trained weights.
    """
    at = {float(x): i for i, x in enumerate(xs)}
    i_lo, i_hi = at[lo], at[hi]
    rows: list[dict[str, Any]] = []
    sb = "seeds x test blocks"

    def boot(a: np.ndarray, b: np.ndarray) -> BootstrapCI:
        return paired_bootstrap(a, b, n_boot=n_boot)

    def pair(claim: str, a: str, b: str, p: float, ca: np.ndarray, cb: np.ndarray, **kw) -> None:
        rows.append(_row(claim, p, a, b, boot(ca, cb), (float(ca.mean()), float(cb.mean())), sb, **kw))

    lim = {"lo": lo, "hi": hi}
    if "adamw" in cells:
        a = cells["adamw"]
        pair(
            "control",
            f"adamw@{hi:g}",
            f"adamw@{lo:g}",
            hi,
            a[:, i_hi],
            a[:, i_lo],
            direction="greater",
            **lim,
        )
    if "horst" in cells and "adamw" in cells:
        h, a = cells["horst"], cells["adamw"]
        for p, i in at.items():
            pair("horst-beats-adamw", f"horst@{p:g}", f"adamw@{p:g}", p, h[:, i], a[:, i])
        pair("gap-widens", f"(horst-adamw)@{hi:g}", f"(horst-adamw)@{lo:g}", hi, h[:, i_hi] - a[:, i_hi],
             h[:, i_lo] - a[:, i_lo], **lim)  # fmt: skip
        for p, i in at.items():
            if i:
                pair("damage", f"horst@{p:g}", f"adamw@{p:g}", p, h[:, i] - h[:, 0], a[:, i] - a[:, 0])
    for other, claim in (("ham", "horst-beats-ham"), ("adamw-l2", "horst-beats-l2")):
        if "horst" in cells and other in cells:
            pair(
                claim, f"horst@{hi:g}", f"{other}@{hi:g}", hi, cells["horst"][:, i_hi], cells[other][:, i_hi]
            )
    if runs and "horst" in {r["optimizer"] for r in runs} and "adamw" in {r["optimizer"] for r in runs}:
        rows += ols_claims(runs, xs)
    if shapes and "horst" in shapes and "adamw" in shapes:
        for claim, key in (("horst-peaked", "frac_below"), ("horst-heavy-tailed", "kurtosis")):
            ca = np.asarray([s[key] for s in shapes["horst"]], dtype=np.float64)
            cb = np.asarray([s[key] for s in shapes["adamw"]], dtype=np.float64)
            means = (float(ca.mean()), float(cb.mean()))
            ci = boot(ca, cb)
            cells_name = "seeds x block matrices"
            rows.append(
                _row(claim, 0.0, "horst", "adamw", ci, means, cells_name, direction="greater", metric=key)
            )
    return rows


def ols_claims(runs: Sequence[Job], xs: Sequence[float]) -> list[dict[str, Any]]:
    """Claim 7 at every p > 0: HORST's damage indicator at equal dense log-perplexity (module docs)."""
    rows = []
    groups = [r["optimizer"] for r in runs]
    dense = [r["test_nll"][0] for r in runs]
    for i, p in enumerate(xs):
        if not i:
            continue
        damage = [r["test_nll"][i] - r["test_nll"][0] for r in runs]
        try:
            fit = ols_indicator(damage, dense, groups, reference="adamw")
        except ValueError:  # too few runs for the regressors (e.g. one seed, no grid): no OLS row
            return []
        lo_h, hi_h = fit["ci"]["horst"]
        ci = BootstrapCI(mean=fit["coef"]["horst"], low=lo_h, high=hi_h, n=fit["n"], shape=(fit["n"],))
        by_group = {
            g: float(np.mean([d for d, gg in zip(damage, groups, strict=True) if gg == g])) for g in groups
        }
        row = _row("damage-ols", float(p), f"horst@{p:g}", f"adamw@{p:g}", ci,
                   (by_group["horst"], by_group["adamw"]), f"{fit['n']} runs (OLS t-interval)")  # fmt: skip
        row["ols"] = fit
        rows.append(row)
    return rows


def claims_table(claims: Sequence[Mapping[str, Any]], checks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Checks and claims as one table: differences in log-perplexity (nats per token) unless named."""
    rows = [
        [c["claim"], c["method"], " / ".join(f"{p:.2f}" for p in c["dense_val_ppl"]), f"{100 * c['spread']:.2f} %"
         f" (limit {100 * c['limit']:g} %)", c["verdict"], ""]
        for c in checks
    ]  # fmt: skip
    for c in claims:
        lo, hi = c["ci"]
        rows.append(
            [
                c["claim"] + ("" if c["metric"] in ("log_ppl",) else f" ({c['metric']})"),
                f"{c['a']} - {c['b']}" + (f" ({c['sparsity']:.0%})" if c["metric"] == "log_ppl" else ""),
                f"{c['a_mean']:.4g} vs {c['b_mean']:.4g}",
                f"{c['estimate']:+.4f} [{lo:+.4f}, {hi:+.4f}]",
                c["verdict"],
                f"{c['min_detectable_effect']:.3g}",
            ]
        )
    return {
        "title": "Checks and claims: paired 95 % bootstrap CI of a - b over (seeds x test blocks) in test "
        "log-perplexity (negative: a better), over (seeds x block matrices) for the weight shape; damage-ols: "
        "OLS t-interval over runs",
        "columns": ["claim", "a - b", "a vs b", "difference [95 % CI]", "verdict", "min detectable effect"],
        "rows": rows,
    }


def ols_table(claims: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Every fitted coefficient of the damage regressions (claim 7)."""
    fits = [(c["sparsity"], c["ols"]) for c in claims if c["claim"] == "damage-ols"]
    if not fits:
        return None
    rows = []
    for p, f in fits:
        for name in f["coef"]:
            lo, hi = f["ci"][name]
            rows.append(
                [f"{p:.0%}", name, f"{f['coef'][name]:+.4f} [{lo:+.4f}, {hi:+.4f}]", f["n"], f"{f['r2']:.3f}"]
            )
    return {
        "title": "Damage regression over every trained run: damage = b0 + b1 * dense test log-ppl + gamma_g * "
        "1[optimizer g] (reference AdamW), 95 % OLS t-intervals",
        "columns": ["sparsity", "regressor", "coefficient [95 % CI]", "runs", "R^2"],
        "rows": rows,
    }


def claim_notes(claims: Sequence[Mapping[str, Any]], checks: Sequence[Mapping[str, Any]]) -> list[str]:
    """One plain sentence per check and claim."""
    notes = [f"seed-spread of {c['method']}: {c['reason']}: {c['verdict']}." for c in checks]
    for c in claims:
        est, lo, hi = (format(x, "+.4f") for x in (c["estimate"], *c["ci"]))
        where = (
            f"at {100 * c['sparsity']:g} %" if c["metric"] == "log_ppl" else "on the trained dense weights"
        )
        notes.append(
            f"{c['claim']} {where} ({c['a']} - {c['b']}, {c['metric']}): {est} [{lo}, {hi}]: "
            f"{c['verdict']} ({c['reason']})."
        )
    return notes


__all__ = [
    "claim_notes",
    "claims_table",
    "evaluate_claims",
    "ols_claims",
    "ols_indicator",
    "ols_table",
    "relative_spread",
    "seed_spread_checks",
]
