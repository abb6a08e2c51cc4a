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
  ``descent/lambda/l``, ``descent/u/l``) and the global sparsity (``sparsity/global``). When the readout
  sampled (a causal LM's default in training), the estimates are labelled: ``descent/f_sampled/l``
  (l < L), ``descent/g_sampled/l``, ``descent/g_se/l``, ``descent/readout/sampled_k`` and ``/n``;
* the sparsity controller's masks go into each checkpoint folder as ``descentlab_sparsity.pt`` (tensors only,
  loaded with ``weights_only=True``) and come back on resume.
* gradient accumulation: the Lagrangian is a per-batch mean, so Trainer must divide it by the accumulation
  steps k. Trainer decides that from ``loss_is_scaled_for_ga`` (transformers >= 5.19, set False here) or,
  before, from the model not taking loss kwargs (``model_accepts_loss_kwargs``, set False here; so a
  constraint and ``compute_loss_func`` exclude each other). Older Trainers (< 4.50) followed other rules
  and are refused at construction. k micro-batches of B examples with the same number of targets equal
  one batch of k·B (each micro-batch's mean weighs 1/k, as Trainer weighs any model without loss kwargs).
* wrappers: the readout needs the model's structure, so it sees through ``torch.compile``'s
  ``OptimizedModule`` and a one-device ``nn.DataParallel``; ``DistributedDataParallel`` and FSDP2 stay (the
  readout runs inside their forward). A compiled model's backbone (``base_model``) forward runs through the
  same compiler settings (``OptimizedModule.dynamo_ctx``) during the readout, outside its structure probe.
  ``nn.DataParallel`` over several GPUs (Trainer's mode when one process sees several GPUs) is refused at
  construction: launch one process per GPU with ``torchrun`` instead.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import transformers
from packaging.version import Version
from torch import nn
from transformers import Trainer, TrainerCallback

from descentlab.constrained.descent import descent_violations
from descentlab.constrained.primal_dual import PrimalDual
from descentlab.errors import ConfigError
from descentlab.train.protocols import MasksGradients, ReportsSparsity

SPARSITY_FILE = "descentlab_sparsity.pt"

# From 4.50 Trainer divides a custom loss by the accumulation steps when the model takes no loss kwargs and
# there is no compute_loss_func (5.19 adds ``loss_is_scaled_for_ga``). 4.46-4.47 never divide it and
# 4.48-4.49 only when the batch has no labels, so there the gradients would be k times too large.
MIN_TRANSFORMERS = "4.50"

_MISSING = object()


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
        eval_layers: which layers evaluation reads: ``"all"`` (or True) every layer, with every per-layer
            loss, violation and met constraint; ``"final"`` what ERM's evaluation reads plus the final
            constraint's check (a causal LM's readout then takes two head passes, not L+1); False none (the
            model's own evaluation). None: ``"final"`` when a constraint is given, else False.
        sparsity: a factory ``(model, optimizer) -> controller`` (e.g. ``ACDC``), called once the optimizer
            exists; the controller needs ``step()``, ``state_dict()``, ``load_state_dict()`` and may have
            ``before_optimizer_step()`` and ``report()``.
        *args, **kwargs: everything ``Trainer`` takes.
    """

    def __init__(
        self,
        *args: Any,
        constraint: Any = None,
        readout: Any = None,
        eval_layers: bool | str | None = None,
        sparsity: Callable[[torch.nn.Module, torch.optim.Optimizer], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if Version(transformers.__version__) < Version(MIN_TRANSFORMERS):
            raise ConfigError(
                f"DescentTrainer needs transformers >= {MIN_TRANSFORMERS} (installed: {transformers.__version__}): "
                "older Trainers scale a custom loss for gradient accumulation by other rules, and the "
                f"gradients would come out k times too large; pip install 'transformers>={MIN_TRANSFORMERS}'"
            )
        if sparsity is not None and not callable(sparsity):
            raise ConfigError(
                "sparsity must be a factory (model, optimizer) -> controller, e.g. lambda m, o: dl.ACDC(m, o)"
            )
        from descentlab.readout import BUILTIN

        self.constraint = constraint
        # a built-in name becomes one instance, so its last estimate (sampled or exact) can label the logs
        self.readout = BUILTIN[readout]() if isinstance(readout, str) and readout in BUILTIN else readout
        self._train_estimate: Any = None  # what the readout of the last training batch read
        self._estimate: Any = None  # what the readout of the last batch (training or eval) read
        if eval_layers is None:
            eval_layers = "final" if constraint is not None else False
        if eval_layers is True:
            eval_layers = "all"
        if eval_layers not in (False, "all", "final"):
            raise ConfigError(f"eval_layers must be 'all', 'final', True, False or None, got {eval_layers!r}")
        self.eval_layers: str | bool = eval_layers
        self._eval_sum: torch.Tensor | None = None  # Σ n_b f_b over the eval batches (float64 [L+1])
        self._eval_count = 0
        self._task_sum: torch.Tensor | None = None  # Σ f_L over the training batches since the last log line
        self._task_count = 0
        self._sparsity_factory = sparsity
        self.sparsity_controller: Any = None
        super().__init__(*args, **kwargs)
        if constraint is not None:
            self._loss_is_a_batch_mean()
        if (constraint is not None or self.eval_layers) and self.args.n_gpu > 1:
            raise ConfigError(_data_parallel_message(self.args.n_gpu))
        if sparsity is not None:
            self.add_callback(_SparsityHooks(self))

    def _loss_is_a_batch_mean(self) -> None:
        """Make Trainer divide the Lagrangian (a per-batch mean) by the gradient-accumulation steps.

        Only with a constraint: without one, the model's own loss goes through Trainer's own rule (a causal
        LM normalises by the accumulated token count itself and must not be divided again).
        """
        if self.compute_loss_func is not None:
            raise ConfigError(
                "compute_loss_func is not used with a constraint (the loss is the Lagrangian of the per-layer "
                "losses); drop it, or give a readout (readout=fn) for a custom per-layer loss"
            )
        if hasattr(Trainer, "loss_is_scaled_for_ga"):  # transformers >= 5.19 asks
            self.loss_is_scaled_for_ga = False
        else:  # 4.50-5.18: a loss from a model without loss kwargs is divided by the accumulation steps
            self.model_accepts_loss_kwargs = False

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
        f = self._layer_losses(model, inputs)
        self._train_estimate = self._estimate
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
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            f = self._layer_losses(model, inputs, layers=str(self.eval_layers)).detach()
        n = _batch_size(inputs)
        weighted = f.to(torch.float64) * n
        self._eval_sum = weighted if self._eval_sum is None else self._eval_sum + weighted
        self._eval_count += n
        if prediction_loss_only and self.label_smoother is None:
            return f[-1], None, None  # f_L is the model's own loss: no second forward
        return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)

    def _layer_losses(self, model: nn.Module, inputs: dict[str, Any], layers: str = "all") -> torch.Tensor:
        """``dl.layer_losses`` on the model inside Trainer's wrappers (see :func:`_readout_model`); what its
        readout read is left in ``self._estimate``. ``layers="final"``: the layers not read are NaN."""
        from descentlab.readout import find_readout, layer_losses

        target, compiler = _readout_model(model)
        inner = target.module if isinstance(target, nn.parallel.DistributedDataParallel) else target
        readout = find_readout(inner) if self.readout is None else self.readout
        with _compiled_backbone(target, compiler):
            f = layer_losses(target, inputs, readout=readout, layers=layers)
        self._estimate = getattr(readout, "last_estimate", None)
        return f

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
        f = totals[:-1] / totals[-1]  # NaN where eval_layers="final" did not read the layer
        metrics = {f"{prefix}_layer_loss/{i}": float(v) for i, v in enumerate(f) if torch.isfinite(v)}
        if self.constraint is None:
            return metrics
        g = descent_violations(f, self.constraint.alpha.cpu(), form=self.constraint.form)
        metrics.update(
            {f"{prefix}_violation/{i + 1}": float(v) for i, v in enumerate(g) if torch.isfinite(v)}
        )
        constrained = torch.nonzero(self.constraint.mask.cpu()).flatten().tolist()
        met = {layer + 1: bool(g[layer] <= 0) for layer in constrained if torch.isfinite(g[layer])}
        metrics.update({f"{prefix}_constraint_met/{layer}": float(ok) for layer, ok in met.items()})
        if met:
            metrics[f"{prefix}_constraints_met"] = sum(met.values()) / len(met)
        return metrics

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if "loss" in logs:  # a training log line, not an evaluation one
            if self.constraint is not None:
                logs.update(self._task_logs())
                values = self.constraint.log_dict(estimate=self._train_estimate)
                logs.update({f"descent/{k}": float(v) for k, v in values.items()})
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


def _data_parallel_message(devices: int) -> str:
    return (
        f"the per-layer readout does not run under nn.DataParallel over {devices} GPUs (Trainer's mode when one "
        "process sees several GPUs): it calls the model's sub-modules, which DataParallel neither scatters "
        f"nor replicates. Start one process per GPU instead: torchrun --nproc_per_node={devices} train.py "
        "(DistributedDataParallel, which the readout supports), or expose one GPU (CUDA_VISIBLE_DEVICES=0)"
    )


def _is_compiled(model: nn.Module) -> bool:
    """Whether ``model`` is the ``OptimizedModule`` that ``torch.compile(model)`` returns."""
    dynamo = getattr(torch, "_dynamo", None)
    return dynamo is not None and isinstance(model, dynamo.eval_frame.OptimizedModule)


def _readout_model(model: nn.Module) -> tuple[nn.Module, Callable[[Callable[..., Any]], Any] | None]:
    """The module the readout reads, and the compiler of a ``torch.compile``-d model (None otherwise).

    Strips, outside in, ``OptimizedModule`` (``torch.compile``) and an ``nn.DataParallel`` over at most one
    device (which only calls its module), down to the model itself or to a ``DistributedDataParallel``
    wrapper, which stays: the readout runs inside its forward so the gradients synchronise. The compiler is
    the outermost ``OptimizedModule``'s ``dynamo_ctx``: ``dynamo_ctx(fn)`` compiles ``fn`` with that
    ``torch.compile`` call's backend, mode and options.

    Raises:
        ConfigError: ``nn.DataParallel`` over several devices (use torchrun), or a compiled module inside
            ``DistributedDataParallel`` (compile the wrapper, as Trainer and Accelerate do).
    """
    compiler = None
    while True:
        if isinstance(model, nn.DataParallel):
            if len(model.device_ids) > 1:
                raise ConfigError(_data_parallel_message(len(model.device_ids)))
            model = model.module
        elif _is_compiled(model):
            compiler = compiler or model.dynamo_ctx
            model = model._orig_mod
        else:
            break
    inner = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    if isinstance(inner, nn.DataParallel) or _is_compiled(inner):
        raise ConfigError(
            f"a {type(inner).__name__} inside DistributedDataParallel: the readout needs the model itself "
            "there; compile the DDP wrapper instead (torch.compile(DDP(model)), as Trainer and Accelerate do)"
        )
    return model, compiler


_COMPILED_FORWARDS: weakref.WeakKeyDictionary[nn.Module, tuple[Any, Callable[..., Any]]] = (
    weakref.WeakKeyDictionary()
)


@contextlib.contextmanager
def _compiled_backbone(
    model: nn.Module, compiler: Callable[[Callable[..., Any]], Any] | None
) -> Iterator[None]:
    """While the readout runs, the backbone's forward (the whole model's, without a ``base_model``) is
    compiled by ``compiler``, so a ``torch.compile``-d model keeps its compiled forward in training.

    The readout calls the backbone rather than the model, which would otherwise bypass the compiled wrapper.
    Its structure probe (one small row under ``no_grad``, with recording hooks) stays eager. The instance
    attribute ``forward`` is swapped and restored, as ``run_in_forward`` does; the compiled callable is kept
    per module, and dynamo's cache keeps the graphs across steps.
    """
    if compiler is None:
        yield
        return
    from descentlab.readout.structure import in_probe

    structure = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    base = getattr(structure, "base_model", None)
    target = base if isinstance(base, nn.Module) and base is not structure else structure
    saved = target.__dict__.get("forward", _MISSING)
    eager = saved if saved is not _MISSING else type(target).forward.__get__(target)
    cached = _COMPILED_FORWARDS.get(target)
    if cached is None or cached[0] is not compiler:
        cached = (compiler, compiler(eager))
        _COMPILED_FORWARDS[target] = cached
    compiled = cached[1]

    def forward(*args: Any, **kwargs: Any) -> Any:
        return eager(*args, **kwargs) if in_probe() else compiled(*args, **kwargs)

    target.forward = forward
    try:
        yield
    finally:
        if saved is _MISSING:
            del target.forward
        else:
            target.forward = saved


def _batch_size(inputs: dict[str, Any]) -> int:
    for key in ("labels", "input_ids", "pixel_values", "inputs_embeds"):
        value = inputs.get(key)
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    for value in inputs.values():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    raise ConfigError("an eval batch holds no tensor with a batch dimension")


# -- callbacks: any Trainer subclass (TRL's SFTTrainer, Seq2SeqTrainer, yours) --------------------------------
def primal_dual_optimizer(
    constraint: Any, optimizer_cls: type[torch.optim.Optimizer] = torch.optim.AdamW, **optimizer_kwargs: Any
) -> tuple[type[PrimalDual], dict[str, Any]]:
    """``optimizer_cls_and_kwargs`` for any ``Trainer``: ``optimizer_cls(params, **kwargs)`` wrapped in
    :class:`~descentlab.constrained.PrimalDual` around ``constraint``, so Trainer's ``optimizer.pt`` carries the
    multipliers and its scheduler sees the wrapped optimizer's groups::

        trainer = SFTTrainer(..., callbacks=[ConstraintCallback(cs, values=fn)],
                             optimizer_cls_and_kwargs=primal_dual_optimizer(cs, torch.optim.AdamW, lr=1e-4))
    """

    class BoundPrimalDual(PrimalDual):  # a class, as Trainer calls optimizer_cls(params, **kwargs)
        def __init__(self, params: Any, **kwargs: Any) -> None:
            super().__init__(optimizer_cls(params, **kwargs), constraint)

    BoundPrimalDual.__name__ = BoundPrimalDual.__qualname__ = f"PrimalDual_{optimizer_cls.__name__}"
    return BoundPrimalDual, dict(optimizer_kwargs)


class ConstraintCallback(TrainerCallback):
    """Train any ``Trainer`` (or subclass) on a Lagrangian, through a forward hook on the model.

    In training (module in train mode, gradients on) the hook replaces the model output's ``loss`` by

        LayerwiseDescent:  f_L + Σ_l λ_l ĝ_l             with f = ``dl.layer_losses(model, batch, readout)``
        ConstraintSet:     loss + Σ_c ψ_c(values(model, batch, outputs))     (any formulation)

    so Trainer's (and TRL's) own ``compute_loss`` back-propagates the Lagrangian. Evaluation and
    ``no_grad`` passes keep the model's loss and never move λ. The optimizer must be a ``PrimalDual`` around the
    same constraint: pass ``optimizer_cls_and_kwargs=primal_dual_optimizer(constraint, ...)``
    (checked at ``on_train_begin``).

    Gradient accumulation: when Trainer hands the model ``num_items_in_batch`` it does not divide the loss by
    the accumulation steps k (the model normalises by the accumulated token count itself), so the hook brings
    the Lagrangian to the same normalisation: the descent Lagrangian is scaled by loss / f_L (the micro-batch's
    share of the accumulated targets), and the constraint terms of a ConstraintSet by 1/k. Otherwise Trainer
    divides the whole loss by k, as for any model. The dual step averages the violations of the k micro-batches.

    Logs: on every training log line (``on_log``, the ``logs`` dict that has Trainer's ``loss``) the callback
    adds the multipliers, the last violations and the slacks, read once when the line is written:

        ConstraintSet:     constraints/lambda/name/i, constraints/g/name/i, constraints/u/name/i
                           (an indexed constraint: constraints/lambda/name/mean and /max)
        LayerwiseDescent:  descent/lambda_mean, descent/lambda_max (over the constrained layers),
                           descent/lambda/l, descent/u/l, and the last batch's descent/f/l, descent/g/l;
                           when the readout sampled (a causal LM's default ``sample_tokens="auto"``), the
                           estimates say so: descent/f_sampled/l (l < L), descent/g_sampled/l, their standard
                           errors descent/g_se/l, and descent/readout/sampled_k of descent/readout/n targets.

    They go into ``trainer.state.log_history`` and reach every callback after this one (the printer, yours).
    Trainer puts the ``report_to`` integrations (TensorBoard, W&B, ...) ahead of the callbacks it is given,
    so they see these keys only once :func:`log_before_reporters` has moved this callback ahead of them.

    Args:
        constraint: a ``LayerwiseDescent`` or a ``ConstraintSet``.
        values: for a ConstraintSet, ``fn(model, batch, outputs) -> {name: tensor or ConstraintValue}``.
        readout: for a LayerwiseDescent, passed to ``dl.layer_losses`` (a built-in name becomes one instance
            for the callback's life, so its last estimate can label the logs). The readout runs its own
            forward, so a training step costs one extra forward beside the model's (use ``DescentTrainer`` to
            avoid it).
    """

    def __init__(
        self,
        constraint: Any,
        values: Callable[[nn.Module, dict[str, Any], Any], dict[str, Any]] | None = None,
        readout: Any = None,
    ) -> None:
        from descentlab.constrained.problem import ConstraintSet

        self.constraint = constraint
        self.is_set = isinstance(constraint, ConstraintSet)
        if self.is_set and values is None:
            raise ConfigError("a ConstraintSet needs values=fn(model, batch, outputs) -> {name: tensor}")
        self.values = values
        from descentlab.readout import BUILTIN

        self.readout = BUILTIN[readout]() if isinstance(readout, str) and readout in BUILTIN else readout
        self._estimate: Any = None  # what the readout of the last training batch read (sampled or exact)
        self._handle: Any = None
        self._inside = False
        self._accumulation = 1

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        optimizer = kwargs.get("optimizer")
        if optimizer is not None and not (
            isinstance(optimizer, PrimalDual) and optimizer.constraint is self.constraint
        ):
            inner = getattr(optimizer, "optimizer", None)  # Accelerate's AcceleratedOptimizer
            if not (isinstance(inner, PrimalDual) and inner.constraint is self.constraint):
                raise ConfigError(
                    f"ConstraintCallback needs a PrimalDual around its constraint, Trainer built "
                    f"{type(optimizer).__name__}: pass optimizer_cls_and_kwargs=primal_dual_optimizer(constraint, ...)"
                )
        self._accumulation = int(args.gradient_accumulation_steps)
        target, _ = _readout_model(model)
        if self._handle is None:
            self._handle = target.register_forward_hook(self._hook, with_kwargs=True)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def loss_func(self, outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None) -> torch.Tensor:
        """A ``compute_loss_func`` for trainers that compute their own loss (TRL's ``SFTTrainer`` computes it
        from fused log-probabilities, so the model output has no ``loss`` for the hook to replace).

        The loss is the causal-LM token cross-entropy of ``outputs.logits`` against the shifted ``labels``
        (-100 ignored; divided by ``num_items_in_batch`` when Trainer gives it, else a per-token mean), plus the
        constraint terms of ``values(None, {"labels": labels}, outputs)``, where ``outputs["loss"]`` is set to
        the micro-batch's per-token mean cross-entropy. Trainer divides by nothing when a ``compute_loss_func`` is set, so the terms (and, without
        ``num_items_in_batch``, the whole loss) are divided by the accumulation steps here. ConstraintSet only.
        """
        if not self.is_set:
            raise ConfigError(
                "loss_func serves a ConstraintSet; a LayerwiseDescent needs the model (use the hook)"
            )
        logits = outputs["logits"][:, :-1].float()
        target = labels[:, 1:].to(logits.device)
        total = nn.functional.cross_entropy(
            logits.flatten(0, 1), target.flatten(), ignore_index=-100, reduction="sum"
        )
        mean = total / (target != -100).sum().clamp_min(1)  # this micro-batch's per-token mean
        outputs["loss"] = mean  # what values() sees
        values = self.values(None, {"labels": labels}, outputs)
        loss = (
            mean
            if num_items_in_batch is None
            else total / torch.as_tensor(num_items_in_batch, device=total.device)
        )
        terms = self.constraint.lagrangian(torch.zeros_like(loss), values, record=loss.requires_grad)
        if num_items_in_batch is None:
            return (loss + terms) / self._accumulation
        return loss + terms / self._accumulation

    def _hook(self, module: nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> Any:
        if self._inside or not module.training or not torch.is_grad_enabled():
            return None
        loss = output.get("loss") if hasattr(output, "get") else None
        if loss is None:
            return None  # no labels: nothing to constrain (e.g. a forward for logits only)
        batch = dict(kwargs)
        if args:
            batch.setdefault("input_ids", args[0])
        scaled = "num_items_in_batch" in kwargs
        self._inside = True
        try:
            if self.is_set:
                values = self.values(module, batch, output)
                terms = self.constraint.lagrangian(torch.zeros_like(loss), values, record=True)
                output["loss"] = loss + (terms / self._accumulation if scaled else terms)
            else:
                from descentlab.readout import find_readout, layer_losses

                batch.pop("num_items_in_batch", None)
                readout = find_readout(module) if self.readout is None else self.readout
                f = layer_losses(module, batch, readout=readout)
                self._estimate = getattr(readout, "last_estimate", None)
                lagrangian = self.constraint.lagrangian(f)
                output["loss"] = lagrangian * (loss / f[-1]).detach() if scaled else lagrangian
        finally:
            self._inside = False
        return output

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any
    ) -> None:
        if logs is not None and "loss" in logs:  # a training line, not an evaluation one
            _add_to_log(state, logs, self.log_values())

    def log_values(self) -> dict[str, float]:
        """The keys ``on_log`` adds (see the class docstring), read from the device once."""
        if self.is_set:
            return {f"constraints/{k}": v for k, v in self.constraint.log_values().items()}
        from descentlab.logs import LazyLogs

        constraint = self.constraint
        logs = constraint.log_values(estimate=self._estimate)
        lam = constraint.multipliers.detach()
        constrained = torch.nonzero(constraint.mask.cpu()).flatten().to(lam.device)  # never empty
        lam = lam.index_select(0, constrained)
        logs.update(LazyLogs({"lambda_mean": lam.mean(), "lambda_max": lam.max()}))  # read with the rest
        return {f"descent/{k}": v for k, v in logs.items()}


def _add_to_log(state: Any, logs: dict[str, float], values: dict[str, float]) -> None:
    """Add ``values`` to the log line being written and to its copy in ``state.log_history`` (Trainer appends
    ``{**logs, "step": global_step}`` there before it calls ``on_log``)."""
    logs.update(values)
    history = getattr(state, "log_history", None)
    if history and history[-1].get("step") == state.global_step and "loss" in history[-1]:
        history[-1].update(values)


def log_before_reporters(trainer: Trainer) -> None:
    """Move this module's callbacks ahead of the ``report_to`` integrations in ``trainer``'s callback list.

    Trainer runs its own callbacks (the flow control, then TensorBoard, W&B, ... from ``report_to``) before
    the ones it is given, and each sees the ``logs`` dict as it is when its turn comes; after this call the
    keys :class:`ConstraintCallback` and :class:`ACDCCallback` add (λ, slacks, violations, sparsity) reach
    the integrations too. Call it once, after building the Trainer; the order of everything else is kept.
    """
    from transformers.trainer_callback import DefaultFlowCallback

    handler = trainer.callback_handler
    ours = [cb for cb in handler.callbacks if isinstance(cb, (ConstraintCallback, ACDCCallback))]
    rest = [cb for cb in handler.callbacks if not isinstance(cb, (ConstraintCallback, ACDCCallback))]
    flow = [i for i, cb in enumerate(rest) if isinstance(cb, DefaultFlowCallback)]
    at = flow[0] + 1 if flow else 0  # after the flow control, which decides when a line is due
    handler.callbacks = rest[:at] + ours + rest[at:]


class ACDCCallback(TrainerCallback):
    """AC/DC (or any sparsity controller) in any ``Trainer``: masks gradients before, and steps the controller
    after, every optimizer step; its masks go into each checkpoint folder as ``descentlab_sparsity.pt`` and come
    back when ``args.resume_from_checkpoint`` names a folder.

    Args:
        factory: ``(model, optimizer) -> controller``, e.g. ``lambda m, o: dl.ACDC(m, o, sparsity=0.9,
            total_steps=args.max_steps)``; called at ``on_train_begin`` once the optimizer exists.
    """

    def __init__(self, factory: Callable[[nn.Module, torch.optim.Optimizer], Any]) -> None:
        if not callable(factory):
            raise ConfigError("ACDCCallback takes a factory (model, optimizer) -> controller")
        self.factory = factory
        self.controller: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self.controller is None:
            optimizer = kwargs["optimizer"]
            optimizer = (
                getattr(optimizer, "optimizer", optimizer)
                if not isinstance(optimizer, PrimalDual)
                else optimizer
            )
            self.controller = self.factory(_readout_model(model)[0], optimizer)
        resume = getattr(args, "resume_from_checkpoint", None)
        if isinstance(resume, str) and os.path.isfile(os.path.join(resume, SPARSITY_FILE)):
            state_dict = torch.load(
                os.path.join(resume, SPARSITY_FILE), weights_only=True, map_location="cpu"
            )
            self.controller.load_state_dict(state_dict)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if isinstance(self.controller, MasksGradients):
            self.controller.before_optimizer_step()

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.controller.step()

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kwargs: Any
    ) -> None:
        if logs is not None and "loss" in logs and isinstance(self.controller, ReportsSparsity):
            _add_to_log(state, logs, {"sparsity/global": float(self.controller.report().global_sparsity)})

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.controller is None or not args.should_save:
            return
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if os.path.isdir(folder):
            tmp = os.path.join(folder, SPARSITY_FILE + ".tmp")
            torch.save(self.controller.state_dict(), tmp)
            os.replace(tmp, os.path.join(folder, SPARSITY_FILE))
