"""text-robustness's report: the method blocks, tables and notes of ``results.json``, and the figures, drawn
from the arrays the run saved (the per-review ones from its cell store), never a live model.

Spreads in the tables are population std (ddof = 0), as this study has always reported them. The paired gap
of a method m against ERM at noise level γ is

    δ[s, d, γ] = acc_m[s, d, γ] - acc_erm[s, d, γ],   reported as mean ± std over the (seed s, draw d) pairs;

pairs share the training seed and the noise realisation (noise is keyed by content), so the spread is that
of the *difference*, much smaller than that of either curve. Every band of a figure drawn from per-review
cells is the seed-level 95 % interval of :func:`~descentlab.report.stats.paired_interval`, the kind of
interval a claim has.

The arrays beside the cell store: ``arrays/lambda.npz`` (``<m>__steps`` [T]; ``<m>``: λ ``[seed, T, L]`` of every trained
constrained method), ``arrays/lambda-selection.npz`` (the same per candidate's tuning run, ``<m>__cand<i>``)
and, with the local-DP kinds, ``arrays/ldp.npz`` (``epsilons``; ``<m>__<kind>``: correctness ``[seed,
draw, ε, example]``). The ε curves are described, not judged: no claim of the paper is about ε.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib.ticker import MaxNLocator

from descentlab.evaluation import NoiseEvalConfig, RobustnessCurves, privacy_rows
from descentlab.experiments.text_robustness.claims import claim_arrays
from descentlab.experiments.text_robustness.config import CONTROL, CORRECT, ERM, LOSS, SEP
from descentlab.io import load_arrays
from descentlab.report.figures import new_figure, save_figure
from descentlab.report.results import Curve, MethodResult
from descentlab.report.stats import PairedInterval, column_mean_std, mean_std, paired_interval
from descentlab.report.tables import multiplier_tables
from descentlab.study.cells import CellStore, cell_key
from descentlab.study.figures import figure_record, panel_figure, plot_band, plot_multipliers
from descentlab.study.tables import Table, pm
from descentlab.study.tuning_rules import binding_level, choose_candidate

if TYPE_CHECKING:  # the report reads saved arrays: no training runtime at import
    from descentlab.experiments.text_robustness.config import TextRobustnessConfig
    from descentlab.experiments.text_robustness.jobs import Outcome

LAMBDA = "arrays/lambda.npz"
LAMBDA_SELECTION = "arrays/lambda-selection.npz"
LDP = "arrays/ldp.npz"

# --- the method blocks, tables and notes -----------------------------------------------------------------


def summarise(cfg: TextRobustnessConfig, outcome: Outcome) -> dict[str, Any]:
    """``results.json``'s method blocks (each with the seed-level interval of its per-layer loss, its
    constraint and its ε curves), tables and notes."""
    curves, losses = outcome.curves(), outcome.losses()
    ldp = outcome.curves("ldp_curves") if outcome.geometry is not None else {}
    blocks = {}
    for m, outs in outcome.outputs.items():
        profiles = {k: [o["profiles"][k] for o in outs] for k in outs[0]["profiles"]}
        extra = {k: [o["extra"][k] for o in outs] for k in outs[0]["extra"]}
        lams = [o["multipliers"] for o in outs if o["multipliers"] is not None and m not in cfg.frozen_zero]
        block = blocks[m] = method_block(curves[m], profiles, extra, lams, cfg.evaluation.kinds[0])
        block.extra["layer_loss_ci"] = [[iv.low, iv.high] for iv in intervals(losses[m], axis=1)]
        if (setting := outcome.chosen[m].method).constrained:
            block.extra["constraint"] = asdict(setting.constraint)
        for kind, c in (ldp[m].curves() if m in ldp else {}).items():  # x_name "epsilon"
            block.curves[kind] = Curve.from_dict(c)
            block.metrics[f"{kind}_mean_over_epsilons"] = c["summary"]
    # the tables: the paired gaps, the dataset shift, the selection, the final multipliers, the ε accounting
    out: list[Table] = []
    if gap := paired_gap_rows(curves):
        title = "Accuracy minus ERM's (paired: same seeds, same noise), mean ± std over (seed, draw)"
        out.append(Table(title, ["method", "kind", *[f"γ={g:g}" for g in cfg.evaluation.gammas]], gap))
    if shift := list(cfg.data.shift):
        title = "Dataset shift: clean accuracy on extra test sets (mean over seeds)"
        out.append(Table(title, ["method", "in-distribution", *shift]))
        for m, b in blocks.items():
            out[-1].add(m, b.metrics["accuracy"], *[b.metrics.get(f"shift:{s}", "") for s in shift])
    if rows := [row for m, r in outcome.tried.items() for row in selection(cfg, outcome.erm_clean, m, r)[1]]:
        columns = ["method", "candidate", "val clean acc", "val acc, gaussian grid mean"]
        columns += ["binding: mean Σλ over the 2nd half", "chosen"]
        title = f"Selection on the validation split (tuning seed {cfg.tune_seed}, never an evaluation seed)"
        out.append(Table(title, columns, rows))
    tables = [t.to_dict() for t in out] + multiplier_tables({m: b.to_dict() for m, b in blocks.items()})
    if ldp:
        tables.append(privacy(outcome, cfg.evaluation).to_dict())
    lam = side_arrays(cfg, outcome)[LAMBDA]
    return {"methods": blocks, "tables": tables, "notes": notes(blocks, len(cfg.seeds), lam)}


def selection(
    cfg: TextRobustnessConfig, erm_clean: float | None, arm: str, results: Sequence[Mapping[str, Any]]
) -> tuple[int, list[list[Any]], str]:
    """:func:`~descentlab.study.tuning_rules.choose_candidate` under the config's selection rule, on the
    validation scores of ``arm``'s candidates: (pick, selection-table rows, reason)."""
    sel = cfg.selection
    return choose_candidate(
        arm, sel.candidates[arm], results, erm_clean,
        criterion=sel.criterion, max_clean_drop=sel.max_clean_drop, min_binding=sel.min_binding,
    )  # fmt: skip


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


def privacy(outcome: Outcome, ev: NoiseEvalConfig) -> Table:
    """The accounting table of the ε grid: for each (kind, ε) the equivalent γ, E‖z‖, per-token and
    per-sequence ε of sequences of ``outcome.tokens`` tokens. ``ev.clip`` must be resolved; the geometry is
    the pretrained model's, its D widened to cover every evaluated model (fine-tuning moves the rows a
    little)."""
    assert ev.clip is not None and outcome.geometry is not None
    norms = [o["embedding_max_norm"] for outs in outcome.outputs.values() for o in outs]
    geometry = replace(outcome.geometry, max_norm=max([outcome.geometry.max_norm, *norms]))
    table = Table(
        title=f"Privacy of the ε kinds: d = {geometry.d}, σ_E = {geometry.sigma_e:.4g}, token distance "
        f"D <= {geometry.diameter:.4g}, Gaussian clip C = {ev.clip:.4g} and δ = {ev.delta:g} per token; "
        f"sequences of T = {outcome.tokens} tokens",
        columns=["kind", "epsilon", "equivalent γ", "E‖noise‖", "per-token ε", "per-sequence ε", "seq. δ"],
    )
    for kind in ev.ldp_kinds:
        rows = privacy_rows(kind, ev.epsilons, geometry, tokens=outcome.tokens, delta=ev.delta, clip=ev.clip)
        for r in rows:
            table.add(
                r.kind, r.epsilon, f"{r.gamma:.3g}", f"{r.noise_norm:.3g}", f"{r.token_epsilon:.4g}",
                f"{r.sequence_epsilon:.4g}", f"{r.sequence_delta:.2g}",
            )  # fmt: skip
    return table


def side_arrays(cfg: TextRobustnessConfig, outcome: Outcome) -> dict[str, dict[str, np.ndarray]]:
    """The arrays beside the cell store, by file (module docstring): λ of the evaluation runs (seeds cut to
    the shortest trace), λ of each candidate's tuning run, and the local-DP correctness."""
    lam = {}
    for m, outs in outcome.outputs.items():
        traces = [o["lambda_trace"] for o in outs]
        if m not in cfg.frozen_zero and all(t and t["steps"] for t in traces):
            n = min(len(t["steps"]) for t in traces)
            lam[f"{m}{SEP}steps"] = np.asarray(traces[0]["steps"][:n], dtype=np.float64)
            lam[m] = np.asarray([t["lambda"][:n] for t in traces], dtype=np.float64)
    tuning = {
        f"{m}{SEP}cand{i}{suffix}": np.asarray(trace[key], dtype=np.float64)
        for m, cands in outcome.tried.items()
        for i, s in enumerate(cands)
        if (trace := s.get("lambda_trace")) and trace["steps"]
        for suffix, key in ((f"{SEP}steps", "steps"), ("", "lambda"))
    }
    ldp: dict[str, np.ndarray] = {}
    if outcome.geometry is not None:
        curves = outcome.curves("ldp_curves")
        if any(c.examples is None for c in curves.values()):
            raise ValueError("the ε curves kept no per-example values (keep_examples=True)")
        ldp["epsilons"] = np.asarray(next(iter(curves.values())).gammas, dtype=np.float64)
        ldp |= {
            f"{m}{SEP}{k}": v.astype(np.float32) for m, c in curves.items() for k, v in c.examples.items()
        }
    return {LAMBDA: lam, LAMBDA_SELECTION: tuning, LDP: ldp}


def notes(methods: Mapping[str, MethodResult], n_seeds: int, lam: Mapping[str, np.ndarray]) -> list[str]:
    """What was measured, in words: monotone profiles, the clean and high-noise gaps to ERM, and per
    constrained method of ``arrays/lambda.npz`` its λ per layer at the end of training (mean over seeds) and
    how hard it bound (:func:`~descentlab.study.tuning_rules.binding_level` per seed)."""
    out = []
    for method, block in methods.items():
        counts = ", ".join(f"{k}: {v}/{n_seeds}" for k, v in block.extra["layer_loss_monotone_seeds"].items())
        out.append(f"{method}: seeds with a non-increasing per-layer test loss — {counts}")
    erm = methods[ERM].metrics if ERM in methods else None
    for method, block in methods.items():
        if erm is None or method == ERM:
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
    for m, x in lam.items():
        if SEP in m:  # "<m>__steps"
            continue
        steps = lam[f"{m}{SEP}steps"]
        bound = [binding_level(steps, seed) for seed in x]
        out.append(
            f"{m}: λ at the end of training (step {int(steps[-1])}, mean over {x.shape[0]} seeds), per layer: "
            + ", ".join(f"λ_{layer + 1} {v:.4g}" for layer, v in enumerate(x[:, -1, :].mean(0)))
            + f"; time-average of Σλ over the second half of training: {np.mean(bound):.4g} "
            f"(per seed {', '.join(f'{b:.3g}' for b in bound)})"
        )
    return out


# --- the figures ---------------------------------------------------------------------------------------


def figures(results: dict[str, Any], run_dir: Path) -> list[dict[str, Any]]:
    """Every figure whose arrays the run saved."""
    run_dir = Path(run_dir)
    store = claim_arrays(run_dir)
    if not isinstance(store, CellStore):
        return [*_lambda(run_dir), *_ldp(results, run_dir)]
    return [
        *_accuracy(store, run_dir),
        *_layer_loss(store, run_dir),
        *_lambda(run_dir),
        *_paired_gap(results, store, run_dir),
        *_ldp(results, run_dir),
    ]


def load(run_dir: Path | str, name: str) -> dict[str, np.ndarray]:
    """The arrays of ``<run_dir>/<name>``; {} when the run did not save that file."""
    path = Path(run_dir) / name
    return load_arrays(path) if path.is_file() else {}


def intervals(cells: np.ndarray, axis: int) -> list[PairedInterval]:
    """The seed-level 95 % interval of the mean of ``cells`` (``[seed, ..., example]``) at each index along
    ``axis``: :func:`~descentlab.report.stats.paired_interval` against 0, symmetric about the mean."""
    cells = np.moveaxis(np.asarray(cells, dtype=np.float64), axis, 0)
    return [paired_interval(c, np.zeros_like(c)) for c in cells]


def interval_band(ax: Any, x: Any, cells: np.ndarray, axis: int, *, label: str) -> None:
    """:func:`~descentlab.study.figures.plot_band` of the means along ``axis`` and their :func:`intervals`."""
    ivs = intervals(cells, axis)
    plot_band(ax, x, [iv.mean for iv in ivs], [iv.high - iv.mean for iv in ivs], label=label)


def _saved(store: CellStore, metric: str, kinds: list[str] | None = None) -> list[str]:
    """The design's methods whose ``metric`` cells the run saved (under every one of ``kinds``)."""
    return [m for m in store.design.arms if all(cell_key(metric, m, k) in store for k in kinds or [None])]


def _accuracy(store: CellStore, run_dir: Path) -> list[dict[str, Any]]:
    gammas = np.asarray(store.design.extra["gammas"], dtype=np.float64)
    kinds = store.conditions()

    def draw(ax: Any, kind: str) -> None:
        for m in _saved(store, CORRECT, kinds):
            interval_band(ax, gammas, store.get(CORRECT, m, kind), 2, label=m)
        ax.set(title=kind, xlabel="gamma", ylabel="test accuracy" if kind == kinds[0] else "")

    caption = "Test accuracy against γ per noise kind, mean and seed-level 95 % interval"
    panels = kinds if _saved(store, CORRECT, kinds) else []
    return panel_figure(run_dir, "figures/accuracy-ci.png", panels, draw, caption, sharey=True)


def _layer_loss(store: CellStore, run_dir: Path) -> list[dict[str, Any]]:
    arrays = {m: store.get(LOSS, m) for m in _saved(store, LOSS)}
    caption = "Per-layer clean test loss at every layer, mean and seed-level 95 % interval"
    # the paper: ERM's loss spikes at layer 19 of its RoBERTa (deeper than base; it names no size)
    if (spike := largest_rise(arrays[ERM]) if ERM in arrays else None) is not None:
        layer, rise = spike
        caption += f"; dotted: ERM's largest rise, at layer {layer} (+{rise:.3g} nats over layer {layer - 1})"

    def draw(ax: Any, _: None) -> None:
        for m, x in arrays.items():  # [seed, L+1, example]: every layer, 0..L
            interval_band(ax, np.arange(x.shape[1]), x, 1, label=m)
        if spike is not None:
            ax.axvline(spike[0], color="grey", ls=":", lw=1.0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set(xlabel="layer (0 = embedding output)", ylabel="clean test loss read out at the layer")

    return panel_figure(run_dir, "figures/layer-loss-ci.png", [None] if arrays else [], draw, caption)


def largest_rise(losses: np.ndarray) -> tuple[int, float] | None:
    """``(l, f_l − f_{l−1})`` of the largest rise of the mean per-layer loss ``losses [seed, L+1, example]``,
    l in 1..L; None when the mean loss never rises."""
    rises = np.diff(np.asarray(losses, dtype=np.float64).mean(axis=(0, 2)))
    layer = int(np.argmax(rises)) + 1
    return (layer, float(rises[layer - 1])) if rises[layer - 1] > 0 else None


def _lambda(run_dir: Path) -> list[dict[str, Any]]:
    """λ_l over training for every trained constrained method, one panel each (``plot_multipliers``)."""
    arrays = load(run_dir, LAMBDA)

    def draw(ax: Any, m: str) -> None:
        plot_multipliers(ax, arrays[f"{m}{SEP}steps"], arrays[m])  # λ [seed, T, L]
        ax.set(title=f"{m} ({arrays[m].shape[0]} seeds)", xlabel="step", ylabel="multiplier λ_l")

    caption = (
        "Multipliers λ_l over training per constrained layer: mean over the evaluation seeds (thick) and "
        "each seed (thin); layers whose λ stayed 0 throughout are not drawn"
    )
    methods = [m for m in arrays if SEP not in m]
    return panel_figure(run_dir, "figures/lambda-trajectory.png", methods, draw, caption, sharey=True)


def _paired_gap(results: dict[str, Any], store: CellStore, run_dir: Path) -> list[dict[str, Any]]:
    """Each method minus ERM per noise kind, ±1 std over (seed, draw) pairs of the accuracy over reviews."""
    kinds = store.conditions()
    gammas = store.design.extra["gammas"]
    accuracy = {
        m: {k: store.get(CORRECT, m, k).mean(-1) for k in kinds} for m in _saved(store, CORRECT, kinds)
    }
    gaps = paired_gaps(accuracy)

    def draw(ax: Any, kind: str) -> None:
        for (method, k), diff in gaps.items():
            if k == kind:
                plot_band(ax, gammas, *column_mean_std(diff, ddof=0, impl="numpy"), label=method, alpha=0.2)
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set(title=kind, xlabel="gamma", ylabel="accuracy minus ERM's" if kind == kinds[0] else "")

    caption = "Accuracy minus ERM's against γ (paired: same seeds, same noise), mean ± std over (seed, draw)"
    suptitle = str(results.get("experiment", ""))
    path = "figures/paired-gap.png"
    return panel_figure(run_dir, path, kinds if gaps else [], draw, caption, sharey=True, suptitle=suptitle)


def _ldp(results: dict[str, Any], run_dir: Path) -> list[dict[str, Any]]:
    """Accuracy against ε per local-DP kind (top: each method, the clean accuracy dashed; bottom: each
    method minus the matched control, or ERM without one), log ε axis."""
    arrays = load(run_dir, LDP)
    if not arrays:
        return []
    epsilons = arrays.pop("epsilons")
    by_kind: dict[str, dict[str, np.ndarray]] = {}
    for name, v in arrays.items():  # "<method>__<kind>"
        method, kind = name.split(SEP, 1)
        by_kind.setdefault(kind, {})[method] = np.asarray(v, dtype=np.float64)
    reference = next((r for r in (CONTROL, ERM) if all(r in v for v in by_kind.values())), None)
    fig, axes = new_figure(2 if reference else 1, len(by_kind), sharex=True)
    clean = {m: b.get("metrics", {}).get("accuracy") for m, b in results.get("methods", {}).items()}
    for col, (kind, values) in enumerate(by_kind.items()):
        top = axes[0][col]
        for method, v in values.items():
            interval_band(top, epsilons, v, 2, label=method)
            if clean.get(method) is not None:
                top.axhline(clean[method], color=top.lines[-1].get_color(), ls="--", lw=0.8)
            if reference is not None and method != reference:
                diff = v - values[reference]
                interval_band(axes[1][col], epsilons, diff, 2, label=f"{method} − {reference}")
        top.set(xscale="log", title=kind, ylabel="accuracy")
        if reference is not None:
            axes[1][col].axhline(0.0, color="grey", lw=0.8)
            axes[1][col].set(ylabel=f"accuracy minus {reference}'s")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("epsilon (log scale)")
    for row in axes:
        row[0].legend(fontsize=8)
    fig.suptitle(f"{results.get('experiment', '')}: accuracy against ε (seed-level 95 % intervals)")
    fig.tight_layout()
    save_figure(fig, run_dir / "figures" / "ldp-accuracy.png")
    caption = (
        "Accuracy against the local-DP ε (top: seed-level 95 % interval; dashed: clean accuracy); bottom: "
        "minus the reference's, paired over the same seeds and noise"
    )
    return [figure_record("figures/ldp-accuracy.png", caption)]
