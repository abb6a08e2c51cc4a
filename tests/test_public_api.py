"""Every module imports and every public name resolves (catches names moved between modules)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import descentlab
from descentlab import experiments

MODULES = [m.name for m in pkgutil.walk_packages(descentlab.__path__, "descentlab.")]


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name: str) -> None:
    importlib.import_module(name)


def test_public_names_resolve_and_every_experiment_is_registered() -> None:
    for name in descentlab.__all__:
        assert getattr(descentlab, name) is not None
    assert set(experiments.available()) == set(experiments.REGISTRY)
    for name in experiments.REGISTRY:
        exp = experiments.get(name)
        assert {"quick", "full"} <= set(exp.presets), name
        assert callable(exp.run) and isinstance(exp.config_cls, type)
        if name != "smoke":  # a one-file smoke test of the pipeline, not a study
            assert hasattr(exp.module, "__path__"), f"{name} is not a study folder"
            assert exp.part("claims") is not None and exp.claims, f"{name} declares no CLAIMS"
