"""regime-map: how the HORST and the constrained-learning effects move with model size.

Protocol. Every sweep point is an ordinary run of another study through the registry (``jobs.run_point``):
sparse-lm at each GPT-2 width, text-robustness at each encoder depth, all with the same evaluation seeds.
The map copies the cells its claims read out of each point's cell store into its own, under one design
record: ``nll/<adamw|horst>/<size>@<sparsity>`` ``[seeds, test blocks]`` and
``noisy/<erm|constrained>/L<depth>`` / ``clean/.../L<depth>`` ``[seeds, test reviews]`` (accuracy under
Gaussian embedding noise, the mean over γ >= 1 and the draws; clean: γ = 0). The parameter count of
each size is recorded in the design (``extra["params"]``): the trend's x is log10 of it.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from descentlab.experiments.regime_map.config import RegimeMapConfig, condition, design
from descentlab.experiments.regime_map.jobs import run_point
from descentlab.experiments.regime_map.report import method_curves, tables
from descentlab.study.cells import CellStore
from descentlab.train.rundir import RunDir


def run(cfg: RegimeMapConfig, run: RunDir) -> dict:
    # 1. the sweep points, smallest first; each resumes from its own job cache
    root = run.path / "points"
    horst = {
        size: run_point(root, f"horst-{size}", "sparse-lm", cfg.horst_preset, cfg.horst_overrides(size))
        for size in (cfg.horst_sizes if "horst" in cfg.parts else [])
    }
    text = {
        depth: run_point(
            root,
            f"constrained-L{depth}",
            "text-robustness",
            cfg.constrained_preset,
            cfg.constrained_overrides(depth),
        )
        for depth in (cfg.constrained_depths if "constrained" in cfg.parts else [])
    }

    # 2. the map's own cells, under its design record
    record = design(cfg)
    record.extra["params"] = {size: _params(root, f"horst-{size}") for size in horst}
    store = CellStore(record)
    for size, point in horst.items():
        for arm in ("adamw", "horst"):
            for p in [0.0, *cfg.sparsities]:
                store.put("nll", arm, condition("horst", size, p), point.get("nll", arm, p))
    for depth, point in text.items():
        gammas = np.asarray(point.design.extra["gammas"], dtype=np.float64)
        for arm in ("erm", "constrained"):
            correct = np.asarray(point.get("correct", arm, "gaussian"), dtype=np.float64)  # [s, draw, γ, e]
            store.put(
                "noisy", arm, condition("constrained", depth), correct[:, :, gammas >= 1].mean(axis=(1, 2))
            )
            store.put(
                "clean", arm, condition("constrained", depth), correct[:, :, gammas == 0].mean(axis=(1, 2))
            )
    store.save(run.path, writer=run.writer)

    # 3. the tables (trend, per-cell intervals, prediction); the figure is drawn from the saved cells
    return {
        "protocol": {
            "points": {"horst": list(horst), "constrained": [f"L{d}" for d in text]},
            "params": record.extra["params"],
            "seeds": list(cfg.seeds),
            "sub_studies": {
                "horst": f"sparse-lm --preset {cfg.horst_preset} {' '.join(cfg.horst_base)}",
                "constrained": f"text-robustness --preset {cfg.constrained_preset} {' '.join(cfg.constrained_base)}",
            },
        },
        "methods": method_curves(store),
        "tables": [t.to_dict() for t in tables(store)],
    }


def _params(root: Path, label: str) -> int:
    """The trained model's parameter count, from the point's protocol (``"..., 1,063,680 parameters"``)."""
    import json

    (path,) = [p for p in sorted((root / label).iterdir()) if (p / "results.json").is_file()][-1:]
    model = json.loads((path / "results.json").read_text())["protocol"]["model"]
    return int(re.search(r"([\d,]+) parameters", model).group(1).replace(",", ""))
