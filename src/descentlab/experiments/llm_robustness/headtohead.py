"""llm-robustness statistics: head to head against the baseline, claims with verdicts, the results body.

Cells are held-out examples i (and noise draws d) of one (kind, level); every method saw the same noisy
embeddings there. Against the baseline B (ERM), method M has, per cell,

    preference  p_di = 1[r^M < r^B - tol] + 1/2 · 1[|r^M - r^B| <= tol]      (r: reference NLL, nats)
    ΔNLL        δ_di = (r^M_di - r^B_di) / n_i                               (n_i: reference tokens)

The win rate is mean p, its 95 % CI the paired bootstrap of p against 1/2 over (draws x examples)
(:func:`~descentlab.report.stats.paired_bootstrap`); ΔNLL likewise (negative: M assigns the reference more
probability). Claims (METHODS.md §1.6, the paper's Llama 3.1 8B on AlpacaEval):

* ``clean-parity``: 50 % at γ = 0; reproduced when the win rate's CI contains 50 %
  (:func:`~descentlab.report.stats.parity_verdict`);
* ``paper-1.5``: 69.93 % at γ = 1.5 read on NEFTune's scale (α = 1.5); the win rate minus 1/2 must
  exceed 0 and not lie entirely short of 0.1993;
* ``noisy-win`` and ``noisy-nll`` at each level where ERM's perplexity grew x1.5, x3, x10: win rate > 50 %
  and ΔNLL < 0.

Tables and figures: :mod:`descentlab.report.llm_robustness`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from descentlab.report.llm_robustness import PAPER_KIND, PAPER_WIN_RATE, tables
from descentlab.report.results import Curve, MethodResult
from descentlab.report.stats import paired_bootstrap, parity_verdict, verdict


def noise_key(kind: str, level: float, draw: int) -> str:
    """The evaluation key of one condition (the same as :func:`descentlab.robustness.lm_eval.noise_key`)."""
    return "clean" if level == 0 else f"{kind}@{level:g}#{draw}"


def _cells(ev: Mapping[str, Any], kind: str, level: float, draws: int) -> np.ndarray:
    """Reference NLLs ``[draws, N]`` (the clean pass repeated over draws at level 0)."""
    return np.asarray([ev["nll"][noise_key(kind, level, 0 if level == 0 else d)] for d in range(draws)])


def head_to_head(
    ev_m: Mapping[str, Any],
    ev_b: Mapping[str, Any],
    kind: str,
    level: float,
    *,
    draws: int,
    tol: float = 1e-6,
    n_boot: int = 2000,
) -> dict[str, Any]:
    """Win rate and per-token ΔNLL of M against B at one condition, each with a paired bootstrap CI."""
    a, b = _cells(ev_m, kind, level, draws), _cells(ev_b, kind, level, draws)
    n = np.asarray(ev_m["ref_tokens"], dtype=float)[None, :]
    p = np.where(a < b - tol, 1.0, np.where(a > b + tol, 0.0, 0.5))
    if level == 0:  # one clean pass: resampling identical draws adds nothing
        p, a, b = p[:1], a[:1], b[:1]
    win = paired_bootstrap(p, np.full_like(p, 0.5), n_boot=n_boot)
    delta = paired_bootstrap(a / n, b / n, n_boot=n_boot)
    return {
        "win_rate": float(p.mean()),
        "win_ci": [0.5 + win.low, 0.5 + win.high],
        "win_bootstrap": win,
        "wins": int((p == 1).sum()),
        "ties": int((p == 0.5).sum()),
        "losses": int((p == 0).sum()),
        "delta_nll": delta.mean,
        "delta_ci": [delta.low, delta.high],
        "delta_bootstrap": delta,
    }


def _perplexity(ev: Mapping[str, Any], kind: str, level: float, draws: int) -> float:
    keys = [noise_key(kind, level, 0 if level == 0 else d) for d in range(draws)]
    return float(np.mean([ev["perplexity"][k] for k in keys]))


def _judge(claim: str, r: Mapping[str, Any]) -> tuple[Any, Any]:
    """(bootstrap CI, verdict) of one claim on one head-to-head record."""
    if claim == "noisy-nll":
        return r["delta_bootstrap"], verdict(r["delta_bootstrap"], "less")
    ci = r["win_bootstrap"]
    if claim == "clean-parity":
        return ci, parity_verdict(ci, 0.0)
    if claim == "paper-1.5":
        return ci, verdict(ci, "greater", claimed_size=PAPER_WIN_RATE[1.5] - 0.5)
    return ci, verdict(ci, "greater")


def _claim_row(
    method: str,
    claim: str,
    kind: str,
    level: float,
    erm_ratio: float,
    paper: str,
    r: Mapping[str, Any],
    r_null: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """One claim of ``method`` against the baseline (record ``r``) and, when given, against the null."""
    nll = claim == "noisy-nll"
    ci, v = _judge(claim, r)
    row = {
        "method": method,
        "claim": claim,
        "kind": kind,
        "level": level,
        "erm_ratio": erm_ratio,
        "paper": paper,
        "estimate": r["delta_nll" if nll else "win_rate"],
        "ci": r["delta_ci" if nll else "win_ci"],
        "verdict": v.outcome,
        "reason": v.reason,
        "min_detectable_effect": ci.min_detectable_effect(),
    }
    if r_null is not None:
        _, vn = _judge(claim, r_null)
        row["vs_null"] = {
            "estimate": r_null["delta_nll" if nll else "win_rate"],
            "ci": r_null["delta_ci" if nll else "win_ci"],
            "verdict": vn.outcome,
        }
        # against both fine-tunes of the baseline (two data orders): a claim holds only if it holds for both
        same = v.outcome == vn.outcome
        row["verdict_both"] = v.outcome if same else "inconclusive"
    return row


def summarise(
    *,
    evaluations: Mapping[str, Mapping[str, Any]],
    facts: Mapping[str, Mapping[str, Any]],
    reference: Mapping[str, Any],
    grid: Mapping[str, Any],
    levels: Mapping[str, Sequence[float]],
    baseline: str,
    ratios: Mapping[str, Sequence[float]],
    profile: str,
    null: str | None = None,
    draws: int = 1,
    tol: float = 1e-6,
    n_boot: int = 2000,
) -> dict[str, Any]:
    """The results body: method blocks (curves with CIs), claims with verdicts, tables, notes.

    ``null`` names a second fine-tune of the baseline (another data order): every claim of every other
    method is also judged against it (``vs_null``), and ``verdict_both`` keeps a verdict only when both
    baselines give it. A single pair of runs is paired over examples only, so the CIs do not see
    training-seed variance; the null's own rows against the baseline show how large that is.
    """
    base = evaluations[baseline]
    null_ev = evaluations.get(null) if null else None
    derived = {kind: dict(zip(ratios[kind], grid["kinds"][kind]["levels"], strict=True)) for kind in levels}
    methods: dict[str, Any] = {}
    claims: list[dict[str, Any]] = []
    for m, ev in evaluations.items():
        curves: dict[str, Curve] = {}
        metrics: dict[str, Any] = {"perplexity": ev["perplexity"]["clean"]}
        for kind, xs in levels.items():
            ppl = [_perplexity(ev, kind, x, draws) for x in xs]
            curves[f"perplexity@{kind}"] = Curve("gamma", list(xs), "perplexity", ppl)
            metrics.update({f"perplexity@{kind}{x:g}": v for x, v in zip(xs, ppl, strict=True) if x > 0})
            if m == baseline:
                continue
            h = [head_to_head(ev, base, kind, x, draws=draws, tol=tol, n_boot=n_boot) for x in xs]
            curves[f"win_rate@{kind}"] = Curve(
                "gamma",
                list(xs),
                "win_rate",
                [r["win_rate"] for r in h],
                extra={
                    "ci_low": [r["win_ci"][0] for r in h],
                    "ci_high": [r["win_ci"][1] for r in h],
                    **{k: [r[k] for r in h] for k in ("wins", "ties", "losses")},
                },
            )
            curves[f"delta_nll@{kind}"] = Curve(
                "gamma",
                list(xs),
                "delta_nll_per_token",
                [r["delta_nll"] for r in h],
                extra={"ci_low": [r["delta_ci"][0] for r in h], "ci_high": [r["delta_ci"][1] for r in h]},
            )
            by_level = dict(zip(xs, h, strict=True))
            by_null: dict[float, Any] = {}
            if null_ev is not None and m != null:
                by_null = {
                    x: head_to_head(ev, null_ev, kind, x, draws=draws, tol=tol, n_boot=n_boot) for x in xs
                }

            def add(
                claim: str, kind: str, x: float, paper: str, m=m, by_level=by_level, by_null=by_null
            ) -> None:
                ratio = _perplexity(base, kind, x, draws) / base["perplexity"]["clean"] if x else 1.0
                claims.append(_claim_row(m, claim, kind, x, ratio, paper, by_level[x], by_null.get(x)))

            if kind == next(iter(levels)):
                metrics["win_rate"] = by_level[0.0]["win_rate"]
                add("clean-parity", kind, 0.0, "50.00 %")
                claims[-1]["kind"] = "clean"
            if kind == PAPER_KIND and 1.5 in by_level:
                metrics["win_rate@neftune1.5"] = by_level[1.5]["win_rate"]
                add("paper-1.5", kind, 1.5, "69.93 %")
            for ratio, x in derived[kind].items():
                add("noisy-win", kind, x, "> 50 %")
                add("noisy-nll", kind, x, "< 0")
                claims[-2]["target_ratio"] = claims[-1]["target_ratio"] = ratio
        f = facts.get(m, {})
        metrics.update({k: f[k] for k in ("train_seconds", "seconds_per_step", "steps") if k in f})
        metrics["eval_seconds"] = ev.get("eval_seconds")
        methods[m] = MethodResult(
            metrics=metrics, curves=curves, layer_loss=dict(ev["layer_loss"]), extra={"train": dict(f)}
        ).to_dict()
    body = {
        "methods": methods,
        "claims": claims,
        "grid": dict(grid),
        "reference": dict(reference),
        "profile_condition": profile,
    }
    body["tables"] = tables(body, baseline)
    body["notes"] = [
        "Win rate: likelihood judge, ties count half, 50 % is parity; CIs are paired bootstrap over "
        "(noise draws x held-out examples). The paper's 50 % -> 69.93 % is Llama 3.1 8B judged on AlpacaEval.",
        "delta_nll: (method - ERM) reference NLL per token, nats; negative favours the method.",
        "Levels: gaussian in units of sigma_E; neftune is NEFTune's alpha (noise alpha / sqrt(n d)).",
        "Per-example NLLs of every method and condition are in jobs/eval-<method>.json.",
    ]
    return body


__all__ = ["head_to_head", "noise_key", "summarise"]
