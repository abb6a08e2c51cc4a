"""Typed results: the ``results.json`` shape every experiment writes, as dataclasses.

``Results.from_dict(d).to_dict() == d`` for every ``results.json`` an experiment writes: keys the types do
not name are kept in each level's ``extra`` and written back after the named ones, so experiments may add
keys (``per_seed``, ``summary``, ``layer_loss_std``...) without a change here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from descentlab.errors import ConfigError
from descentlab.report.claims import Claim, engine_rows


def _require(d: Mapping[str, Any], keys: tuple[str, ...], where: str) -> None:
    missing = [k for k in keys if k not in d]
    if missing:
        raise ConfigError(
            f"{where} lacks {missing}; results.json blocks need {list(keys)} (see descentlab.report.results)"
        )


@dataclass
class Curve:
    """A metric against one varied quantity (``gamma``, ``sparsity``...): mean and std over repeats.

    ``std`` is None when the experiment wrote none; ``extra`` holds any other keys (``per_seed``,
    ``per_model``, ``summary``...).
    """

    x_name: str
    x: list[Any]
    metric: str
    mean: list[float]
    std: list[float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS = ("x_name", "x", "metric", "mean", "std")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"x_name": self.x_name, "x": self.x, "metric": self.metric, "mean": self.mean}
        if self.std is not None:
            out["std"] = self.std
        return {**out, **self.extra}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Curve:
        _require(d, ("x_name", "x", "metric", "mean"), "a curve")
        return cls(
            x_name=d["x_name"],
            x=list(d["x"]),
            metric=d["metric"],
            mean=list(d["mean"]),
            std=None if d.get("std") is None else list(d["std"]),
            # an explicit "std": null stays in extra so that it is written back
            extra={k: v for k, v in d.items() if k not in cls._KEYS or (k == "std" and v is None)},
        )


@dataclass
class MethodResult:
    """One method's block: scalar metrics, curves by name, per-layer loss profiles, sparsity read back.

    ``layer_loss`` and ``sparsity`` are None when the experiment has none (they are then not written).
    """

    metrics: dict[str, Any] = field(default_factory=dict)
    curves: dict[str, Curve] = field(default_factory=dict)
    layer_loss: dict[str, list[float]] | None = None
    sparsity: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS = ("metrics", "curves", "layer_loss", "sparsity")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "metrics": self.metrics,
            "curves": {name: c.to_dict() for name, c in self.curves.items()},
        }
        if self.layer_loss is not None:
            out["layer_loss"] = self.layer_loss
        if self.sparsity is not None:
            out["sparsity"] = self.sparsity
        return {**out, **self.extra}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MethodResult:
        return cls(
            metrics=dict(d.get("metrics", {})),
            curves={name: Curve.from_dict(c) for name, c in d.get("curves", {}).items()},
            layer_loss=d.get("layer_loss"),
            sparsity=d.get("sparsity"),
            extra={k: v for k, v in d.items() if k not in cls._KEYS},
        )


@dataclass
class Results:
    """A run's ``results.json``.

    ``tables`` are ``{"title", "columns", "rows"}`` dicts, ``figures`` ``{"path", "caption"}`` dicts (paths
    relative to the run directory), ``notes`` strings, ``claims`` the judged rows of the claims engine
    (:func:`descentlab.report.claims.judge`); ``extra`` holds any other top-level key.
    """

    experiment: str
    config: dict[str, Any] = field(default_factory=dict)
    protocol: dict[str, Any] = field(default_factory=dict)
    methods: dict[str, MethodResult] = field(default_factory=dict)
    tables: list[dict[str, Any]] = field(default_factory=list)
    figures: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    _KEYS = ("experiment", "config", "protocol", "methods", "tables", "figures", "notes", "claims")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "experiment": self.experiment,
            "config": self.config,
            "protocol": self.protocol,
            "methods": {name: m.to_dict() for name, m in self.methods.items()},
            "tables": self.tables,
            "figures": self.figures,
            "notes": self.notes,
        }
        if self.claims:
            out["claims"] = [c.to_dict() for c in self.claims]
        return {**out, **self.extra}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Results:
        _require(d, ("experiment",), "results.json")
        claims = engine_rows(d.get("claims", []))
        return cls(
            experiment=d["experiment"],
            config=dict(d.get("config", {})),
            protocol=dict(d.get("protocol", {})),
            methods={name: MethodResult.from_dict(m) for name, m in d.get("methods", {}).items()},
            tables=list(d.get("tables", [])),
            figures=list(d.get("figures", [])),
            notes=list(d.get("notes", [])),
            claims=claims or [],
            # rows written before the claims engine stay as they were until the run is re-judged
            extra={k: v for k, v in d.items() if k not in cls._KEYS or (k == "claims" and claims is None)},
        )
