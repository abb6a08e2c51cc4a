"""Run directories: ``<root>/<name>-<timestamp>[-k]``, never shared between two runs.

Creation relies on ``mkdir`` being atomic: two runs that start in the same second race for the same name,
one wins, the other takes the next free suffix. Every file is written atomically (temporary file, fsync,
rename), so a killed run leaves either the old or the new version of a file, never half of one.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from descentlab.errors import ConfigError
from descentlab.io import atomic_write_bytes, atomic_write_text, dumps_json, save_arrays, save_json
from descentlab.io import jsonable as _jsonable

# the writers moved to descentlab.io; experiments import them from here
__all__ = ["RunDir", "atomic_write_bytes", "atomic_write_text", "dumps_json"]


class RunDir:
    """One run's folder: config, ``metrics.jsonl``, checkpoints, ``results.json``, ``report.md``, figures."""

    def __init__(self, path: Path, writer: bool = True) -> None:
        self.path = Path(path)
        # False on the ranks > 0 of a torchrun / accelerate launch: they share rank 0's folder and their
        # writes are dropped, so one run leaves one metrics.jsonl, one results.json, one set of figures.
        self.writer = writer

    @classmethod
    def create(cls, root: Path | str, name: str) -> RunDir:
        """Make a fresh directory ``<root>/<name>-<YYYYmmdd-HHMMSS>``, adding ``-2``, ``-3``... on collision."""
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for k in range(1, 10_000):
            path = root / (f"{name}-{stamp}" if k == 1 else f"{name}-{stamp}-{k}")
            try:
                path.mkdir()
            except FileExistsError:
                continue
            return cls(path)
        raise RuntimeError(f"could not find a free run directory name under {root}")

    @classmethod
    def open(cls, path: Path | str) -> RunDir:
        """An existing run directory (to resume it or rebuild its report)."""
        path = Path(path)
        if not (path / "config.yaml").is_file():
            raise ConfigError(
                f"{path} is not a descentlab run directory (no config.yaml); pass a folder made by `descentlab run`"
            )
        return cls(path)

    def log(self, step: int | None = None, **metrics: Any) -> None:
        """Append one JSON line to ``metrics.jsonl``; lines are small, so an append is effectively atomic."""
        if not self.writer:
            return
        record = {"time": round(time.time(), 3), **({"step": step} if step is not None else {}), **metrics}
        with open(self.path / "metrics.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(_jsonable(record), allow_nan=False) + "\n")

    def metrics(self) -> list[dict[str, Any]]:
        path = self.path / "metrics.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def figure(self, name: str) -> Path:
        """Path for a PNG figure, ``figures/<name>.png`` (the folder is created; a scratch folder off rank 0)."""
        if not self.writer:
            return Path(tempfile.mkdtemp(prefix="descentlab-figure-")) / f"{name}.png"
        folder = self.path / "figures"
        folder.mkdir(exist_ok=True)
        return folder / f"{name}.png"

    def save_json(self, name: str, obj: Any) -> Path:
        path = self.path / name
        if self.writer:
            save_json(path, obj)
        return path

    def save_arrays(self, name: str, **arrays: Any) -> Path:
        """Figure data as ``<name>`` (an ``.npz`` file, see :func:`descentlab.io.save_arrays`); rank 0 only."""
        path = self.path / name
        if self.writer:
            save_arrays(path, **arrays)
        return path

    def load_json(self, name: str) -> Any:
        return json.loads((self.path / name).read_text())

    def checkpoint_dir(self, tag: str = "") -> Path:
        """Folder holding the checkpoints of one training job of this run (one per method/seed ``tag``)."""
        folder = self.path / "checkpoints" / (tag or "main")
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"
