"""text-robustness's descriptive results: method blocks, the paired-gap / shift / selection / λ tables, notes
and the protocol. The claims and their verdicts are not here (:mod:`.claims`; the report renders them).

Pure functions of the measured arrays. Spreads are population std (ddof = 0) in numpy, as this experiment
has always reported them. The paired gap of a method m against ERM at noise level γ is

    δ[s, d, γ] = acc_m[s, d, γ] - acc_erm[s, d, γ],   reported as mean ± std over the (seed s, draw d) pairs;

pairs share the training seed and the noise realisation (noise is keyed by content), so the spread is that
of the *difference*, much smaller than that of either curve.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from descentlab.experiments.text_robustness.arrays import SEP
from descentlab.experiments.text_robustness.claims import CONTROL, ERM
from descentlab.report.results import Curve, MethodResult
from descentlab.report.stats import column_mean_std, mean_std, paired_interval
from descentlab.report.tables import multiplier_tables
from descentlab.robustness import RobustnessCurves
from descentlab.study.tables import Table, pm
from descentlab.train.tuning import binding_level


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
        rows.append([method, kind, *[pm(m, s, signed=True) for m, s in zip(mean, std, strict=True)]])
    return rows


def extra_tables(
    curves: Mapping[str, RobustnessCurves],
    methods: Mapping[str, MethodResult],
    selection_rows: list[list[Any]],
    shift_names: Sequence[str],
    *,
    tune_seed: int,
) -> list[dict[str, Any]]:
    """The tables appended to the standard report (``tune_seed``: the seed the selection trained from)."""
    gammas = next(iter(curves.values())).gammas
    tables: list[Table] = []
    if gap := paired_gap_rows(curves):
        tables.append(
            Table(
                "Accuracy minus ERM's (paired: same seeds, same noise), mean ± std over (seed, draw)",
                ["method", "kind", *[f"γ={g:g}" for g in gammas]],
                gap,
            )
        )
    if shift_names:
        shift = Table(
            "Dataset shift: clean accuracy on extra test sets (mean over seeds)",
            ["method", "in-distribution", *shift_names],
        )
        for m, b in methods.items():
            shift.add(m, b.metrics["accuracy"], *[b.metrics.get(f"shift:{s}", "") for s in shift_names])
        tables.append(shift)
    if selection_rows:
        columns = ["method", "candidate", "val clean acc", "val acc, gaussian grid mean"]
        columns += ["binding: mean Σλ over the 2nd half", "chosen"]
        title = f"Selection on the validation split (tuning seed {tune_seed}, never an evaluation seed)"
        tables.append(Table(title, columns, selection_rows))
    return [
        *(t.to_dict() for t in tables),
        *multiplier_tables({m: b.to_dict() for m, b in methods.items()}),
    ]


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


def lambda_notes(lam: Mapping[str, np.ndarray]) -> list[str]:
    """One note per constrained method of ``arrays/lambda.npz`` (``<m>__steps`` [T], ``<m>`` λ [seed, T, L]):
    its λ per layer at the end of training (mean over seeds) and how hard it bound
    (:func:`~descentlab.train.tuning.binding_level` per seed)."""
    out = []
    for m, x in lam.items():
        if SEP in m:  # "<m>__steps"
            continue
        steps = lam[f"{m}{SEP}steps"]
        end = x[:, -1, :].mean(0)
        bound = [binding_level(steps, seed) for seed in x]
        out.append(
            f"{m}: λ at the end of training (step {int(steps[-1])}, mean over {x.shape[0]} seeds), per layer: "
            + ", ".join(f"λ_{layer + 1} {v:.4g}" for layer, v in enumerate(end))
            + f"; time-average of Σλ over the second half of training: {np.mean(bound):.4g} "
            f"(per seed {', '.join(f'{b:.3g}' for b in bound)})"
        )
    return out


def layer_loss_ci(losses: np.ndarray) -> list[list[float]]:
    """Per layer ``[low, high]`` of the seed-level 95 % interval of the mean clean loss (``losses``:
    ``[seed, L+1, example]``)."""
    out = []
    for layer in range(losses.shape[1]):
        x = np.asarray(losses[:, layer], dtype=np.float64)
        iv = paired_interval(x, np.zeros_like(x))
        out.append([iv.low, iv.high])
    return out


def protocol(
    cfg: Any, *, n_train: int, n_eval: int, n_val: int, selection: Mapping[str, str]
) -> dict[str, Any]:
    """The run's ``protocol`` block from its resolved config (a ``TextRobustnessConfig``) and sizes."""
    d, ev, opt, sel = cfg.data, cfg.evaluation, cfg.method.optimizer, cfg.selection
    rule = (
        f"rule: highest validation {'accuracy averaged over the gaussian γ grid' if sel.criterion == 'robust' else 'clean accuracy'} "
        f"among candidates within {sel.max_clean_drop} clean validation accuracy of ERM, every run trained from "
        f"the tuning seed {cfg.tune_seed} (never an evaluation seed; its runs are not reported)"
    )
    if sel.min_binding is not None:
        rule += (
            f"; eligible only if the candidate's constraint binds on its tuning run: the time-average of "
            f"Σ_l λ_l over the second half of training > {sel.min_binding:g} (if none binds, among all)"
        )
    return {
        "dataset": d.name,
        "model": cfg.model,
        "pooling": cfg.pooling,
        "split": (
            f"test; constraint settings selected on validation (tuning seed {cfg.tune_seed})"
            if cfg.evaluate_on == "test"
            else f"validation (a search: no test example is scored); constraint settings selected on "
            f"validation (tuning seed {cfg.tune_seed})"
        ),
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
            CONTROL: "trained through the per-layer readout with λ frozen at 0 (frozen_zero)",
            "deep-supervision": "fixed equal weights (1/L) Σ_l f_l, no multipliers",
            "erm-noise": f"ERM on gaussian embedding noise, γ_train = {cfg.train_noise} (positive control)",
        },
        "selection": {m: f"{why}; {rule}" for m, why in selection.items()},
        "claims": "declared in the study's claims module, judged with the seed-level interval; primary "
        f"endpoint: constrained − {CONTROL} (the matched λ ≡ 0 control) accuracy under Gaussian noise, mean "
        "over γ >= 1",
        "shift_sets": list(d.shift)
        or "none: no second offline text set with the fresh/rotten label space installs "
        "(descentlab.data.ASSETS)",
    }
