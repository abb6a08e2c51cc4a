"""The cell store: every per-cell array a study's claims and figures read, under one key scheme.

Key scheme. A cell array is keyed ``metric/arm`` or ``metric/arm/condition``: ``metric`` names what was
measured (``correct``, ``nll``), ``arm`` the trained method (``erm-horst``) and ``condition`` the
setting it was measured at (a sparsity ``0.9``, a noise kind), written by :func:`condition_name` (a
number as ``f"{x:g}"``). No part may contain ``/``. Values are shaped ``[seeds, ..., examples]``, seeds
in the order of the design record, so two arms' arrays at one condition are paired cell by cell.

The store is saved as one ``.npz`` (:data:`CELLS_FILE`) and a design record (:data:`DESIGN_FILE`),
written from the study's config (its ``config.design(cfg)``) by the runner before the run starts, and
completed by the run's store when it saves (:func:`record_design`: the store must name the same arms,
conditions and seeds): the arms, conditions and seeds the run was designed with, and the number of
examples. The record is what tells a claim's two failures apart:

* :class:`~descentlab.report.claims.NotInRun`: the design has no such arm or condition (another run of
  the study judges the claim);
* :class:`~descentlab.report.claims.MissingArrays`: the design has it, but the run did not save it (the
  row pends until the run is re-done).

:meth:`CellStore.compare` hands a claim its :class:`~descentlab.report.claims.Cells`. The store is a
read-only ``Mapping`` of its flat keys, so it is the ``arrays`` argument of
:func:`~descentlab.report.claims.judge` as it stands.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.io import atomic_write_text, load_arrays, save_arrays
from descentlab.report.claims import Cells, MissingArrays, NotInRun

__all__ = [
    "CELLS_FILE",
    "DESIGN_FILE",
    "CellStore",
    "Design",
    "cell_key",
    "condition_name",
    "load_store",
    "record_design",
    "require_store",
    "stack_seeds",
]

CELLS_FILE = "arrays/cells.npz"
DESIGN_FILE = "arrays/design.json"


def condition_name(condition: float | int | str | None) -> str:
    """The key form of a condition: ``""`` for none, a number as ``f"{x:g}"`` (``0.9``, ``0``), a string as is."""
    if condition is None:
        return ""
    if isinstance(condition, str):
        return condition
    return f"{float(condition):g}"


def cell_key(metric: str, arm: str, condition: float | int | str | None = None) -> str:
    """``metric/arm`` or ``metric/arm/condition``; ValueError when a part is empty or holds ``/``."""
    parts = [metric, arm] + ([c] if (c := condition_name(condition)) else [])
    for part in parts:
        if not part or "/" in part:
            raise ValueError(f"a cell key part must be non-empty and hold no '/', got {part!r} in {parts}")
    return "/".join(parts)


@dataclass(frozen=True)
class Design:
    """What a run was designed to measure, written from its config before any array.

    Attributes:
        arms: the methods the config asked for.
        conditions: the conditions every arm is measured at, in key form (empty: none).
        seeds: the evaluation seeds, in the order of every array's first axis.
        examples: the number of evaluation examples per cell (None when it has no such axis).
        condition_seeds: condition (key form) -> its own seeds, for a condition measured on other seeds
            than ``seeds`` (a side arm run on fresh seeds): its arrays' first axis follows these instead.
    """

    arms: tuple[str, ...]
    conditions: tuple[str, ...] = ()
    seeds: tuple[int, ...] = ()
    examples: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    condition_seeds: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "arms", tuple(self.arms))
        object.__setattr__(self, "conditions", tuple(condition_name(c) for c in self.conditions))
        object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))
        for arm in self.arms:
            cell_key("m", arm)  # the same rule as the keys
        if len(set(self.arms)) != len(self.arms):
            raise ValueError(f"design arms repeat: {list(self.arms)}")
        own = {condition_name(c): tuple(int(s) for s in v) for c, v in self.condition_seeds.items()}
        if stray := sorted(set(own) - set(self.conditions)):
            raise ValueError(f"condition_seeds names conditions the design lacks: {stray}")
        object.__setattr__(self, "condition_seeds", own)

    def seeds_at(self, condition: float | int | str | None = None) -> tuple[int, ...]:
        """The seeds of the arrays at ``condition``, in order: its ``condition_seeds``, else ``seeds``."""
        return self.condition_seeds.get(condition_name(condition), self.seeds)

    def require(self, arm: str, condition: float | int | str | None = None) -> None:
        """Raise :class:`NotInRun` unless the design has ``arm`` (and ``condition``, when given)."""
        if arm not in self.arms:
            raise NotInRun(f"the run trained no {arm} arm (it trained {', '.join(self.arms)})")
        name = condition_name(condition)
        if name and name not in self.conditions:
            raise NotInRun(f"the run measured no condition {name} (it measured {', '.join(self.conditions)})")
        if name in self.condition_seeds and not self.condition_seeds[name]:
            raise NotInRun(f"the run measured condition {name} on no seeds")

    def to_dict(self) -> dict[str, Any]:
        """The record's JSON form (``condition_seeds`` only when a condition has its own seeds)."""
        d = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        own = d.pop("condition_seeds")
        return d | ({"condition_seeds": {c: list(v) for c, v in own.items()}} if own else {})

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Design:
        return cls(
            arms=tuple(d["arms"]),
            conditions=tuple(d.get("conditions", ())),
            seeds=tuple(d.get("seeds", ())),
            examples=d.get("examples"),
            extra=dict(d.get("extra", {})),
            condition_seeds=dict(d.get("condition_seeds", {})),
        )


class CellStore(Mapping[str, np.ndarray]):
    """The cell arrays of one run under :func:`cell_key` keys, with its :class:`Design`.

    A run fills it with :meth:`put` and writes it with :meth:`save`; claims and figures read it back with
    :meth:`load` and :meth:`get` / :meth:`compare`.
    """

    def __init__(self, design: Design, arrays: Mapping[str, Any] | None = None) -> None:
        self.design = design
        self._arrays: dict[str, np.ndarray] = {}
        for key, value in (arrays or {}).items():
            self._arrays[key] = np.asarray(value)

    # Mapping: the flat keys (what judge() receives as ``arrays``)
    def __getitem__(self, key: str) -> np.ndarray:
        return self._arrays[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def put(self, metric: str, arm: str, condition: float | int | str | None, values: Any) -> None:
        """Store ``values`` (``[seeds, ..., examples]``) for ``arm`` at ``condition`` (which the design has)."""
        self.design.require(arm, condition)
        values = np.asarray(values)
        seeds = self.design.seeds_at(condition)
        if seeds and values.shape[:1] != (len(seeds),):
            raise ValueError(
                f"{cell_key(metric, arm, condition)}: first axis {values.shape[:1]} is not the "
                f"{len(seeds)} seeds of the design"
            )
        self._arrays[cell_key(metric, arm, condition)] = values

    def get(self, metric: str, arm: str, condition: float | int | str | None = None) -> np.ndarray:
        """The array of ``metric`` for ``arm`` at ``condition``.

        Raises:
            NotInRun: the design has no such arm or condition.
            MissingArrays: the design has it, but the run saved no such array.
        """
        self.design.require(arm, condition)
        key = cell_key(metric, arm, condition)
        if key not in self._arrays:
            raise MissingArrays(f"{key} (the design has {arm}, but the run saved no such array)")
        return self._arrays[key]

    def compare(
        self,
        metric: str,
        a: str,
        b: str,
        at: float | int | str | None = None,
        *,
        label: str | None = None,
        reduce: Callable[[np.ndarray], np.ndarray] | None = None,
        dtype: Any = np.float64,
    ) -> Cells:
        """The paired cells of ``a − b`` on ``metric`` at condition ``at``: each arm's array as ``dtype``,
        mapped by ``reduce`` when given (e.g. a mean over a noise grid), labelled ``label`` (default: the
        condition's key form).

        Raises:
            NotInRun / MissingArrays: as :meth:`get`, for either arm.
        """
        cells_a = np.asarray(self.get(metric, a, at), dtype=dtype)
        cells_b = np.asarray(self.get(metric, b, at), dtype=dtype)
        if reduce is not None:
            cells_a, cells_b = reduce(cells_a), reduce(cells_b)
        return Cells(cells_a, cells_b, a, b, label if label is not None else condition_name(at))

    def save(self, run_dir: Path | str, *, writer: bool = True) -> Path:
        """Write :data:`CELLS_FILE` and :data:`DESIGN_FILE` under ``run_dir`` (only when ``writer``: rank 0).

        The design record is merged with the one the runner wrote from the config (:func:`record_design`):
        ValueError, and nothing written, when this store's arms, conditions or seeds differ from it."""
        run_dir = Path(run_dir)
        if writer:
            record = record_design(run_dir, self.design, write=False)  # refuses a store off its design
            save_arrays(run_dir / CELLS_FILE, **self._arrays)
            atomic_write_text(run_dir / DESIGN_FILE, json.dumps(record.to_dict(), indent=2) + "\n")
        return run_dir / CELLS_FILE

    @classmethod
    def load(cls, run_dir: Path | str) -> CellStore | None:
        """The store a run saved; None when the run has no design record (an older run: see its study's
        ``legacy.py``). A design record without the cells file loads as an empty store (every claim pends)."""
        run_dir = Path(run_dir)
        if not (run_dir / DESIGN_FILE).is_file():
            return None
        design = Design.from_dict(json.loads((run_dir / DESIGN_FILE).read_text()))
        path = run_dir / CELLS_FILE
        return cls(design, load_arrays(path) if path.is_file() else {})

    def metrics(self) -> list[str]:
        """The metric names the store holds, in first-stored order."""
        return list(dict.fromkeys(k.split("/", 1)[0] for k in self._arrays))

    def conditions(self, numeric: bool = False) -> list[Any]:
        """The design's conditions (as floats with ``numeric``)."""
        return [float(c) for c in self.design.conditions] if numeric else list(self.design.conditions)


def record_design(run_dir: Path | str, design: Design, *, write: bool = True) -> Design:
    """Write ``design`` as the run's :data:`DESIGN_FILE`, merged with the record already there: the runner
    writes the config's design before the run, the run's store its own when it saves. Both must name the
    same arms and conditions (in any order) and the same seeds (in order, ``condition_seeds`` too);
    ``extra`` is merged (``design``'s keys win) and ``examples`` is ``design``'s unless it has none. Returns
    the merged record (written only with ``write``).

    Raises:
        ValueError: ``design`` differs from the record in arms, conditions or seeds: the run measured
            something other than it was designed to.
    """
    path = Path(run_dir) / DESIGN_FILE
    if path.is_file():
        written = Design.from_dict(json.loads(path.read_text()))
        same = {
            "arms": set(design.arms) == set(written.arms),
            "conditions": set(design.conditions) == set(written.conditions),
            "seeds": design.seeds == written.seeds,
            "condition_seeds": design.condition_seeds == written.condition_seeds,
        }
        if differ := [name for name, ok in same.items() if not ok]:
            now, then = design.to_dict(), written.to_dict()  # condition_seeds only when a condition has them
            raise ValueError(
                f"{path}: the run measured {', '.join(f'{n} {now.get(n, {})}' for n in differ)}, but was "
                f"designed with {', '.join(f'{n} {then.get(n, {})}' for n in differ)}"
            )
        examples = design.examples if design.examples is not None else written.examples
        design = replace(design, examples=examples, extra={**written.extra, **design.extra})
    if write:
        atomic_write_text(path, json.dumps(design.to_dict(), indent=2) + "\n")
    return design


def stack_seeds(per_seed: Sequence[Any], dtype: Any = None) -> np.ndarray:
    """``[seeds, ...]`` from one array per seed."""
    return np.stack([np.asarray(x, dtype=dtype) for x in per_seed])


def load_store(
    run_dir: Path | str, legacy: Callable[[Path], CellStore | None] | None = None
) -> CellStore | dict:
    """What a study's ``claim_arrays(run_dir)`` hands the claims engine: the run's cell store; for a run
    saved before the store, ``legacy(run_dir)`` (the study's ``legacy.legacy_store``); ``{}`` when neither
    exists (no run yet: every claim pends). An empty store is falsy, so ``None`` is tested, not truth."""
    store = CellStore.load(run_dir)
    if store is None and legacy is not None:
        store = legacy(Path(run_dir)) or None
    return {} if store is None else store


def require_store(arrays: Mapping[str, Any]) -> CellStore:
    """``arrays`` as a :class:`CellStore`; MissingArrays (the row pends) when the run saved none."""
    if not isinstance(arrays, CellStore):
        raise MissingArrays(f"the cell store ({CELLS_FILE} and {DESIGN_FILE})")
    return arrays
