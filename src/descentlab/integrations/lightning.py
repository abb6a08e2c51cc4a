"""Lightning adapter: a ``LightningModule`` mixin that trains with layer-wise descent constraints.

Put :class:`DescentModule` before ``LightningModule`` in your module's bases, give the module a ``model`` and a
``constraint``, and wrap your optimizer in :class:`~descentlab.constrained.primal_dual.PrimalDual` in
``configure_optimizers``, as in a plain loop; the mixin supplies ``training_step``::

    import lightning as L

    class Classifier(DescentModule, L.LightningModule):     # pytorch_lightning.LightningModule works too
        def __init__(self):
            super().__init__()
            self.model = AutoModelForSequenceClassification.from_pretrained(...)
            self.constraint = dl.LayerwiseDescent(num_layers=self.model.config.num_hidden_layers,
                                                  alpha=0.05, dual_lr=1e-2)

        def configure_optimizers(self):
            optimizer = dl.PrimalDual(dl.HORST(self.parameters(), lr=3e-5, alpha=1.0), self.constraint)
            return optimizer          # or {"optimizer": optimizer, "lr_scheduler": a scheduler built on it}

    L.Trainer(max_steps=1000).fit(Classifier(), train_loader)   # ckpt_path=... resumes λ and u too

What the mixin does, and where:

* ``training_step``: f = :meth:`DescentModule.descent_losses` (``dl.layer_losses(self.model, batch,
  readout=self.readout)``; override it for another model or readout), returns
  ``constraint.lagrangian(f)`` = f_L + Σ_l λ_l ĝ_l. Lightning's automatic optimization back-propagates it and
  calls ``PrimalDual.step(closure)``: the wrapped optimizer's step runs the closure (forward, backward), takes
  the primal step, then the dual step moves λ, as in a plain loop. Gradient accumulation, clipping and
  schedulers are Lightning's own and need nothing here.
* ``on_before_optimizer_step`` (after backward and clipping, before the wrapped optimizer moves anything):
  :class:`PrimalDual`'s finiteness check of the gradients and of ĝ. Lightning always passes a closure, and
  ``PrimalDual`` skips its check when it gets one, so the mixin runs it here instead: a NaN/Inf raises
  ``NumericalError`` with the parameters, the optimizer state and λ untouched. Off when the ``PrimalDual`` was
  built with ``check_finite=False`` (the check is one host read-back per step, a device sync on GPU).
* ``on_fit_start``: checks that Lightning's optimizer is a ``PrimalDual`` around ``self.constraint``
  (``ConfigError`` otherwise: a plain optimizer would leave λ at 0 without a word).
* checkpoints: ``PrimalDual.state_dict()`` carries λ, u and the counters under ``"descent"``, so Lightning's
  own checkpoint (``optimizer_states``) holds them and ``fit(..., ckpt_path=...)`` restores them exactly.
* logging, through ``self.log`` at Lightning's own cadence (``log_every_n_steps``); every value is handed to
  Lightning as a device tensor, so the mixin adds no host read-back: Lightning reads them when it writes a
  log line, as it does its own metrics (rank 0's values, Lightning's default; λ is the same on every rank):

      task_loss                              f_L, the model's own loss (``task_loss_step`` and, averaged over
                                             the epoch, ``task_loss_epoch``)
      descent/lagrangian                     the loss that was minimised, f_L + Σ_l λ_l ĝ_l
      descent/lambda_mean, descent/lambda_max  over the constrained layers, after this step's dual step
      descent/f/l, descent/g/l               this batch's f_l (l = 0..L) and ĝ_l (l = 1..L)
      descent/lambda/l, descent/u/l          λ_l and the slack u_l (resilient constraints only) after this
                                             step's dual step

  ``descent_log_layers = False`` (a class or instance attribute) keeps only the first four keys.

Why a mixin and not a callback: the Lagrangian has to be the loss that ``training_step`` returns, since
Lightning back-propagates that and nothing else, and a callback cannot change it; the wrapped optimizer has to
be in place before Lightning restores a checkpoint's optimizer state, which happens right after
``configure_optimizers``, where the user builds it anyway. A plain mixin (not a ``LightningModule`` subclass)
works with both ``lightning.pytorch`` and ``pytorch_lightning`` and imports neither.

If you override ``training_step``, ``on_fit_start``, ``on_train_batch_end`` or ``on_before_optimizer_step``,
call ``super()``'s (or :meth:`DescentModule.descent_step` from your ``training_step``).

Under DDP (``strategy="ddp"``) Lightning calls ``training_step`` inside the DDP wrapper's forward, so the
per-layer readout's gradients synchronise, and ``PrimalDual`` averages ĝ over the ranks before every dual
step: all ranks hold the same λ.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

from descentlab.constrained.primal_dual import PrimalDual
from descentlab.errors import ConfigError


class DescentModule:
    """A ``LightningModule`` mixin: ``training_step`` returns the Lagrangian of the per-layer losses.

    Needs, on the module:
        constraint: a ``LayerwiseDescent`` (set it in ``__init__``).
        model: the network ``dl.layer_losses`` reads out (not needed when :meth:`descent_losses` is
            overridden).

    Optional attributes:
        readout: passed to ``dl.layer_losses`` (None: dispatch by model family; a callable
            ``fn(hidden_state, batch) -> loss`` for a custom model).
        descent_log_layers: log the per-layer f, ĝ, λ and u (default True); the summary keys are always logged.
    """

    readout: Any = None
    descent_log_layers: bool = True

    # -- the step ------------------------------------------------------------------------------------------
    def descent_losses(self, batch: Any) -> Tensor:
        """The L+1 per-layer losses f_0..f_L of ``batch`` (default: ``dl.layer_losses(self.model, batch)``)."""
        from descentlab.readout import layer_losses

        model = getattr(self, "model", None)
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(
                f"{type(self).__name__} has no `model` (an nn.Module) for dl.layer_losses: set self.model in "
                "__init__, or override descent_losses(self, batch) to return the L+1 per-layer losses"
            )
        return layer_losses(model, batch, readout=self.readout)

    def descent_step(self, batch: Any) -> Tensor:
        """Per-layer losses, then the Lagrangian (returned, for backward); logs f_L, f, ĝ and the Lagrangian."""
        constraint = self._descent_constraint()
        f = self.descent_losses(batch)
        loss = constraint.lagrangian(f)
        self._descent_log_batch(f, loss, constraint)
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self.descent_step(batch)

    # -- Lightning hooks -----------------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        constraint = self._descent_constraint()
        optimizers = [_unwrap(o) for o in self.trainer.optimizers]
        ours = [o for o in optimizers if isinstance(o, PrimalDual) and o.constraint is constraint]
        if not ours:
            names = [type(o).__name__ for o in optimizers] or ["none"]
            raise ConfigError(
                f"{type(self).__name__}.configure_optimizers returned {', '.join(names)}, not a PrimalDual around "
                "self.constraint: λ would stay at 0. Return dl.PrimalDual(your_optimizer, self.constraint)"
            )
        for optimizer in ours:
            # PrimalDual warns when step() comes before any lagrangian call; under Lightning the closure (and so
            # training_step) runs inside step(), after that check, so the mixin checks after the closure instead
            optimizer._warned_no_lagrangian = True
        self._descent_warned = False
        super().on_fit_start()  # type: ignore[misc]

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        inner = _unwrap(optimizer)
        if isinstance(inner, PrimalDual):
            if getattr(inner.constraint, "lagrangian_calls", None) == 0 and not getattr(
                self, "_descent_warned", False
            ):
                self._descent_warned = True
                warnings.warn(
                    "the optimizer step came but constraint.lagrangian(f) was never called: λ stays out of the "
                    "loss and the dual step has no ĝ. Return self.descent_step(batch) from training_step; this "
                    "warning is shown once",
                    RuntimeWarning,
                    stacklevel=2,
                )
            if inner.check_finite:
                inner._check_finite()  # Lightning hands PrimalDual a closure, which skips its own check
        super().on_before_optimizer_step(optimizer)  # type: ignore[misc]

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._descent_log_duals(self._descent_constraint())
        super().on_train_batch_end(outputs, batch, batch_idx)  # type: ignore[misc]

    # -- logging (device tensors only: Lightning reads them when it writes a log line) --------------------
    def _descent_constraint(self) -> Any:
        constraint = getattr(self, "constraint", None)
        if constraint is None or not callable(getattr(constraint, "lagrangian", None)):
            raise ConfigError(
                f"{type(self).__name__} has no `constraint`: set self.constraint = dl.LayerwiseDescent(...) in "
                "__init__"
            )
        return constraint

    def _descent_log_batch(self, f: Tensor, loss: Tensor, constraint: Any) -> None:
        f = f.detach()
        log = self.log  # type: ignore[attr-defined]
        log("task_loss", f[-1], on_step=True, on_epoch=True)
        log("descent/lagrangian", loss.detach(), on_step=True, on_epoch=False)
        if not self.descent_log_layers:
            return
        for layer in range(f.numel()):
            log(f"descent/f/{layer}", f[layer], on_step=True, on_epoch=False)
        g = constraint.violations
        if g is not None:
            for layer in range(g.numel()):
                log(f"descent/g/{layer + 1}", g[layer], on_step=True, on_epoch=False)

    def _descent_log_duals(self, constraint: Any) -> None:
        lam = constraint.multipliers.detach()
        index = getattr(self, "_descent_index", None)
        if index is None or index.device != lam.device:
            # nonzero on the CPU mask (no device sync), moved once to λ's device
            index = torch.nonzero(constraint.mask.cpu()).flatten().to(lam.device)
            self._descent_index = index
        constrained = lam.index_select(0, index)
        log = self.log  # type: ignore[attr-defined]
        log("descent/lambda_mean", constrained.mean(), on_step=True, on_epoch=False)
        log("descent/lambda_max", constrained.max(), on_step=True, on_epoch=False)
        if not self.descent_log_layers:
            return
        for layer in range(lam.numel()):
            log(f"descent/lambda/{layer + 1}", lam[layer], on_step=True, on_epoch=False)
        slacks = constraint.slacks
        if slacks is not None:
            for layer in range(slacks.numel()):
                log(f"descent/u/{layer + 1}", slacks[layer].detach(), on_step=True, on_epoch=False)


def _unwrap(optimizer: Any) -> Any:
    """The optimizer inside a ``LightningOptimizer`` (whose ``_optimizer`` it is), else the optimizer itself.

    Not ``.optimizer``: that is the optimizer ``PrimalDual`` wraps."""
    return getattr(optimizer, "_optimizer", optimizer)


__all__ = ["DescentModule"]
