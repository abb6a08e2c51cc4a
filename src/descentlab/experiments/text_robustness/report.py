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
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.evaluation import EmbeddingGeometry, NoiseEvalConfig, RobustnessCurves, privacy_rows
from descentlab.experiments.text_robustness.claims import CONTROL, CORRECT, ERM, LOSS, SEP, claim_arrays
from descentlab.io import load_arrays
from descentlab.report.figures import new_figure, save_figure
from descentlab.report.results import Curve, MethodResult
from descentlab.report.stats import column_mean_std, mean_std, paired_interval
from descentlab.report.tables import multiplier_tables
from descentlab.study.cells import CellStore, cell_key
from descentlab.study.figures import figure_record, panel_figure, plot_band, plot_multipliers
from descentlab.study.tables import Table, pm
from descentlab.study.tuning_rules import binding_level

LAMBDA = "arrays/lambda.npz"
LAMBDA_SELECTION = "arrays/lambda-selection.npz"
LDP = "arrays/ldp.npz"

# --- the method blocks, tables and notes -----------------------------------------------------------------


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


def add_ldp_curves(block: MethodResult, curves: RobustnessCurves | None) -> None:
    """Put the ε curves (x_name ``epsilon``) into a method block, and their grid means into its metrics."""
    for kind, c in (curves.curves() if curves is not None else {}).items():
        block.curves[kind] = Curve.from_dict(c)
        block.metrics[f"{kind}_mean_over_epsilons"] = c["summary"]


def layer_loss_ci(losses: np.ndarray) -> list[list[float]]:
    """Per layer ``[low, high]`` of the seed-level 95 % interval of the mean clean loss (``losses``:
    ``[seed, L+1, example]``)."""
    return [
        list(mean_interval(np.asarray(losses[:, layer], dtype=np.float64))[1:])
        for layer in range(losses.shape[1])
    ]


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


def tables(
    curves: Mapping[str, RobustnessCurves],
    methods: Mapping[str, MethodResult],
    selection_rows: list[list[Any]],
    shift_names: Sequence[str],
    *,
    tune_seed: int,
) -> list[dict[str, Any]]:
    """The paired gaps, the dataset shift, the selection (``tune_seed``: the seed it trained from) and the
    final multipliers."""
    gammas = next(iter(curves.values())).gammas
    out: list[Table] = []
    if gap := paired_gap_rows(curves):
        title = "Accuracy minus ERM's (paired: same seeds, same noise), mean ± std over (seed, draw)"
        out.append(Table(title, ["method", "kind", *[f"γ={g:g}" for g in gammas]], gap))
    if shift_names:
        shift = Table(
            "Dataset shift: clean accuracy on extra test sets (mean over seeds)",
            ["method", "in-distribution", *shift_names],
        )
        for m, b in methods.items():
            shift.add(m, b.metrics["accuracy"], *[b.metrics.get(f"shift:{s}", "") for s in shift_names])
        out.append(shift)
    if selection_rows:
        columns = ["method", "candidate", "val clean acc", "val acc, gaussian grid mean"]
        columns += ["binding: mean Σλ over the 2nd half", "chosen"]
        title = f"Selection on the validation split (tuning seed {tune_seed}, never an evaluation seed)"
        out.append(Table(title, columns, selection_rows))
    return [t.to_dict() for t in out] + multiplier_tables({m: b.to_dict() for m, b in methods.items()})


def privacy(
    outputs: Mapping[str, Sequence[Mapping[str, Any]]],
    geometry: EmbeddingGeometry,
    ev: NoiseEvalConfig,
    tokens: int,
) -> tuple[dict[str, RobustnessCurves], Table, dict[str, Any]]:
    """From each method's job outputs (one per seed, with ``ldp_curves`` and ``embedding_max_norm``): the ε
    curves joined over seeds, the accounting table of the ε grid (for each (kind, ε): the equivalent γ,
    E‖z‖, per-token and per-sequence ε of sequences of ``tokens`` tokens) and the protocol entry.
    ``ev.clip`` must be resolved; ``geometry`` is the pretrained model's, its D widened to cover every
    evaluated model (fine-tuning moves the rows a little)."""
    assert ev.clip is not None
    curves = {m: RobustnessCurves.concat([o["ldp_curves"] for o in outs]) for m, outs in outputs.items()}
    max_norm = max([geometry.max_norm] + [o["embedding_max_norm"] for outs in outputs.values() for o in outs])
    geometry = replace(geometry, max_norm=max_norm)
    table = Table(
        title=f"Privacy of the ε kinds: d = {geometry.d}, σ_E = {geometry.sigma_e:.4g}, token distance "
        f"D <= {geometry.diameter:.4g}, Gaussian clip C = {ev.clip:.4g} and δ = {ev.delta:g} per token; "
        f"sequences of T = {tokens} tokens",
        columns=["kind", "epsilon", "equivalent γ", "E‖noise‖", "per-token ε", "per-sequence ε", "seq. δ"],
    )
    for kind in ev.ldp_kinds:
        for r in privacy_rows(kind, ev.epsilons, geometry, tokens=tokens, delta=ev.delta, clip=ev.clip):
            table.add(
                r.kind, r.epsilon, f"{r.gamma:.3g}", f"{r.noise_norm:.3g}", f"{r.token_epsilon:.4g}",
                f"{r.sequence_epsilon:.4g}", f"{r.sequence_delta:.2g}",
            )  # fmt: skip
    protocol = {
        "kinds": list(ev.ldp_kinds),
        "epsilons": list(ev.epsilons),
        "delta_per_token": ev.delta,
        "clip": ev.clip,
        "sequence_tokens": tokens,
        "mechanisms": "metric_ldp: e + z, p(z) ∝ exp(-ε‖z‖) (E‖z‖ = d/ε); gaussian_mechanism: clip_C(e) + "
        "N(0, σ²I), σ from the analytic Gaussian mechanism at (ε, δ) with Δ = 2C; both on the word-embedding "
        "output, every position, keyed by content; ε is absolute, the same for every model",
    }
    return curves, table, protocol


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


def by_method(arrays: Mapping[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """``{"<m>__<kind>": x}`` -> ``{m: {kind: x}}`` (names without the separator are left out)."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for name, v in arrays.items():
        if SEP in name:
            method, kind = name.split(SEP, 1)
            out.setdefault(method, {})[kind] = v
    return out


def mean_interval(x: np.ndarray, reference: np.ndarray | None = None) -> tuple[float, float, float]:
    """Mean of ``x − reference`` (``reference`` 0 when None) with its seed-level 95 % interval."""
    iv = paired_interval(x, np.zeros_like(x) if reference is None else reference)
    return iv.mean, iv.low, iv.high


def interval_band(ax: Any, x: Any, columns: Sequence[np.ndarray], *, label: str, **style: Any) -> None:
    """One column of cells per x (``[seed, ...]`` each): its mean and seed-level 95 % band."""
    stats = np.array([mean_interval(c) for c in columns])
    (line,) = ax.plot(x, stats[:, 0], marker="o", ms=3, label=label, **style)
    ax.fill_between(x, stats[:, 1], stats[:, 2], alpha=0.15, color=line.get_color())


def _saved(store: CellStore, metric: str, kinds: list[str] | None = None) -> list[str]:
    """The design's methods whose ``metric`` cells the run saved (under every one of ``kinds``)."""
    return [m for m in store.design.arms if all(cell_key(metric, m, k) in store for k in kinds or [None])]


def _accuracy(store: CellStore, run_dir: Path) -> list[dict[str, Any]]:
    gammas = np.asarray(store.design.extra["gammas"], dtype=np.float64)
    kinds = store.conditions()

    def draw(ax: Any, kind: str) -> None:
        for m in _saved(store, CORRECT, kinds):
            x = store.get(CORRECT, m, kind)
            interval_band(ax, gammas, [x[:, :, g] for g in range(len(gammas))], label=m)
        ax.set(title=kind, xlabel="gamma", ylabel="test accuracy" if kind == kinds[0] else "")

    caption = "Test accuracy against γ per noise kind, mean and seed-level 95 % interval"
    return panel_figure(
        run_dir,
        "figures/accuracy-ci.png",
        kinds if _saved(store, CORRECT, kinds) else [],
        draw,
        caption,
        sharey=True,
    )


def _layer_loss(store: CellStore, run_dir: Path) -> list[dict[str, Any]]:
    arrays = {m: store.get(LOSS, m) for m in _saved(store, LOSS)}
    if not arrays:
        return []
    depth = max(x.shape[1] for x in arrays.values())
    fig, axes = new_figure(1, 1, panel_size=(max(4.2, 0.28 * depth), 3.4))
    ax = axes[0][0]
    for m, x in arrays.items():  # [seed, L+1, example]: every layer, 0..L
        interval_band(ax, np.arange(x.shape[1]), [x[:, layer] for layer in range(x.shape[1])], label=m)
    caption = "Per-layer clean test loss at every layer, mean and seed-level 95 % interval"
    # the paper: ERM's loss spikes at layer 19 of its RoBERTa (deeper than base; it names no size)
    if (spike := largest_rise(arrays[ERM]) if ERM in arrays else None) is not None:
        layer, rise = spike
        ax.axvline(layer, color="grey", ls=":", lw=1.0)
        caption += f"; dotted: ERM's largest rise, at layer {layer} (+{rise:.3g} nats over layer {layer - 1})"
    ax.set_xticks(np.arange(depth))
    ax.set(xlabel="layer (0 = embedding output)", ylabel="clean test loss read out at the layer")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, run_dir / "figures" / "layer-loss-ci.png")
    return [figure_record("figures/layer-loss-ci.png", caption)]


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
    panels = kinds if gaps else []
    return panel_figure(
        run_dir, "figures/paired-gap.png", panels, draw, caption, sharey=True, suptitle=suptitle
    )


def _ldp(results: dict[str, Any], run_dir: Path) -> list[dict[str, Any]]:
    """Accuracy against ε per local-DP kind (top: each method, the clean accuracy dashed; bottom: each
    method minus the matched control, or ERM without one), log ε axis."""
    arrays = load(run_dir, LDP)
    if not arrays:
        return []
    epsilons = arrays.pop("epsilons")
    by_kind: dict[str, dict[str, np.ndarray]] = {}
    for method, per_kind in by_method(arrays).items():
        for kind, v in per_kind.items():
            by_kind.setdefault(kind, {})[method] = np.asarray(v, dtype=np.float64)
    reference = next((r for r in (CONTROL, ERM) if all(r in v for v in by_kind.values())), None)
    fig, axes = new_figure(2 if reference else 1, len(by_kind), sharex=True)
    clean = {m: b.get("metrics", {}).get("accuracy") for m, b in results.get("methods", {}).items()}
    for col, (kind, values) in enumerate(by_kind.items()):
        for i, (method, v) in enumerate(values.items()):
            interval_band(
                axes[0][col],
                epsilons,
                [v[:, :, j] for j in range(len(epsilons))],
                label=method,
                color=f"C{i}",
            )
            if clean.get(method) is not None:
                axes[0][col].axhline(clean[method], color=f"C{i}", ls="--", lw=0.8)
            if reference is not None and method != reference:
                ref = values[reference]
                diffs = [v[:, :, j] - ref[:, :, j] for j in range(len(epsilons))]
                interval_band(axes[1][col], epsilons, diffs, label=f"{method} − {reference}", color=f"C{i}")
        axes[0][col].set(xscale="log", title=kind, ylabel="accuracy")
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
