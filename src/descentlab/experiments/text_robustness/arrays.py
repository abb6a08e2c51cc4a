"""The arrays a text-robustness run saves under its run directory, and how they are named and read back.

* the cell store (:mod:`descentlab.study.cells`: ``arrays/cells.npz`` and ``arrays/design.json``), what the
  claims and the per-review figures read: ``correct/<method>/<kind>``, 0/1 correctness
  ``[seed, draw, γ, example]``, and ``loss/<method>``, the clean per-review loss read out at every layer
  ``[seed, L+1, example]``. The design record holds the methods, the noise kinds (its conditions), the
  seeds, the number of test reviews, the γ grid (``extra["gammas"]``) and, when ERM trained on the tuning
  seed, ERM's mean per-layer validation loss (``extra["erm_val_profile"]`` [L+1], the ``alpha_from=erm``
  reference). Runs made before the store are read by :mod:`.legacy`;
* ``arrays/accuracy.npz``: ``gammas`` and ``<method>__<kind>``: accuracy ``[seed, draw, γ]`` (the mean over
  the test reviews);
* ``arrays/lambda.npz``: ``<method>__steps`` ``[T]`` and ``<method>``: λ ``[seed, T, L]`` of every trained
  constrained method;
* ``arrays/lambda-selection.npz``, when the selection trained candidates: ``<method>__cand<i>__steps`` [T]
  and ``<method>__cand<i>``: λ [T, L] of each candidate's tuning run (validation only, tuning seed);
* ``arrays/ldp.npz``, when the run evaluated the local-DP kinds: ``epsilons`` and ``<method>__<kind>``:
  correctness ``[seed, draw, ε, example]``.

Every method sees the same test reviews under the same noise (keyed by content) and shares the training
seeds, so a cell of one method pairs with the same cell of another.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from descentlab.io import load_arrays
from descentlab.robustness import RobustnessCurves
from descentlab.study.cells import CellStore, Design

CORRECT, LOSS = "correct", "loss"  # the cell store's metrics
ACCURACY = "arrays/accuracy.npz"
LAMBDA = "arrays/lambda.npz"
LAMBDA_SELECTION = "arrays/lambda-selection.npz"
LDP = "arrays/ldp.npz"
SEP = "__"  # "<method>__<kind>"


def load(run_dir: Path | str, name: str) -> dict[str, np.ndarray]:
    """The arrays of ``<run_dir>/<name>``; {} when the run did not save that file."""
    path = Path(run_dir) / name
    return load_arrays(path) if path.is_file() else {}


def by_method(arrays: Mapping[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """``{"<m>__<kind>": x}`` -> ``{m: {kind: x}}`` (names without the separator, such as the grid, are
    left out)."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for name, v in arrays.items():
        if SEP in name:
            method, kind = name.split(SEP, 1)
            out.setdefault(method, {})[kind] = v
    return out


def accuracy_arrays(curves: Mapping[str, RobustnessCurves]) -> dict[str, np.ndarray]:
    """``arrays/accuracy.npz``: the γ grid and each method's accuracies ``[seed, draw, γ]``."""
    gammas = next(iter(curves.values())).gammas
    out = {"gammas": np.asarray(gammas, dtype=np.float64)}
    out.update({f"{m}{SEP}{kind}": v for m, c in curves.items() for kind, v in c.values.items()})
    return out


def cell_store(
    curves: Mapping[str, RobustnessCurves],
    losses: Mapping[str, np.ndarray],
    *,
    seeds: Sequence[int],
    erm_val_profile: Sequence[float] | None,
) -> CellStore:
    """The claims' cells of a run: each method's correctness per noise kind (``curves``, kept per example)
    and its per-layer clean loss (``losses`` ``[seed, L+1, example]``), under the design record (module
    docs)."""
    first = next(iter(curves.values()))
    if first.examples is None:
        raise ValueError("the accuracy curves kept no per-example values (keep_examples=True)")
    extra: dict[str, Any] = {"gammas": [float(g) for g in first.gammas]}
    if erm_val_profile is not None:  # the monotone claim is untestable when ERM's own profile never rises
        extra["erm_val_profile"] = [float(v) for v in erm_val_profile]
    examples = int(next(iter(first.examples.values())).shape[-1])
    store = CellStore(Design(tuple(curves), tuple(first.examples), tuple(seeds), examples, extra))
    for m, c in curves.items():
        for kind, correct in (c.examples or {}).items():
            store.put(CORRECT, m, kind, np.asarray(correct, dtype=np.float32))
        store.put(LOSS, m, None, np.asarray(losses[m], dtype=np.float32))
    return store


def ldp_arrays(curves: Mapping[str, RobustnessCurves]) -> dict[str, np.ndarray]:
    """``arrays/ldp.npz``: the ε grid and each method's per-review correctness per local-DP kind."""
    first = next(iter(curves.values()))
    out = {"epsilons": np.asarray(first.gammas, dtype=np.float64)}
    for m, c in curves.items():
        if c.examples is None:
            raise ValueError(f"the ε curves of {m} kept no per-example values (keep_examples=True)")
        out.update({f"{m}{SEP}{kind}": v.astype(np.float32) for kind, v in c.examples.items()})
    return out


def lambda_arrays(
    outputs: Mapping[str, Sequence[Mapping[str, Any]]], frozen: Sequence[str]
) -> dict[str, np.ndarray]:
    """``arrays/lambda.npz``: ``<m>__steps`` [T] and ``<m>`` λ [seed, T, L] of every trained constrained
    method (seeds cut to the shortest trace)."""
    out = {}
    for m, outs in outputs.items():
        traces = [o["lambda_trace"] for o in outs]
        if m in frozen or not all(t and t["steps"] for t in traces):
            continue
        n = min(len(t["steps"]) for t in traces)
        out[f"{m}{SEP}steps"] = np.asarray(traces[0]["steps"][:n], dtype=np.float64)
        out[m] = np.asarray([t["lambda"][:n] for t in traces], dtype=np.float64)
    return out


def selection_lambda_arrays(scores: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, np.ndarray]:
    """``arrays/lambda-selection.npz``: ``<m>__cand<i>__steps`` [T] and ``<m>__cand<i>`` λ [T, L] of every
    constrained candidate's tuning run (``scores``: method -> each candidate's validation scores)."""
    out = {}
    for m, cands in scores.items():
        for i, s in enumerate(cands):
            trace = s.get("lambda_trace")
            if trace and trace["steps"]:
                out[f"{m}{SEP}cand{i}{SEP}steps"] = np.asarray(trace["steps"], dtype=np.float64)
                out[f"{m}{SEP}cand{i}"] = np.asarray(trace["lambda"], dtype=np.float64)
    return out
