"""The one training loop: objective x optimizer x sparsity controller, on Accelerate, resumable.

``fit`` trains for ``max_steps`` (or ``epochs`` passes) over a map-style dataset. The data order is a
function of ``(seed, epoch)`` only, so a run resumed from a checkpoint (weights, optimizer state with its
duals or masks, sparsity controller, RNG states, loop position) continues exactly as the uninterrupted run
would have: bit for bit on CPU.

Under data parallelism (``accelerate launch`` / ``torchrun``) every step draws one *global* batch of
``batch_size · grad_accum_steps`` examples, cut into ``grad_accum_steps`` micro-batches, and each rank takes
its contiguous share of each, so gradients averaged by DDP equal the single-process gradient on the same
global batch. The finite-loss flag is all-reduced: a step is skipped on every rank or on none.
"""

from __future__ import annotations

import contextlib
import math
import random
import shutil
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import default_collate

from descentlab.distributed import rank_bad_flags
from descentlab.errors import CheckpointError, ConfigError, DataError, NumericalError
from descentlab.logs import CurveWriter
from descentlab.progress import progress_bar
from descentlab.sparsity.sharded import is_sharded
from descentlab.train.checkpoint import list_checkpoints, load_latest, save_checkpoint, set_rng_state
from descentlab.train.protocols import (
    EpochEndHook,
    MasksGradients,
    Objective,
    SparsityController,
    Stateful,
)
from descentlab.train.rundir import RunDir

__all__ = [
    "EpochEndHook",
    "FitResult",
    "MasksGradients",
    "Objective",
    "SparsityController",
    "Stateful",
    "TrainConfig",
    "TrainingInterrupted",
    "check_finite_batch",
    "epoch_order",
    "fit",
    "global_batches",
    "rank_share",
]


@dataclass
class TrainConfig:
    """Loop settings shared by every experiment."""

    epochs: int = 1
    max_steps: int | None = None  # overrides epochs when set
    batch_size: int = 32
    grad_clip: float | None = 1.0
    log_every: int = 10
    checkpoint_every: int | None = None  # steps; a final checkpoint is always written when a run dir is given
    seed: int = 0
    max_bad_steps: int = 10  # non-finite losses tolerated (skipped and counted) before the run stops
    mixed_precision: str = "no"  # "no" | "bf16" | "fp16"
    progress: bool = True
    # > 0: batches of similar length (less padding): each epoch's shuffled order is cut into chunks of
    # group_by_length * batch_size examples, each chunk sorted by length and cut into batches, and the batches
    # shuffled; still a function of (seed, epoch) only. Needs examples with ``input_ids``. 0: plain shuffling.
    group_by_length: int = 0
    # micro-batches per optimizer step: each step draws grad_accum_steps * batch_size examples, back-propagates
    # them batch_size at a time (each micro-batch's loss weighted by its share of the step's examples, DDP's
    # gradient all-reduce only on the last one) and steps once. Equal to grad_accum_steps=1 at that batch size.
    grad_accum_steps: int = 1
    # > 0: a torch DataLoader with this many worker processes collates the micro-batches ahead of the loop
    # (pinned memory on CUDA). Same batches in the same order as 0 (collated in the loop), so the same training
    # wherever the dataset's items draw no random numbers (a worker has its own RNG).
    loader_workers: int = 0

    def __post_init__(self) -> None:
        if self.epochs < 1 and self.max_steps is None:
            raise ConfigError(f"train.epochs must be >= 1, got {self.epochs}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"train.max_steps must be >= 1, got {self.max_steps}")
        if self.batch_size < 1:
            raise ConfigError(f"train.batch_size must be >= 1, got {self.batch_size}")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ConfigError(f"train.grad_clip must be > 0 or null, got {self.grad_clip}")
        if not isinstance(self.grad_accum_steps, int) or self.grad_accum_steps < 1:
            raise ConfigError(f"train.grad_accum_steps must be an int >= 1, got {self.grad_accum_steps!r}")
        if self.group_by_length < 0:
            raise ConfigError(f"train.group_by_length must be >= 0, got {self.group_by_length}")
        if self.mixed_precision not in ("no", "bf16", "fp16"):
            raise ConfigError(f"train.mixed_precision must be no, bf16 or fp16, got {self.mixed_precision!r}")
        if not isinstance(self.loader_workers, int) or self.loader_workers < 0:
            raise ConfigError(f"train.loader_workers must be an int >= 0, got {self.loader_workers!r}")

    def total_steps(self, n_train: int) -> int:
        """Optimizer steps ``fit`` takes on ``n_train`` examples: ``max_steps``, else ``epochs · ⌈n / (B·k)⌉``.

        ``batch_size`` B is the global micro-batch (all ranks together) and k ``grad_accum_steps``, so the
        count does not depend on the number of processes.
        """
        return self.max_steps if self.max_steps is not None else self.epochs * -(-n_train // self.step_size)

    @property
    def step_size(self) -> int:
        """Examples per optimizer step, all ranks and micro-batches together: ``batch_size · grad_accum_steps``."""
        return self.batch_size * self.grad_accum_steps


@dataclass
class FitResult:
    steps: int
    skipped_steps: int
    last_logs: dict[str, float] = field(default_factory=dict)
    resumed_from: int | None = None


class TrainingInterrupted(Exception):
    """SIGTERM/SIGINT arrived; a checkpoint was written and the run can be resumed.

    ``run_dir`` is the absolute path of the run directory to pass as ``resume=`` (None without one).
    """

    def __init__(self, message: str, run_dir: str | None = None) -> None:
        super().__init__(message)
        self.run_dir = run_dir

    def __reduce__(self) -> tuple[Any, ...]:  # crosses a worker process whole, run_dir included
        return type(self), (str(self), self.run_dir)


def seed_everything(seed: int) -> None:
    """Seed torch (CPU and CUDA) and Python's ``random``: a model built next is a function of ``seed``."""
    random.seed(seed)
    torch.manual_seed(seed)


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The example order of one epoch: a permutation that depends on ``(seed, epoch)`` only."""
    gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch))
    return torch.randperm(n, generator=gen)


def global_batches(
    n: int,
    batch_size: int,
    seed: int,
    epoch: int,
    start: int = 0,
    *,
    lengths: Sequence[int] | None = None,
    group: int = 0,
) -> Iterator[torch.Tensor]:
    """The batches of one epoch from batch ``start`` on; with ``lengths`` and ``group`` > 0, length-grouped
    (see ``TrainConfig.group_by_length``). Depends on ``(seed, epoch)`` only, so a resumed run continues."""
    order = epoch_order(n, seed, epoch)
    batches = [order[b * batch_size : (b + 1) * batch_size] for b in range(math.ceil(n / batch_size))]
    if lengths is not None and group > 0:
        size = group * batch_size
        lens = torch.as_tensor(lengths)
        grouped = []
        for c in range(0, n, size):
            chunk = order[c : c + size]
            chunk = chunk[torch.argsort(lens[chunk], descending=True, stable=True)]
            grouped += list(chunk.split(batch_size))
        gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch) + 7_919)
        batches = [grouped[i] for i in torch.randperm(len(grouped), generator=gen).tolist()]
    yield from batches[start:]


def rank_share(indices: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """This rank's contiguous share of a global batch (equal shares when the size divides)."""
    return indices.tensor_split(world)[rank]


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: _to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(_to_device(v, device) for v in batch)
    return batch


def _unwritable_checkpoint(directory: Path, step: int, exc: Exception) -> CheckpointError:
    """One line for a checkpoint write that failed (a full disk, a file-size limit, a vanished folder):
    the reason, the free space, and the newest complete checkpoint, which the failed write left intact (a
    checkpoint is assembled under a temporary name, removed on failure, and renamed into place last)."""
    try:
        free = f"{shutil.disk_usage(directory).free / 2**30:.2f} GiB free"
    except OSError:
        free = "free space unknown"
    done = list_checkpoints(directory)
    kept = (
        f"the newest complete checkpoint {done[-1].name} is intact"
        if done
        else "no earlier checkpoint exists"
    )
    reason = " ".join(str(exc).split()) or type(exc).__name__
    return CheckpointError(
        f"cannot write the step-{step} checkpoint in {directory}: {reason} ({free}); nothing of it was kept, "
        f"{kept}; free disk space (or raise the file-size limit) and resume the run"
    )


def _floating_fields(batch: Any) -> list[tuple[Any, torch.Tensor]]:
    tensors = (
        batch.items()
        if isinstance(batch, Mapping)
        else enumerate(batch if isinstance(batch, list | tuple) else [batch])
    )
    return [(k, v) for k, v in tensors if isinstance(v, torch.Tensor) and v.is_floating_point()]


def batch_finite(batch: Any) -> torch.Tensor | None:
    """A 0-dim device flag: every floating tensor of the batch is finite (None: the batch has none). No host
    read: ``fit`` reads it with the step's own finiteness flag, and calls :func:`check_finite_batch` to name
    the field only when it is false."""
    flags = [torch.isfinite(v).all() for _, v in _floating_fields(batch)]
    return torch.stack(flags).all() if flags else None


def check_finite_batch(batch: Any) -> None:
    """Raise DataError when a floating tensor of the batch holds NaN or Inf (one host read per tensor: the
    slow path, for naming the field)."""
    for key, value in _floating_fields(batch):
        if not torch.isfinite(value).all():
            raise DataError(f"batch field {key!r} contains NaN or Inf; clean the data before training")


class _SignalGuard:
    """Turn SIGTERM/SIGINT into a flag the loop checks between steps (main thread only)."""

    def __init__(self) -> None:
        self.caught: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _SignalGuard:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.caught = signum

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _plain_forward_after(accelerator: Any, model: torch.nn.Module) -> Iterator[None]:
    """On exit (normal or not), undo ``prepare``'s autocast patch of ``model.forward``.

    With mixed precision, ``Accelerator.prepare`` replaces the model's forward with an autocast one, and that
    stays on the caller's module. The loop autocasts its own forward passes, so the patch is only needed
    while training; after ``fit`` the model is handed back as it came, and whatever runs next (evaluation,
    pruning sweeps) chooses its own precision.
    """
    try:
        yield
    finally:
        accelerator.unwrap_model(model, keep_fp32_wrapper=False)


def _micro_batches(indices: torch.Tensor, batch_size: int, accum: int) -> list[torch.Tensor]:
    """A step's global batch cut into its micro-batches of ``batch_size`` (the whole batch without accumulation)."""
    return [m for m in indices.split(batch_size) if len(m)] if accum > 1 else [indices]


def _ignore_sigint(_worker_id: int) -> None:
    # Ctrl-C reaches the whole process group: the loop (main process) checkpoints and stops; a loader worker
    # that died of it first would turn that into a "worker exited unexpectedly" error instead
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class _EpochPlan:
    """The batch sampler of ``fit``'s DataLoader: the current epoch's rank shares, replaced every epoch.

    The main process walks it and hands the indices to the workers, so the workers live on across epochs."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class _MicroBatchSource:
    """``epoch(batches)`` gives ``fetch(rank_indices) -> collated batch`` for that epoch, called in loop order.

    ``cfg.loader_workers == 0``: each call collates its examples in this process. Otherwise one DataLoader for
    the whole ``fit`` walks the same rank shares of the same micro-batches, in the same order, in worker
    processes that persist across epochs (``persistent_workers``), and each call takes its next batch (the
    loop asks in that order, so ``part`` is not read again). The workers' seeds (torch, ``random`` and numpy:
    a base seed + the worker id) come from the loader's own generator, seeded by (seed, rank): drawn from the
    global RNG, as a DataLoader without a generator does, the base seed would shift the loop's dropout masks
    against ``loader_workers=0``. Used as a context manager: on exit the workers go.
    """

    def __init__(
        self,
        train_data: Sequence[Any],
        collate: Callable[[list[Any]], Any],
        cfg: TrainConfig,
        rank: int,
        world: int,
        pin_memory: bool,
    ) -> None:
        self._data, self._collate, self._cfg, self._rank, self._world = train_data, collate, cfg, rank, world
        self._plan = _EpochPlan()
        self._loader: Any = None
        self._ahead: Iterator[Any] | None = None
        if cfg.loader_workers > 0:
            from torch.utils.data import DataLoader

            self._loader = DataLoader(
                train_data,  # type: ignore[arg-type]
                batch_sampler=self._plan,
                collate_fn=collate,
                num_workers=cfg.loader_workers,
                pin_memory=pin_memory,
                worker_init_fn=_ignore_sigint,
                persistent_workers=True,
                generator=torch.Generator().manual_seed(int(cfg.seed) * 65_537 + rank),
            )

    def epoch(self, batches: Sequence[torch.Tensor]) -> Callable[[torch.Tensor], Any]:
        if self._loader is None:
            data, collate = self._data, self._collate
            return lambda part: collate([data[int(i)] for i in part])
        cfg = self._cfg
        self._plan.batches = [
            rank_share(m, self._rank, self._world).tolist()
            for indices in batches
            for m in _micro_batches(indices, cfg.batch_size, cfg.grad_accum_steps)
        ]
        self._ahead = iter(self._loader)  # the same workers, restarted on this epoch's plan
        return lambda part: next(self._ahead)  # type: ignore[arg-type]

    def __enter__(self) -> _MicroBatchSource:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._ahead = self._loader = None  # the last references: the iterator shuts its workers down


def _curve_writer(run: RunDir | None, tag: str, main: bool) -> contextlib.AbstractContextManager[Any]:
    """The job's :class:`~descentlab.logs.CurveWriter` when its run directory asks for curves (rank 0)."""
    if run is None or not getattr(run, "curves", False) or not main or not run.writer:
        return contextlib.nullcontext()
    return CurveWriter(run.path, tag)


def _learning_rates(optimizer: torch.optim.Optimizer) -> dict[str, float]:
    """``lr`` (one param group) or ``lr/<i>`` per group; a tensor lr is read here, at a log step only."""
    groups = optimizer.param_groups
    rates = {}
    for i, group in enumerate(groups):
        if "lr" in group:
            rates["lr" if len(groups) == 1 else f"lr/{i}"] = float(group["lr"])
    return rates


def _fallback_source(optimizer: Any) -> Any:
    """The optimizer (``optimizer`` or one it wraps: PrimalDual, Accelerate's wrapper) that records its
    fallbacks as ``fallback_messages`` (HORST), or None."""
    seen: set[int] = set()
    while optimizer is not None and id(optimizer) not in seen:
        seen.add(id(optimizer))
        if hasattr(optimizer, "fallback_messages"):
            return optimizer
        optimizer = getattr(optimizer, "optimizer", None)
    return None


def _new_fallbacks(source: Any, written: set[str]) -> dict[str, str]:
    """The fallback lines (reason -> line) not yet in the run's log; marks them written. Host data only
    (the optimizer keeps its counts in its param groups as ints), so a log step reads no device for it."""
    if source is None:
        return {}
    new = {why: line for why, line in dict(source.fallback_messages).items() if why not in written}
    written.update(new)
    return new


def _accelerator(mixed_precision: str) -> Any:
    """An Accelerator with this run's precision.

    Accelerate keeps one process-wide state and refuses a second precision; one process may train several
    models (an experiment's methods) at different precisions, so the precision part of that state is reset
    when it differs. The distributed part (process group, rank) is kept.
    """
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    state = AcceleratorState._shared_state
    if state and state.get("_mixed_precision", mixed_precision) != mixed_precision:
        AcceleratorState._reset_state(reset_partial_state=False)
    return Accelerator(cpu=not torch.cuda.is_available(), mixed_precision=mixed_precision)


def fit(
    model: torch.nn.Module,
    train_data: Sequence[Any],
    *,
    objective: Objective,
    optimizer: torch.optim.Optimizer,
    cfg: TrainConfig,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    sparsity: SparsityController | None = None,
    scheduler: Any = None,
    run: RunDir | None = None,
    tag: str = "",
    callbacks: Sequence[Callable[[int, torch.nn.Module, dict[str, float]], None]] = (),
    resume: bool = True,
) -> FitResult:
    """Train ``model`` and return the number of steps taken.

    Each step: ``loss, logs = objective(model, batch)``; backward (per micro-batch, weighted by its share of
    the step, with ``cfg.grad_accum_steps`` > 1; ``logs`` are then the last micro-batch's);
    ``sparsity.before_optimizer_step()``
    (gradient masking) if present; gradient clipping; ``optimizer.step()``; ``scheduler.step()``;
    ``sparsity.step()``. A non-finite loss skips the step and is counted; more than ``cfg.max_bad_steps`` of
    them stop the run with :class:`NumericalError`. An objective may define ``begin_step()`` (called before
    each step's micro-batches) and ``skip_step()`` (called when that step is skipped): :class:`~descentlab.train.objectives.Constrained`
    uses them to drop a skipped step's ĝ. With a ``run`` directory, checkpoints go to
    ``run.checkpoint_dir(tag)`` every ``cfg.checkpoint_every`` steps, at the end, and when SIGTERM/SIGINT
    arrives (then :class:`TrainingInterrupted` is raised); with ``resume`` the newest good checkpoint there
    is loaded first. When ``run.curves`` is set (the experiment runner sets it; a library ``RunDir`` has
    it off), every log step is also written as curves: ``metrics.csv`` and TensorBoard events under
    ``tensorboard/<tag>/`` (:class:`~descentlab.logs.CurveWriter`), with ``skipped`` and each param
    group's ``lr`` beside the objective's logs. An optimizer that records why it left its fast path
    (``fallback_messages``, as HORST does; also when wrapped by PrimalDual) has each reason's line written
    once into ``metrics.jsonl``, in the first log record after it appears, as ``optimizer_fallbacks``
    (reason -> line); a resumed run does not repeat a reason its log already holds.
    """
    n = len(train_data)
    if n == 0:
        raise DataError("the training set is empty; check the dataset name, path and split sizes")
    collate = collate_fn or default_collate
    accelerator = _accelerator(cfg.mixed_precision)
    rank, world = accelerator.process_index, accelerator.num_processes
    if cfg.batch_size < world:
        raise ConfigError(f"train.batch_size={cfg.batch_size} is smaller than the {world} processes")
    accum = cfg.grad_accum_steps
    steps_per_epoch = math.ceil(n / cfg.step_size)
    total = cfg.total_steps(n)
    lengths = None
    if cfg.group_by_length:
        try:
            lengths = [len(train_data[i]["input_ids"]) for i in range(n)]
        except (KeyError, TypeError, IndexError):
            raise ConfigError(
                "train.group_by_length needs examples with input_ids; set train.group_by_length=0"
            ) from None
    raw_model, raw_optimizer = model, optimizer
    sharded = any(is_sharded(p) for p in model.parameters())
    if sharded:  # FSDP2 (fully_shard) already synchronises gradients: no DDP wrapper around it
        optimizer = accelerator.prepare(optimizer)
    else:
        model, optimizer = accelerator.prepare(model, optimizer)

    step, skipped, resumed_from = 0, 0, None
    ckpt_dir = run.checkpoint_dir(tag) if run is not None else None
    if ckpt_dir is not None and resume:
        ckpt = load_latest(ckpt_dir)
        if ckpt is not None:
            ckpt.load_model_(raw_model)
            ckpt.load_optimizer_(raw_optimizer)
            extra = ckpt.extra_state()
            for name, obj in (("sparsity", sparsity), ("scheduler", scheduler), ("objective", objective)):
                if name in extra and obj is not None and isinstance(obj, Stateful):
                    obj.load_state_dict(extra[name])
            set_rng_state(ckpt.rng_state())
            step, skipped, resumed_from = ckpt.step, int(ckpt.state.get("skipped", 0)), ckpt.step

    fallbacks = _fallback_source(raw_optimizer)
    written: set[str] = set()  # fallback reasons already in this job's log
    if fallbacks is not None and resumed_from is not None and run is not None and accelerator.is_main_process:
        # the loaded optimizer state carries the earlier run's reasons; its log already said them
        for record in run.metrics():
            if record.get("tag") == tag and isinstance(record.get("optimizer_fallbacks"), dict):
                written.update(record["optimizer_fallbacks"])

    def checkpoint() -> None:
        # an FSDP2 model is gathered by every rank (rank 0 writes); otherwise rank 0 alone saves
        if ckpt_dir is None or not (accelerator.is_main_process or sharded):
            return
        extra = {
            name: obj.state_dict()
            for name, obj in (("sparsity", sparsity), ("scheduler", scheduler), ("objective", objective))
            if obj is not None and isinstance(obj, Stateful)
        }
        try:
            save_checkpoint(
                ckpt_dir,
                step=step,
                model=accelerator.unwrap_model(model),
                optimizer=raw_optimizer,
                extra=extra,
                state={"skipped": skipped, "total": total},
            )
        # a full disk surfaces as an OSError, a SafetensorError or torch's RuntimeError, by writer
        except Exception as exc:
            raise _unwritable_checkpoint(ckpt_dir, step, exc) from exc

    begin_step = getattr(objective, "begin_step", None)
    skip_step = getattr(objective, "skip_step", None)
    model.train()
    last: dict[str, float] = {}
    bar = progress_bar(
        total, initial=step, desc=tag or "train", enabled=cfg.progress and accelerator.is_main_process
    )
    source = _MicroBatchSource(train_data, collate, cfg, rank, world, accelerator.device.type == "cuda")
    with (
        _SignalGuard() as guard,
        _plain_forward_after(accelerator, model),
        source,
        _curve_writer(run, tag, accelerator.is_main_process) as curves,
    ):
        while step < total:
            epoch, start = divmod(step, steps_per_epoch)
            batches = list(
                global_batches(
                    n, cfg.step_size, cfg.seed, epoch, start, lengths=lengths, group=cfg.group_by_length
                )
            )
            fetch = source.epoch(batches)
            for indices in batches:
                if callable(begin_step):
                    begin_step()
                micro = _micro_batches(indices, cfg.batch_size, accum)
                finite: torch.Tensor | None = None
                data_ok: torch.Tensor | None = None  # the batches' own finiteness, read with `finite`
                for k, part in enumerate(micro):
                    batch = _to_device(fetch(rank_share(part, rank, world)), accelerator.device)
                    ok_data = batch_finite(batch)
                    if ok_data is not None:
                        data_ok = ok_data if data_ok is None else data_ok & ok_data
                    with accelerator.autocast():
                        loss, logs = objective(model, batch)
                    ok = torch.isfinite(loss.detach()).all()
                    finite = ok if finite is None else finite & ok
                    if len(micro) == 1:
                        break  # no accumulation: checked (and all-reduced) before the one backward
                    # every micro-batch is back-propagated (a non-finite one too: its gradients are dropped
                    # with the step below); DDP all-reduces the gradients on the last one only
                    sync = k == len(micro) - 1 or sharded
                    with contextlib.nullcontext() if sync else accelerator.no_sync(model):
                        accelerator.backward(loss * (len(part) / len(indices)))
                # every rank skips together (one rank skipping alone hangs DDP's next all-reduce): one
                # all-reduce of a [world] vector says whether any rank saw a non-finite loss, and which
                step_ok = finite if data_ok is None else finite & data_ok
                bad_ranks = rank_bad_flags([step_ok]) if world > 1 else None
                if bad_ranks is None:
                    where = [] if bool(step_ok) else [rank]  # the step's one host read
                else:
                    where = [r for r, bad in enumerate(bad_ranks.tolist()) if bad]  # the same one read
                if where and data_ok is not None:
                    # a failed step: was it the data? (reads only on this path; every rank asks together)
                    data_bad = rank_bad_flags([data_ok]) if world > 1 else None
                    bad_data = not bool(data_ok) if data_bad is None else bool(data_bad.any())
                    if bad_data:
                        for part in micro:  # fetched again on this path only: names the field
                            check_finite_batch(fetch(rank_share(part, rank, world)))
                        ranks = [] if data_bad is None else [r for r, b in enumerate(data_bad.tolist()) if b]
                        raise DataError(
                            f"a batch on rank(s) {ranks} of {world} contains NaN or Inf; clean the data "
                            "before training"
                        )
                if where:
                    skipped += 1
                    if callable(skip_step):  # e.g. Constrained: drop the ĝ this step recorded
                        skip_step()
                    optimizer.zero_grad(set_to_none=True)
                    if skipped > cfg.max_bad_steps:
                        checkpoint()
                        on = f" on rank(s) {where} of {world}" if world > 1 else ""
                        raise NumericalError(
                            f"{skipped} non-finite losses (last at step {step}{on}); lower the learning rate, "
                            "enable grad_clip, or check the data. The last good state is checkpointed."
                        )
                    if sparsity is not None:  # its schedule counts loop steps, taken or skipped
                        sparsity.step()
                else:
                    if len(micro) == 1:
                        accelerator.backward(loss)
                    if isinstance(sparsity, MasksGradients):
                        sparsity.before_optimizer_step()
                    if cfg.grad_clip is not None:
                        accelerator.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                    optimizer.step()
                    if scheduler is not None:
                        scheduler.step()
                    optimizer.zero_grad(set_to_none=True)
                    if sparsity is not None:
                        sparsity.step()
                    last = logs
                step += 1
                bar.update(1)
                if step % steps_per_epoch == 0 and isinstance(objective, EpochEndHook):
                    objective.end_epoch()
                if (
                    run is not None
                    and accelerator.is_main_process
                    and (step % cfg.log_every == 0 or step == total)
                ):
                    new = _new_fallbacks(fallbacks, written)
                    run.log(
                        step=step,
                        tag=tag,
                        skipped=skipped,
                        **last,
                        **({"optimizer_fallbacks": new} if new else {}),
                    )
                    if curves is not None:  # the values run.log just read: no further device read
                        curves.write(step, {**last, "skipped": skipped, **_learning_rates(raw_optimizer)})
                for callback in callbacks:
                    callback(step, model, last)
                if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < total:
                    checkpoint()
                if guard.caught is not None:
                    checkpoint()
                    bar.close()
                    if run is None:
                        raise TrainingInterrupted(
                            f"signal {guard.caught} at step {step}: stopped (no run directory, no checkpoint)"
                        )
                    where = str(run.path.resolve())
                    raise TrainingInterrupted(
                        f"signal {guard.caught} at step {step}: checkpoint written; resume with resume={where}",
                        run_dir=where,
                    )
                if step >= total:
                    break
    bar.close()
    if resumed_from != step or resumed_from is None:
        checkpoint()
    accelerator.wait_for_everyone()
    return FitResult(steps=step, skipped_steps=skipped, last_logs=last, resumed_from=resumed_from)
