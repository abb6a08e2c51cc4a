"""text-robustness results: method blocks, the paired-gap / shift / selection / λ tables, notes, figures.

Pure functions of the measured arrays. Spreads are population std (ddof = 0) in numpy, as this experiment
has always reported them. The paired gap of a method m against ERM at noise level γ is

    δ[s, d, γ] = acc_m[s, d, γ] - acc_erm[s, d, γ],   reported as mean ± std over the (seed s, draw d) pairs;

pairs share the training seed and the noise realisation (noise is keyed by content), so the spread is that
of the *difference*, much smaller than that of either curve. :func:`figures` draws it from the accuracies
``run()`` saved in ``arrays/accuracy.npz``.


Accuracy against ε, when the run evaluated the local-DP kinds: :mod:`.text_robustness_ldp`.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.io import load_arrays
from descentlab.report.figures import new_figure, save_figure
from descentlab.report.results import Curve, MethodResult
from descentlab.report.stats import column_mean_std, mean_std
from descentlab.report.tables import multiplier_tables
from descentlab.robustness import RobustnessCurves

ERM = "erm"
ACCURACY_ARRAYS = "arrays/accuracy.npz"  # relative to the run directory
_SEP = "__"  # array name = "<method>__<kind>"


def _std0(values: Any) -> list[float]:
    return column_mean_std(values, ddof=0, impl="numpy")[1]


def is_monotone(values: Sequence[float]) -> bool:
    """Whether a per-layer loss profile never increases from one layer to the next."""
    return all(b <= a + 1e-12 for a, b in itertools.pairwise(values))


def method_block(
    result: RobustnessCurves,
    profiles: Mapping[str, Sequence[Sequence[float]]],
    extra_metrics: Mapping[str, Sequence[float]],
    multipliers: Sequence[Sequence[float]],
    clean_kind: str,
) -> MethodResult:
    """One method's ``metrics`` / ``curves`` / ``layer_loss`` (mean over seeds; std and monotone counts too).

    ``profiles`` maps a condition name ("clean", "gaussian@1") to one profile per seed.
    """
    block = result.curves()
    accuracy, accuracy_std = mean_std(result.values[clean_kind][:, 0, 0], ddof=0, impl="numpy")
    high = [g for g, x in enumerate(result.gammas) if x >= 1.0]
    metrics: dict[str, Any] = {"accuracy": accuracy, "accuracy_std": accuracy_std}
    for kind, values in result.values.items():
        metrics[f"{kind}_mean_over_grid"] = block[kind]["summary"]
        if high:
            metrics[f"{kind}_mean_gamma>=1"] = float(values[..., high].mean())
    metrics.update({k: mean_std(v, ddof=0, impl="numpy")[0] for k, v in extra_metrics.items()})
    layer_loss = {k: column_mean_std(v, ddof=0, impl="numpy") for k, v in profiles.items()}
    extra: dict[str, Any] = {
        "layer_loss_std": {k: std for k, (_, std) in layer_loss.items()},
        "layer_loss_monotone_seeds": {k: int(sum(is_monotone(p) for p in v)) for k, v in profiles.items()},
    }
    if len(multipliers):
        extra["multipliers"] = column_mean_std(multipliers, ddof=0, impl="numpy")[0]
    return MethodResult(
        metrics=metrics,
        curves={kind: Curve.from_dict(c) for kind, c in block.items()},
        layer_loss={k: mean for k, (mean, _) in layer_loss.items()},
        extra=extra,
    )


def accuracy_arrays(curves: Mapping[str, RobustnessCurves]) -> dict[str, np.ndarray]:
    """The arrays :func:`figures` needs: the γ grid and each method's accuracies ``[seed, draw, γ]``."""
    gammas = next(iter(curves.values())).gammas
    out = {"gammas": np.asarray(gammas, dtype=np.float64)}
    out.update({f"{m}{_SEP}{kind}": v for m, c in curves.items() for kind, v in c.values.items()})
    return out


def paired_gaps(values: Mapping[str, Mapping[str, np.ndarray]]) -> dict[tuple[str, str], np.ndarray]:
    """``(method, kind) -> δ`` of shape ``[seed · draw, γ]`` (module docstring); {} without ERM."""
    if ERM not in values:
        return {}
    return {
        (method, kind): (v - values[ERM][kind]).reshape(-1, v.shape[-1])
        for method, by_kind in values.items()
        if method != ERM
        for kind, v in by_kind.items()
    }


def paired_gap_rows(curves: Mapping[str, RobustnessCurves]) -> list[list[Any]]:
    """Method minus ERM accuracy per γ, ``mean ± std`` over (seed, draw) pairs."""
    rows = []
    for (method, kind), diff in paired_gaps({m: c.values for m, c in curves.items()}).items():
        mean, std = column_mean_std(diff, ddof=0, impl="numpy")
        rows.append([method, kind, *[f"{m:+.4f} ± {s:.4f}" for m, s in zip(mean, std, strict=True)]])
    return rows


def extra_tables(
    curves: Mapping[str, RobustnessCurves],
    methods: Mapping[str, MethodResult],
    selection_rows: list[list[Any]],
    shift_names: Sequence[str],
) -> list[dict[str, Any]]:
    """The tables appended to the standard report."""
    gammas = next(iter(curves.values())).gammas
    tables = []
    gap = paired_gap_rows(curves)
    if gap:
        tables.append(
            {
                "title": "Accuracy minus ERM's (paired: same seeds, same noise), mean ± std over (seed, draw)",
                "columns": ["method", "kind", *[f"γ={g:g}" for g in gammas]],
                "rows": gap,
            }
        )
    if shift_names:
        tables.append(
            {
                "title": "Dataset shift: clean accuracy on extra test sets (mean over seeds)",
                "columns": ["method", "in-distribution", *shift_names],
                "rows": [
                    [m, b.metrics["accuracy"], *[b.metrics.get(f"shift:{s}", "") for s in shift_names]]
                    for m, b in methods.items()
                ],
            }
        )
    if selection_rows:
        tables.append(
            {
                "title": "Selection on the validation split (first seed)",
                "columns": ["method", "candidate", "val clean acc", "val acc, gaussian grid mean", "chosen"],
                "rows": selection_rows,
            }
        )
    tables.extend(multiplier_tables({m: b.to_dict() for m, b in methods.items()}))
    return tables


def notes(methods: Mapping[str, MethodResult], n_seeds: int) -> list[str]:
    """Plain statements of what was measured: monotone profiles, clean gap, high-noise gap."""
    out = []
    for method, block in methods.items():
        counts = ", ".join(f"{k}: {v}/{n_seeds}" for k, v in block.extra["layer_loss_monotone_seeds"].items())
        out.append(f"{method}: seeds with a non-increasing per-layer test loss — {counts}")
    if ERM in methods:
        erm = methods[ERM].metrics
        for method, block in methods.items():
            if method == ERM:
                continue
            m = block.metrics
            gaps = [
                f"{k.removesuffix('_mean_gamma>=1')} {m[k] - erm[k]:+.4f}"
                for k in m
                if k.endswith("_mean_gamma>=1") and k in erm
            ]
            out.append(
                f"{method} vs erm: clean accuracy {m['accuracy'] - erm['accuracy']:+.4f}; "
                f"mean accuracy over γ >= 1: {', '.join(gaps)}"
            )
    return out


def figures(results: dict[str, Any], run_dir: Path) -> list[dict[str, Any]]:
    """The paired gap against ERM per noise kind (one panel each), with a ±1 std band over (seed, draw),
    and, when the run evaluated the ε kinds, :func:`ldp_figure`.

    Drawn from ``arrays/accuracy.npz`` (and ``arrays/ldp.npz``); nothing when the run saved no arrays or has
    no ERM to pair with.
    """
    from descentlab.report.text_claims import figures as claim_figures
    from descentlab.report.text_robustness_ldp import ldp_figure

    return (
        claim_figures(results, run_dir) + _paired_gap_figure(results, run_dir) + ldp_figure(results, run_dir)
    )


def _paired_gap_figure(results: dict[str, Any], run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / ACCURACY_ARRAYS
    if not path.is_file():
        return []
    arrays = load_arrays(path)
    gammas = arrays.pop("gammas")
    values: dict[str, dict[str, np.ndarray]] = {}
    for name, v in arrays.items():
        method, kind = name.split(_SEP, 1)
        values.setdefault(method, {})[kind] = v
    gaps = paired_gaps(values)
    if not gaps:
        return []
    kinds = list(dict.fromkeys(kind for _, kind in gaps))
    fig, axes = new_figure(1, len(kinds), sharey=True)
    for ax, kind in zip(axes[0], kinds, strict=True):
        for (method, k), diff in gaps.items():
            if k != kind:
                continue
            mean, std = (np.asarray(a) for a in column_mean_std(diff, ddof=0, impl="numpy"))
            ax.plot(gammas, mean, marker="o", ms=3, label=method)
            ax.fill_between(gammas, mean - std, mean + std, alpha=0.2)
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_title(kind)
        ax.set_xlabel("gamma")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("accuracy minus ERM's")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(str(results.get("experiment", "")))
    fig.tight_layout()
    save_figure(fig, Path(run_dir) / "figures" / "paired-gap.png")
    caption = "Accuracy minus ERM's against γ (paired: same seeds, same noise), mean ± std over (seed, draw)"
    return [{"path": "figures/paired-gap.png", "caption": caption}]


def protocol(
    cfg: Any, *, n_train: int, n_eval: int, n_val: int, selection: Mapping[str, str]
) -> dict[str, Any]:
    """The run's ``protocol`` block from its resolved config (a ``TextRobustnessConfig``) and sizes."""
    d, ev, opt, sel = cfg.data, cfg.evaluation, cfg.method.optimizer, cfg.selection
    rule = (
        f"rule: highest validation {'accuracy averaged over the gaussian γ grid' if sel.criterion == 'robust' else 'clean accuracy'} "
        f"among candidates within {sel.max_clean_drop} clean validation accuracy of ERM (first seed only)"
    )
    return {
        "dataset": d.name,
        "model": cfg.model,
        "pooling": cfg.pooling,
        "split": "test; constraint settings selected on validation (first seed)",
        "n_train": n_train,
        "n_eval": n_eval,
        "n_val": n_val,
        "seeds": list(cfg.seeds),
        "draws": ev.draws,
        "noise": "added to the input-embedding output, per-coordinate variance (γ σ_E)², σ_E = RMS of the "
        "embedding matrix; keyed by example content, so all methods see the same noise",
        "kinds": list(ev.kinds),
        "gammas": list(ev.gammas),
        "noise_seed": ev.noise_seed,
        "budget": f"{cfg.train.epochs} epoch(s), batch {cfg.train.batch_size}, AdamW lr {opt.lr} "
        f"wd {opt.weight_decay}, max_length {d.max_length}, length-grouped batches "
        f"({cfg.train.group_by_length} x batch)",
        "layer_loss": "test mean of the per-example cross-entropy read out at layers 0..L through the "
        "model's own pooling and head, clean; mean over seeds",
        "controls": {
            "erm-readout": "trained through the per-layer readout with λ frozen at 0 (frozen_zero)",
            "deep-supervision": "fixed equal weights (1/L) Σ_l f_l, no multipliers",
            "erm-noise": f"ERM on gaussian embedding noise, γ_train = {cfg.train_noise} (positive control)",
        },
        "selection": {m: f"{why}; {rule}" for m, why in selection.items()},
        "claims": f"paired bootstrap 95 % CI over (seed, draw, example), {cfg.n_boot} replicates; clean "
        f"parity margin {cfg.margin}; graceful: mean over γ >= 1",
        "shift_sets": list(d.shift)
        or "none: no second offline text set with the fresh/rotten label space installs (METHODS.md Part 3)",
    }
