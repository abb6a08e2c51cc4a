"""Hugging Face ``Trainer`` adapter: layer-wise descent constraints, our optimizers, sparsity controllers.

Swap ``Trainer`` for :class:`DescentTrainer`; nothing else in a Trainer script changes::

    trainer = DescentTrainer(
        model=model, args=args, train_dataset=train, eval_dataset=val,
        constraint=dl.LayerwiseDescent(num_layers=model.config.num_hidden_layers, alpha=0.05, dual_lr=1e-2),
        optimizer_cls_and_kwargs=(dl.HORST, {"lr": 3e-5, "alpha": 1.0}),      # optional: any optimizer
        sparsity=lambda model, opt: dl.ACDC(model, opt, sparsity=0.9,        # optional: a controller factory
                                            total_steps=args.max_steps),
    )
    trainer.train()                       # trainer.train(resume_from_checkpoint=True) resumes λ, u and masks

What the adapter does, and where:

* ``create_optimizer``: builds the optimizer as Trainer would (``optimizers=``, ``optimizer_cls_and_kwargs=``
  or ``args.optim``) and wraps it in :class:`~descentlab.constrained.primal_dual.PrimalDual` when a
  constraint is given, so Trainer's ``optimizer.pt`` carries λ and u and its scheduler sees the same groups.
* ``compute_loss`` (training only): ``dl.layer_losses`` then ``constraint.lagrangian``; evaluation keeps the
  model's own loss.
* evaluation (``trainer.evaluate()``, and every ``eval_strategy`` pass), when a constraint is given (or
  ``eval_layers=True``): the per-layer losses f_0..f_L of every eval batch, example-weighted over the whole
  eval set (summed over ranks), the violations ĝ_l = f_l - (1 - α_l) f_{l-1} (the constraint's own form),
  and for each constrained layer whether ĝ_l <= 0 holds on the eval set. The keys, with Trainer's prefix::

      eval_layer_loss/0 .. eval_layer_loss/L      f_l on the eval set (eval_layer_loss/L == eval_loss)
      eval_violation/1 .. eval_violation/L        ĝ_l on the eval set (<= 0: met)
      eval_constraint_met/l                       1.0 if constraint l (a constrained layer) holds, else 0.0
      eval_constraints_met                        the fraction of the constrained layers that hold

  An evaluation pass never moves λ. With ``prediction_loss_only`` (no ``compute_metrics``) the per-layer
  pass replaces the model's own forward (f_L *is* the model's loss), so evaluation costs no extra forward.
  Under several processes, give every rank the same number of eval examples (Accelerate pads an uneven
  last batch with repeated examples, which the per-layer sums would count).
* Trainer's own training ``log`` calls: with a constraint, Trainer's ``loss`` is the **Lagrangian**
  f_L + Σ_l λ_l ĝ_l (what was minimised), not the task loss. Beside it the adapter logs ``task_loss``, the
  mean of f_L (the model's own loss) over the training batches since the previous log line (averaged over
  ranks as Trainer averages ``loss``), ``descent/lambda_mean`` and ``descent/lambda_max`` (over the
  constrained layers), the last batch's per-layer f, ĝ, λ, u (``descent/f/l``, ``descent/g/l``,
  ``descent/lambda/l``, ``descent/u/l``) and the global sparsity (``sparsity/global``);
* the sparsity controller's masks go into each checkpoint folder as ``descentlab_sparsity.pt`` (tensors only,
  loaded with ``weights_only=True``) and come back on resume.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from transformers import Trainer, TrainerCallback

from descentlab.constrained.descent import descent_violations
from descentlab.constrained.primal_dual import PrimalDual
from descentlab.errors import ConfigError
from descentlab.train.protocols import MasksGradients, ReportsSparsity

SPARSITY_FILE = "descentlab_sparsity.pt"


class _SparsityHooks(TrainerCallback):
    """Mask gradients before, and re-zero pruned weights after, every optimizer step."""

    def __init__(self, trainer: DescentTrainer) -> None:
        self.trainer = trainer

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        controller = self.trainer.sparsity_controller
        if isinstance(controller, MasksGradients):
            controller.before_optimizer_step()

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.trainer.sparsity_controller is not None:
            self.trainer.sparsity_controller.step()


class DescentTrainer(Trainer):
    """A ``transformers.Trainer`` that trains with layer-wise descent constraints and sparsity controllers.

    Args:
        constraint: a ``LayerwiseDescent`` (None: plain ERM, e.g. to train with HORST or AC/DC only).
        readout: passed to ``dl.layer_losses`` (None: dispatch by model family).
        eval_layers: log the per-layer eval losses, violations and met constraints (None: when a constraint
            is given).
        sparsity: a factory ``(model, optimizer) -> controller`` (e.g. ``ACDC``), called once the optimizer
            exists; the controller needs ``step()``, ``state_dict()``, ``load_state_dict()`` and may have
            ``before_optimizer_step()`` and ``report()``.
        *args, **kwargs: everything ``Trainer`` takes.
    """

    # The Lagrangian is a per-batch mean: Trainer divides it by the gradient-accumulation steps.
    loss_is_scaled_for_ga = False

    def __init__(
        self,
        *args: Any,
        constraint: Any = None,
        readout: Any = None,
        eval_layers: bool | None = None,
        sparsity: Callable[[torch.nn.Module, torch.optim.Optimizer], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if sparsity is not None and not callable(sparsity):
            raise ConfigError(
                "sparsity must be a factory (model, optimizer) -> controller, e.g. lambda m, o: dl.ACDC(m, o)"
            )
        self.constraint = constraint
        self.readout = readout
        self.eval_layers = constraint is not None if eval_layers is None else bool(eval_layers)
        self._eval_sum: torch.Tensor | None = None  # Σ n_b f_b over the eval batches (float64 [L+1])
        self._eval_count = 0
        self._task_sum: torch.Tensor | None = None  # Σ f_L over the training batches since the last log line
        self._task_count = 0
        self._sparsity_factory = sparsity
        self.sparsity_controller: Any = None
        super().__init__(*args, **kwargs)
        if sparsity is not None:
            self.add_callback(_SparsityHooks(self))

    def create_optimizer(self, model: torch.nn.Module | None = None) -> torch.optim.Optimizer:
        optimizer = super().create_optimizer(model) if model is not None else super().create_optimizer()
        if self.constraint is not None and not isinstance(optimizer, PrimalDual):
            optimizer = PrimalDual(optimizer, self.constraint)
            self.optimizer = optimizer
        if self._sparsity_factory is not None and self.sparsity_controller is None:
            self.sparsity_controller = self._sparsity_factory(self.model, optimizer)
        return optimizer

    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        if self.constraint is None or not model.training:
            return super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
        from descentlab.readout import layer_losses

        f = layer_losses(model, inputs, readout=self.readout)
        loss = self.constraint.lagrangian(f)
        task = f[-1].detach().to(torch.float64)  # stays on the device: read once, when a log line is written
        self._task_sum = task if self._task_sum is None else self._task_sum + task
        self._task_count += 1
        return (loss, None) if return_outputs else loss

    def prediction_step(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        if not self.eval_layers:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
        from descentlab.readout import layer_losses

        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            f = layer_losses(model, inputs, readout=self.readout).detach()
        n = _batch_size(inputs)
        weighted = f.to(torch.float64) * n
        self._eval_sum = weighted if self._eval_sum is None else self._eval_sum + weighted
        self._eval_count += n
        if prediction_loss_only and self.label_smoother is None:
            return f[-1], None, None  # f_L is the model's own loss: no second forward
        return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)

    def evaluation_loop(self, *args: Any, **kwargs: Any) -> Any:
        self._eval_sum, self._eval_count = None, 0
        output = super().evaluation_loop(*args, **kwargs)
        if self.eval_layers:
            prefix = kwargs.get("metric_key_prefix", args[4] if len(args) > 4 else "eval")
            output.metrics.update(self._layer_metrics(prefix))
        return output

    def _layer_metrics(self, prefix: str) -> dict[str, float]:
        """Per-layer eval losses over all ranks, the violations and which constraints hold."""
        from descentlab.distributed import all_reduce_sum

        if self._eval_sum is None:
            return {}
        device = self._eval_sum.device
        totals = torch.cat([self._eval_sum, torch.tensor([float(self._eval_count)], device=device)])
        totals = all_reduce_sum(totals.to(self.args.device)).cpu()
        f = totals[:-1] / totals[-1]
        metrics = {f"{prefix}_layer_loss/{i}": float(v) for i, v in enumerate(f)}
        if self.constraint is None:
            return metrics
        g = descent_violations(f, self.constraint.alpha.cpu(), form=self.constraint.form)
        metrics.update({f"{prefix}_violation/{i + 1}": float(v) for i, v in enumerate(g)})
        constrained = torch.nonzero(self.constraint.mask.cpu()).flatten().tolist()
        met = {layer + 1: bool(g[layer] <= 0) for layer in constrained}
        metrics.update({f"{prefix}_constraint_met/{layer}": float(ok) for layer, ok in met.items()})
        if met:
            metrics[f"{prefix}_constraints_met"] = sum(met.values()) / len(met)
        return metrics

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if "loss" in logs:  # a training log line, not an evaluation one
            if self.constraint is not None:
                logs.update(self._task_logs())
                logs.update({f"descent/{k}": float(v) for k, v in self.constraint.log_dict().items()})
            controller = self.sparsity_controller
            if isinstance(controller, ReportsSparsity):
                logs["sparsity/global"] = float(controller.report().global_sparsity)
        super().log(logs, *args, **kwargs)

    def _task_logs(self) -> dict[str, float]:
        """``task_loss`` (mean f_L since the last log line, over all ranks) and a summary of λ.

        Trainer calls ``log`` with a ``loss`` on every rank (its own ``loss`` is gathered there too), so the
        one all-reduce here is matched on every rank.
        """
        from descentlab.distributed import all_reduce_sum

        out: dict[str, float] = {}
        lam = self.constraint.multipliers.detach()
        lam = lam[self.constraint.mask.to(lam.device)]  # the constrained layers (never empty)
        out["descent/lambda_mean"] = float(lam.mean())
        out["descent/lambda_max"] = float(lam.max())
        device = self.args.device
        count = torch.tensor(float(self._task_count), dtype=torch.float64, device=device)
        total = torch.zeros_like(count) if self._task_sum is None else self._task_sum.to(device)
        totals = all_reduce_sum(torch.stack([total, count])).cpu()
        self._task_sum, self._task_count = None, 0
        if totals[1] > 0:
            out["task_loss"] = float(totals[0] / totals[1])
        return out

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        super()._save_optimizer_and_scheduler(output_dir)
        if self.sparsity_controller is not None and self.args.should_save:
            tmp = os.path.join(output_dir, SPARSITY_FILE + ".tmp")
            torch.save(self.sparsity_controller.state_dict(), tmp)
            os.replace(tmp, os.path.join(output_dir, SPARSITY_FILE))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None or self.sparsity_controller is None:
            return
        path = os.path.join(checkpoint, SPARSITY_FILE)
        if os.path.isfile(path):
            self.sparsity_controller.load_state_dict(torch.load(path, weights_only=True, map_location="cpu"))


def _batch_size(inputs: dict[str, Any]) -> int:
    for key in ("labels", "input_ids", "pixel_values", "inputs_embeds"):
        value = inputs.get(key)
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    for value in inputs.values():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    raise ConfigError("an eval batch holds no tensor with a batch dimension")
