"""llm-robustness head to head: per-example judged outcomes against the baseline, the curves, the claim arrays.

Cells are evaluation seeds s, noise draws d and held-out examples i of one condition (kind, level); every
model saw the same noisy embeddings there. Against the baseline B (ERM) of the same seed, method M has,
per cell,

    outcome  p_sdi = 1[r^M_sdi < r^B_sdi - tol] + 1/2 · 1[|r^M_sdi - r^B_sdi| <= tol]   (r: reference NLL, nats)
    ΔNLL     δ_sdi = (r^M_sdi - r^B_sdi) / n_i                                        (n_i: reference tokens)

The win rate is mean p and ΔNLL mean δ (negative: M gives the reference more probability). Each curve point
carries the interval of :func:`~descentlab.report.stats.paired_interval` over the cells ``[seeds, draws,
examples]``, with the seed as the unit of replication (with one seed it counts examples only, so it
describes that pair of fine-tunes, not the method). The baseline's own curves compare ERM on seed s_i with
ERM on the next seed s_{i+1 mod S}: the null control. The claims (:mod:`.claims`) are judged from the
outcomes :func:`claim_store` puts in the run's cell store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from descentlab.experiments.llm_robustness.claims import (
    LEVEL,
    NULL,
    PERPLEXITY_RATIO,
    WIN,
    condition_name,
)
from descentlab.experiments.llm_robustness.tables import tables
from descentlab.report.results import Curve, MethodResult
from descentlab.report.stats import paired_interval
from descentlab.study.cells import CellStore, Design


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


def shifted(evs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """``evs`` (one per evaluation seed) shifted by one seed, cyclically: the null control's other arm."""
    return [evs[(i + 1) % len(evs)] for i in range(len(evs))]


def seed_outcomes(
    evs_m: Sequence[Mapping[str, Any]],
    evs_b: Sequence[Mapping[str, Any]],
    kind: str,
    level: float,
    *,
    draws: int,
    tol: float = 1e-6,
) -> np.ndarray:
    """``[seeds, draws, examples]`` outcomes of M against B, seed by seed (``evs_m[s]`` against ``evs_b[s]``)."""
    if len(evs_m) != len(evs_b):
        raise ValueError(f"paired by seed: {len(evs_m)} evaluations against {len(evs_b)}")
    return np.stack(
        [
            outcomes(_nll(m, kind, level, draws), _nll(b, kind, level, draws), tol)
            for m, b in zip(evs_m, evs_b, strict=True)
        ]
    )


def head_to_head(
    evs_m: Sequence[Mapping[str, Any]],
    evs_b: Sequence[Mapping[str, Any]],
    kind: str,
    level: float,
    *,
    draws: int,
    tol: float = 1e-6,
) -> dict[str, Any]:
    """Win rate and per-token ΔNLL of M against B at one condition, paired by seed (``evs_m[s]`` against
    ``evs_b[s]``), each with its seed-level 95 % interval, and the win rate of every seed."""
    p = seed_outcomes(evs_m, evs_b, kind, level, draws=draws, tol=tol)
    a = np.stack([_nll(m, kind, level, draws) for m in evs_m])
    b = np.stack([_nll(e, kind, level, draws) for e in evs_b])
    n = np.asarray(evs_m[0]["ref_tokens"], dtype=np.float64)[None, None, :]
    win = paired_interval(p, np.full_like(p, 0.5))
    delta = paired_interval(a / n, b / n)
    return {
        "outcomes": p,
        "win_rate": float(p.mean()),
        "win_ci": [0.5 + win.low, 0.5 + win.high],
        "per_seed": p.mean(axis=(1, 2)).tolist(),
        "wins": int((p == 1).sum()),
        "ties": int((p == 0.5).sum()),
        "losses": int((p == 0).sum()),
        "delta_nll": delta.mean,
        "delta_ci": [delta.low, delta.high],
    }


def perplexity(evs: Sequence[Mapping[str, Any]], kind: str, level: float, draws: int) -> float:
    """The mean perplexity over the seeds and draws of one condition."""
    n = 1 if level == 0 else draws
    return float(np.mean([ev["perplexity"][noise_key(kind, level, d)] for ev in evs for d in range(n)]))


def seed_perplexity(evs: Sequence[Mapping[str, Any]], kind: str, level: float, draws: int) -> np.ndarray:
    """``[seeds]``: each seed's perplexity at one condition, the mean over its draws."""
    return np.asarray([perplexity([ev], kind, level, draws) for ev in evs])


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


def claim_store(
    evaluations: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    baseline: str,
    conds: Mapping[str, tuple[str, float]],
    seeds: Sequence[int],
    draws: int,
    tol: float = 1e-6,
) -> CellStore:
    """The cell store :mod:`.claims` reads; ``evaluations[m][s]``: method m on evaluation seed s (the same
    seeds, in the same order, for every method). Every arm's outcomes against ``baseline`` of the same seed
    (the baseline's own: 1/2, a tie on every cell), the null control (:data:`~.claims.NULL`, two seeds or
    more), and the baseline's level and perplexity growth at every condition."""
    base = evaluations[baseline]
    null = [NULL] if len(base) > 1 else []
    design = Design(
        arms=(*evaluations, *null), conditions=tuple(conds), seeds=tuple(seeds), examples=_examples(base)
    )
    store = CellStore(design)
    kind0 = next(iter(conds.values()))[0]
    clean = seed_perplexity(base, kind0, 0.0, draws)
    for name, (kind, x) in conds.items():
        store.put(LEVEL, baseline, name, np.full(len(base), float(x)))
        store.put(PERPLEXITY_RATIO, baseline, name, seed_perplexity(base, kind, x, draws) / clean)
        for m, evs in evaluations.items():
            store.put(WIN, m, name, seed_outcomes(evs, base, kind, x, draws=draws, tol=tol))
        if null:
            store.put(WIN, NULL, name, seed_outcomes(base, shifted(base), kind, x, draws=draws, tol=tol))
    return store


def _examples(evs: Sequence[Mapping[str, Any]]) -> int | None:
    """The number of held-out examples of an evaluation (the length of its per-example NLLs)."""
    nll = next(iter(evs[0].get("nll", {}).values()), None)
    return None if nll is None else len(nll)


def _mean_profiles(evs: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
    """Each layer-loss profile averaged over the seeds."""
    keys = evs[0]["layer_loss"].keys()
    return {k: np.mean([ev["layer_loss"][k] for ev in evs], axis=0).tolist() for k in keys}


def _h2h_curves(
    evs_m: Sequence[Mapping[str, Any]],
    evs_b: Sequence[Mapping[str, Any]],
    kind: str,
    xs: Sequence[float],
    *,
    draws: int,
    tol: float,
    against: str,
) -> dict[str, Curve]:
    h = [head_to_head(evs_m, evs_b, kind, x, draws=draws, tol=tol) for x in xs]
    return {
        f"win_rate@{kind}": Curve(
            "gamma",
            list(xs),
            "win_rate",
            [r["win_rate"] for r in h],
            extra={
                "ci_low": [r["win_ci"][0] for r in h],
                "ci_high": [r["win_ci"][1] for r in h],
                "per_seed": [r["per_seed"] for r in h],
                "against": against,
                **{k: [r[k] for r in h] for k in ("wins", "ties", "losses")},
            },
        ),
        f"delta_nll@{kind}": Curve(
            "gamma",
            list(xs),
            "delta_nll_per_token",
            [r["delta_nll"] for r in h],
            extra={
                "ci_low": [r["delta_ci"][0] for r in h],
                "ci_high": [r["delta_ci"][1] for r in h],
                "against": against,
            },
        ),
    }


def summarise(
    *,
    evaluations: Mapping[str, Sequence[Mapping[str, Any]]],
    facts: Mapping[str, Sequence[Mapping[str, Any]]],
    reference: Mapping[str, Any],
    grid: Mapping[str, Any],
    levels: Mapping[str, Sequence[float]],
    baseline: str,
    profile: str,
    seeds: Sequence[int],
    selection: Mapping[str, Any] | None = None,
    draws: int = 1,
    tol: float = 1e-6,
) -> dict[str, Any]:
    """The results body: method blocks (perplexity, win-rate and ΔNLL curves with seed-level intervals, the
    fine-tunes of every seed), the selection, tables, notes.

    ``evaluations[m]`` and ``facts[m]`` hold one entry per evaluation seed, in the order of ``seeds``. The
    baseline's own win-rate curves are the null control (ERM against ERM on the next seed; two seeds or
    more). The claims are not here: the runner judges them from :func:`claim_store`'s cells.
    """
    base = evaluations[baseline]
    methods: dict[str, Any] = {}
    for m, evs in evaluations.items():
        curves: dict[str, Curve] = {}
        metrics: dict[str, Any] = {"perplexity": perplexity(evs, "clean", 0.0, draws)}
        for kind, xs in levels.items():
            ppl = [perplexity(evs, kind, x, draws) for x in xs]
            per_seed = [seed_perplexity(evs, kind, x, draws).tolist() for x in xs]
            curves[f"perplexity@{kind}"] = Curve(
                "gamma", list(xs), "perplexity", ppl, extra={"per_seed": per_seed}
            )
            metrics.update({f"perplexity@{kind}{x:g}": v for x, v in zip(xs, ppl, strict=True) if x > 0})
            if m == baseline:
                if len(evs) > 1:
                    curves.update(
                        _h2h_curves(
                            evs, shifted(evs), kind, xs, draws=draws, tol=tol, against=f"{m}, the next seed"
                        )
                    )
                continue
            curves.update(
                _h2h_curves(evs, base, kind, xs, draws=draws, tol=tol, against=f"{baseline}, same seed")
            )
            metrics.setdefault(
                "win_rate", curves[f"win_rate@{kind}"].mean[0]
            )  # clean: every kind starts at 0
        f = list(facts.get(m, []))
        for k in ("train_seconds", "seconds_per_step", "steps"):
            values = [x[k] for x in f if x.get(k) is not None]
            if values:
                metrics[k] = float(np.mean(values))
        metrics["eval_seconds"] = float(np.mean([ev.get("eval_seconds", float("nan")) for ev in evs]))
        methods[m] = MethodResult(
            metrics=metrics,
            curves=curves,
            layer_loss=_mean_profiles(evs),
            extra={"seeds": list(seeds), "train": [dict(x) for x in f]},
        ).to_dict()
    body: dict[str, Any] = {
        "methods": methods,
        "grid": dict(grid),
        "reference": dict(reference),
        "profile_condition": profile,
        "seeds": list(seeds),
    }
    if selection is not None:
        body["selection"] = dict(selection)
    body["tables"] = tables(body, baseline)
    n = len(seeds)
    body["notes"] = [
        "Win rate: likelihood judge, ties count half, 50 % is parity; each method is compared with ERM of the "
        f"same evaluation seed ({n} seed{'s' if n > 1 else ''}: {list(seeds)}). The curves' 95 % intervals are "
        "paired_interval over (seeds, noise draws, held-out examples), the seed the unit of replication"
        + ("." if n > 1 else "; with one seed they count examples only.")
        + " The paper's 50 % -> 69.93 % is Llama 3.1 8B judged on AlpacaEval.",
        f"The null control ({baseline}'s own win-rate rows): {baseline} on seed s_i against {baseline} on the "
        "next seed s_(i+1 mod S); its interval is the spread between ERM seeds every win rate is read against"
        + (" (it needs two seeds; this run has one)." if n < 2 else "."),
        "delta_nll: (method - ERM) reference NLL per token, nats; negative favours the method.",
        "Levels: gaussian in units of sigma_E; neftune is NEFTune's alpha (noise alpha / sqrt(n d)). They come "
        "from ERM's fine-tune on the tuning seed (validation only), as every other choice.",
        "Per-example NLLs of every method, seed and condition are in jobs/eval-<method>-seed<s>.json; the "
        "judged outcomes the claims read are in arrays/cells.npz (design record: arrays/design.json).",
    ]
    return body


__all__ = [
    "claim_store",
    "conditions",
    "head_to_head",
    "noise_key",
    "outcomes",
    "perplexity",
    "seed_outcomes",
    "seed_perplexity",
    "shifted",
    "summarise",
]
