"""regime-map: how the HORST and the constrained-learning effects move with model size.

The map copies the cells its claims read out of each sweep point's cell store (``jobs.run_point``) into its
own, under one design record: ``nll/<adamw|horst>/<size>@<sparsity>`` ``[seeds, test blocks]`` and
``noisy/<erm|constrained>/L<depth>`` / ``clean/.../L<depth>`` ``[seeds, test reviews]`` (accuracy under
Gaussian embedding noise, the mean over γ >= 1 and the draws; clean: γ = 0). The parameter count of each
size, read from the point's job results, is recorded in the design (``extra["params"]``): the trend's x is
log10 of it.
"""

from __future__ import annotations

import numpy as np

from descentlab.experiments.regime_map.config import RegimeMapConfig, condition, design
from descentlab.experiments.regime_map.jobs import run_point, trained_params
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
    record.extra["params"] = {size: trained_params(path) for size, (path, _) in horst.items()}
    store = CellStore(record)
    for size, (_, point) in horst.items():
        for arm in ("adamw", "horst"):
            for p in [0.0, *cfg.sparsities]:
                store.put("nll", arm, condition("horst", size, p), point.get("nll", arm, p))
    for depth, (_, point) in text.items():
        gammas = np.asarray(point.design.extra["gammas"], dtype=np.float64)
        for arm in ("erm", "constrained"):
            correct = np.asarray(point.get("correct", arm, "gaussian"), dtype=np.float64)  # [s, draw, γ, e]
            for metric, kept in (("noisy", gammas >= 1), ("clean", gammas == 0)):
                store.put(metric, arm, condition("constrained", depth), correct[:, :, kept].mean(axis=(1, 2)))
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
