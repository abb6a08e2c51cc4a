"""robust-sparse's figures: accuracy against γ with one line per one-shot sparsity, and accuracy against
sparsity per method. Drawn from ``results.json`` alone (the ``<kind>@s=<s>`` and ``<kind>@gamma=<γ>_vs_sparsity``
curves), so ``descentlab report`` redraws them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from descentlab.study.figures import panel_figure, plot_band

FIGURE = "figures/accuracy_vs_gamma_by_sparsity.png"
SPARSITY_FIGURE = "figures/accuracy_vs_sparsity_by_method.png"
SUFFIX = "_vs_sparsity"


def figures(results: dict[str, Any], run_dir: Path) -> list[dict[str, str]]:
    """One panel per method: accuracy against γ, one line per sparsity; then one panel per γ (0 and every
    γ >= 1): accuracy against the sparsity reached, one line per method."""
    methods = results.get("methods", {})
    kind = results["config"]["evaluation"]["kinds"][0]
    levels = results["config"]["pruning"]["sparsities"]
    if not methods:
        return []

    def by_sparsity(ax: Any, method: str) -> None:
        for s in levels:
            c = methods[method]["curves"][f"{kind}@s={s:g}"]
            plot_band(ax, c["x"], c["mean"], c["std"], label=f"s={s:g}")
        ax.set(title=method, xlabel="γ (embedding noise)", ylabel="accuracy")

    def by_method(ax: Any, key: str) -> None:
        for method, block in methods.items():
            c = block["curves"][key]
            plot_band(ax, c["x"], c["mean"], c["std"], label=method, alpha=0.12)
        title = key[len(f"{kind}@") : -len(SUFFIX)].replace("gamma", "γ")
        ax.set(title=title, xlabel="sparsity reached", ylabel="accuracy")

    first = next(iter(methods.values()))["curves"]
    keys = sorted(
        (k for k in first if k.startswith(f"{kind}@gamma=") and k.endswith(SUFFIX)),
        key=lambda k: float(k[len(f"{kind}@gamma=") : -len(SUFFIX)]),
    )
    return [
        *panel_figure(run_dir, FIGURE, list(methods), by_sparsity, sharey=True, legend="sparsity",
                      caption=f"Test accuracy against γ ({kind}), one line per one-shot sparsity; band = ± std"),
        *panel_figure(run_dir, SPARSITY_FIGURE, keys, by_method, sharey=True,
                      caption=f"Test accuracy against the sparsity reached, one panel per γ ({kind}), one line "
                      "per method; band = ± std"),
    ]  # fmt: skip
