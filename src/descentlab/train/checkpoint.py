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
from safetensors.torch import load_model, save_model

from descentlab.errors import CheckpointError
from descentlab.io import atomic_write_text

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
        missing, unexpected = load_model(model, str(self.path / "model.safetensors"), strict=True)
        if missing or unexpected:  # pragma: no cover - strict=True raises first
            raise CheckpointError(f"{self.path}: weights do not match the model ({missing=}, {unexpected=})")

    def optimizer_state(self) -> dict[str, Any]:
        return torch.load(self.path / "optimizer.pt", weights_only=True, map_location="cpu")

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
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"{_PREFIX}{step:08d}"
    tmp = directory / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
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
        raise
    for old in list_checkpoints(directory)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


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
