"""text-robustness claims (METHODS.md §1.6), each a paired bootstrap 95 % CI against ERM and a verdict, and the
figures drawn from the per-example arrays the run saved.

Cells. ``correct[m][kind]`` is the 0/1 correctness ``[seed, draw, γ, example]`` of method m; ``losses[m]``
the per-example cross-entropy read out at every layer, clean, ``[seed, L+1, example]``. Every method sees the
same test examples under the same noise (content-keyed), and shares the training seeds, so every cell of m
pairs with the same cell of ERM. With Γ = {γ >= 1}:

1. ``monotone``: the rise of the test-mean per-layer loss profile p, ``R(p) = Σ_{l=1..L} max(0, p_l - p_{l-1})``
   (0 for a non-increasing profile); claimed: R(m) < R(ERM), i.e. m descends where ERM does not. R is not a
   mean of cells, so its CI resamples seeds and examples (the same pigeonhole weights as
   :func:`~descentlab.report.stats.paired_bootstrap`) and recomputes R for both methods on each replicate.
2. ``clean-parity``: clean accuracy within ``margin`` (0.3 points) of ERM's: claimed
   ``acc_m - acc_ERM > -margin`` (the cells of m shifted by +margin, "greater").
3. ``graceful:<kind>``: mean accuracy over Γ above ERM's, per noise kind ("greater").

Verdicts: :func:`~descentlab.report.stats.verdict` (reproduced / refuted / inconclusive, with the minimum
detectable effect).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.io import load_arrays
from descentlab.report.figures import new_figure, save_figure
from descentlab.report.stats import BootstrapCI, paired_bootstrap, verdict

ERM = "erm"
EXAMPLE_ARRAYS = "arrays/examples.npz"  # "<method>__<kind>": correctness [seed, draw, γ, example]; "gammas"
LAYER_ARRAYS = "arrays/layer_loss.npz"  # "<method>": per-example loss [seed, L+1, example]
LAMBDA_ARRAYS = "arrays/lambda.npz"  # "<method>__steps": [T]; "<method>": λ [seed, T, L]
N_BOOT = 2000
MARGIN = 0.003  # the paper's "degradation often < 0.3 %", in accuracy units
_SEP = "__"

CLAIMS = {
    "monotone": "per-layer test loss rises less than ERM's (sum of increases of the test-mean profile)",
    "clean-parity": "clean test accuracy within 0.3 points of ERM's",
    "graceful": "mean test accuracy over gamma >= 1 above ERM's",
}


def rise(profile: np.ndarray) -> np.ndarray:
    """``Σ_l max(0, p_l - p_{l-1})`` along the last axis (layers)."""
    return np.clip(np.diff(profile, axis=-1), 0.0, None).sum(-1)


def _weights(shape: Sequence[int], n_boot: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot).astype(np.float64) for n in shape]


def rise_bootstrap(
    a: np.ndarray, b: np.ndarray, *, n_boot: int = N_BOOT, level: float = 0.95, seed: int = 0
) -> tuple[BootstrapCI, BootstrapCI, BootstrapCI]:
    """CIs of R(a), R(b) and R(a) - R(b) for per-example losses ``[seed, L+1, example]`` (paired weights)."""
    ws, we = _weights((a.shape[0], a.shape[2]), n_boot, seed)

    def profiles(x: np.ndarray) -> np.ndarray:  # [n_boot, L+1]
        per_seed = np.einsum("sle,be->bsl", x, we) / x.shape[2]
        return np.einsum("bsl,bs->bl", per_seed, ws) / x.shape[0]

    ra, rb = rise(profiles(a)), rise(profiles(b))
    tail = (1 - level) / 2

    def ci(rep: np.ndarray, point: float) -> BootstrapCI:
        low, high = np.quantile(rep, [tail, 1 - tail])
        return BootstrapCI(point, float(low), float(high), int(a[:, 0].size), (a.shape[0], a.shape[2]), level)

    pa, pb = float(rise(a.mean((0, 2)))), float(rise(b.mean((0, 2))))
    return ci(ra, pa), ci(rb, pb), ci(ra - rb, pa - pb)


def _row(method: str, claim: str, ci: BootstrapCI, direction: str, **extra: Any) -> dict[str, Any]:
    v = verdict(ci, direction)  # type: ignore[arg-type]
    base = claim.split(":")[0]
    return {
        "method": method,
        "reference": extra.pop("reference"),
        "claim": claim,
        "description": CLAIMS[base] + (f" ({claim.split(':')[1]} noise)" if ":" in claim else ""),
        "estimate": ci.mean,
        "ci": [ci.low, ci.high],
        "shape": list(ci.shape),
        "verdict": v.outcome,
        "reason": v.reason,
        "min_detectable_effect": ci.min_detectable_effect(),
        **extra,
    }


def evaluate_claims(
    correct: Mapping[str, Mapping[str, np.ndarray]],
    losses: Mapping[str, np.ndarray],
    gammas: Sequence[float],
    *,
    margin: float = MARGIN,
    n_boot: int = N_BOOT,
    reference: str = ERM,
) -> list[dict[str, Any]]:
    """Every claim for every method against ``reference`` (module docstring; ERM by default). With another
    reference (a matched control such as ``erm-readout``), ERM and the reference itself are skipped; each
    row's ``reference`` names what it was compared with (the ``erm_*`` keys then hold the reference's)."""
    if reference not in correct:
        return []
    high = [i for i, g in enumerate(gammas) if g >= 1.0]
    clean = list(gammas).index(0.0)
    rows = []
    ERM = reference
    for m in correct:
        if m in (ERM, "erm"):
            continue
        if m in losses and ERM in losses:
            ca, cb, cd = rise_bootstrap(losses[m], losses[ERM], n_boot=n_boot)
            rows.append(
                _row(
                    m,
                    "monotone",
                    cd,
                    "less",
                    method_rise=[ca.mean, ca.low, ca.high],
                    erm_rise=[cb.mean, cb.low, cb.high],
                    method_monotone_seeds=int(sum(rise(p) <= 1e-12 for p in losses[m].mean(2))),
                    erm_monotone_seeds=int(sum(rise(p) <= 1e-12 for p in losses[ERM].mean(2))),
                    n_seeds=int(losses[m].shape[0]),
                    reference=ERM,
                )
            )
        kind0 = next(iter(correct[m]))
        a, b = correct[m][kind0][:, :1, clean], correct[ERM][kind0][:, :1, clean]  # [seed, 1, example]
        raw = paired_bootstrap(a, b, n_boot=n_boot)
        shifted = paired_bootstrap(a + margin, b, n_boot=n_boot)
        rows.append(
            _row(
                m,
                "clean-parity",
                shifted,
                "greater",
                margin=margin,
                raw_estimate=raw.mean,
                raw_ci=[raw.low, raw.high],
                method_mean=float(a.mean()),
                erm_mean=float(b.mean()),
                reference=ERM,
            )
        )
        if not high:
            continue
        for kind, values in correct[m].items():
            a, b = values[:, :, high].mean(2), correct[ERM][kind][:, :, high].mean(2)  # [seed, draw, example]
            ci = paired_bootstrap(a, b, n_boot=n_boot)
            rows.append(
                _row(
                    m,
                    f"graceful:{kind}",
                    ci,
                    "greater",
                    method_mean=float(a.mean()),
                    erm_mean=float(b.mean()),
                    reference=ERM,
                )
            )
    return rows


def claims_table(claims: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    rows = []
    for c in claims:
        est, (lo, hi) = c["estimate"], c["ci"]
        if c["claim"] == "monotone":
            what = (
                f"rise {c['method_rise'][0]:.4f} vs {c['erm_rise'][0]:.4f}; difference {est:+.4f} "
                f"[{lo:+.4f}, {hi:+.4f}]; monotone seeds {c['method_monotone_seeds']}/{c['n_seeds']} "
                f"(reference {c['erm_monotone_seeds']}/{c['n_seeds']})"
            )
        elif c["claim"] == "clean-parity":
            what = (
                f"{c['method_mean']:.4f} vs {c['erm_mean']:.4f}: difference {c['raw_estimate']:+.4f} "
                f"[{c['raw_ci'][0]:+.4f}, {c['raw_ci'][1]:+.4f}] (claimed > {-c['margin']:+.3f})"
            )
        else:
            what = (
                f"{c['method_mean']:.4f} vs {c['erm_mean']:.4f}: difference {est:+.4f} [{lo:+.4f}, {hi:+.4f}]"
            )
        ref = c.get("reference", ERM)
        rows.append([c["method"], ref, c["claim"], what, c["verdict"], f"{c['min_detectable_effect']:.3g}"])
    return {
        "title": "Claims against ERM and the matched control: paired 95 % bootstrap CI over (seed, draw, "
        "example) of method minus reference",
        "columns": [
            "method",
            "vs",
            "claim",
            "method vs reference, difference [95 % CI]",
            "verdict",
            "min detectable effect",
        ],
        "rows": rows,
    }


def split_arrays(arrays: Mapping[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    out: dict[str, dict[str, np.ndarray]] = {}
    for name, v in arrays.items():
        if _SEP in name:
            method, kind = name.split(_SEP, 1)
            out.setdefault(method, {})[kind] = v
    return out


def example_arrays(correct: Mapping[str, Mapping[str, np.ndarray]], gammas: Sequence[float]) -> dict:
    out = {"gammas": np.asarray(gammas, dtype=np.float64)}
    out.update({f"{m}{_SEP}{k}": v.astype(np.float32) for m, by in correct.items() for k, v in by.items()})
    return out


def _mean_ci(x: np.ndarray, n_boot: int) -> tuple[float, float, float]:
    ci = paired_bootstrap(x, np.zeros_like(x), n_boot=n_boot)
    return ci.mean, ci.low, ci.high


def figures(results: dict[str, Any], run_dir: Path, *, n_boot: int = 1000) -> list[dict[str, Any]]:
    """Accuracy against γ per kind, the per-layer test loss (both with 95 % bootstrap bands), and λ over
    training; each only when its arrays exist."""
    run_dir = Path(run_dir)
    out = []
    path = run_dir / EXAMPLE_ARRAYS
    if path.is_file():
        arrays = load_arrays(path)
        gammas = arrays.pop("gammas")
        by_method = split_arrays(arrays)
        kinds = list(dict.fromkeys(k for by in by_method.values() for k in by))
        fig, axes = new_figure(1, len(kinds), sharey=True)
        for ax, kind in zip(axes[0], kinds, strict=True):
            for m, by in by_method.items():
                stats = np.array([_mean_ci(by[kind][:, :, g], n_boot) for g in range(len(gammas))])
                ax.plot(gammas, stats[:, 0], marker="o", ms=3, label=m)
                ax.fill_between(gammas, stats[:, 1], stats[:, 2], alpha=0.15)
            ax.set_title(kind)
            ax.set_xlabel("gamma")
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("test accuracy")
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        save_figure(fig, run_dir / "figures" / "accuracy-ci.png")
        out.append(
            {
                "path": "figures/accuracy-ci.png",
                "caption": "Test accuracy against γ per noise kind, mean and 95 % bootstrap CI over "
                "(seed, draw, example)",
            }
        )
    path = run_dir / LAYER_ARRAYS
    if path.is_file():
        arrays = load_arrays(path)
        fig, axes = new_figure(1, 1)
        ax = axes[0][0]
        for m, x in arrays.items():  # [seed, L+1, example]
            stats = np.array([_mean_ci(x[:, layer], n_boot) for layer in range(x.shape[1])])
            layers = np.arange(x.shape[1])
            ax.plot(layers, stats[:, 0], marker="o", ms=3, label=m)
            ax.fill_between(layers, stats[:, 1], stats[:, 2], alpha=0.15)
        ax.set_xlabel("layer (0 = embedding output)")
        ax.set_ylabel("clean test loss read out at the layer")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        save_figure(fig, run_dir / "figures" / "layer-loss-ci.png")
        out.append(
            {
                "path": "figures/layer-loss-ci.png",
                "caption": "Per-layer clean test loss, mean and 95 % bootstrap CI over (seed, example)",
            }
        )
    path = run_dir / LAMBDA_ARRAYS
    if path.is_file():
        arrays = load_arrays(path)
        methods = [m for m in arrays if _SEP not in m]
        if methods:
            fig, axes = new_figure(1, len(methods), sharey=True)
            for ax, m in zip(axes[0], methods, strict=True):
                steps, lam = arrays[f"{m}{_SEP}steps"], arrays[m]  # [seed, T, L]
                for layer in range(lam.shape[2]):
                    if np.any(lam[:, :, layer] != 0):
                        ax.plot(steps, lam[:, :, layer].mean(0), label=f"λ_{layer + 1}")
                ax.set_title(m)
                ax.set_xlabel("step")
                ax.grid(alpha=0.3)
                ax.legend(fontsize=7)
            axes[0][0].set_ylabel("multiplier (mean over seeds)")
            fig.tight_layout()
            save_figure(fig, run_dir / "figures" / "lambda.png")
            out.append(
                {"path": "figures/lambda.png", "caption": "Multipliers over training, mean over seeds"}
            )
    return out


def layer_loss_ci(losses: np.ndarray, n_boot: int = N_BOOT) -> list[list[float]]:
    """Per layer ``[low, high]`` of the 95 % bootstrap CI over (seed, example) of the mean loss
    (``losses``: ``[seed, L+1, example]``)."""
    return [list(_mean_ci(losses[:, layer], n_boot)[1:]) for layer in range(losses.shape[1])]


def lambda_arrays(
    outputs: Mapping[str, Sequence[Mapping[str, Any]]], frozen: Sequence[str]
) -> dict[str, np.ndarray]:
    """``<m>__steps`` [T] and ``<m>`` λ [seed, T, L] of every trained constrained method (seeds cut to the
    shortest trace)."""
    out = {}
    for m, outs in outputs.items():
        traces = [o["lambda_trace"] for o in outs]
        if m in frozen or not all(t and t["steps"] for t in traces):
            continue
        n = min(len(t["steps"]) for t in traces)
        out[f"{m}__steps"] = np.asarray(traces[0]["steps"][:n], dtype=np.float64)
        out[m] = np.asarray([t["lambda"][:n] for t in traces], dtype=np.float64)
    return out
