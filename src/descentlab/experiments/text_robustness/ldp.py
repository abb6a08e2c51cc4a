"""text-robustness results against the local-DP ε: accuracy curves with CIs, privacy and verdict tables.

Accuracy against ε (the local-DP kinds, when the run evaluated them) is drawn from the per-example
correctness ``c[s, d, ε, e]`` saved in ``arrays/ldp.npz``: each method's accuracy with a 95 % bootstrap CI
(:func:`~descentlab.report.stats.paired_bootstrap` of c against 0, resampling seeds, draws and examples),
and each method minus ERM with the paired CI over the same cells; :func:`ldp_verdict_rows` turns the
latter into verdicts for the claim "the method keeps more accuracy than ERM at equal ε".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.io import load_arrays
from descentlab.report.figures import new_figure, save_figure
from descentlab.report.results import Curve, MethodResult
from descentlab.report.stats import paired_bootstrap, verdict
from descentlab.report.text_robustness import _SEP, ERM
from descentlab.robustness import EmbeddingGeometry, NoiseEvalConfig, RobustnessCurves, privacy_rows
from descentlab.robustness.accounting import PrivacyRow

LDP_ARRAYS = "arrays/ldp.npz"  # "epsilons" and "<method>__<kind>": correctness [seed, draw, ε, example]
N_BOOT = 2000


def ldp_arrays(curves: Mapping[str, RobustnessCurves]) -> dict[str, np.ndarray]:
    """The arrays :func:`ldp_figure` needs: the ε grid and each method's per-example values per kind."""
    first = next(iter(curves.values()))
    out = {"epsilons": np.asarray(first.gammas, dtype=np.float64)}
    for m, c in curves.items():
        if c.examples is None:
            raise ValueError(f"the ε curves of {m} kept no per-example values (keep_examples=True)")
        out.update({f"{m}{_SEP}{kind}": v.astype(np.float32) for kind, v in c.examples.items()})
    return out


def add_ldp_curves(block: MethodResult, curves: RobustnessCurves | None) -> None:
    """Put the ε curves (x_name ``epsilon``) into a method block, and their grid means into its metrics."""
    if curves is None:
        return
    for kind, c in curves.curves().items():
        block.curves[kind] = Curve.from_dict(c)
        block.metrics[f"{kind}_mean_over_epsilons"] = c["summary"]


def _split_arrays(arrays: Mapping[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    out: dict[str, dict[str, np.ndarray]] = {}
    for name, v in arrays.items():
        method, kind = name.split(_SEP, 1)
        out.setdefault(kind, {})[method] = np.asarray(v, dtype=np.float64)
    return out


def ldp_verdict_rows(
    examples: Mapping[str, Mapping[str, np.ndarray]], epsilons: Sequence[float], *, n_boot: int = N_BOOT
) -> list[list[Any]]:
    """Per kind, method ≠ ERM and ε (then the mean over the ε grid): the paired gap to ERM, its 95 % CI
    and the verdict on "the method keeps more accuracy than ERM at equal ε" (direction greater).

    ``examples[kind][method]`` is the correctness ``[seed, draw, ε, example]``.
    """
    rows: list[list[Any]] = []
    for kind, by_method in examples.items():
        if ERM not in by_method:
            continue
        erm = by_method[ERM]
        for method, values in by_method.items():
            if method == ERM:
                continue
            cells = [(f"{eps:g}", values[:, :, i], erm[:, :, i]) for i, eps in enumerate(epsilons)]
            cells.append(("mean over the grid", values.mean(axis=2), erm.mean(axis=2)))
            for label, a, b in cells:
                ci = paired_bootstrap(a, b, n_boot=n_boot)
                v = verdict(ci, "greater")
                mde = f"{v.min_detectable_effect:.4f}" if v.min_detectable_effect is not None else ""
                rows.append(
                    [
                        f"{method} - erm",
                        kind,
                        label,
                        float(a.mean()),
                        float(b.mean()),
                        f"{ci.mean:+.4f}",
                        f"[{ci.low:+.4f}, {ci.high:+.4f}]",
                        v.outcome,
                        mde,
                    ]
                )
    return rows


LDP_VERDICT_COLUMNS = [
    "comparison",
    "kind",
    "epsilon",
    "acc (method)",
    "acc (erm)",
    "gap",
    "95% CI (paired bootstrap)",
    "verdict",
    "MDE",
]


def privacy_table(
    rows: Sequence[PrivacyRow], geometry: EmbeddingGeometry, clip: float, delta: float
) -> dict[str, Any]:
    """The accounting table of a run: for each (kind, ε), the equivalent γ, E‖z‖, per-token and
    per-sequence ε (``rows``: :class:`~descentlab.robustness.accounting.PrivacyRow`)."""
    tokens = rows[0].tokens if rows else 0
    return {
        "title": (
            f"Privacy of the ε kinds: d = {geometry.d}, σ_E = {geometry.sigma_e:.4g}, token distance "
            f"D <= {geometry.diameter:.4g}, Gaussian clip C = {clip:.4g} and δ = {delta:g} per token; "
            f"sequences of T = {tokens} tokens"
        ),
        "columns": ["kind", "epsilon", "equivalent γ", "E‖noise‖", "per-token ε", "per-sequence ε", "seq. δ"],
        "rows": [
            [
                r.kind,
                r.epsilon,
                f"{r.gamma:.3g}",
                f"{r.noise_norm:.3g}",
                f"{r.token_epsilon:.4g}",
                f"{r.sequence_epsilon:.4g}",
                f"{r.sequence_delta:.2g}",
            ]
            for r in rows
        ],
    }


def summarise(
    outputs: Mapping[str, Sequence[Mapping[str, Any]]],
    geometry: EmbeddingGeometry,
    ev: NoiseEvalConfig,
    tokens: int,
) -> tuple[dict[str, RobustnessCurves], list[dict[str, Any]], dict[str, Any]]:
    """From each method's job outputs (one per seed, with ``ldp_curves`` and ``embedding_max_norm``): the ε
    curves joined over seeds, the privacy table of the ε grid (sequences of ``tokens`` tokens), the verdict
    table (with ERM) and the protocol entry. ``ev.clip`` must be resolved (a number); ``geometry`` is the
    pretrained model's, its D widened to cover every evaluated model (fine-tuning moves the rows a little).
    """
    assert ev.clip is not None
    curves = {m: RobustnessCurves.concat([o["ldp_curves"] for o in outs]) for m, outs in outputs.items()}
    max_norm = max([geometry.max_norm] + [o["embedding_max_norm"] for outs in outputs.values() for o in outs])
    geometry = replace(geometry, max_norm=max_norm)
    rows = [
        r
        for kind in ev.ldp_kinds
        for r in privacy_rows(kind, ev.epsilons, geometry, tokens=tokens, delta=ev.delta, clip=ev.clip)
    ]
    tables = [privacy_table(rows, geometry, ev.clip, ev.delta)]
    examples = {
        k: {m: c.examples[k] for m, c in curves.items() if c.examples is not None} for k in ev.ldp_kinds
    }
    verdicts = ldp_verdict_rows(examples, ev.epsilons)
    if verdicts:
        title = (
            "Claim: the method keeps more accuracy than ERM at equal ε (paired over seeds, draws and "
            f"examples; {N_BOOT} bootstrap replicates)"
        )
        tables.append({"title": title, "columns": LDP_VERDICT_COLUMNS, "rows": verdicts})
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
    return curves, tables, protocol


def ldp_figure(results: dict[str, Any], run_dir: Path, *, n_boot: int = N_BOOT) -> list[dict[str, Any]]:
    """Accuracy against ε per LDP kind (top: each method with its 95 % bootstrap CI, the clean accuracy
    dashed; bottom: method minus ERM with the paired 95 % CI), log ε axis; from ``arrays/ldp.npz``."""
    path = Path(run_dir) / LDP_ARRAYS
    if not path.is_file():
        return []
    arrays = load_arrays(path)
    epsilons = arrays.pop("epsilons")
    by_kind = _split_arrays(arrays)
    kinds = list(by_kind)
    has_erm = all(ERM in v for v in by_kind.values())
    fig, axes = new_figure(2 if has_erm else 1, len(kinds), sharex=True)
    clean = {m: b.get("metrics", {}).get("accuracy") for m, b in results.get("methods", {}).items()}
    for col, kind in enumerate(kinds):
        ax = axes[0][col]
        for i, (method, values) in enumerate(by_kind[kind].items()):
            color = f"C{i}"
            cis = [
                paired_bootstrap(values[:, :, j], np.zeros_like(values[:, :, j]), n_boot=n_boot)
                for j in range(len(epsilons))
            ]
            ax.plot(epsilons, [c.mean for c in cis], marker="o", ms=3, color=color, label=method)
            ax.fill_between(epsilons, [c.low for c in cis], [c.high for c in cis], color=color, alpha=0.2)
            if clean.get(method) is not None:
                ax.axhline(clean[method], color=color, ls="--", lw=0.8)
        ax.set_xscale("log")
        ax.set_title(kind)
        ax.set_ylabel("accuracy")
        ax.grid(alpha=0.3)
        if not has_erm:
            continue
        ax = axes[1][col]
        erm = by_kind[kind][ERM]
        for i, (method, values) in enumerate(by_kind[kind].items()):
            if method == ERM:
                continue
            cis = [
                paired_bootstrap(values[:, :, j], erm[:, :, j], n_boot=n_boot) for j in range(len(epsilons))
            ]
            ax.plot(epsilons, [c.mean for c in cis], marker="o", ms=3, color=f"C{i}", label=f"{method} - erm")
            ax.fill_between(epsilons, [c.low for c in cis], [c.high for c in cis], color=f"C{i}", alpha=0.2)
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.set_ylabel("accuracy minus ERM's")
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("epsilon (log scale)")
    axes[0][0].legend(fontsize=8)
    if has_erm:
        axes[1][0].legend(fontsize=8)
    fig.suptitle(f"{results.get('experiment', '')}: accuracy against ε (95 % bootstrap CIs)")
    fig.tight_layout()
    save_figure(fig, Path(run_dir) / "figures" / "ldp-accuracy.png")
    caption = (
        "Accuracy against the local-DP ε (top: 95 % bootstrap CI over seeds, draws and examples; dashed: clean"
        " accuracy); bottom: minus ERM's, paired 95 % CI (same seeds, same noise)"
    )
    return [{"path": "figures/ldp-accuracy.png", "caption": caption}]
