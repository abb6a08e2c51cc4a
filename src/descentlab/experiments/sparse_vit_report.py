"""sparse-vit results: methods block, tables, the paired HORST comparison, and the weight-histogram figure.

Kept apart from :mod:`descentlab.experiments.sparse_vit` (config and training) so each file has one concern.
"""

from __future__ import annotations

from typing import Any

import torch

from descentlab.train.rundir import RunDir

PAPER = "DeiT-base, ImageNet, 90 %: HORST 76.83 vs AdamW 68.86; DeiT-small 90 %: HORST 70.5 vs HAM 60.06"


def mean_std(values: list[float]) -> tuple[float, float]:
    t = torch.tensor(values, dtype=torch.float64)
    return float(t.mean()), float(t.std()) if len(values) > 1 else 0.0


def fmt_pct(values: list[float]) -> str:
    mean, std = mean_std(values)
    return f"{100 * mean:.2f} ± {100 * std:.2f}"


def weight_stats(w: torch.Tensor) -> dict[str, float]:
    """Shape of a weight distribution: share of tiny weights, excess kurtosis, and ||w||_1 / (sqrt(n) ||w||_2).

    A Gaussian has excess kurtosis 0 and L1/L2 ratio sqrt(2/pi) ~ 0.80; a distribution sharply peaked at 0
    with heavy tails has a large kurtosis and a small ratio.
    """
    w = w.double()
    centred = w - w.mean()
    kurtosis = float((centred**4).mean() / (centred**2).mean() ** 2 - 3.0)
    return {
        "frac_abs_below_1e-3": float((w.abs() < 1e-3).double().mean()),
        "frac_abs_below_1e-2": float((w.abs() < 1e-2).double().mean()),
        "excess_kurtosis": kurtosis,
        "l1_over_l2": float(w.abs().sum() / (w.numel() ** 0.5 * w.norm())),
    }


def summarise(cfg: Any, results: dict, dense: list[dict], tuning: dict) -> dict:
    """The results.json body without protocol and figures: methods, tables and notes."""
    sparsities, top = list(cfg.sparsities), max(cfg.sparsities)
    methods: dict[str, dict] = {}
    for o in cfg.optimizers:
        tests = [[r["test"] for r in results[o][s]] for s in sparsities]
        stats = [mean_std(t) for t in tests]
        metrics = {f"test_accuracy@{s:g}": m for s, (m, _) in zip(sparsities, stats, strict=True)}
        methods[o] = {
            "metrics": metrics | {"lr": tuning["chosen"][o][0], "alpha": tuning["chosen"][o][1]},
            "curves": {
                "test_accuracy": {
                    "x_name": "sparsity",
                    "x": sparsities,
                    "metric": "accuracy",
                    "mean": [m for m, _ in stats],
                    "std": [s for _, s in stats],
                }
            },
            "sparsity": {
                f"checkpoint@{s:g}": min(r["checkpoint_sparsity"] for r in results[o][s]) for s in sparsities
            },
        }
    if dense:
        methods["adamw-dense"] = {
            "metrics": {"test_accuracy@0": mean_std([r["test"] for r in dense])[0]},
            "sparsity": {"checkpoint": max(r["checkpoint_sparsity"] for r in dense)},
        }

    columns = ["optimizer", *(["dense"] if dense else []), *[f"{100 * s:g} %" for s in sparsities]]
    acc_rows = [
        [o, *(["–"] if dense else []), *[fmt_pct([r["test"] for r in results[o][s]]) for s in sparsities]]
        for o in cfg.optimizers
    ]
    if dense:
        acc_rows.append(["adamw (dense)", fmt_pct([r["test"] for r in dense]), *["–"] * len(sparsities)])
    ckpt_rows = []
    for o in cfg.optimizers:
        for s in sparsities:
            runs = results[o][s]
            ckpt_rows.append(
                [
                    o,
                    f"{100 * s:g} %",
                    f"{min(r['checkpoint_sparsity'] for r in runs):.6f}",
                    f"{max(r['checkpoint_sparsity'] for r in runs):.6f}",
                    f"{min(min(r['block_sparsity']) for r in runs):.4f}–"
                    f"{max(max(r['block_sparsity']) for r in runs):.4f}",
                ]
            )
    tables = [
        {
            "title": f"Test accuracy (%) against sparsity, mean ± std over seeds {list(cfg.seeds)}",
            "columns": columns,
            "rows": acc_rows,
        },
        {
            "title": "Sparsity read back from the saved safetensors checkpoints (block Linear weights, exact zeros)",
            "columns": ["optimizer", "target", "global min", "global max", "per-block range"],
            "rows": ckpt_rows,
        },
    ]
    if tuning["tuning"]:
        tables.append(
            {
                "title": f"Tuning on the validation split (sparsity {cfg.tune_sparsity:g}, seed "
                f"{cfg.seeds[0]}; accuracy %)",
                "columns": ["optimizer", "lr", "alpha", "val accuracy", "chosen"],
                "rows": tuning["tuning"],
            }
        )
    notes, diff_rows = compare(results, top)
    if diff_rows:
        tables.append(
            {
                "title": f"Paired per-seed differences at {100 * top:g} % (test accuracy points)",
                "columns": ["comparison", "per seed", "mean ± std", "HORST ahead"],
                "rows": diff_rows,
            }
        )
    shape_rows = []
    for o in cfg.optimizers:
        hist = results[o][top][0]["hist"]
        if "before_final_pruning" in hist:
            st = weight_stats(hist["before_final_pruning"])
            shape_rows.append([o, *(f"{v:.4f}" for v in st.values())])
    if dense and "final" in dense[0]["hist"]:
        shape_rows.append(
            ["adamw (dense, end)", *(f"{v:.4f}" for v in weight_stats(dense[0]["hist"]["final"]).values())]
        )
    if shape_rows:
        tables.append(
            {
                "title": f"Block-Linear weights before the final pruning (seed {cfg.seeds[0]}, "
                f"{100 * top:g} % run): how peaked at 0",
                "columns": ["optimizer", "|w| < 1e-3", "|w| < 1e-2", "excess kurtosis", "L1/(√n L2)"],
                "rows": shape_rows,
            }
        )
    return {"methods": methods, "tables": tables, "notes": notes}


def compare(results: dict, top: float) -> tuple[list[str], list[list]]:
    """Per-seed paired differences HORST - AdamW and HORST - HAM at the top sparsity, and a plain verdict."""
    notes, rows = [], []
    if "horst" not in results:
        return notes, rows
    horst = [r["test"] for r in results["horst"][top]]
    for other in ("adamw", "ham"):
        if other not in results:
            continue
        diffs = [100 * (h - r["test"]) for h, r in zip(horst, results[other][top], strict=True)]
        mean, std = mean_std(diffs)
        wins = sum(d > 0 for d in diffs)
        rows.append(
            [
                f"horst - {other}",
                ", ".join(f"{d:+.2f}" for d in diffs),
                f"{mean:+.2f} ± {std:.2f}",
                f"{wins}/{len(diffs)}",
            ]
        )
        verdict = "beats" if wins == len(diffs) and mean > 0 else "does not consistently beat"
        notes.append(
            f"At {100 * top:g} % sparsity HORST {verdict} {other.upper()}: {mean:+.2f} ± {std:.2f} "
            f"test-accuracy points (HORST ahead in {wins} of {len(diffs)} seeds)."
        )
    if notes:
        notes.append(f"Paper, for scale: {PAPER}.")
    return notes, rows


def histogram_figure(cfg: Any, run: RunDir, hists: dict[str, dict], dense: dict | None, top: float) -> dict:
    """Block-Linear weight histograms: before the final pruning, and the surviving weights at the end."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    panels = [
        ("before_final_pruning", "end of the last decompressed phase (what the final pruning sees)"),
        ("final", f"final weights: non-zeros at {100 * top:g} %"),
    ]
    for ax, (key, title) in zip(axes, panels, strict=True):
        series = {o: h[key] for o, h in hists.items() if key in h}
        if dense is not None and "final" in dense:
            series["adamw (dense)"] = dense["final"]
        for name, w in series.items():
            w = w[w != 0] if key == "final" else w
            if w.numel():
                ax.hist(
                    w.numpy(), bins=cfg.histogram_bins, histtype="step", density=True, log=True, label=name
                )
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("weight")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("density (log)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(run.figure("weight-histograms"), dpi=120)
    plt.close(fig)
    return {
        "path": "figures/weight-histograms.png",
        "caption": f"Weight histograms of the block Linears (seed {cfg.seeds[0]}), HORST against AdamW and "
        "HAM; the dense AdamW run for reference. Raw values: histograms.safetensors.",
    }
