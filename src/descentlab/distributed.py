"""Helpers for code that runs alone, under ``torchrun`` and under ``accelerate launch`` alike.

Every function here is the identity (or the obvious single-process answer) when ``torch.distributed`` is
not initialised, so an experiment calls them unconditionally. What already lives elsewhere is reused, not
repeated: global magnitude masks are broadcast from rank 0 by
:func:`descentlab.sparsity.masks.global_masks`, and the training loop splits each global batch with
:func:`descentlab.train.loop.rank_share`.

What is added: a token-weighted mean over ranks (:func:`rank_mean`, also :func:`all_reduce_mean`), a
per-rank fault vector so that every rank takes the same skip-or-raise decision (:func:`rank_bad_flags`),
and *evaluation over the whole set*: each rank evaluates its contiguous share of the
evaluation batches and the example-weighted sums are all-reduced, so every rank reports the metric of the
entire set, equal (up to float summation order) to a single-process evaluation. Robustness noise is keyed
by example content, not by position, so sharding does not change which noise an example receives.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor

from descentlab.errors import ConfigError

T = TypeVar("T")

__all__ = [
    "all_reduce_mean",
    "all_reduce_sum",
    "barrier",
    "broadcast_object",
    "gather_objects",
    "is_distributed",
    "is_main_process",
    "rank",
    "rank_bad_flags",
    "rank_mean",
    "shard",
    "shard_bounds",
    "sharded_curve",
    "sharded_layer_profile",
    "sharded_means",
    "world_size",
]


def is_distributed() -> bool:
    """Whether a default process group with more than one rank is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's rank (0 when not distributed)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    """Number of ranks (1 when not distributed)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def is_main_process() -> bool:
    """Rank 0: the one process that writes files, logs and reports."""
    return rank() == 0


def barrier() -> None:
    """Wait for every rank (no-op alone)."""
    if is_distributed():
        dist.barrier()


def _collective_device() -> torch.device:
    # NCCL only moves CUDA tensors; gloo only CPU ones.
    if is_distributed() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(x: Tensor) -> Tensor:
    """Σ over ranks of ``x`` as a new tensor on ``x``'s device (a copy of ``x`` alone)."""
    if not is_distributed():
        return x.clone()
    y = x.detach().to(_collective_device(), copy=True)
    dist.all_reduce(y, op=dist.ReduceOp.SUM)
    return y.to(x.device)


def rank_mean(x: Tensor, weight: Tensor | float | None = None) -> Tensor:
    """Mean of ``x`` over ranks, each rank weighted by ``weight`` (its token or example count).

        mean = Σ_r w_r x_r / Σ_r w_r        (w_r = 1 on every rank when ``weight`` is None)

    With each rank's batch-mean loss as ``x`` and its token count as ``weight``, this is the mean over the
    global batch, whatever the ranks' batch sizes; an unweighted mean of batch means is that only when the
    ranks hold equal counts. One all-reduce of ``[w·x, w]`` packed together (no host sync: ``weight`` may
    be a device tensor such as ``(labels != -100).sum()``). Identity alone.

    Args:
        x: this rank's value, any shape, identical shape on every rank.
        weight: this rank's weight, a scalar (tensor or number) ≥ 0; the total over ranks must be > 0.

    Returns:
        The weighted mean, shape and dtype of ``x``, on ``x``'s device, the same on every rank.
    """
    if not is_distributed():
        return x
    if weight is None:
        return all_reduce_sum(x) / world_size()
    w = torch.as_tensor(weight, device=x.device).to(torch.float64).reshape(1)
    packed = all_reduce_sum(torch.cat([x.detach().to(torch.float64).flatten() * w, w]))
    return (packed[:-1] / packed[-1]).reshape(x.shape).to(x.dtype)


all_reduce_mean = rank_mean


def _plain(flag: Tensor) -> Tensor:
    # an FSDP2 (DTensor) gradient's flag is a DTensor: its whole value, as a plain tensor, on every rank
    full = getattr(flag, "full_tensor", None)
    return full() if callable(full) else flag


def rank_bad_flags(ok: Sequence[Tensor]) -> Tensor | None:
    """Which ranks hold a false flag: an int32 vector ``[world]`` (1 = some flag of that rank is false).

    Each rank writes ``not all(ok)`` into its own slot and one all-reduce sums the vector, so every rank
    learns, in one collective and without a host sync, both *whether* any rank failed a check and
    *which*: the decision to skip or raise is then the same everywhere, and the error names the rank.
    None when not distributed (the caller keeps its single-process read).

    Args:
        ok: this rank's boolean flags (0-dim tensors, on any device); empty means nothing to report.
    """
    if not is_distributed():
        return None
    device = _collective_device()
    bad = torch.zeros((), dtype=torch.int32, device=device)
    if ok:
        bad = (~torch.stack([_plain(f).to(device) for f in ok]).all()).to(torch.int32)
    mine = torch.arange(world_size(), device=device) == rank()
    vector = torch.where(mine, bad, torch.zeros((), dtype=torch.int32, device=device))
    dist.all_reduce(vector, op=dist.ReduceOp.SUM)
    return vector


def gather_objects(obj: T) -> list[T]:
    """Every rank's ``obj`` (picklable), in rank order, on every rank."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: T, src: int = 0) -> T:
    """Rank ``src``'s ``obj`` on every rank."""
    if not is_distributed():
        return obj
    box = [obj if rank() == src else None]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def shard_bounds(n: int, rank_: int | None = None, world: int | None = None) -> tuple[int, int]:
    """[start, end) of a rank's contiguous share of ``n`` items.

    The split is that of ``torch.tensor_split`` (the first ``n % world`` ranks hold one item more), the same
    rule :func:`descentlab.train.loop.rank_share` applies to a global batch.
    """
    r = rank() if rank_ is None else rank_
    w = world_size() if world is None else world
    if not 0 <= r < w:
        raise ConfigError(f"rank {r} is outside 0..{w - 1}")
    base, extra = divmod(n, w)
    start = r * base + min(r, extra)
    return start, start + base + (1 if r < extra else 0)


def shard(items: Sequence[T], rank_: int | None = None, world: int | None = None) -> list[T]:
    """This rank's contiguous share of ``items`` (all of them alone)."""
    start, end = shard_bounds(len(items), rank_, world)
    return list(items[start:end])


def _rows(batch: Any) -> int:
    from descentlab.evaluation.curves import batch_rows

    return int(batch_rows(batch))


def sharded_means(
    batches: Sequence[Any], fn: Callable[[Any], Mapping[str, Tensor]], *, shard_batches: bool = True
) -> dict[str, float]:
    """Per-example means over *all* ``batches``, each rank evaluating its share.

    mean_k = Σ_ranks Σ_(own batches) Σ_i fn(batch)[k]_i  /  Σ_ranks Σ_(own batches) rows(batch)

    Args:
        batches: the whole evaluation set as a list of batches, identical on every rank.
        fn: ``fn(batch) -> {name: per-example values [B]}`` (e.g. correctness, loss), under no_grad.
        shard_batches: False evaluates every batch on every rank (the sums are then not reduced).

    Returns:
        ``{name: mean}`` plus ``"n"``, the number of examples; identical on every rank.
    """
    own = shard(batches) if shard_batches else list(batches)
    sums: dict[str, float] = {}
    count = 0
    with torch.no_grad():
        for batch in own:
            values = fn(batch)
            for name, v in values.items():
                sums[name] = sums.get(name, 0.0) + float(v.detach().double().sum())
            count += _rows(batch)
    names = sorted(set().union(*gather_objects(list(sums)))) if shard_batches else sorted(sums)
    vector = torch.tensor([sums.get(k, 0.0) for k in names] + [float(count)], dtype=torch.float64)
    if shard_batches:
        vector = all_reduce_sum(vector)
    total = float(vector[-1])
    if total == 0:
        raise ConfigError("the evaluation set is empty; give at least one batch")
    return {**{k: float(vector[i]) / total for i, k in enumerate(names)}, "n": int(total)}


def _weighted_reduce(values: np.ndarray, weight: float) -> np.ndarray:
    flat = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64)).flatten()
    packed = all_reduce_sum(torch.cat([flat * weight, torch.tensor([weight], dtype=torch.float64)]))
    return (packed[:-1] / packed[-1]).numpy().reshape(values.shape)


def sharded_curve(model: torch.nn.Module, batches: Sequence[Any], **kwargs: Any) -> Any:
    """:func:`~descentlab.evaluation.curves.robustness_curve` of the whole set, ranks sharing the batches.

    Each rank evaluates its contiguous share of ``batches``; per (model, draw, γ) the shares' accuracies are
    combined weighted by their example counts, which is exact because accuracy is Σ correct / Σ examples.
    With fewer batches than ranks every rank evaluates everything.

    Args:
        model: the classifier.
        batches: the whole evaluation set, identical on every rank.
        **kwargs: passed to ``robustness_curve``; ``metric`` must be "accuracy" (the default). With
            ``keep_examples=True`` every rank gets every example's value, in the order of ``batches``.
    """
    from descentlab.evaluation.curves import RobustnessCurves, robustness_curve

    if kwargs.get("metric", "accuracy") != "accuracy":
        raise ConfigError(
            "sharded_curve combines shards by example count, which is exact for accuracy only; evaluate "
            "other metrics with robustness_curve on every rank"
        )
    if not is_distributed() or len(batches) < world_size():
        return robustness_curve(model, list(batches), **kwargs)
    own = shard(batches)
    local = robustness_curve(model, own, **kwargs)
    weight = float(sum(_rows(b) for b in own))
    values = {kind: _weighted_reduce(local.values[kind], weight) for kind in sorted(local.values)}
    protocol = {**local.protocol, "n_eval": int(float(all_reduce_sum(torch.tensor([weight]))[0]))}
    examples = None
    if local.examples is not None:  # the shares are contiguous and in rank order: concatenate them
        shares = gather_objects(local.examples)
        examples = {
            kind: np.concatenate([s[kind] for s in shares], axis=-1) for kind in sorted(local.examples)
        }
    return RobustnessCurves(
        metric=local.metric,
        gammas=local.gammas,
        values=values,
        protocol=protocol,
        x_name=local.x_name,
        examples=examples,
    )


def sharded_layer_profile(model: torch.nn.Module, batches: Sequence[Any], **kwargs: Any) -> list[float]:
    """:func:`~descentlab.evaluation.layer_profile.layer_loss_profile` of the whole set, ranks sharing it.

    The profile is an example-weighted mean of batch means, so shares combine exactly by example count.
    """
    from descentlab.evaluation.layer_profile import layer_loss_profile

    if not is_distributed() or len(batches) < world_size():
        return layer_loss_profile(model, list(batches), **kwargs)
    own = shard(batches)
    local = np.asarray(layer_loss_profile(model, own, **kwargs), dtype=np.float64)
    return _weighted_reduce(local, float(sum(_rows(b) for b in own))).tolist()
