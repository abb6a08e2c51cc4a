"""Training objectives: ``objective(model, batch) -> (loss, logs)``.

``logs`` is a :class:`~descentlab.logs.LazyLogs` mapping: its values stay on the device until read, so a
step whose logs nobody reads (the loop writes them every ``log_every`` steps) never syncs for them.

* :class:`ERM` minimises the model's final loss.
* :class:`Constrained` reads the loss out at every layer and minimises the Lagrangian of
  :class:`~descentlab.constrained.descent.LayerwiseDescent`,
  ``L(θ, λ) = f_L + Σ_l λ_l ĝ_l``; pair it with :class:`~descentlab.constrained.primal_dual.PrimalDual`,
  whose ``step()`` takes the dual step.

A readout that reads layers 0..L-1 on a token subsample (the causal-LM default in a training step) makes
f_0..f_{L-1} and every ĝ_l estimates; the logs then say so (``f_sampled/l``, ``g_sampled/l``, the standard
error ``g_se/l``, ``readout/sampled_k`` of ``readout/n`` targets; docs/constrained.md).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

from descentlab.errors import ModelError
from descentlab.logs import LazyLogs

LossFn = Callable[[torch.nn.Module, Mapping[str, Any]], torch.Tensor]


def model_loss(model: torch.nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
    """The loss a Hugging Face model computes itself when the batch carries ``labels``."""
    out = model(**batch)
    loss = getattr(out, "loss", None)
    if loss is None:
        raise ModelError(
            f"{type(model).__name__} returned no loss; put `labels` in the batch or pass ERM(loss_fn=...)"
        )
    return loss


def _readout_for(readout: Any, model: torch.nn.Module) -> Any:
    """The readout ``layer_losses`` would use, as an object whose ``last_estimate`` can be read after the
    call: None dispatches by family (the registered instance), anything else is passed on as it is."""
    from descentlab.readout import find_readout

    return find_readout(model) if readout is None else readout


def _own_readout(readout: Any) -> Any:
    """A built-in readout name becomes one instance for the objective's life, so the estimate it records is
    the one this objective's logs describe (``layer_losses`` would build a fresh one per call)."""
    from descentlab.readout import BUILTIN

    return BUILTIN[readout]() if isinstance(readout, str) and readout in BUILTIN else readout


def _sampled_labels(estimate: Any) -> dict[str, float]:
    """``readout/sampled_k`` and ``readout/n`` when the readout sampled (host ints, no device read)."""
    if estimate is None or not getattr(estimate, "sampled", False):
        return {}
    return {"readout/sampled_k": float(estimate.k), "readout/n": float(estimate.n)}


class ERM:
    """Empirical risk minimisation: the final-layer loss only."""

    def __init__(self, loss_fn: LossFn | None = None) -> None:
        self.loss_fn = loss_fn or model_loss

    def __call__(
        self, model: torch.nn.Module, batch: Mapping[str, Any]
    ) -> tuple[torch.Tensor, Mapping[str, float]]:
        loss = self.loss_fn(model, batch)
        return loss, LazyLogs({"loss": loss.detach()})


class Constrained:
    """Layer-wise descent constraints: loss = the Lagrangian of the per-layer losses.

    Args:
        constraint: a ``LayerwiseDescent``.
        readout: passed to ``dl.layer_losses`` (None: dispatch by model family).
    """

    def __init__(self, constraint: Any, readout: Any = None) -> None:
        self.constraint = constraint
        self.readout = _own_readout(readout)
        self._pending: Any = None
        lazy = getattr(constraint, "log_values", None)
        # a constraint whose log_values takes the readout's estimate labels sampled values itself
        # (LayerwiseDescent); for another one the objective adds the labels beside its plain keys
        self._labels_itself = callable(lazy) and "estimate" in inspect.signature(lazy).parameters

    def begin_step(self) -> None:
        """Called by ``fit`` before each optimizer step's micro-batches: remembers the dual step's pending ĝ."""
        state = getattr(self.constraint, "pending_state", None)
        self._pending = state() if callable(state) else None

    def skip_step(self) -> None:
        """Called by ``fit`` when the step is skipped (non-finite loss): the ĝ its micro-batches recorded is
        dropped, so the next dual step averages only the steps taken."""
        restore = getattr(self.constraint, "restore_pending_", None)
        if self._pending is not None and callable(restore):
            restore(self._pending)
        self._pending = None

    def __call__(
        self, model: torch.nn.Module, batch: Mapping[str, Any]
    ) -> tuple[torch.Tensor, Mapping[str, float]]:
        from descentlab.readout import layer_losses

        readout = _readout_for(self.readout, model)
        f = layer_losses(model, batch, readout=readout)
        estimate = getattr(readout, "last_estimate", None)
        # LayerwiseDescent takes the estimate: it sums ĝ's variances for the dual step, refuses a sampled ratio
        loss = (
            self.constraint.lagrangian(f, estimate=estimate)
            if self._labels_itself
            else self.constraint.lagrangian(f)
        )
        logs = LazyLogs({"loss": f[-1].detach(), "lagrangian": loss.detach()})
        lazy = getattr(self.constraint, "log_values", None)
        if self._labels_itself:
            logs.update(lazy(estimate=estimate))
        else:
            logs.update(lazy() if callable(lazy) else self.constraint.log_dict())
            logs.update(_sampled_labels(estimate))
        return loss, logs

    def end_epoch(self) -> None:
        """Forwarded to the constraint, for the once-per-epoch dual cadence."""
        hook = getattr(self.constraint, "end_epoch", None)
        if callable(hook):
            hook()


class DeepSupervision:
    """Deep supervision with fixed weights: the mean of the losses read out at layers 1..L.

    loss = (1/L) Σ_{l=1..L} f_l. The control for the constrained objective: every layer is pushed down,
    but with constant weights instead of multipliers.

    Args:
        readout: passed to ``dl.layer_losses`` (None: dispatch by model family).
    """

    def __init__(self, readout: Any = None) -> None:
        self.readout = _own_readout(readout)

    def __call__(
        self, model: torch.nn.Module, batch: Mapping[str, Any]
    ) -> tuple[torch.Tensor, Mapping[str, float]]:
        from descentlab.readout import layer_losses

        readout = _readout_for(self.readout, model)
        f = layer_losses(model, batch, readout=readout)
        loss = f[1:].mean()
        logs = LazyLogs({"loss": f[-1].detach(), "mean_layer_loss": loss.detach()})
        # mean_layer_loss averages sampled f_1..f_{L-1} when the readout sampled: say so
        logs.update(_sampled_labels(getattr(readout, "last_estimate", None)))
        return loss, logs


class EmbeddingNoise:
    """``inner`` evaluated on noisy input embeddings: the noise-trained positive control.

    Each call perturbs the model's input-embedding output with ``kind`` noise at level ``gamma`` (relative to
    σ_E, as at test time; :func:`descentlab.perturb_embeddings`), a fresh realisation per step: the noise seed
    is ``seed · 1_000_003 + call``, disjoint from the test noise (seed ``evaluation.noise_seed``, draws 0..).
    The call counter is checkpointed, so a resumed run draws the same noise.

    Args:
        inner: the objective trained on noisy inputs (e.g. :class:`ERM`).
        gamma: training noise level γ_train > 0.
        kind: noise kind (``gaussian`` by default).
        seed: base seed of the training noise.
    """

    def __init__(self, inner: Any, gamma: float, kind: str = "gaussian", seed: int = 0) -> None:
        if not gamma > 0:
            raise ModelError(f"training noise gamma must be > 0, got {gamma}")
        self.inner, self.gamma, self.kind, self.seed = inner, float(gamma), kind, int(seed)
        self.calls = 0

    def __call__(
        self, model: torch.nn.Module, batch: Mapping[str, Any]
    ) -> tuple[torch.Tensor, Mapping[str, float]]:
        from descentlab.perturbations.hooks import perturb_embeddings

        self.calls += 1
        noise_seed = 1 + self.seed * 1_000_003 + self.calls  # test noise uses small seeds with draw offsets
        with perturb_embeddings(model, self.kind, self.gamma, noise_seed):
            return self.inner(model, batch)

    def begin_step(self) -> None:
        hook = getattr(self.inner, "begin_step", None)
        if callable(hook):
            hook()

    def skip_step(self) -> None:
        hook = getattr(self.inner, "skip_step", None)
        if callable(hook):
            hook()

    def state_dict(self) -> dict[str, int]:
        return {"calls": self.calls}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.calls = int(state["calls"])

    def end_epoch(self) -> None:
        hook = getattr(self.inner, "end_epoch", None)
        if callable(hook):
            hook()
