"""The arrays a text-robustness run saves under its run directory, and how they are named and read back.

* ``arrays/accuracy.npz``: ``gammas`` and ``<method>__<kind>``: accuracy ``[seed, draw, γ]`` (the mean over
  the test reviews);
* ``arrays/examples.npz``: ``gammas`` and ``<method>__<kind>``: 0/1 correctness ``[seed, draw, γ, example]``;
* ``arrays/layer_loss.npz``: ``<method>``: the clean per-review loss read out at every layer
  ``[seed, L+1, example]``;
* ``arrays/lambda.npz``: ``<method>__steps`` ``[T]`` and ``<method>``: λ ``[seed, T, L]`` of every trained
  constrained method;
* ``arrays/lambda-selection.npz``, when the selection trained candidates: ``<method>__cand<i>__steps`` [T]
  and ``<method>__cand<i>``: λ [T, L] of each candidate's tuning run (validation only, tuning seed);
* ``arrays/erm-val-profile.npz``, when ERM trained on the tuning seed: ``profile`` [L+1], ERM's mean
  per-layer validation loss (the ``alpha_from=erm`` reference);
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

ACCURACY = "arrays/accuracy.npz"
EXAMPLES = "arrays/examples.npz"
LAYER_LOSS = "arrays/layer_loss.npz"
LAMBDA = "arrays/lambda.npz"
LAMBDA_SELECTION = "arrays/lambda-selection.npz"
ERM_VAL_PROFILE = "arrays/erm-val-profile.npz"
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


def example_arrays(correct: Mapping[str, Mapping[str, np.ndarray]], gammas: Sequence[float]) -> dict:
    """``arrays/examples.npz``: the γ grid and each method's correctness per kind."""
    out = {"gammas": np.asarray(gammas, dtype=np.float64)}
    out.update({f"{m}{SEP}{k}": v.astype(np.float32) for m, by in correct.items() for k, v in by.items()})
    return out


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
