"""Lightning integration: a ``Callback`` for constraints, a ``Callback`` for AC/DC, and the ``DescentModule`` mixin.

**Constraints on any LightningModule** (:class:`ConstraintCallback`). Your ``training_step`` returns its loss
as usual; the callback makes it the Lagrangian and moves the multipliers after every optimizer step::

    import lightning as L

    class Regressor(L.LightningModule):                      # any module: nothing descentlab in it
        def training_step(self, batch, batch_idx):
            pred = self.net(batch["x"])
            loss = torch.nn.functional.mse_loss(pred, batch["y"])
            return {"loss": loss, "mean_pred": pred.mean() - 0.5}     # a constraint value: mean_pred <= 0.5

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)    # a plain optimizer works

    cs = dl.ConstraintSet([dl.Constraint("mean_pred", dual_lr=0.1)])
    L.Trainer(max_steps=1000, callbacks=[ConstraintCallback(cs)]).fit(Regressor(), loader)

Per optimizer step t (k micro-batches under ``accumulate_grad_batches=k``; Lightning divides each
micro-batch's loss by k itself)::

    loss the optimizer descends   L̂ = f + Σ_c ψ_c(values of c)         (ConstraintSet: any formulation)
                                  L̂ = f_L + Σ_l λ_l ĝ_l                  (LayerwiseDescent)
    after the primal step         λ_{t+1} = max(0, λ_t + η c̄_t)          (c̄_t: the mean of the k observations)

The pieces, and where they run (the Lightning way: the callback holds no reference to your module's code):

* the Lagrangian: at ``setup`` the callback wraps the module's ``training_step`` (an instance attribute,
  removed at ``teardown``, so ``strategy="ddp"`` runs it inside the DDP forward as usual). After your
  ``training_step`` returns ``loss`` or ``{"loss": loss, ...}``, the wrapper replaces the loss by the
  Lagrangian. The constraint values come from ``values(module, batch, output)`` when given, else from the
  entries of the output dict named after the constraints (a tensor or a ``dl.ConstraintValue``). A
  ``LayerwiseDescent`` reads ``output["layer_losses"]`` if present, else ``module.descent_losses(batch)``, else
  ``dl.layer_losses(module.model, batch, readout)``. A ``training_step`` that builds the Lagrangian itself
  (it calls ``constraint.lagrangian``) is left alone.
* the dual step: a ``torch.optim`` step post-hook on Lightning's optimizer runs ``constraint.dual_step_()``
  right after each optimizer step, so accumulation, skipped steps (AMP's scaler skips ``optimizer.step``) and
  the order of other callbacks need nothing. When the optimizer is a
  :class:`~descentlab.constrained.PrimalDual` around the same constraint, its own step takes the dual step
  and the callback adds none. Extra-gradient needs ``PrimalDual`` (its closure evaluates twice).
* the finiteness check: ``on_before_optimizer_step`` (after backward, before clipping and before anything
  moves) runs :class:`PrimalDual`'s check of the gradients and of the recorded violations: a NaN/Inf raises
  ``NumericalError`` with the weights, the optimizer state and λ untouched. It is one host read-back per step
  (a device sync on GPU), as in ``PrimalDual``; ``check_finite=False`` turns it off, and the constraint's
  deferred guards are then read only when a log line is due.
* checkpoints: with a plain optimizer the callback's ``state_dict`` (Lightning's ``checkpoint["callbacks"]``)
  holds the constraint's ``state_dict()`` (λ, u, the pending violations, a dual optimizer's state), and
  ``fit(..., ckpt_path=...)`` restores it exactly; with a ``PrimalDual`` they are in ``optimizer_states``.
* logging through ``self.log`` at Lightning's ``log_every_n_steps``, all as device tensors (Lightning reads
  them when it writes a line; the callback reads nothing itself). A ConstraintSet logs ``task_loss`` (the
  loss your step returned), ``constraints/lagrangian``, and per constraint ``constraints/g/name/i`` (the last
  strict violations), ``constraints/lambda/name/i`` and ``constraints/u/name/i`` after the step's dual step
  (an indexed constraint: ``constraints/lambda/name/mean`` and ``/max``). A LayerwiseDescent logs the keys of
  :class:`DescentModule` below.

**AC/DC** (:class:`ACDCCallback`): ``factory(module, optimizer)`` builds the controller (e.g. ``dl.ACDC``) at
``on_train_start``; gradients of pruned weights are zeroed in ``on_before_optimizer_step`` and the controller
steps once per optimizer step (the same post-hook); its ``state_dict()`` (step, phase list, masks) goes into
every Lightning checkpoint under ``"descentlab_acdc"`` (``on_save_checkpoint``) and is loaded back on resume
(``on_load_checkpoint``, applied at ``on_train_start`` once weights and optimizer state are restored), so a
resumed run takes the steps an uninterrupted one takes. ``sparsity/global`` and ``acdc/compressed`` are
logged when a log line is due (the sparsity count is a host read, so only then).

**The mixin** (:class:`DescentModule`), a thin convenience for ``LayerwiseDescent`` on a model
``dl.layer_losses`` can read. Put it before ``LightningModule`` in your module's bases, give the module a
``model`` and a ``constraint``, and wrap your optimizer in ``PrimalDual`` in ``configure_optimizers``::

    class Classifier(DescentModule, L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = AutoModelForSequenceClassification.from_pretrained(...)
            self.constraint = dl.LayerwiseDescent(num_layers=self.model.config.num_hidden_layers,
                                                  alpha=0.05, dual_lr=1e-2)

        def configure_optimizers(self):
            return dl.PrimalDual(dl.HORST(self.parameters(), lr=3e-5, alpha=1.0), self.constraint)

    L.Trainer(max_steps=1000).fit(Classifier(), train_loader)   # ckpt_path=... resumes λ and u too

Its ``training_step`` returns ``constraint.lagrangian(f)`` with f = :meth:`DescentModule.descent_losses`;
``configure_callbacks`` adds a :class:`ConstraintCallback` (``build_lagrangian=False``: the module builds it)
that checks finiteness, warns once when ``lagrangian`` was never called, and logs; ``on_fit_start`` refuses an
optimizer that is not a ``PrimalDual`` around ``self.constraint``. Logged keys:

    task_loss                              f_L (``task_loss_step`` and, averaged over the epoch, ``task_loss_epoch``)
    descent/lagrangian                     the loss that was minimised, f_L + Σ_l λ_l ĝ_l
    descent/lambda_mean, descent/lambda_max  over the constrained layers, after this step's dual step
    descent/f/l, descent/g/l               this batch's f_l (l = 0..L) and ĝ_l (l = 1..L)
    descent/lambda/l, descent/u/l          λ_l and u_l (resilient constraints only) after the dual step

When the readout sampled (a causal LM's default ``sample_tokens="auto"`` reads layers 0..L-1 on k of the N
targets in training), f_0..f_{L-1} and every ĝ_l are estimates and are logged as such:
``descent/f_sampled/l`` (l < L; ``descent/f/L`` stays, it is exact), ``descent/g_sampled/l`` and its standard
error ``descent/g_se/l``, beside ``descent/readout/sampled_k`` and ``descent/readout/n``. The callback knows
the readout when it runs it, or when it is the module's ``readout`` (``DescentModule``); f handed over as
``output["layer_losses"]`` or by ``losses=`` is logged under the plain keys.

``descent_log_layers = False`` keeps the first four. If you override ``training_step``, ``on_fit_start`` or
``configure_callbacks``, call ``super()``'s (or :meth:`DescentModule.descent_step` in ``training_step``).

Under DDP, Lightning runs ``training_step`` inside the DDP wrapper's forward, so the readout's gradients
synchronise; the dual step averages dense violations over the ranks (sums indexed ones), so every rank holds
the same λ.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from descentlab.constrained.primal_dual import PrimalDual
from descentlab.constrained.problem import ConstraintSet, ConstraintValue
from descentlab.errors import ConfigError
from descentlab.train.protocols import MasksGradients, ReportsSparsity

try:  # the callbacks subclass Lightning's own base class
    from lightning.pytorch import Callback
except ImportError:  # pragma: no cover - the standalone package
    try:
        from pytorch_lightning import Callback
    except ImportError as exc:
        raise ImportError(
            "descentlab.integrations.lightning needs Lightning: pip install 'descentlab[lightning]'"
        ) from exc

ACDC_KEY = "descentlab_acdc"

ValuesFn = Callable[[Any, Any, Any], Mapping[str, Tensor | ConstraintValue]]
LossesFn = Callable[[Any, Any], Tensor]


def _unwrap(optimizer: Any) -> Any:
    """The optimizer inside a ``LightningOptimizer`` (whose ``_optimizer`` it is), else the optimizer itself.

    Not ``.optimizer``: that is the optimizer ``PrimalDual`` wraps."""
    return getattr(optimizer, "_optimizer", optimizer)


def _log_due(trainer: Any) -> bool:
    """Whether Lightning writes a log line at this step (the same test as Lightning's ``LearningRateMonitor``)."""
    return bool(trainer._logger_connector.should_update_logs)


def _log(module: Any, name: str, value: Tensor, *, on_epoch: bool = False) -> None:
    module.log(name, value, on_step=True, on_epoch=on_epoch)


def own_readout(readout: Any) -> Any:
    """A built-in readout name becomes one instance, kept, so the estimate it records after each call (sampled
    or exact) can label the logs; ``layer_losses`` would build a fresh one per call."""
    from descentlab.readout import BUILTIN

    return BUILTIN[readout]() if isinstance(readout, str) and readout in BUILTIN else readout


def readout_estimate(readout: Any, model: Any) -> Any:
    """What the readout ``layer_losses(model, batch, readout)`` used read last (its ``last_estimate``; None for
    readouts that always read every target, or when none is registered for ``model``)."""
    if readout is None:
        from descentlab.errors import ModelError
        from descentlab.readout import find_readout

        if not isinstance(model, torch.nn.Module):
            return None
        try:
            readout = find_readout(model)
        except ModelError:
            return None
    return getattr(readout, "last_estimate", None)


def log_descent_batch(
    module: Any,
    f: Tensor,
    loss: Tensor,
    log_layers: bool,
    constraint: Any = None,
    estimate: Any = None,
) -> None:
    """``task_loss`` (f_L), ``descent/lagrangian``, and this batch's ``descent/f/l`` and ``descent/g/l`` (ĝ of
    ``constraint``'s last ``lagrangian`` call), as device tensors.

    When ``estimate`` says the readout sampled (layers 0..L-1 read on k of the N targets), those values are
    estimates and their keys say so: ``descent/f_sampled/l`` (l < L; ``descent/f/L`` is exact),
    ``descent/g_sampled/l`` with its standard error ``descent/g_se/l``, and ``descent/readout/sampled_k`` of
    ``descent/readout/n`` targets.
    """
    f = f.detach()
    _log(module, "task_loss", f[-1], on_epoch=True)
    _log(module, "descent/lagrangian", loss.detach())
    if not log_layers:
        return
    sampled = estimate is not None and bool(getattr(estimate, "sampled", False))
    last = f.numel() - 1
    for layer in range(f.numel()):
        name = "f_sampled" if sampled and layer < last else "f"
        _log(module, f"descent/{name}/{layer}", f[layer])
    g = None if constraint is None else constraint.violations
    if g is None:
        return
    for layer in range(g.numel()):
        _log(module, f"descent/{'g_sampled' if sampled else 'g'}/{layer + 1}", g[layer])
    if sampled:
        se = estimate.violation_errors(f.to(g.dtype), constraint.alpha, constraint.form)
        for layer in range(se.numel()):
            _log(module, f"descent/g_se/{layer + 1}", se[layer])
        module.log("descent/readout/sampled_k", float(estimate.k), on_step=True)
        module.log("descent/readout/n", float(estimate.n), on_step=True)


class ConstraintCallback(Callback):
    """Train any ``LightningModule`` on the Lagrangian of a ``ConstraintSet`` or a ``LayerwiseDescent``.

    The contract (module docstring for the equations): the loss ``training_step`` returns is the objective f;
    the callback returns to Lightning ``constraint.lagrangian(f, values)`` in its place and takes
    ``constraint.dual_step_()`` once after every optimizer step (unless a ``PrimalDual`` around the same
    constraint takes it). λ never gets a gradient.

    Args:
        constraint: a :class:`~descentlab.constrained.ConstraintSet` or a
            :class:`~descentlab.constrained.LayerwiseDescent`.
        values: ConstraintSet only: ``fn(module, batch, output) -> {name: tensor or ConstraintValue}``, with
            ``output`` what ``training_step`` returned. None: the output dict's entries named after the
            constraints.
        losses: LayerwiseDescent only: ``fn(module, batch) -> f_0..f_L``. None: ``output["layer_losses"]``,
            else ``module.descent_losses(batch)``, else ``dl.layer_losses(module.model, batch, readout)``
            (that one runs its own forward beside the module's).
        readout: passed to ``dl.layer_losses`` by the default ``losses``.
        build_lagrangian: False when ``training_step`` builds the Lagrangian itself (calls
            ``constraint.lagrangian``, as :meth:`DescentModule.descent_step` does): the callback then leaves
            the output alone and warns once if an optimizer step comes before any ``lagrangian`` call.
        check_finite: with a plain optimizer, the finiteness check before each optimizer step (one host
            read-back per step); a ``PrimalDual`` keeps its own ``check_finite`` setting.
        log_layers: log every entry (per-layer f, ĝ, λ, u; per-constraint entries); False: the summary keys.
    """

    def __init__(
        self,
        constraint: Any,
        values: ValuesFn | None = None,
        *,
        losses: LossesFn | None = None,
        readout: Any = None,
        build_lagrangian: bool = True,
        check_finite: bool = True,
        log_layers: bool = True,
    ) -> None:
        for name in ("lagrangian", "dual_step_", "state_dict", "load_state_dict"):
            if not callable(getattr(constraint, name, None)):
                raise ConfigError(
                    f"ConstraintCallback takes a dl.ConstraintSet or a dl.LayerwiseDescent; "
                    f"{type(constraint).__name__} has no {name}()"
                )
        self.constraint = constraint
        self.is_set = isinstance(constraint, ConstraintSet)
        if values is not None and not self.is_set:
            raise ConfigError(
                "values= serves a ConstraintSet; a LayerwiseDescent takes losses=fn(module, batch)"
            )
        if losses is not None and self.is_set:
            raise ConfigError(
                "losses= serves a LayerwiseDescent; a ConstraintSet takes values=fn(module, batch, out)"
            )
        self.values = values
        self.losses = losses
        self.readout = own_readout(readout)
        self.build_lagrangian = bool(build_lagrangian)
        self.check_finite = bool(check_finite)
        self.log_layers = bool(log_layers)
        self.prefix = "constraints" if self.is_set else "descent"
        self._primal_dual: PrimalDual | None = (
            None  # Lightning's optimizer, when it is a PrimalDual around ours
        )
        self._optimizer: Any = None
        self._checker: PrimalDual | None = None  # runs PrimalDual's finiteness check for a plain optimizer
        self._owns_dual = False
        self._hook: Any = None
        self._wrapped: Any = None
        self._warned = False
        self._index: Tensor | None = None

    @property
    def state_key(self) -> str:
        return self._generate_state_key(constraint=type(self.constraint).__name__, prefix=self.prefix)

    # -- setup and teardown ------------------------------------------------------------------------------
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or not self.build_lagrangian or not pl_module.automatic_optimization:
            return
        if self._wrapped is not None:
            return
        original = pl_module.training_step
        callback, constraint = self, self.constraint

        @functools.wraps(original)
        def training_step(*args: Any, **kwargs: Any) -> Any:
            calls = constraint.lagrangian_calls
            output = original(*args, **kwargs)
            if output is None or constraint.lagrangian_calls != calls:
                return output  # a skipped batch, or a step that built the Lagrangian itself
            batch = kwargs["batch"] if "batch" in kwargs else args[0]
            return callback._lagrangian(pl_module, batch, output)

        pl_module.training_step = training_step
        self._wrapped = pl_module

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._wrapped is not None:
            self._wrapped.__dict__.pop("training_step", None)
            self._wrapped = None

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        optimizers = [_unwrap(o) for o in trainer.optimizers]
        ours = [o for o in optimizers if isinstance(o, PrimalDual) and o.constraint is self.constraint]
        self._primal_dual = ours[0] if ours else None
        self._warned = False
        self._index = None
        if self._primal_dual is not None:
            # PrimalDual warns when step() comes before any lagrangian call; under Lightning the closure (and so
            # training_step) runs inside step(), after that check, so the callback checks after the closure
            self._primal_dual._warned_no_lagrangian = True
            self._owns_dual = False
            return
        if len(optimizers) != 1:
            raise ConfigError(
                f"ConstraintCallback steps the dual after Lightning's optimizer, and there are {len(optimizers)}; "
                "return one optimizer, or dl.PrimalDual(optimizer, constraint) from configure_optimizers"
            )
        if getattr(self.constraint, "extragradient", False):
            raise ConfigError(
                "an extra-gradient ConstraintSet evaluates twice per step: return dl.PrimalDual(optimizer, "
                "constraint) from configure_optimizers (Lightning hands it the closure)"
            )
        self._optimizer = optimizers[0]
        self._owns_dual = True
        if hasattr(self.constraint, "defer_checks") and callable(
            getattr(self.constraint, "health_flag", None)
        ):
            self.constraint.defer_checks = True  # the guards ride on the finiteness read, or on a due log
        if self._hook is None:
            self._hook = self._optimizer.register_step_post_hook(self._after_optimizer_step)

    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        with torch.no_grad():
            self.constraint.dual_step_()

    # -- the Lagrangian ----------------------------------------------------------------------------------
    def _lagrangian(self, module: Any, batch: Any, output: Any) -> Any:
        is_dict = isinstance(output, Mapping)
        if is_dict and "loss" not in output:
            raise ConfigError(
                "training_step returned a dict without 'loss'; Lightning needs one, and so does the Lagrangian"
            )
        loss = output["loss"] if is_dict else output
        if self.is_set:
            observed = self._set_values(module, batch, output)
            total = self.constraint.lagrangian(loss, observed)
            _log(module, "task_loss", loss.detach(), on_epoch=True)
            _log(module, "constraints/lagrangian", total.detach())
        else:
            f, estimate = self._layer_losses(module, batch, output)
            total = self.constraint.lagrangian(f)
            log_descent_batch(module, f, total, self.log_layers, self.constraint, estimate)
        if not is_dict:
            return total
        out = {
            k: (v.strict if v.strict is not None else v.value).detach()
            if isinstance(v, ConstraintValue)
            else v
            for k, v in output.items()
        }  # Lightning detaches the extras and cannot copy a frozen dataclass
        out["loss"] = total
        return out

    def _set_values(self, module: Any, batch: Any, output: Any) -> Mapping[str, Any]:
        if self.values is not None:
            return self.values(module, batch, output)
        names = set(self.constraint.constraints)
        found = {k: v for k, v in output.items() if k in names} if isinstance(output, Mapping) else {}
        if not found:
            raise ConfigError(
                f"training_step returned no constraint values: return {{'loss': loss, {sorted(names)[0]!r}: "
                "values, ...}} (entries named after the constraints), or give ConstraintCallback(values=fn)"
            )
        return found

    def _layer_losses(self, module: Any, batch: Any, output: Any) -> tuple[Tensor, Any]:
        """f_0..f_L and what the readout read (None when the losses came from ``losses=`` or the output:
        their readout is not known here, and the keys stay unlabelled)."""
        if self.losses is not None:
            return self.losses(module, batch), None
        if isinstance(output, Mapping) and "layer_losses" in output:
            return output["layer_losses"], None
        model = getattr(module, "model", None)
        if callable(getattr(module, "descent_losses", None)):
            f = module.descent_losses(batch)
            return f, readout_estimate(getattr(module, "readout", None), model)
        from descentlab.readout import find_readout, layer_losses

        if not isinstance(model, torch.nn.Module):
            raise ConfigError(
                f"{type(module).__name__} has no `model` (an nn.Module) for dl.layer_losses: set self.model, return "
                "{'loss': ..., 'layer_losses': f} from training_step, or give ConstraintCallback(losses=fn)"
            )
        readout = find_readout(model) if self.readout is None else self.readout
        return layer_losses(model, batch, readout=readout), getattr(readout, "last_estimate", None)

    # -- per step ----------------------------------------------------------------------------------------
    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self.constraint.lagrangian_calls == 0 and not self._warned:
            self._warned = True
            warnings.warn(
                "the optimizer step came but constraint.lagrangian was never called: λ stays out of the loss and "
                "the dual step has nothing to ascend. Return the loss (and the constraint values) from "
                "training_step, or self.descent_step(batch) with DescentModule; this warning is shown once",
                RuntimeWarning,
                stacklevel=2,
            )
        inner = _unwrap(optimizer)
        if self._primal_dual is not None and inner is self._primal_dual:
            if inner.check_finite:
                inner._check_finite()  # Lightning hands PrimalDual a closure, which skips its own check
        elif self._owns_dual and self.check_finite:
            # PrimalDual's own check, one read-back for gradients, violations and the constraint's deferred
            # guards (collective under torch.distributed), through a PrimalDual that shares the optimizer's
            # groups and is never stepped
            if self._checker is None or self._checker.optimizer is not inner:
                self._checker = PrimalDual(inner, self.constraint)
            self._checker._check_finite()

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        checked = self._primal_dual.check_finite if self._primal_dual is not None else self.check_finite
        if not checked and _log_due(trainer) and callable(getattr(self.constraint, "check_health", None)):
            self.constraint.check_health()  # the deferred guards, read when a log line is due anyway
        if self.is_set:
            self._log_set(pl_module)
        else:
            self._log_descent(pl_module)

    def _log_set(self, module: Any) -> None:
        for c in self.constraint:
            lam = c.multipliers
            if c.indexed:
                if lam is not None:
                    _log(module, f"constraints/lambda/{c.name}/mean", lam.mean())
                    _log(module, f"constraints/lambda/{c.name}/max", lam.max())
                continue
            if not self.log_layers:
                continue
            for key, vector in (("lambda", lam), ("g", c.last), ("u", c.slacks)):
                if vector is not None:
                    for i in range(vector.numel()):
                        _log(module, f"constraints/{key}/{c.name}/{i}", vector[i])

    def _log_descent(self, module: Any) -> None:
        constraint = self.constraint
        lam = constraint.multipliers.detach()
        if self._index is None or self._index.device != lam.device:
            # nonzero on the CPU mask (no device sync), moved once to λ's device
            self._index = torch.nonzero(constraint.mask.cpu()).flatten().to(lam.device)
        constrained = lam.index_select(0, self._index)
        _log(module, "descent/lambda_mean", constrained.mean())
        _log(module, "descent/lambda_max", constrained.max())
        if not self.log_layers:
            return
        g = constraint.violations
        if g is not None and not self.build_lagrangian and not isinstance(module, DescentModule):
            # a training_step that built the Lagrangian itself logged no ĝ (log_descent_batch logs it for
            # the callback's own Lagrangian and for DescentModule's)
            estimate = readout_estimate(getattr(module, "readout", None), getattr(module, "model", None))
            name = "g_sampled" if bool(getattr(estimate, "sampled", False)) else "g"
            for layer in range(g.numel()):
                _log(module, f"descent/{name}/{layer + 1}", g[layer])
        for layer in range(lam.numel()):
            _log(module, f"descent/lambda/{layer + 1}", lam[layer])
        slacks = constraint.slacks
        if slacks is not None:
            for layer in range(slacks.numel()):
                _log(module, f"descent/u/{layer + 1}", slacks[layer].detach())

    # -- checkpoints -------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The constraint's state when the callback takes the dual step (a ``PrimalDual`` saves its own)."""
        return {"constraint": self.constraint.state_dict()} if self._owns_dual else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "constraint" in state_dict:
            self.constraint.load_state_dict(state_dict["constraint"])


class ACDCCallback(Callback):
    """AC/DC (or any sparsity controller) on any ``LightningModule``, its masks in Lightning's checkpoints.

    Per optimizer step: ``controller.before_optimizer_step()`` (zero the pruned weights' gradients) in
    ``on_before_optimizer_step``, then ``controller.step()`` (re-zero pruned weights, advance the schedule,
    compress or decompress when a phase ends) in a step post-hook on the optimizer: once per optimizer step,
    whatever the accumulation. Checkpoints carry ``controller.state_dict()`` under ``"descentlab_acdc"``;
    resuming loads it back (masks re-applied to the restored weights), so the resumed run's masks, weights
    and schedule are the uninterrupted run's.

    Args:
        factory: ``(module, optimizer) -> controller``, e.g. ``lambda m, o: dl.ACDC(m.model, o, sparsity=0.9,
            total_steps=trainer_max_steps)``; called at ``on_train_start`` with Lightning's (unwrapped)
            optimizer. The controller needs ``step()``, ``state_dict()`` and ``load_state_dict()``, and may
            have ``before_optimizer_step()`` and ``report()``.
    """

    def __init__(self, factory: Callable[[Any, torch.optim.Optimizer], Any]) -> None:
        if not callable(factory):
            raise ConfigError(
                "ACDCCallback takes a factory (module, optimizer) -> controller, e.g. lambda m, o: dl.ACDC(m, o)"
            )
        self.factory = factory
        self.controller: Any = None
        self._pending: dict[str, Any] | None = None
        self._hook: Any = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        optimizers = [_unwrap(o) for o in trainer.optimizers]
        if len(optimizers) != 1:
            raise ConfigError(f"ACDCCallback steps with one optimizer, Lightning has {len(optimizers)}")
        if self.controller is None:
            self.controller = self.factory(pl_module, optimizers[0])
        if self._pending is not None:
            self.controller.load_state_dict(self._pending)
            self._pending = None
        if self._hook is None:
            self._hook = optimizers[0].register_step_post_hook(self._after_optimizer_step)

    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.controller.step()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if isinstance(self.controller, MasksGradients):
            self.controller.before_optimizer_step()

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not _log_due(trainer):
            return
        if isinstance(
            self.controller, ReportsSparsity
        ):  # counts zeros on the host: only when a line is written
            pl_module.log("sparsity/global", float(self.controller.report().global_sparsity), on_step=True)
        compressed = getattr(self.controller, "compressed", None)
        if compressed is not None:
            pl_module.log("acdc/compressed", float(compressed), on_step=True)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        if self.controller is not None:
            checkpoint[ACDC_KEY] = self.controller.state_dict()  # every rank calls it (FSDP2 gathers masks)

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        # applied at on_train_start, after Lightning restored the weights and the optimizer state
        self._pending = checkpoint.get(ACDC_KEY)


class DescentModule:
    """A ``LightningModule`` mixin: ``training_step`` returns the Lagrangian of the per-layer losses.

    A thin layer over :class:`ConstraintCallback`, which it adds through ``configure_callbacks``.

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
        """Per-layer losses, then the Lagrangian (returned, for backward); logs f_L, f and the Lagrangian."""
        constraint = self._descent_constraint()
        self.readout = own_readout(self.readout)
        f = self.descent_losses(batch)
        loss = constraint.lagrangian(f)
        estimate = readout_estimate(self.readout, getattr(self, "model", None))
        log_descent_batch(self, f, loss, self.descent_log_layers, constraint, estimate)
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        return self.descent_step(batch)

    # -- Lightning hooks -----------------------------------------------------------------------------------
    def configure_callbacks(self) -> Any:
        """The module's :class:`ConstraintCallback` (the module builds the Lagrangian), then ``super()``'s."""
        callback = ConstraintCallback(
            self._descent_constraint(), build_lagrangian=False, log_layers=self.descent_log_layers
        )
        inherited = super().configure_callbacks()  # type: ignore[misc]
        inherited = (
            [] if inherited is None else [inherited] if isinstance(inherited, Callback) else list(inherited)
        )
        return [callback, *inherited]

    def on_fit_start(self) -> None:
        constraint = self._descent_constraint()
        optimizers = [_unwrap(o) for o in self.trainer.optimizers]  # type: ignore[attr-defined]
        if not any(isinstance(o, PrimalDual) and o.constraint is constraint for o in optimizers):
            names = [type(o).__name__ for o in optimizers] or ["none"]
            raise ConfigError(
                f"{type(self).__name__}.configure_optimizers returned {', '.join(names)}, not a PrimalDual around "
                "self.constraint: λ would stay out of its checkpoints. Return dl.PrimalDual(your_optimizer, "
                "self.constraint)"
            )
        super().on_fit_start()  # type: ignore[misc]

    def _descent_constraint(self) -> Any:
        constraint = getattr(self, "constraint", None)
        if constraint is None or not callable(getattr(constraint, "lagrangian", None)):
            raise ConfigError(
                f"{type(self).__name__} has no `constraint`: set self.constraint = dl.LayerwiseDescent(...) in "
                "__init__"
            )
        return constraint


__all__ = [
    "ACDC_KEY",
    "ACDCCallback",
    "ConstraintCallback",
    "DescentModule",
    "log_descent_batch",
    "own_readout",
    "readout_estimate",
]
