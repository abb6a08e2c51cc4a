"""A method, written once: objective x optimizer x constraint x sparsity, turned into what ``fit`` takes.

Every experiment names its methods the same way: a :class:`MethodConfig` made of the components' own
configs (:class:`~descentlab.optim.config.OptimizerConfig`,
:class:`~descentlab.constrained.config.DescentConfig`, :class:`~descentlab.sparsity.config.ACDCConfig`),
optionally edited by one override string of dotted ``key=value`` pairs::

    base = MethodConfig(optimizer=OptimizerConfig(name="adamw", lr=5e-5))
    resilient = with_overrides(base, "objective=constrained constraint.resilient=true")
    recipe = build_recipe(resilient, model, total_steps=cfg.train.total_steps(len(train)))
    fit(model, train, cfg=cfg.train, **recipe.fit_kwargs())

Objectives (the loss the primal optimizer descends):

* ``erm``: the final-layer loss f_L;
* ``constrained``: the Lagrangian f_L + Σ_l λ_l ĝ_l of :class:`~descentlab.LayerwiseDescent`, its optimizer
  wrapped in :class:`~descentlab.PrimalDual` so that each step also takes the dual step;
* ``deep-supervision``: the fixed-weight mean (1/L) Σ_{l=1..L} f_l (the control with no multipliers).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from descentlab.constrained.config import DescentConfig
from descentlab.errors import ConfigError
from descentlab.optim.config import OptimizerConfig, build_optimizer, build_scheduler
from descentlab.sparsity.config import ACDCConfig
from descentlab.sparsity.masks import Selection, select_prunable
from descentlab.train.objectives import ERM, Constrained, DeepSupervision, LossFn

OBJECTIVES = ("erm", "constrained", "deep-supervision")


@dataclass
class MethodConfig:
    """One training method: what is minimised, by which optimizer, under which constraints and sparsity.

    ``constraint`` is used only by the ``constrained`` objective; AC/DC sparse training is off when ``acdc`` is None.
    """

    objective: str = "erm"
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    constraint: DescentConfig = field(default_factory=DescentConfig)
    acdc: ACDCConfig | None = None

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"objective must be one of {list(OBJECTIVES)}, got {self.objective!r}")

    @property
    def constrained(self) -> bool:
        return self.objective == "constrained"


def with_overrides(base: MethodConfig, spec: str) -> MethodConfig:
    """``base`` edited by ``spec``: space-separated dotted ``key=value`` pairs, typed by OmegaConf.

    Example: ``"objective=constrained constraint.resilient=true optimizer.name=horst optimizer.alpha=10"``.

    Raises:
        ConfigError: an unknown key or an ill-typed value, naming the spec.
    """
    if not spec.strip():
        return base
    try:
        merged = OmegaConf.merge(OmegaConf.structured(base), OmegaConf.from_dotlist(shlex.split(spec)))
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except (OmegaConfBaseException, ValueError) as exc:
        reason = str(exc).splitlines()[0]
        raise ConfigError(
            f"bad method spec {spec!r}: {reason}; use dotted MethodConfig keys such as objective=constrained, "
            "optimizer.lr=1e-4, constraint.alpha=0.05, acdc.sparsity=0.9"
        ) from None


def methods_from_specs(base: MethodConfig, specs: Mapping[str, str]) -> dict[str, MethodConfig]:
    """``{label: spec}`` -> ``{label: MethodConfig}``: every method of an experiment from one base."""
    return {label: with_overrides(base, spec) for label, spec in specs.items()}


# a method label names job cache files and checkpoint folders
METHOD_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def check_method_names(specs: Mapping[str, str], **named: Sequence[str]) -> None:
    """The labels of ``specs`` are file-name safe, and every list in ``named`` (``methods=[...]``,
    ``tune_alpha=[...]``) names only labels that ``specs`` defines; ``methods`` names at least one.

    Raises:
        ConfigError: naming the offending key and the defined labels.
    """
    bad = [label for label in specs if not METHOD_LABEL.fullmatch(label)]
    if bad:
        raise ConfigError(f"method labels {bad} must match {METHOD_LABEL.pattern}; e.g. horst-a10")
    if "methods" in named and not named["methods"]:
        raise ConfigError(f"methods must name at least one of the specs {sorted(specs)}")
    for key, names in named.items():
        unknown = sorted(set(names) - set(specs))
        if unknown:
            raise ConfigError(f"{key} names unknown methods {unknown}; the specs define {sorted(specs)}")


@dataclass
class Recipe:
    """What ``fit`` takes for one method, plus the pieces an experiment reads afterwards."""

    objective: Callable[[torch.nn.Module, Any], tuple[torch.Tensor, dict[str, float]]]
    optimizer: torch.optim.Optimizer
    scheduler: Any = None
    sparsity: Any = None  # an ACDC controller, or None
    constraint: Any = None  # the LayerwiseDescent of a constrained method, or None

    def fit_kwargs(self) -> dict[str, Any]:
        return {
            "objective": self.objective,
            "optimizer": self.optimizer,
            "scheduler": self.scheduler,
            "sparsity": self.sparsity,
        }


def build_recipe(
    method: MethodConfig,
    model: torch.nn.Module,
    *,
    total_steps: int,
    num_layers: int | None = None,
    loss_fn: LossFn | None = None,
    readout: Any = None,
    steps_per_epoch: int | None = None,
    mirror_filter: Callable[[str, torch.nn.Parameter], bool] | None = None,
) -> Recipe:
    """Build the objective, optimizer (and scheduler), constraint and AC/DC controller of ``method``.

    Args:
        method: the method.
        model: the model to train (its parameters go to the optimizer, its layers to the constraint).
        total_steps: the run's optimizer steps (``TrainConfig.total_steps(n)``), for schedules and AC/DC.
        num_layers: L, for the constraint; default ``model.config.num_hidden_layers`` or ``model.num_layers``.
        loss_fn: ``loss_fn(model, batch)`` of the ERM objective (default: the model's own loss).
        readout: per-layer readout for the constrained and deep-supervision objectives (None: by family).
        steps_per_epoch: converts AC/DC phases given in epochs into steps.
        mirror_filter: restricts HORST's mirror step to the parameters it accepts (``(name, param)``).
            With ``optimizer.mirror="prunable"`` and none given, it accepts exactly the weights AC/DC masks
            (``method.acdc.prune``; the block Linears for a dense run), dense runs included.
    """
    if method.optimizer.mirror == "prunable" and mirror_filter is None and method.optimizer.name != "adamw":
        mirror_filter = prunable_filter(model, method.acdc.selection() if method.acdc else None)
    optimizer = build_optimizer(method.optimizer, model, mirror_filter=mirror_filter)
    scheduler = build_scheduler(method.optimizer, optimizer, total_steps)
    constraint = None
    if method.objective == "erm":
        objective: Any = ERM(loss_fn)
    elif method.objective == "deep-supervision":
        objective = DeepSupervision(readout=readout)
    else:
        from descentlab.constrained.primal_dual import PrimalDual

        constraint = method.constraint.build(num_layers or _num_layers(model))
        optimizer = PrimalDual(optimizer, constraint)
        objective = Constrained(constraint, readout=readout)
    sparsity = None
    if method.acdc is not None:
        sparsity = method.acdc.build(
            model, optimizer, total_steps=total_steps, steps_per_epoch=steps_per_epoch
        )
    return Recipe(objective, optimizer, scheduler, sparsity, constraint)


def prunable_filter(
    model: torch.nn.Module, select: Selection | None = None
) -> Callable[[str, torch.nn.Parameter], bool]:
    """``(name, param) -> bool``: True for exactly the tensors AC/DC masks (``select_prunable(model, select)``,
    by default the Linear weights inside the transformer blocks), matched by identity, not by name."""
    ids = {id(t.param) for t in select_prunable(model, select)}
    return lambda _name, param: id(param) in ids


# a dual step every this many optimizer steps: never, within any budget
NEVER = 10**12


def build_frozen_recipe(
    method: MethodConfig, model: torch.nn.Module, lam: Sequence[float], **kwargs: Any
) -> Recipe:
    """:func:`build_recipe` of a constrained ``method`` with its multipliers held at ``lam``: no dual step at
    all (``dual_every`` beyond any budget, and η_λ = 0 for the epoch-end flush too). The frozen-λ control."""
    method = replace(method, constraint=replace(method.constraint, dual_every=NEVER))
    recipe = build_recipe(method, model, **kwargs)
    recipe.constraint.duals.lam = torch.tensor(list(lam), dtype=torch.float64)
    recipe.constraint.duals.lr = 0.0
    return recipe


def _num_layers(model: torch.nn.Module) -> int:
    config = getattr(model, "config", None)
    layers = getattr(config, "num_hidden_layers", None) or getattr(model, "num_layers", None)
    if not isinstance(layers, int):
        raise ConfigError(
            f"cannot tell how many layers {type(model).__name__} has; pass num_layers= to build_recipe"
        )
    return layers
