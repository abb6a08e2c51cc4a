"""Experiment registry: name -> module. Each module defines a config dataclass, ``PRESETS`` and ``run``.

Modules are imported on demand, so listing experiments costs nothing.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType

from descentlab.errors import ConfigError

REGISTRY: dict[str, str] = {
    "text-robustness": "descentlab.experiments.text_robustness",
    "video-denoising": "descentlab.experiments.video_denoising",
    "llm-robustness": "descentlab.experiments.llm_robustness",
    "sparse-vit": "descentlab.experiments.sparse_vit",
    "sparse-lm": "descentlab.experiments.sparse_lm",
    "implicit-bias": "descentlab.experiments.implicit_bias",
    "robust-sparse": "descentlab.experiments.robust_sparse",
    "smoke": "descentlab.experiments.smoke",
}

# The headline quick runs of both papers (`make demo`), and everything (`make reproduce`).
DEMO = ["text-robustness", "sparse-vit", "implicit-bias"]


@dataclass(frozen=True)
class Experiment:
    name: str
    module: ModuleType

    @property
    def config_cls(self) -> type:
        explicit = getattr(self.module, "CONFIG", None)
        if explicit is not None:
            return explicit
        classes = [
            v
            for v in vars(self.module).values()
            if isinstance(v, type)
            and dataclasses.is_dataclass(v)
            and v.__module__ == self.module.__name__
            and v.__name__.endswith("Config")
        ]
        if len(classes) != 1:
            raise RuntimeError(f"{self.module.__name__} must define CONFIG or exactly one *Config dataclass")
        return classes[0]

    @property
    def presets(self) -> dict[str, dict]:
        return dict(getattr(self.module, "PRESETS", {}))


def available() -> list[str]:
    """Names of the experiments whose module is installed."""
    return [name for name, module in REGISTRY.items() if importlib.util.find_spec(module) is not None]


def get(name: str) -> Experiment:
    if name not in REGISTRY or importlib.util.find_spec(REGISTRY[name]) is None:
        raise ConfigError(f"unknown experiment {name!r}; choose one of: {', '.join(available())}")
    return Experiment(name=name, module=importlib.import_module(REGISTRY[name]))
