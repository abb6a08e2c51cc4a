"""llm-robustness head to head: per-example judged outcomes against the baseline, the curves, the claim arrays.

Cells are held-out examples i and noise draws d of one condition (kind, level); every model saw the same
noisy embeddings there. Against the baseline B (ERM), method M has, per cell,

    outcome  p_di = 1[r^M < r^B - tol] + 1/2 · 1[|r^M - r^B| <= tol]      (r: reference NLL, nats)
    ΔNLL     δ_di = (r^M_di - r^B_di) / n_i                               (n_i: reference tokens)

The win rate is mean p and ΔNLL mean δ (negative: M gives the reference more probability). Each curve point
carries the interval of :func:`~descentlab.report.stats.paired_interval` over the cells ``[seeds, draws,
examples]``; with one training seed it counts examples only, so it describes this pair of fine-tunes, not
the method. The claims (:mod:`.claims`) are judged from the outcomes saved by :func:`claim_cells`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from descentlab.experiments.llm_robustness.claims import condition_name, win_key
from descentlab.experiments.llm_robustness.tables import tables
from descentlab.report.results import Curve, MethodResult
from descentlab.report.stats import paired_interval


def noise_key(kind: str, level: float, draw: int) -> str:
    """The evaluation key of one condition (the same as :func:`descentlab.robustness.lm_eval.noise_key`)."""
    return "clean" if level == 0 else f"{kind}@{level:g}#{draw}"


def _nll(ev: Mapping[str, Any], kind: str, level: float, draws: int) -> np.ndarray:
    """Reference NLLs ``[draws, N]``; the clean pass is one draw."""
    n = 1 if level == 0 else draws
    return np.asarray([ev["nll"][noise_key(kind, level, d)] for d in range(n)], dtype=np.float64)


def outcomes(nll_m: np.ndarray, nll_b: np.ndarray, tol: float = 1e-6) -> np.ndarray:
    """The judged outcome of M against B per cell: 1 (lower NLL), 0, or 1/2 within ``tol`` nats."""
    return np.where(nll_m < nll_b - tol, 1.0, np.where(nll_m > nll_b + tol, 0.0, 0.5))


def head_to_head(
    ev_m: Mapping[str, Any],
    ev_b: Mapping[str, Any],
    kind: str,
    level: float,
    *,
    draws: int,
    tol: float = 1e-6,
) -> dict[str, Any]:
    """Win rate and per-token ΔNLL of M against B at one condition, each with its 95 % interval."""
    a, b = _nll(ev_m, kind, level, draws), _nll(ev_b, kind, level, draws)
    n = np.asarray(ev_m["ref_tokens"], dtype=np.float64)[None, :]
    p = outcomes(a, b, tol)
    win = paired_interval(p[None], np.full_like(p[None], 0.5))
    delta = paired_interval((a / n)[None], (b / n)[None])
    return {
        "outcomes": p,
        "win_rate": float(p.mean()),
        "win_ci": [0.5 + win.low, 0.5 + win.high],
        "wins": int((p == 1).sum()),
        "ties": int((p == 0.5).sum()),
        "losses": int((p == 0).sum()),
        "delta_nll": delta.mean,
        "delta_ci": [delta.low, delta.high],
    }


def perplexity(ev: Mapping[str, Any], kind: str, level: float, draws: int) -> float:
    """The mean perplexity over the draws of one condition."""
    n = 1 if level == 0 else draws
    return float(np.mean([ev["perplexity"][noise_key(kind, level, d)] for d in range(n)]))


def conditions(
    levels: Mapping[str, Sequence[float]], derived: Mapping[str, Mapping[float, float]]
) -> dict[str, tuple[str, float]]:
    """Condition name -> (kind, level) for every level evaluated; ``derived[kind]`` maps ratio -> level."""
    out: dict[str, tuple[str, float]] = {}
    for kind, xs in levels.items():
        ratio_of = {level: ratio for ratio, level in derived.get(kind, {}).items()}
        for x in xs:
            out.setdefault(condition_name(kind, x, ratio_of.get(x)), (kind, x))
    return out


def claim_cells(
    evaluations: Mapping[str, Mapping[str, Any]],
    *,
    baseline: str,
    conds: Mapping[str, tuple[str, float]],
    draws: int,
    tol: float = 1e-6,
) -> dict[str, np.ndarray]:
    """The arrays :mod:`.claims` reads (one training seed: the seed axis has length 1)."""
    base = evaluations[baseline]
    clean = perplexity(base, next(iter(conds.values()))[0], 0.0, draws)
    out: dict[str, np.ndarray] = {}
    for name, (kind, x) in conds.items():
        out[f"level/{name}"] = np.asarray([x])
        out[f"erm_ratio/{name}"] = np.asarray([perplexity(base, kind, x, draws) / clean])
        for m, ev in evaluations.items():
            if m != baseline:
                p = outcomes(_nll(ev, kind, x, draws), _nll(base, kind, x, draws), tol)
                out[win_key(m, name)] = p[None]
    return out


def summarise(
    *,
    evaluations: Mapping[str, Mapping[str, Any]],
    facts: Mapping[str, Mapping[str, Any]],
    reference: Mapping[str, Any],
    grid: Mapping[str, Any],
    levels: Mapping[str, Sequence[float]],
    baseline: str,
    profile: str,
    draws: int = 1,
    tol: float = 1e-6,
) -> dict[str, Any]:
    """The results body: method blocks (perplexity, win-rate and ΔNLL curves with intervals), tables, notes.

    The claims are not here: the runner judges them from :func:`claim_cells`' arrays.
    """
    base = evaluations[baseline]
    methods: dict[str, Any] = {}
    for m, ev in evaluations.items():
        curves: dict[str, Curve] = {}
        metrics: dict[str, Any] = {"perplexity": ev["perplexity"]["clean"]}
        for kind, xs in levels.items():
            ppl = [perplexity(ev, kind, x, draws) for x in xs]
            curves[f"perplexity@{kind}"] = Curve("gamma", list(xs), "perplexity", ppl)
            metrics.update({f"perplexity@{kind}{x:g}": v for x, v in zip(xs, ppl, strict=True) if x > 0})
            if m == baseline:
                continue
            h = [head_to_head(ev, base, kind, x, draws=draws, tol=tol) for x in xs]
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
            metrics.setdefault("win_rate", h[0]["win_rate"])  # the clean point (every kind starts at 0)
        f = facts.get(m, {})
        metrics.update({k: f[k] for k in ("train_seconds", "seconds_per_step", "steps") if k in f})
        metrics["eval_seconds"] = ev.get("eval_seconds")
        methods[m] = MethodResult(
            metrics=metrics, curves=curves, layer_loss=dict(ev["layer_loss"]), extra={"train": dict(f)}
        ).to_dict()
    body: dict[str, Any] = {
        "methods": methods,
        "grid": dict(grid),
        "reference": dict(reference),
        "profile_condition": profile,
    }
    body["tables"] = tables(body, baseline)
    body["notes"] = [
        "Win rate: likelihood judge, ties count half, 50 % is parity. The curves' 95 % intervals are "
        "paired_interval over (seeds, noise draws, held-out examples); with one training seed they count "
        "examples only. The paper's 50 % -> 69.93 % is Llama 3.1 8B judged on AlpacaEval.",
        "delta_nll: (method - ERM) reference NLL per token, nats; negative favours the method.",
        "Levels: gaussian in units of sigma_E; neftune is NEFTune's alpha (noise alpha / sqrt(n d)).",
        "Per-example NLLs of every method and condition are in jobs/eval-<method>.json; the judged "
        "outcomes the claims read are in arrays/claims.npz.",
    ]
    return body


__all__ = ["claim_cells", "conditions", "head_to_head", "noise_key", "outcomes", "perplexity", "summarise"]
