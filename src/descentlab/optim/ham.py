r"""HAM: a hyperbolic-entropy mirror step with the raw gradient after any optimizer's step.

After the wrapped optimizer's step, every mirrored tensor (ndim >= 2 by default) gets::

    w <- w * exp(clamp(eta * (-alpha * sign(w) * grad - beta), -c, c))

with the group's learning rate ``eta`` and the RAW gradient (HORST instead feeds the Adam update into the same
exponent). Defaults alpha = 200, beta = 1e-3, c = 5 follow the HAM paper's code (Jacobs et al., ICLR 2026).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
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


class HAM(Optimizer):
    """Wrap ``base_optimizer`` and follow each of its steps with the HAM mirror step.

    The wrapper shares ``param_groups`` and ``state`` with the base optimizer, so schedulers, Accelerate and
    checkpointing see one optimizer. Group keys added (``setdefault``, so per-group values win): ``alpha``,
    ``beta``, ``exp_clamp`` and ``mirror`` (``None`` = tensors with ndim >= 2). ``alpha`` and ``beta`` must be
    finite and >= 0, ``exp_clamp`` finite and > 0 or None (``ConfigError``, a ``ValueError``, at construction
    and before each step).

    Args:
        base_optimizer: any optimizer whose groups carry ``lr``.
        alpha: strength of the raw-gradient mirror step.
        beta: multiplicative decay exp(-lr * beta) per step of mirrored tensors.
        exp_clamp: clamp of the exponent (``None``: none).
        mirror: default of the ``mirror`` group key.
    """

    def __init__(
        self,
        base_optimizer: Optimizer,
        alpha: float = 200.0,
        beta: float = 1e-3,
        exp_clamp: float | None = 5.0,
        mirror: bool | None = None,
    ) -> None:
        if not isinstance(base_optimizer, Optimizer):
            raise ConfigError(f"HAM wraps a torch.optim.Optimizer, got {type(base_optimizer).__name__}")
        check_hyper("HAM", {"alpha": alpha, "beta": beta, "exp_clamp": exp_clamp})
        self.base_optimizer = base_optimizer
        defaults = {**base_optimizer.defaults, "alpha": alpha, "beta": beta, "exp_clamp": exp_clamp}
        defaults["mirror"] = mirror
        # Optimizer.__init__ appends the very same group dicts, so the base and HAM share them.
        super().__init__(base_optimizer.param_groups, defaults)
        self.state = base_optimizer.state

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        """Step the base optimizer (which evaluates ``closure``), then the mirror step."""
        for group in self.param_groups:  # before the base step: a bad value touches nothing
            check_hyper("HAM", {k: group[k] for k in ("alpha", "beta", "exp_clamp")}, tensors=False)
        loss = self.base_optimizer.step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                mirror = p.ndim >= 2 if group["mirror"] is None else bool(group["mirror"])
                if mirror and (group["alpha"] or group["beta"]):
                    p.copy_(
                        ham_mirror_step(
                            p,
                            p.grad,
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

    def __repr__(self) -> str:
        return f"HAM({self.base_optimizer!r})"


__all__ = ["HAM", "ham_mirror_step"]
