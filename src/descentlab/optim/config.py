r"""OptimizerConfig: the settings of AdamW, HORST or HAM and their learning-rate schedule, and their builders.

:func:`param_groups` is the one place that splits parameters into groups. Two explicit rules decide a
tensor's group keys:

- ``decay`` (weight decay): ``"all"`` gives every tensor ``weight_decay``; ``"matrices"`` gives it to tensors
  with ndim >= 2 only (biases, norm gains and other vectors get 0).
- ``mirror`` (HORST / HAM mirror step): ``"matrices"`` = tensors with ndim >= 2, ``"all"``, ``"none"``, or
  ``"prunable"`` = exactly the tensors the caller's ``mirror_filter(name, param)`` accepts (it is required;
  :func:`~descentlab.train.recipe.build_recipe` passes the weights AC/DC masks), every other tensor getting
  the plain AdamW step; with the other rules a ``mirror_filter`` restricts the rule's tensors further.

Groups are ordered decayed before non-decayed, mirrored before non-mirrored, and keep the model's tensor
order inside; empty groups are dropped. With the ``"matrices"`` mirror rule and no filter the group key is
``mirror=None``, which HORST and HAM resolve to ndim >= 2 themselves, so ``decay="all"`` gives one group: the
same optimizer (and state-dict layout) as ``HORST(model.parameters(), ...)``.

Schedules (k = scheduler steps taken, T = ``total_steps``, W = max(1, round(warmup_frac T))):

    constant        no scheduler
    cosine          torch's CosineAnnealingLR(T_max=T): lr_k = lr (1 + cos(pi k / T)) / 2
    warmup_cosine   lr_k = lr (k + 1) / W for k < W, then lr (1 + cos(pi min(1, (k - W) / max(1, T - W)))) / 2
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import CosineAnnealingLR, LambdaLR, LRScheduler

from descentlab.errors import ConfigError
from descentlab.optim.ham import HAM
from descentlab.optim.horst import HORST

NAMES = ("adamw", "horst", "ham")
BASES = ("adamw", "adam")
DECAY_RULES = ("matrices", "all")
MIRROR_RULES = ("matrices", "all", "none", "prunable")
SCHEDULES = ("constant", "cosine", "warmup_cosine")

Params = nn.Module | Iterable[Tensor] | Iterable[tuple[str, Tensor]]
MirrorFilter = Callable[[str, Tensor], bool]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class OptimizerConfig:
    """Settings of one optimizer and its learning-rate schedule; :func:`build_optimizer` builds it.

    Attributes:
        name: ``"adamw"`` (``torch.optim.AdamW``), ``"horst"`` (:class:`~descentlab.optim.horst.HORST`) or
            ``"ham"`` (:class:`~descentlab.optim.ham.HAM` around ``base``).
        lr: peak learning rate.
        betas: Adam's (beta1, beta2).
        eps: Adam's epsilon.
        weight_decay: decoupled weight decay of the tensors the ``decay`` rule selects (coupled L2 for
            ``base="adam"``).
        alpha: mirror-step strength (horst, ham); ``None``: the optimizer's default (HORST 1.0, HAM 200.0).
        beta: multiplicative decay of mirrored tensors (horst, ham); ``None``: default (HORST 0.0, HAM 1e-3).
        decay: ``"all"`` (every tensor, as ``AdamW(model.parameters())``) or ``"matrices"`` (ndim >= 2 only).
        mirror: which tensors get the mirror step (horst, ham): ``"matrices"`` (ndim >= 2), ``"all"``,
            ``"none"`` or ``"prunable"`` (only the weights AC/DC prunes, the block Linears of
            :func:`~descentlab.sparsity.select_prunable`; the rest get AdamW's step); ignored by adamw.
        base: the optimizer HAM wraps: ``"adamw"`` or ``"adam"`` (only with ``name="ham"``).
        fused: torch's ``fused`` flag of AdamW / Adam, and HORST's (``None``: the optimizer's default; for
            HORST ``true`` demands its fused kernel or compiled step for every tensor, ``false`` forbids them).
        stochastic_rounding: HORST only: round each step's fp32 result stochastically into bf16 / fp16
            parameters (unbiased, so updates below half an ulp are not lost; ``HORST``'s docstring).
        schedule: ``"constant"``, ``"cosine"`` or ``"warmup_cosine"`` (module docstring).
        warmup_frac: linear warm-up fraction of the steps, in [0, 1) (``warmup_cosine`` only).
    """

    name: str = "adamw"
    lr: float = 1e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 0.01
    alpha: float | None = None
    beta: float | None = None
    decay: str = "all"
    mirror: str = "matrices"
    base: str = "adamw"
    fused: bool | None = None
    stochastic_rounding: bool = False
    schedule: str = "constant"
    warmup_frac: float = 0.0

    def __post_init__(self) -> None:
        for key, choices in (
            ("name", NAMES),
            ("decay", DECAY_RULES),
            ("mirror", MIRROR_RULES),
            ("base", BASES),
            ("schedule", SCHEDULES),
        ):
            if getattr(self, key) not in choices:
                raise ConfigError(
                    f"optimizer.{key} must be one of {list(choices)}, got {getattr(self, key)!r}"
                )
        for key in ("lr", "eps", "weight_decay", "warmup_frac"):
            if not _is_number(getattr(self, key)) or getattr(self, key) < 0:
                raise ConfigError(f"optimizer.{key} must be a finite number >= 0, got {getattr(self, key)!r}")
        if self.lr == 0:
            raise ConfigError("optimizer.lr must be > 0, got 0; e.g. optimizer.lr=1e-3")
        betas = list(self.betas) if isinstance(self.betas, list | tuple) else None
        if betas is None or len(betas) != 2 or not all(_is_number(b) and 0.0 <= b < 1.0 for b in betas):
            raise ConfigError(
                f"optimizer.betas must be two numbers in [0, 1), got {self.betas!r}; e.g. [0.9, 0.999]"
            )
        self.betas = betas
        for key in ("alpha", "beta"):
            value = getattr(self, key)
            if value is None:
                continue
            if self.name == "adamw":
                raise ConfigError(f"optimizer.{key} applies to horst and ham only; drop it for adamw")
            if not _is_number(value) or value < 0:
                raise ConfigError(f"optimizer.{key} must be a finite number >= 0 or null, got {value!r}")
        if self.base != "adamw" and self.name != "ham":
            raise ConfigError(
                f"optimizer.base is the optimizer HAM wraps; set name=ham or drop base={self.base!r}"
            )
        if not isinstance(self.stochastic_rounding, bool):
            raise ConfigError(
                f"optimizer.stochastic_rounding must be true or false, got {self.stochastic_rounding!r}"
            )
        if self.stochastic_rounding and self.name != "horst":
            raise ConfigError(
                "optimizer.stochastic_rounding applies to horst only; drop it or set name=horst"
            )
        if self.fused is not None and not isinstance(self.fused, bool):
            raise ConfigError(f"optimizer.fused must be true, false or null, got {self.fused!r}")
        if not self.warmup_frac < 1.0:
            raise ConfigError(f"optimizer.warmup_frac must lie in [0, 1), got {self.warmup_frac}")
        if self.warmup_frac and self.schedule != "warmup_cosine":
            raise ConfigError(
                f"optimizer.warmup_frac applies to schedule=warmup_cosine only; schedule is {self.schedule!r}"
            )


def _named_params(params: Params) -> list[tuple[str, Tensor]]:
    if isinstance(params, nn.Module):
        named = list(params.named_parameters())
    elif isinstance(params, Tensor):
        raise ConfigError(
            "pass a model, an iterable of tensors or (name, tensor) pairs, e.g. [w], not a tensor"
        )
    else:
        named = []
        for i, item in enumerate(params):
            if isinstance(item, Tensor):
                named.append((str(i), item))
            elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], Tensor):
                named.append((str(item[0]), item[1]))
            else:
                raise ConfigError(
                    "param_groups builds the groups itself: pass a model, tensors or (name, tensor) pairs, "
                    f"got a {type(item).__name__}"
                )
    if not named:
        raise ConfigError("no parameters to optimize: the model or iterable is empty")
    return named


def _mirror_key(rule: str, name: str, param: Tensor, mirror_filter: MirrorFilter | None) -> bool | None:
    """The group ``mirror`` key of one tensor: True, False or None (ndim >= 2, resolved by the optimizer)."""
    if rule == "none":
        return False
    if rule == "prunable":
        if mirror_filter is None:
            raise ConfigError(
                "optimizer.mirror=prunable needs the prunable weights: pass mirror_filter (build_recipe "
                "passes the tensors AC/DC masks), or use mirror=matrices"
            )
        return bool(mirror_filter(name, param))
    if mirror_filter is None:
        return True if rule == "all" else None
    selected = param.ndim >= 2 if rule == "matrices" else True
    return selected and bool(mirror_filter(name, param))


def param_groups(
    model_or_named_params: Params, cfg: OptimizerConfig, mirror_filter: MirrorFilter | None = None
) -> list[dict[str, Any]]:
    """Split parameters into param groups by the config's decay and mirror rules (module docstring).

    Args:
        model_or_named_params: a model (its ``named_parameters()``), tensors (named ``"0"``, ``"1"``, ...) or
            ``(name, tensor)`` pairs.
        cfg: the optimizer config; ``decay`` and ``weight_decay`` set each group's ``weight_decay``; for horst
            and ham ``mirror`` sets each group's ``mirror`` key (adamw groups have none).
        mirror_filter: ``(name, param) -> bool``; only tensors it accepts (and the ``mirror`` rule
            selects) get the mirror step; required by the ``"prunable"`` rule. Ignored by adamw.

    Returns:
        Param groups ``{"params", "weight_decay"[, "mirror"]}``; every other hyper-parameter is the
        optimizer's default, set by :func:`build_optimizer`.
    """
    mirrors = cfg.name != "adamw"
    buckets: dict[tuple[bool, bool | None], list[Tensor]] = {}
    for name, param in _named_params(model_or_named_params):
        decays = cfg.decay == "all" or param.ndim >= 2
        mirror = _mirror_key(cfg.mirror, name, param, mirror_filter) if mirrors else None
        buckets.setdefault((decays, mirror), []).append(param)
    rank = {True: 0, None: 1, False: 2}
    groups = []
    for decays, mirror in sorted(buckets, key=lambda k: (not k[0], rank[k[1]])):
        group: dict[str, Any] = {
            "params": buckets[decays, mirror],
            "weight_decay": cfg.weight_decay if decays else 0.0,
        }
        if mirrors:
            group["mirror"] = mirror
        groups.append(group)
    return groups


def _adam(kind: str, groups: list[dict[str, Any]], cfg: OptimizerConfig) -> Optimizer:
    cls = torch.optim.AdamW if kind == "adamw" else torch.optim.Adam
    return cls(
        groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay, fused=cfg.fused
    )


def build_optimizer(
    cfg: OptimizerConfig, model_or_params: Params, mirror_filter: MirrorFilter | None = None
) -> Optimizer:
    """The optimizer ``cfg`` describes, over :func:`param_groups` of ``model_or_params``.

    Args:
        cfg: the config.
        model_or_params: a model, an iterable of tensors (e.g. ``[w]``) or ``(name, tensor)`` pairs.
        mirror_filter: see :func:`param_groups`.

    Returns:
        ``torch.optim.AdamW``, :class:`~descentlab.optim.horst.HORST` or
        :class:`~descentlab.optim.ham.HAM` (around ``torch.optim.AdamW`` / ``Adam``).
    """
    groups = param_groups(model_or_params, cfg, mirror_filter)
    if cfg.name == "adamw":
        return _adam("adamw", groups, cfg)
    # the defaults equal the groups' rule, so add_param_group later follows it too
    rule_default = {"matrices": None, "all": True, "none": False, "prunable": False}
    extra: dict[str, Any] = {"mirror": rule_default[cfg.mirror]}
    extra.update({key: getattr(cfg, key) for key in ("alpha", "beta") if getattr(cfg, key) is not None})
    if cfg.name == "horst":
        return HORST(
            groups,
            lr=cfg.lr,
            betas=tuple(cfg.betas),
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
            fused=cfg.fused,
            stochastic_rounding=cfg.stochastic_rounding,
            **extra,
        )
    return HAM(_adam(cfg.base, groups, cfg), **extra)


def warmup_cosine_factor(step: int, *, total_steps: int, warmup_steps: int) -> float:
    """The ``warmup_cosine`` lr factor after ``step`` scheduler steps (equation in the module docstring)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(cfg: OptimizerConfig, optimizer: Optimizer, total_steps: int) -> LRScheduler | None:
    """The config's learning-rate schedule over ``total_steps`` optimizer steps; ``None`` for ``constant``.

    Call ``scheduler.step()`` once after every ``optimizer.step()``.
    """
    if cfg.schedule == "constant":
        return None
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise ConfigError(f"build_scheduler needs total_steps >= 1 (an int), got {total_steps!r}")
    if cfg.schedule == "cosine":
        return CosineAnnealingLR(optimizer, T_max=total_steps)
    warm = max(1, round(cfg.warmup_frac * total_steps))
    return LambdaLR(optimizer, lambda k: warmup_cosine_factor(k, total_steps=total_steps, warmup_steps=warm))


def horst_param_groups(
    model: nn.Module,
    *,
    min_mirror_ndim: int = 2,
    no_mirror_weight_decay: float | None = None,
    verbose: bool = True,
    **options: Any,
) -> list[dict[str, Any]]:
    """Split a model's trainable parameters into a mirrored group (ndim >= ``min_mirror_ndim``) and the rest.

    Kept for existing callers; new code builds groups with :func:`descentlab.optim.config.param_groups`,
    whose decay and mirror rules are explicit.

    Args:
        model: the model whose ``named_parameters`` are grouped (frozen parameters are skipped).
        min_mirror_ndim: tensors with at least this many dimensions get the mirror step.
        no_mirror_weight_decay: weight decay of the non-mirrored group (biases, norms); ``None`` keeps the
            optimizer default.
        verbose: print one line per group with its tensor and parameter counts.
        **options: extra keys for both groups (e.g. ``alpha=10.0``).

    Returns:
        Param groups for :class:`HORST`, each with ``name``, ``mirror``, ``params`` and ``num_params``.
    """
    mirrored, plain = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (mirrored if p.ndim >= min_mirror_ndim else plain).append(p)
    groups = []
    for name, params, mirror in (("mirror", mirrored, True), ("no_mirror", plain, False)):
        group = {"name": name, "mirror": mirror, "params": params, **options}
        group["num_params"] = sum(p.numel() for p in params)
        if not mirror and no_mirror_weight_decay is not None:
            group["weight_decay"] = no_mirror_weight_decay
        groups.append(group)
        if verbose:
            print(f"HORST group {name!r}: {len(params)} tensors, {group['num_params']:,} parameters")
    return groups


__all__ = [
    "BASES",
    "DECAY_RULES",
    "MIRROR_RULES",
    "NAMES",
    "SCHEDULES",
    "OptimizerConfig",
    "build_optimizer",
    "build_scheduler",
    "horst_param_groups",
    "param_groups",
    "warmup_cosine_factor",
]
