"""Which tensors are prunable, and magnitude masks over them (per matrix, global, N:M).

Masks are plain boolean tensors held by whoever prunes (a controller, an optimizer wrapper); the model is
never re-parametrised, so its state-dict keys stay the same and pruned weights are real zeros. A mask is
``True`` where the weight is *kept*.

The mask functions are pure: they take score tensors and return masks. Every top-k here is *exact*: the
number of kept entries is exactly ``n - round(sparsity * n)``, whatever the ties; among tied scores the
entry with the lowest flat index is kept, so the result is deterministic.

Thresholds are found on the scores' device: nothing is copied to the host but a few counts.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from descentlab.errors import ConfigError, ModelError
from descentlab.sparsity.sharded import is_sharded, local_part, local_rows, sharded_topk_masks

__all__ = [
    "PrunableTensor",
    "Selection",
    "compute_masks",
    "exact_topk_mask",
    "exact_topk_mask_reference",
    "find_blocks",
    "global_masks",
    "global_masks_reference",
    "layer_masks",
    "nm_mask",
    "nm_mask_reference",
    "num_pruned",
    "select_prunable",
]


def _default_module_types() -> tuple[type[nn.Module], ...]:
    # GPT-2 keeps its block projections in transformers' Conv1D ([in, out] weights), not nn.Linear.
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # transformers is a dependency, but the masks must not need it
        return (nn.Linear,)
    return (nn.Linear, Conv1D)


@dataclass(frozen=True)
class Selection:
    """Which weights are prunable.

    Import it with ``from descentlab.sparsity import Selection``. For a CNN or any model without a list of
    transformer blocks, pass ``Selection(module_types=(nn.Linear, nn.Conv2d), blocks_only=False)``.

    Attributes:
        module_types: Modules whose ``param_name`` parameter is a candidate. Default: ``nn.Linear`` and
            transformers' ``Conv1D`` (GPT-2). Convolutions (``nn.Conv1d/2d/3d``) are not in the default; a
            selection that skips conv weights it would otherwise take warns once (per model class).
        include: Regular expression the module's qualified name must match (``re.search``); None = all.
        exclude: Regular expression that removes matching modules; None = nothing removed.
        blocks_only: Keep only modules inside the transformer blocks (found by :func:`find_blocks`), which
            leaves out embeddings, patch projections, pooler and classification / LM heads.
        param_name: The parameter of each module to prune. Biases and norms are never candidates because
            only ``module_types`` are visited.
    """

    module_types: tuple[type[nn.Module], ...] = field(default_factory=_default_module_types)
    include: str | None = None
    exclude: str | None = None
    blocks_only: bool = True
    param_name: str = "weight"


@dataclass
class PrunableTensor:
    """One prunable weight: its parameter name, the parameter, its block index and its input dimension.

    ``in_dim`` is the dimension along which N:M groups run (the input features): 1 for ``nn.Linear``
    (weights [out, in]), 0 for ``Conv1D`` (weights [in, out]).
    """

    name: str
    param: nn.Parameter
    block: int | None
    in_dim: int


def find_blocks(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """Find the transformer block list of a model by structure, not by name.

    The blocks are the ``nn.ModuleList`` whose children all share one class, that holds at least one
    ``nn.Linear``/``Conv1D``, and that has the most parameters among such lists. This finds
    ``vit.encoder.layer`` (transformers 4.x ViT), ``vit.layers`` (5.x), ``transformer.h`` (GPT-2) and
    ``model.layers`` (Llama) alike.

    Returns:
        The qualified name of the list and the list.

    Raises:
        ModelError: if the model has no such list.
    """
    types = _default_module_types()
    best: tuple[int, str, nn.ModuleList] | None = None
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) == 0:
            continue
        if len({type(child) for child in module}) != 1:
            continue
        if not any(isinstance(m, types) for m in module.modules()):
            continue
        size = sum(p.numel() for p in module.parameters())
        if best is None or size > best[0]:
            best = (size, name, module)
    if best is None:
        raise ModelError(
            f"{type(model).__name__} has no list of repeated transformer blocks; pass select="
            "Selection(blocks_only=False, module_types=(nn.Linear, nn.Conv2d)) (from descentlab.sparsity import "
            "Selection; add include=/exclude= regexes to choose weights by name)."
        )
    return best[1], best[2]


def select_prunable(model: nn.Module, select: Selection | None = None) -> list[PrunableTensor]:
    """List the prunable weights of ``model`` in registration order.

    Args:
        model: Any module; with ``blocks_only`` it must contain a block list (see :func:`find_blocks`).
        select: The selection; default = the Linear / Conv1D weights inside the transformer blocks.

    Raises:
        ModelError: if nothing is selected.
    """
    select = select or Selection()
    include = re.compile(select.include) if select.include else None
    exclude = re.compile(select.exclude) if select.exclude else None
    block_of: dict[int, int] = {}
    if select.blocks_only:
        _, blocks = find_blocks(model)
        for i, block in enumerate(blocks):
            for m in block.modules():
                block_of[id(m)] = i
    conv1d = _default_module_types()[1:]
    out: list[PrunableTensor] = []
    seen: set[int] = set()
    skipped: dict[str, int] = {}  # conv weights the selection would take but for module_types
    for mod_name, module in model.named_modules():
        if select.blocks_only and id(module) not in block_of:
            continue
        if include is not None and not include.search(mod_name):
            continue
        if exclude is not None and exclude.search(mod_name):
            continue
        if not isinstance(module, select.module_types):
            if isinstance(module, _CONVS) and isinstance(
                getattr(module, select.param_name, None), nn.Parameter
            ):
                skipped[type(module).__name__] = skipped.get(type(module).__name__, 0) + 1
            continue
        param = getattr(module, select.param_name, None)
        if not isinstance(param, nn.Parameter) or id(param) in seen:  # tied weights count once
            continue
        seen.add(id(param))
        in_dim = 0 if conv1d and isinstance(module, conv1d) else param.dim() - 1
        full = f"{mod_name}.{select.param_name}" if mod_name else select.param_name
        out.append(PrunableTensor(full, param, block_of.get(id(module)), in_dim))
    if skipped:
        _warn_skipped(type(model).__name__, skipped)
    if not out:
        raise ModelError(
            f"no prunable weights selected in {type(model).__name__} with {select}; widen module_types (e.g. "
            "Selection(module_types=(nn.Linear, nn.Conv2d), blocks_only=False), from descentlab.sparsity) or "
            "the include pattern."
        )
    return out


_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_WARNED_SKIPS: set[tuple[str, tuple[str, ...]]] = set()


def _warn_skipped(model: str, skipped: dict[str, int]) -> None:
    """Warn once per (model class, skipped kinds) that convolution weights are left dense."""
    key = (model, tuple(sorted(skipped)))
    if key in _WARNED_SKIPS:
        return
    _WARNED_SKIPS.add(key)
    counts = ", ".join(f"{n} {kind} weight(s)" for kind, n in sorted(skipped.items()))
    kinds = ", ".join(f"nn.{kind}" for kind in sorted(skipped))
    warnings.warn(
        f"select_prunable: {counts} of {model} stay dense: the Selection's module_types do not include "
        f"them; to prune them too pass Selection(module_types=(nn.Linear, {kinds}), ...) (shown once)",
        UserWarning,
        stacklevel=3,
    )


def num_pruned(numel: int, sparsity: float) -> int:
    """Number of entries to zero for a requested sparsity: ``round(sparsity * numel)``."""
    if not 0.0 <= sparsity < 1.0:
        raise ConfigError(f"sparsity must lie in [0, 1), got {sparsity}; e.g. use 0.9 for 90 % zeros.")
    return round(sparsity * numel)


def exact_topk_mask(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean mask of the ``k`` largest entries of a flat score tensor, ties to the lowest index.

    Fast path: one ``kthvalue`` on the scores' device gives the threshold t; entries > t are kept, then the
    first ``k - #(scores > t)`` entries equal to t (in index order) fill up to exactly k. One count is read
    back (the ties to fill); the scores stay where they are.
    """
    n = scores.numel()
    if k >= n:
        return torch.ones(n, dtype=torch.bool, device=scores.device)
    if k <= 0:
        return torch.zeros(n, dtype=torch.bool, device=scores.device)
    threshold = torch.kthvalue(scores, n - k + 1).values
    keep = scores > threshold
    missing = k - int(keep.sum())
    if missing > 0:
        ties = torch.nonzero(scores == threshold).flatten()[:missing]
        keep[ties] = True
    return keep


def exact_topk_mask_reference(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Slow twin of :func:`exact_topk_mask`: a full lexicographic sort by (-score, index) in numpy."""
    s = scores.detach().double().cpu().numpy()
    order = np.lexsort((np.arange(s.size), -s))
    keep = np.zeros(s.size, dtype=bool)
    keep[order[: max(k, 0)]] = True
    return torch.from_numpy(keep).to(scores.device)


def layer_masks(weights: Mapping[str, torch.Tensor], sparsity: float) -> dict[str, torch.Tensor]:
    """One magnitude threshold per tensor: each tensor keeps its ``n - round(sparsity n)`` largest |w|."""
    masks = {}
    for name, w in weights.items():
        n = w.numel()
        keep = exact_topk_mask(w.detach().abs().flatten(), n - num_pruned(n, sparsity))
        masks[name] = keep.view_as(w)
    return masks


#: Above this many scores in all, :func:`global_masks` does not concatenate them: it selects with a radix
#: select over the tensors in place (:func:`~descentlab.sparsity.sharded.sharded_topk_masks`). 2^27 fp32
#: scores are a 512 MiB copy.
CONCAT_LIMIT = 1 << 27


def global_masks(
    weights: Mapping[str, torch.Tensor], sparsity: float, *, concat_limit: int = CONCAT_LIMIT
) -> dict[str, torch.Tensor]:
    """One magnitude threshold over all tensors together (global top-k of |w|), found on their device.

    Up to ``concat_limit`` scores in all: one ``kthvalue`` over the concatenated |w| (:func:`exact_topk_mask`).
    Beyond: a radix select over the scores' bits, histograms on the device, one tensor at a time, with no
    concatenated copy (:func:`~descentlab.sparsity.sharded.sharded_topk_masks`). Both give the masks of
    :func:`global_masks_reference` (the host-side slow twin), ties to the lowest flat index.

    If ``torch.distributed`` is initialised, rank 0's masks are broadcast so that every data-parallel rank
    prunes exactly the same entries even when replicas differ by float noise.
    """
    names = list(weights)
    if not names:
        return {}
    total = sum(weights[n].numel() for n in names)
    kept = total - num_pruned(total, sparsity)
    if total > concat_limit:
        selected = sharded_topk_masks([[weights[n] for n in names]], [kept])[0]
        return {n: _broadcast_from_rank0(m) for n, m in zip(names, selected, strict=True)}
    scores = torch.cat([weights[n].detach().abs().flatten() for n in names])
    keep = _broadcast_from_rank0(exact_topk_mask(scores, kept))
    return _split(keep, names, weights)


def global_masks_reference(weights: Mapping[str, torch.Tensor], sparsity: float) -> dict[str, torch.Tensor]:
    """Slow twin of :func:`global_masks`: every score copied to the host, one lexicographic sort there."""
    names = list(weights)
    if not names:
        return {}
    scores = torch.cat([weights[n].detach().abs().flatten() for n in names]).cpu()
    total = scores.numel()
    keep = exact_topk_mask_reference(scores, total - num_pruned(total, sparsity))
    device = weights[names[0]].device
    return {n: m.to(device) for n, m in _split(keep, names, weights).items()}


def _split(
    keep: torch.Tensor, names: list[str], weights: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The per-tensor views of a mask over the concatenated tensors."""
    masks, offset = {}, 0
    for n in names:
        w = weights[n]
        masks[n] = keep[offset : offset + w.numel()].view_as(w)
        offset += w.numel()
    return masks


def nm_mask(weight: torch.Tensor, n: int = 2, m: int = 4, in_dim: int = -1) -> torch.Tensor:
    """N:M mask: in every group of ``m`` consecutive entries along ``in_dim``, keep the ``n`` largest |w|.

    Raises:
        ConfigError: if ``0 < n < m`` fails or the size along ``in_dim`` is not a multiple of ``m``.
    """
    if not 0 < n < m:
        raise ConfigError(f"N:M sparsity needs 0 < N < M, got {n}:{m}; the usual choice is 2:4.")
    w = weight.detach().abs().movedim(in_dim, -1)
    if w.shape[-1] % m:
        raise ConfigError(
            f"N:M sparsity needs the input size {w.shape[-1]} to be a multiple of M={m}; exclude this "
            "tensor from the selection or pick another M."
        )
    groups = w.reshape(-1, m)
    # Stable descending sort keeps the earliest entry among ties, matching the reference.
    order = torch.sort(groups, dim=1, descending=True, stable=True).indices[:, :n]
    keep = torch.zeros_like(groups, dtype=torch.bool).scatter_(1, order, True)
    return keep.reshape(w.shape).movedim(-1, in_dim)


def nm_mask_reference(weight: torch.Tensor, n: int = 2, m: int = 4, in_dim: int = -1) -> torch.Tensor:
    """Slow twin of :func:`nm_mask`: a Python loop over groups with :func:`exact_topk_mask_reference`."""
    w = weight.detach().abs().movedim(in_dim, -1).contiguous()
    flat = w.reshape(-1, m)
    keep = torch.zeros_like(flat, dtype=torch.bool)
    for g in range(flat.shape[0]):
        keep[g] = exact_topk_mask_reference(flat[g], n)
    return keep.reshape(w.shape).movedim(-1, in_dim)


def compute_masks(
    tensors: Sequence[PrunableTensor],
    sparsity: float,
    scope: str = "global",
    nm: tuple[int, int] = (2, 4),
) -> dict[str, torch.Tensor]:
    """Masks for ``tensors`` by magnitude under ``scope`` in {"layer", "global", "nm"}.

    For ``scope="nm"`` the sparsity must equal ``1 - N/M``.
    """
    weights = {t.name: t.param for t in tensors}
    if scope in ("layer", "global") and any(is_sharded(t.param) for t in tensors):
        # FSDP2: masks of the local shards, from an exact distributed selection (sparsity/sharded.py)
        groups = [[t.param] for t in tensors] if scope == "layer" else [[t.param for t in tensors]]
        keep = [sum(p.numel() for p in g) - num_pruned(sum(p.numel() for p in g), sparsity) for g in groups]
        local = [m for group in sharded_topk_masks(groups, keep) for m in group]
        return {t.name: m for t, m in zip(tensors, local, strict=True)}
    if scope == "layer":
        return layer_masks(weights, sparsity)
    if scope == "global":
        return global_masks(weights, sparsity)
    if scope == "nm":
        n, m = nm
        if abs(sparsity - (1 - n / m)) > 1e-9:
            raise ConfigError(
                f"scope='nm' with {n}:{m} gives sparsity {1 - n / m}, not {sparsity}; pass that."
            )
        return {t.name: _local_nm_mask(t, n, m) for t in tensors}
    raise ConfigError(f"unknown pruning scope {scope!r}; use 'layer', 'global' or 'nm'.")


def _local_nm_mask(t: PrunableTensor, n: int, m: int) -> torch.Tensor:
    """N:M groups run along the input dimension; a row-sharded weight keeps whole groups on each rank unless
    the input dimension is the sharded one (``Conv1D``), where the shard must hold whole groups."""
    local = local_part(t.param)
    if (
        is_sharded(t.param)
        and t.in_dim == 0
        and (local.shape[0] % m or local_rows(torch.arange(t.param.shape[0]), t.param)[:1].remainder(m).any())
    ):
        raise ModelError(
            f"{t.name}: its shard splits N:M groups of {m} input rows across ranks; shard it in multiples of "
            f"{m} rows or prune it with scope='layer'/'global'"
        )
    return nm_mask(local, n, m, t.in_dim)


def _broadcast_from_rank0(mask: torch.Tensor) -> torch.Tensor:
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return mask
    if torch.distributed.get_world_size() == 1:
        return mask
    payload = mask.to(torch.uint8)
    if torch.distributed.get_backend() == "nccl" and not payload.is_cuda:
        payload = payload.cuda()
    torch.distributed.broadcast(payload, src=0)
    return payload.to(mask.device).bool()
