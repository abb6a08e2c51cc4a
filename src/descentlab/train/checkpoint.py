"""Atomic, checksummed, resumable checkpoints that never execute pickled code on load.

Layout of one checkpoint, ``<dir>/step-00000120/``::

    model.safetensors   weights (shared tensors such as tied embeddings handled by safetensors)
    optimizer.pt        optimizer state dict (duals, moments, ...), read with torch.load(weights_only=True)
    extra.pt            state dicts of the sparsity controller, LR scheduler, objective
    rng.pt              torch CPU/CUDA RNG states
    state.json          loop position: step, epoch, batch within the epoch, skipped steps
    MANIFEST.json       sha256 and size of every file above; written last

The folder is assembled under a temporary name and renamed into place, so a checkpoint either exists
whole or not at all. On load the manifest is verified; a truncated or corrupted checkpoint is reported and
the previous good one is used.

A model sharded by FSDP2 (``fully_shard``: DTensor parameters) is saved in the same layout, whole: every
rank calls :func:`save_checkpoint`, the weights are gathered with ``torch.distributed.checkpoint``'s
``get_model_state_dict(full_state_dict=True, cpu_offload=True)`` and every sharded optimizer state with
``full_tensor()``, and rank 0 writes the folder (temp + rename) while the others wait at a barrier. So a
sharded checkpoint loads into one process, and one process's into a sharded model:
:meth:`Checkpoint.load_model_` uses ``set_model_state_dict`` and :meth:`Checkpoint.load_optimizer_` hands
each rank its rows of every state shaped like its parameter (every rank reads the folder: a shared file
system, as for any rank-0-written checkpoint).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from descentlab.errors import CheckpointError
from descentlab.io import atomic_write_text
from descentlab.sparsity.sharded import is_sharded, local_part, local_rows

MANIFEST = "MANIFEST.json"
_PREFIX = "step-"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass
class Checkpoint:
    """A verified checkpoint on disk."""

    path: Path
    state: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.state["step"])

    def load_model_(self, model: torch.nn.Module) -> None:
        if _has_sharded_params(model):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            weights = load_file(str(self.path / "model.safetensors"))
            set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=True))
            return
        missing, unexpected = load_model(model, str(self.path / "model.safetensors"), strict=True)
        if missing or unexpected:  # pragma: no cover - strict=True raises first
            raise CheckpointError(f"{self.path}: weights do not match the model ({missing=}, {unexpected=})")

    def optimizer_state(self) -> dict[str, Any]:
        return torch.load(self.path / "optimizer.pt", weights_only=True, map_location="cpu")

    def load_optimizer_(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.load_state_dict`` of the saved state; for sharded parameters each state shaped like its
        parameter becomes a DTensor of this rank's rows first."""
        state = self.optimizer_state()
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if any(is_sharded(p) for p in params):
            state = _shard_optimizer_state(state, params)
        optimizer.load_state_dict(state)

    def extra_state(self) -> dict[str, Any]:
        return torch.load(self.path / "extra.pt", weights_only=True, map_location="cpu")

    def rng_state(self) -> dict[str, Any]:
        return torch.load(self.path / "rng.pt", weights_only=True, map_location="cpu")


def save_checkpoint(
    directory: Path,
    *,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    extra: dict[str, Any] | None = None,
    state: dict[str, Any] | None = None,
    keep: int = 2,
) -> Path:
    """Write ``<directory>/step-<step>`` atomically and keep only the newest ``keep`` checkpoints."""
    directory = Path(directory)
    final = directory / f"{_PREFIX}{step:08d}"
    sharded = _has_sharded_params(model)
    if sharded:  # a collective: every rank gathers, rank 0 writes
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = get_model_state_dict(model, options=options)
        optim_state = _full_optimizer_state(optimizer) if optimizer is not None else {}
        if torch.distributed.get_rank() != 0:
            torch.distributed.barrier()
            return final
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        if sharded:
            save_file(_unshared(_drop_tied(model, weights)), str(tmp / "model.safetensors"))
            torch.save(optim_state, tmp / "optimizer.pt")
        else:
            save_model(model, str(tmp / "model.safetensors"))
            torch.save(optimizer.state_dict() if optimizer is not None else {}, tmp / "optimizer.pt")
        torch.save(extra or {}, tmp / "extra.pt")
        torch.save(rng_state(), tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps({"step": step, **(state or {})}, indent=2))
        files = sorted(p.name for p in tmp.iterdir())
        manifest = {
            name: {"sha256": _sha256(tmp / name), "bytes": (tmp / name).stat().st_size} for name in files
        }
        for name in files:
            with open(tmp / name, "rb") as fh:
                os.fsync(fh.fileno())
        atomic_write_text(tmp / MANIFEST, json.dumps(manifest, indent=2))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if sharded:
            torch.distributed.barrier()  # let the other ranks go on to see the failure in their own time
        raise
    for old in list_checkpoints(directory)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    if sharded:
        torch.distributed.barrier()
    return final


def _has_sharded_params(model: torch.nn.Module) -> bool:
    return any(is_sharded(p) for p in model.parameters())


def _drop_tied(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One name per tied tensor, the one ``safetensors.torch.save_model`` keeps (the first in sorted order),
    so a sharded checkpoint has the keys of a one-process one."""
    names: dict[int, list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        names.setdefault(id(tensor), []).append(name)
    drop = {n for group in names.values() if len(group) > 1 for n in sorted(group)[1:]}
    return {k: v for k, v in weights.items() if k not in drop}


def _unshared(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous tensors, none sharing storage with another (tied weights appear under both names)."""
    seen: set[int] = set()
    out = {}
    for name, tensor in weights.items():
        t = tensor.detach().contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        out[name] = t
    return out


def _full_optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``optimizer.state_dict()`` with every DTensor gathered whole onto the CPU (a collective, in the state
    dict's own order, identical on every rank)."""
    state = optimizer.state_dict()

    def whole(value: Any) -> Any:
        return value.full_tensor().cpu() if is_sharded(value) else value

    state["state"] = {pid: {k: whole(v) for k, v in entry.items()} for pid, entry in state["state"].items()}
    return state


def _shard_optimizer_state(state: dict[str, Any], params: list[torch.Tensor]) -> dict[str, Any]:
    """The inverse of :func:`_full_optimizer_state` on this rank: states shaped like a sharded parameter
    become DTensors holding this rank's rows; the rest stays as saved."""
    from torch.distributed.tensor import DTensor

    out = dict(state)
    entries = {}
    for pid, entry in state["state"].items():
        param = params[int(pid)]
        if not is_sharded(param):
            entries[pid] = entry
            continue
        converted = {}
        for key, value in entry.items():
            if torch.is_tensor(value) and value.shape == param.shape:
                rows = local_rows(value, param).to(local_part(param).device)
                value = DTensor.from_local(
                    rows, param.device_mesh, param.placements, shape=param.shape, stride=param.stride()
                )
            converted[key] = value
        entries[pid] = converted
    out["state"] = entries
    return out


def list_checkpoints(directory: Path) -> list[Path]:
    """Checkpoint folders in ``directory``, oldest first (temporary folders excluded)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.is_dir() and p.name.startswith(_PREFIX))


def verify_checkpoint(path: Path) -> dict[str, Any]:
    """Check every file against the manifest; return ``state.json``'s content.

    Raises:
        CheckpointError: a file is missing, has the wrong size, or fails its checksum.
    """
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"{path}: no {MANIFEST} (the checkpoint was not completed)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: {MANIFEST} is corrupted ({exc})") from None
    for name, entry in manifest.items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{path}: {name} is missing")
        if file.stat().st_size != entry["bytes"]:
            raise CheckpointError(
                f"{path}: {name} is truncated ({file.stat().st_size} of {entry['bytes']} bytes)"
            )
        if _sha256(file) != entry["sha256"]:
            raise CheckpointError(f"{path}: {name} fails its sha256 checksum (corrupted)")
    return json.loads((path / "state.json").read_text())


def load_latest(directory: Path) -> Checkpoint | None:
    """The newest checkpoint that passes verification, or None when there is none at all.

    A bad checkpoint is skipped with a warning that names it; if checkpoints exist but none is good,
    :class:`CheckpointError` is raised rather than silently starting over.
    """
    candidates = list_checkpoints(directory)
    problems: list[str] = []
    for path in reversed(candidates):
        try:
            state = verify_checkpoint(path)
        except CheckpointError as exc:
            problems.append(str(exc))
            warnings.warn(f"skipping bad checkpoint: {exc}; trying the previous one", stacklevel=2)
            continue
        return Checkpoint(path=path, state=state)
    if candidates:
        raise CheckpointError(
            "no usable checkpoint in "
            + str(directory)
            + ": "
            + "; ".join(problems)
            + ". Delete the folder to start this job over."
        )
    return None
