r"""HAM: a hyperbolic-entropy mirror step with the raw gradient after AdamW's (or any optimizer's) step.

After the wrapped optimizer's step, every mirrored tensor (ndim >= 2 by default) gets::

    w <- w * exp(clamp(eta * (-alpha * sign(w) * grad - beta), -c, c))

with the group's learning rate ``eta`` and the RAW gradient (HORST instead feeds the Adam update into the same
exponent). Defaults alpha = 200, beta = 1e-3, c = 5 follow the HAM paper's code (Jacobs et al., ICLR 2026).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from descentlab.errors import ConfigError
from descentlab.optim.functional import check_hyper, hyperbolic_mirror

_LOW_PRECISION = (torch.bfloat16, torch.float16)


def ham_mirror_step(
    param: Tensor, grad: Tensor, *, lr: float, alpha: float, beta: float, exp_clamp: float | None = 5.0
) -> Tensor:
    """The HAM mirror step of one tensor as a pure function (equation in the module docstring).

    It is :func:`~descentlab.optim.functional.hyperbolic_mirror` driven by the raw gradient, with strength
    ``lr * alpha``.

    Returns:
        The new parameter in ``param.dtype`` (computed in float32 for bf16 / fp16 inputs).
    """
    compute = torch.float32 if param.dtype in _LOW_PRECISION else param.dtype
    w = hyperbolic_mirror(
        param.to(compute), grad.to(compute), alpha=alpha * lr, lr_beta=lr * beta, clamp=exp_clamp
    )
    return w.to(param.dtype)


_BASES: dict[str, type[Optimizer]] = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam}
_HAM_KEYS = ("alpha", "beta", "exp_clamp", "mirror")


def _checked(group: dict[str, Any]) -> dict[str, Any]:
    """The keys of a group that :func:`check_hyper` checks: a base's ``betas`` only when it is a pair (an
    optimizer with three betas keeps its own rules)."""
    betas = group.get("betas")
    pair = isinstance(betas, list | tuple) and len(betas) == 2
    return {k: v for k, v in group.items() if k != "betas" or pair}


class HAM(Optimizer):
    r"""A base optimizer's step followed by the HAM mirror step (module docstring), in either of two forms.

    * ``HAM(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, alpha=200.0, beta=1e-3, ...)``:
      the constructor of HORST and of every ``torch.optim`` optimizer. The base is ``torch.optim.AdamW``
      (``base="adam"``: ``torch.optim.Adam``), built over ``params`` with ``lr``, ``betas``, ``eps``,
      ``weight_decay`` and AdamW's keywords ``maximize``, ``foreach``, ``fused``, ``capturable``,
      ``differentiable``; it validates them in torch's words.
    * ``HAM(optimizer, alpha=..., beta=..., exp_clamp=..., mirror=...)``: wrap an optimizer already built
      (any ``torch.optim`` optimizer whose groups carry ``lr``). The base's own keywords belong to it:
      passing one here raises ``ConfigError``.

    ``HAM(params, lr=lr, ...)`` and ``HAM(torch.optim.AdamW(params, lr=lr, ...), ...)`` are the same
    optimizer, step for step (tested). Either way the groups and state *are* the base's (the same list and
    dicts), so schedulers, Accelerate and checkpoints see one optimizer, and :meth:`add_param_group` adds to
    the base. Group keys added (``setdefault``, so per-group values win): ``alpha``, ``beta``, ``exp_clamp``
    and ``mirror`` (``None`` = tensors with ndim >= 2). ``alpha`` and ``beta`` must be finite and >= 0,
    ``exp_clamp`` finite and > 0 or None, and the base's ``lr``, ``eps``, ``weight_decay`` (finite, >= 0) and
    ``betas`` (in [0, 1)) where its groups have them (``ConfigError``, a ``ValueError``, at construction, in
    :meth:`add_param_group` and before each step). With the base's ``maximize=True`` the mirror step is
    driven by -g, so maximising f is minimising -f. ``differentiable=True`` is refused ("HAM does not
    support `differentiable`"); ``capturable`` and ``fused`` / ``foreach`` are the base's, with torch's rules.

    Args:
        params: parameters or param groups, or a built ``torch.optim.Optimizer`` (the wrapping form).
        lr, betas, eps, weight_decay: the base's (params form only; AdamW's defaults).
        alpha: strength of the raw-gradient mirror step.
        beta: multiplicative decay exp(-lr * beta) per step of mirrored tensors.
        exp_clamp: clamp of the exponent (``None``: none).
        mirror: default of the ``mirror`` group key.
        base: ``"adamw"`` or ``"adam"`` (params form only).
        **torch_kwargs: AdamW's keyword-only options (params form only): ``maximize``, ``foreach``, ``fused``,
            ``capturable``, ``differentiable``, ``amsgrad``.
    """

    def __init__(
        self,
        params: Optimizer | Iterable[Tensor] | Iterable[dict[str, Any]],
        lr: float | Tensor | None = None,
        betas: tuple[float, float] | None = None,
        eps: float | None = None,
        weight_decay: float | None = None,
        alpha: float = 200.0,
        beta: float = 1e-3,
        *,
        exp_clamp: float | None = 5.0,
        mirror: bool | None = None,
        base: str | None = None,
        **torch_kwargs: Any,
    ) -> None:
        check_hyper("HAM", {"alpha": alpha, "beta": beta, "exp_clamp": exp_clamp})
        own = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "base": base}
        if isinstance(params, Optimizer):
            given = sorted([k for k, v in own.items() if v is not None] + list(torch_kwargs))
            if given:
                raise ConfigError(
                    f"HAM(optimizer, ...) wraps a built optimizer, whose settings are its own: drop {given} "
                    "(or pass the parameters, HAM(params, lr=..., ...), to build AdamW here)"
                )
            base_optimizer = params
        elif isinstance(params, nn.Module):
            raise ConfigError(
                f"HAM takes parameters or a torch.optim.Optimizer, got a {type(params).__name__}; pass "
                "model.parameters()"
            )
        else:
            kind = "adamw" if base is None else base
            if kind not in _BASES:
                raise ConfigError(f"HAM: base must be one of {list(_BASES)}, got {kind!r}")
            adam_kwargs = {k: v for k, v in own.items() if k != "base" and v is not None}
            base_optimizer = _BASES[kind](params, **adam_kwargs, **torch_kwargs)
        self.base_optimizer = base_optimizer
        ham = {"alpha": alpha, "beta": beta, "exp_clamp": exp_clamp, "mirror": mirror}
        self._ham_defaults = ham
        # The base initialiser installs the hook dictionaries and the profiled step; HAM then adopts the
        # base's own group list, so a group added through either is stepped by both.
        self._adopting = True
        super().__init__(base_optimizer.param_groups, {**base_optimizer.defaults, **ham})
        self._adopting = False
        for group in base_optimizer.param_groups:
            self._add_ham_keys(group)
        self.param_groups = base_optimizer.param_groups
        self.state = base_optimizer.state

    def _add_ham_keys(self, group: dict[str, Any]) -> None:
        """HAM's keys, then the whole group checked: HAM's keys and the base's ``lr``, ``eps``,
        ``weight_decay``, ``betas`` (NaN never passes; torch checks its own at construction only)."""
        for key in _HAM_KEYS:
            group.setdefault(key, self._ham_defaults[key])
        check_hyper("HAM", _checked(group))
        if group.get("differentiable"):
            raise ConfigError(
                "HAM does not support `differentiable`: its mirror step writes the parameters in place under "
                "torch.no_grad (as torch's fused optimizers, which say \"`fused` does not support "
                '`differentiable`")'
            )

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group to the base optimizer (torch's checks and wording), with HAM's keys."""
        if self._adopting:
            return
        self.base_optimizer.add_param_group(param_group)
        self._add_ham_keys(self.base_optimizer.param_groups[-1])

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        """Step the base optimizer (which evaluates ``closure``), then the mirror step."""
        for group in self.param_groups:  # before the base step: a bad value touches nothing
            check_hyper("HAM", _checked(group), tensors=False)
        loss = self.base_optimizer.step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                mirror = p.ndim >= 2 if group["mirror"] is None else bool(group["mirror"])
                if mirror and (group["alpha"] or group["beta"]):
                    grad = -p.grad if group.get("maximize", False) else p.grad
                    p.copy_(
                        ham_mirror_step(
                            p,
                            grad,
                            lr=float(group["lr"]),
                            alpha=group["alpha"],
                            beta=group["beta"],
                            exp_clamp=group["exp_clamp"],
                        )
                    )
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.base_optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """The base optimizer's state dict; its groups carry HAM's keys too."""
        return self.base_optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load into the base optimizer and share its new groups and state again."""
        self.base_optimizer.load_state_dict(state_dict)
        self.param_groups = self.base_optimizer.param_groups
        self.state = self.base_optimizer.state
        for group in self.param_groups:  # a plain AdamW state dict: HAM's defaults
            self._add_ham_keys(group)

    def __repr__(self) -> str:
        return f"HAM({self.base_optimizer!r})"


__all__ = ["HAM", "ham_mirror_step"]
