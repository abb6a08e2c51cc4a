"""Magnitude masks of sharded parameters (FSDP2's DTensors), equal to the masks one process would compute.

Under ``torch.distributed.fsdp.fully_shard`` every parameter is a DTensor whose rank-local part is a block
of rows (``Shard(0)`` on a 1-D mesh). A mask here is a plain bool tensor shaped like that local part, and it
is applied in place to ``param.to_local()``; nothing is gathered.

The threshold is found by an exact distributed selection, not an estimate. Scores |w| are non-negative
floats, whose bit patterns, read as integers, sort like the values; a radix select over those integers, 8
bits per pass, finds the k-th largest score of each group (every tensor for ``scope="layer"``, all tensors
for ``scope="global"``): per pass each rank histograms the bytes of the entries still in play and one
``all_reduce`` of the [groups, 256] counts tells every rank which byte the k-th largest has (4 passes for
fp32, 2 for bf16). Ties at the threshold are then kept lowest flat index first, as in
:func:`~descentlab.sparsity.masks.exact_topk_mask`: one ``all_gather`` of the per-shard tie counts gives
each shard how many tied entries precede it in the one-process order (tensors in selection order, then
rows). The masks are therefore bit for bit the one-process masks whatever the ties. Plain (replicated)
tensors in a sharded run count once (on rank 0) and are masked alike on every rank.

The same selection, with no process group, is :func:`~descentlab.sparsity.masks.global_masks`'s path for
scores too many to concatenate: it makes no copy of all the scores. The integer keys of one tensor at a
time are recomputed at each pass (in the scores' own width, int16 for bf16), so the memory it needs is a
few times the largest tensor, not the sum of them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from descentlab.errors import ConfigError, ModelError

__all__ = ["full_mask", "is_replicated", "is_sharded", "local_part", "local_rows", "sharded_topk_masks"]

_INT_OF = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _dtensor_type() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without distributed
        return None
    return DTensor


def is_sharded(t: object) -> bool:
    """Whether ``t`` is a DTensor (a parameter, gradient or state of a ``fully_shard``-ed module)."""
    cls = _dtensor_type()
    return cls is not None and isinstance(t, cls)


def local_part(t: Tensor) -> Tensor:
    """The rank-local tensor of a DTensor (a view: in-place edits reach the parameter); ``t`` otherwise."""
    return t.to_local() if is_sharded(t) else t


def _row_offset(t: Tensor) -> int:
    """First global row of this rank's shard, checking the layout is one we mask exactly."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    placements = t.placements
    if t.device_mesh.ndim != 1 or not all(isinstance(p, (Shard, Replicate)) for p in placements):
        raise ModelError(
            f"magnitude masks of sharded parameters need a 1-D mesh with Shard(0) or Replicate placements, "
            f"got mesh {tuple(t.device_mesh.shape)} with {placements}; use fully_shard's default placement"
        )
    if any(isinstance(p, Shard) and p.dim != 0 for p in placements):
        raise ModelError(f"sharded masks need Shard(0) (rows), got {placements}")
    _, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, placements)
    return int(offset[0]) if offset else 0


def is_replicated(t: Tensor) -> bool:
    from torch.distributed.tensor import Replicate

    return not is_sharded(t) or all(isinstance(p, Replicate) for p in t.placements)


def _group_of(tensors: Sequence[Tensor]) -> dist.ProcessGroup | None:
    for t in tensors:
        if is_sharded(t):
            return t.device_mesh.get_group()
    return None


def _keys(t: Tensor, dtype: torch.dtype) -> Tensor:
    """|t| in ``dtype`` as non-negative integers that sort like the values, in the signed integer type of the
    same width (the sign bit is clear, so every key is >= 0)."""
    scores = local_part(t).detach().abs().to(dtype).contiguous().flatten()
    width = scores.element_size()
    return scores.view(_INT_OF[width]) & ((1 << (8 * width - 1)) - 1)  # a NaN's sign bit too


@torch.no_grad()
def sharded_topk_masks(groups: Sequence[Sequence[Tensor]], keep: Sequence[int]) -> list[list[Tensor]]:
    """Per group, keep the ``keep[g]`` largest |w| over the *global* tensors of the group, ties to the lowest
    flat index (tensors concatenated in order); return local bool masks shaped like each local part.

    Every rank must call it with the same groups (a collective).
    """
    flat = [t for group in groups for t in group]
    pg = _group_of(flat)
    world = dist.get_world_size(pg) if pg is not None else 1
    rank = dist.get_rank(pg) if pg is not None else 0
    device = local_part(flat[0]).device
    dtypes = []
    for group in groups:
        dtype = group[0].dtype
        for t in group[1:]:
            dtype = torch.promote_types(dtype, t.dtype)
        if not dtype.is_floating_point:
            raise ConfigError(f"magnitude masks need floating-point weights, got {dtype}")
        dtypes.append(dtype)
    widths = [8 * torch.empty((), dtype=d).element_size() for d in dtypes]  # key bits per group
    # a replicated tensor is counted once, on rank 0
    weight = [[0 if (is_replicated(t) and rank != 0) else 1 for t in group] for group in groups]
    totals = [sum(t.numel() for t in group) for group in groups]
    prefix = [0] * len(groups)
    remaining = [int(k) for k in keep]
    active = [0 < remaining[g] < totals[g] for g in range(len(groups))]
    for shift in range(max(widths) - 8, -1, -8):  # the top byte first; every rank runs every pass
        hist = torch.zeros(len(groups), 257, dtype=torch.int64, device=device)
        now = [active[g] and shift < widths[g] for g in range(len(groups))]
        for g, group in enumerate(groups):
            if not now[g]:
                continue
            for t, w in zip(group, weight[g], strict=True):
                if not w or local_part(t).numel() == 0:
                    continue
                k = _keys(t, dtypes[g])  # one tensor's keys at a time, recomputed at each pass
                byte = (k >> shift) & 255
                if shift + 8 < widths[g]:  # only entries whose higher bytes match the prefix so far
                    byte = torch.where((k >> (shift + 8)) == (prefix[g] >> (shift + 8)), byte, 256)
                hist[g] += torch.bincount(byte, minlength=257)
        if pg is not None:
            dist.all_reduce(hist, group=pg)
        counts = hist[:, :256].tolist()
        for g in range(len(groups)):
            if not now[g]:
                continue
            above = 0
            for b in range(255, -1, -1):
                if above + counts[g][b] >= remaining[g]:
                    remaining[g] -= above
                    prefix[g] |= b << shift
                    break
                above += counts[g][b]
    # ties at the threshold: how many precede each shard in the one-process order
    ties = torch.zeros(len(flat), 2, dtype=torch.int64, device=device)
    i = 0
    for g, group in enumerate(groups):
        for t in group:
            ties[i, 0] = (_keys(t, dtypes[g]) == prefix[g]).sum() if active[g] else 0
            ties[i, 1] = _row_offset(t) if is_sharded(t) and not is_replicated(t) else 0
            i += 1
    if pg is not None:
        gathered = [torch.empty_like(ties) for _ in range(world)]
        dist.all_gather(gathered, ties, group=pg)
        every = torch.stack(gathered).tolist()  # [rank][tensor] -> (ties, row offset)
    else:
        every = [ties.tolist()]
    masks: list[list[Tensor]] = []
    i = 0
    for g, group in enumerate(groups):
        out, before = [], 0
        for t in group:
            local = local_part(t)
            if not active[g]:
                out.append(torch.full(local.shape, remaining[g] > 0, dtype=torch.bool, device=local.device))
                i += 1
                continue
            k = _keys(t, dtypes[g])
            if is_replicated(t):
                mine, total_here = before, every[0][i][0]
            else:
                mine = before + sum(
                    every[r][i][0] for r in range(world) if every[r][i][1] < every[rank][i][1]
                )
                total_here = sum(every[r][i][0] for r in range(world))
            tie = k == prefix[g]
            rank_in_ties = torch.cumsum(tie.to(torch.int64), 0) + mine
            out.append(((k > prefix[g]) | (tie & (rank_in_ties <= remaining[g]))).view(local.shape))
            before += total_here
            i += 1
        masks.append(out)
    return masks


def full_mask(mask: Tensor, param: Tensor) -> Tensor:
    """The whole mask of a sharded parameter on every rank (an all-gather); ``mask`` itself otherwise."""
    if not is_sharded(param) or is_replicated(param):
        return mask
    from torch.distributed.tensor import DTensor

    shards = DTensor.from_local(
        mask.to(torch.uint8), param.device_mesh, param.placements, shape=param.shape, stride=param.stride()
    )
    return shards.full_tensor().bool()


def local_rows(full: Tensor, param: Tensor) -> Tensor:
    """This rank's rows of a whole tensor shaped like a sharded parameter (a mask, a state); ``full`` otherwise."""
    if not is_sharded(param) or is_replicated(param):
        return full
    start = _row_offset(param)
    return full[start : start + local_part(param).shape[0]]
