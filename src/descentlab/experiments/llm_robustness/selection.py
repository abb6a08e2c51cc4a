"""llm-robustness's selection: each constrained method's candidates, fine-tuned on the tuning seed, scored on
validation against ERM's tuning run, and the choice between them.

A candidate ``c`` of method ``m`` gets three scores (:func:`candidate_score`), from the validation outcomes of
its run against ERM's run on the tuning seed ``t`` (lower reference NLL wins, ties split):

* clean: its win rate ``w_c(0)`` on clean validation examples;
* robust: ``(1/K) Σ_k w_c(x_k)``, the mean win rate over the ``K`` positive levels of ``grid.profile_kind``;
* binding: ``Σ_l λ_l`` time-averaged over the second half of its training
  (:func:`~descentlab.train.tuning.binding_level`).

:func:`~descentlab.train.tuning.choose_candidate` then keeps the candidates that bind (with
``selection.min_binding``), of those the ones whose clean win rate is ``>= 50 % - max_clean_drop``, and
picks the highest ``selection.criterion`` score. Every function here is pure: the job graph runs
:func:`choose` as a step once its inputs are done, and :func:`selection_record` gathers the choices after.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from descentlab.experiments.llm_robustness.config import LlmRobustnessConfig
from descentlab.experiments.llm_robustness.headtohead import seed_outcomes
from descentlab.experiments.llm_robustness.jobs import run_tag, validation_levels
from descentlab.train.tuning import binding_level, choose_candidate


def tuned_methods(cfg: LlmRobustnessConfig) -> list[str]:
    """The methods with more than one candidate, in config order: only these are tuned."""
    return [m for m in cfg.methods if len(cfg.candidates(m)) > 1]


def candidate_tags(cfg: LlmRobustnessConfig, label: str) -> list[str]:
    """The run tags of ``label``'s candidates on the tuning seed, in candidate order."""
    return [run_tag(label, cfg.tune_seed, i) for i in range(len(cfg.candidates(label)))]


def win_rate(cfg: LlmRobustnessConfig, mine: Mapping, erm: Mapping, level: float) -> float:
    """A candidate's validation win rate against ERM's tuning run at one ``grid.profile_kind`` level."""
    kind, sel = cfg.grid.profile_kind, cfg.selection
    return float(seed_outcomes([mine], [erm], kind, level, draws=sel.draws, tol=cfg.eval.tie_tol).mean())


def candidate_score(
    cfg: LlmRobustnessConfig, mine: Mapping, erm: Mapping, levels: Sequence[float], facts: Mapping
) -> dict[str, float]:
    """``{"clean", "robust", "binding"}`` of one candidate: its validation outcomes ``mine`` against ERM's
    ``erm``, ``levels`` the validation levels of ``grid.profile_kind``, ``facts`` its fine-tune's record."""
    trace = facts.get("lambda_trace")
    return {
        "clean": win_rate(cfg, mine, erm, 0.0),
        "robust": float(np.mean([win_rate(cfg, mine, erm, x) for x in levels if x > 0])),
        "binding": binding_level(trace["steps"], trace["lambda"]) if trace else 0.0,
    }


def choose(cfg: LlmRobustnessConfig, label: str, done: Mapping[str, Any]) -> dict[str, Any]:
    """``label``'s choice from the finished jobs ``done``: ``{"best", "spec", "scores", "rows", "reason"}``
    (``rows`` are :func:`~descentlab.train.tuning.choose_candidate`'s selection rows)."""
    sel, specs = cfg.selection, cfg.candidates(label)
    levels = validation_levels(cfg, done["grid"])[cfg.grid.profile_kind]
    erm = done[f"validate-{run_tag(cfg.baseline, cfg.tune_seed)}"]
    scores = [
        candidate_score(cfg, done[f"validate-{tag}"], erm, levels, done[f"train-{tag}"])
        for tag in candidate_tags(cfg, label)
    ]
    rule = {"criterion": sel.criterion, "min_binding": sel.min_binding}
    best, rows, _ = choose_candidate(label, specs, scores, 0.5, max_clean_drop=sel.max_clean_drop, **rule)
    reason = selection_reason(label, specs, rows, best, margin=sel.max_clean_drop, **rule)
    return {"best": best, "spec": specs[best], "scores": scores, "rows": rows, "reason": reason}


def selection_reason(
    label: str,
    specs: list[str],
    rows: list[list[Any]],
    best: int,
    *,
    criterion: str,
    margin: float,
    min_binding: float | None,
) -> str:
    """Why :func:`~descentlab.train.tuning.choose_candidate` chose ``specs[best]``, in win-rate words (its
    own reason speaks of accuracy). ``rows``: its selection rows ``[method, spec, clean, robust, binding,
    chosen]``, the scores being validation win rates against ERM's tuning run."""
    binds = [r for r in rows if min_binding is None or (isinstance(r[4], int | float) and r[4] > min_binding)]
    pool = binds or rows
    within = [r for r in pool if r[2] >= 0.5 - margin]
    what = (
        "win rate under noise (mean over the gaussian levels)" if criterion == "robust" else "clean win rate"
    )
    parts = [
        f"{label}: {len(within)} of {len(pool)} candidates within {100 * margin:g} points of ERM's clean 50 %"
    ]
    if min_binding is not None:
        parts.insert(
            0,
            f"{label}: {len(binds)} of {len(rows)} candidates bind (Σλ over the second half > {min_binding:g})"
            if binds
            else f"{label}: no candidate binds (Σλ over the second half <= {min_binding:g}), so all take part",
        )
    rule = f"the highest validation {what} among them" if within else f"none is, so the highest {what} of all"
    return "; ".join(parts) + f"; {rule}: {specs[best] or '(as configured)'!r}"


def selection_record(cfg: LlmRobustnessConfig, done: Mapping[str, Any], examples: int) -> dict[str, Any]:
    """The ``selection`` of ``results.json``: ERM's tuning run and, when a method is tuned, every choice
    (its candidates, scores, rows, reason) and every candidate's fine-tune, on ``examples`` validation
    examples."""
    erm_run = done[f"train-{run_tag(cfg.baseline, cfg.tune_seed)}"]
    tuned = tuned_methods(cfg)
    if not tuned:
        return {"tune_seed": cfg.tune_seed, "erm_tuning_run": erm_run}
    choices = {m: done[f"choose-{m}"] for m in tuned}
    return {
        "tune_seed": cfg.tune_seed,
        "examples": examples,
        "candidates": {m: cfg.candidates(m) for m in tuned},
        "chosen": {m: c["spec"] for m, c in choices.items()},
        "reasons": {m: c["reason"] for m, c in choices.items()},
        "scores": {m: c["scores"] for m, c in choices.items()},
        "rows": [row for c in choices.values() for row in c["rows"]],
        "erm_tuning_run": erm_run,
        "candidate_runs": {m: [done[f"train-{t}"] for t in candidate_tags(cfg, m)] for m in tuned},
    }


__all__ = [
    "candidate_score",
    "candidate_tags",
    "choose",
    "selection_reason",
    "selection_record",
    "tuned_methods",
    "win_rate",
]
