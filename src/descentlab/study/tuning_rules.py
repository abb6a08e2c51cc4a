"""The checks and choice rules of the tuning protocol: a tuning seed that is never an evaluation seed, equal
tuning budgets for compared methods, and the rules that pick a constrained candidate on validation.

The planner that tunes then replicates is :func:`descentlab.study.tuning.tune_then_replicate`; it uses these
checks. No tuning run is reported as an evaluation run: a tuning run's validation score picked its
candidate, so its test numbers would be a draw selected for its luck. Every compared method gets the same
number of candidates (:func:`check_equal_budgets`).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence, Sized
from dataclasses import dataclass, field, replace
from typing import Any

from descentlab.errors import ConfigError
from descentlab.train.recipe import MethodConfig

__all__ = [
    "CandidateSelection",
    "binding_level",
    "candidate_methods",
    "check_equal_budgets",
    "check_tune_seed",
    "choose_candidate",
    "lr_alpha_grid",
    "settings_diff",
    "with_reference",
]


def check_tune_seed(tune_seed: int, *evaluation_seeds: Sequence[int]) -> None:
    """Raise ConfigError when ``tune_seed`` is one of the evaluation seeds (each list in ``evaluation_seeds``).

    A candidate is chosen because its tuning run scored well on validation; that run's test numbers share
    the luck that chose it, so the tuning seed never trains a reported model.
    """
    used = sorted({s for seeds in evaluation_seeds for s in seeds})
    if tune_seed in used:
        raise ConfigError(
            f"tune_seed={tune_seed} is also an evaluation seed {used}: tuning seeds are never evaluation "
            f"seeds; choose another, e.g. tune_seed={max(used) + 1000}"
        )


def check_equal_budgets(grids: Mapping[Hashable, Sized]) -> int:
    """The number of tuning candidates every compared method gets; ConfigError unless it is the same for all.

    Args:
        grids: method -> its candidates (anything with a length), one entry per compared method.

    A method tuned over more candidates has more chances of a lucky validation score, so a comparison of
    methods tuned on grids of different sizes favours the larger grid.
    """
    counts = {m: len(c) for m, c in grids.items()}
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{m}: {n}" for m, n in counts.items())
        raise ConfigError(
            f"unequal tuning budgets ({listed} candidates): every compared method must get the same number "
            "of candidates"
        )
    return next(iter(counts.values()), 0)


def lr_alpha_grid(method: MethodConfig, lrs: Sequence[float], alphas: Sequence[float]) -> list[MethodConfig]:
    """``method`` at every (lr, α) of ``lrs`` × ``alphas``, lr-major; an empty ``alphas`` keeps the
    optimizer's own α (one candidate per lr)."""
    alphas = list(alphas) or [method.optimizer.alpha]
    return [
        replace(method, optimizer=replace(method.optimizer, lr=lr, alpha=a)) for lr in lrs for a in alphas
    ]


def candidate_methods(label: str, method: MethodConfig, selection: Any) -> list[MethodConfig]:
    """``method`` with each of its selection candidates applied to its constraint (one, itself, if none)."""
    if not method.constrained:
        return [method]
    out = []
    for spec in selection.candidates.get(label, [""]):
        try:
            out.append(replace(method, constraint=method.constraint.with_overrides(spec)))
        except ConfigError as e:
            raise ConfigError(f"bad selection candidate {spec!r} of {label}: {e}") from None
    return out


def binding_level(steps: Sequence[float], multipliers: Sequence[Sequence[float]]) -> float:
    """How hard a constraint bound in one training run: the time-average of Σ_l λ_l over its second half.

    With λ_l(t) logged at steps t_1 < ... < t_n (``multipliers[i]`` = λ_1..λ_L at ``steps[i]``) and T = t_n
    the last step,

        B = mean_{i : t_i > T/2} Σ_l λ_l(t_i),

    0 for a run with no trace. λ >= 0 grows only while a constraint is violated (λ ← [λ + η_λ ĝ]_+), so B > 0
    says that the constraints were still active after the first half of training; a λ that rose early and
    decayed back to 0 (a constraint met once the model fits) gives B = 0.
    """
    if len(steps) != len(multipliers):
        raise ValueError(f"binding_level: {len(steps)} steps but {len(multipliers)} multiplier rows")
    if not len(steps):
        return 0.0
    half = float(steps[-1]) / 2.0
    late = [sum(float(x) for x in lam) for t, lam in zip(steps, multipliers, strict=True) if float(t) > half]
    return sum(late) / len(late) if late else 0.0


def choose_candidate(
    method: str,
    candidates: Sequence[str],
    scores: Sequence[Mapping[str, float]],
    erm_clean: float | None,
    *,
    criterion: str = "robust",
    max_clean_drop: float = 0.01,
    min_binding: float | None = None,
) -> tuple[int, list[list[Any]], str]:
    """Pick a candidate from its validation numbers ``{"clean": .., "robust": .., "binding": ..}``.

    With ``min_binding`` set, only candidates whose constraint binds are eligible: ``binding``
    (:func:`binding_level` of the candidate's own tuning run) > ``min_binding``. If none binds, the reason
    says so and every candidate goes on to the usual rule. The usual rule: candidates whose clean validation
    accuracy is within ``max_clean_drop`` of ERM's come first; among them the highest ``criterion`` score
    wins (ties: higher clean accuracy, then the earlier candidate). If none is within the margin, the same
    order applies to all. Returns (index, selection-table rows, reason).
    """
    key = "robust" if criterion == "robust" else "clean"
    binds = [min_binding is None or s.get("binding", 0.0) > min_binding for s in scores]
    pool = [i for i, b in enumerate(binds) if b] or list(range(len(scores)))
    ranked = {
        i: (erm_clean is None or scores[i]["clean"] >= erm_clean - max_clean_drop, scores[i][key],
            scores[i]["clean"], -i)
        for i in pool
    }  # fmt: skip
    best = max(pool, key=lambda i: ranked[i])
    rows = [
        [method, c or "(defaults)", s["clean"], s["robust"], s.get("binding", ""), "yes" if i == best else ""]
        for i, (c, s) in enumerate(zip(candidates, scores, strict=True))
    ]
    what = "mean accuracy over the gaussian γ grid" if key == "robust" else "clean accuracy"
    eligible = "" if ranked[best][0] else " (no candidate was within the clean-accuracy margin)"
    bound = ""
    if min_binding is not None:
        n_bind = sum(binds)
        bound = (
            f"{n_bind} of {len(scores)} candidates bind (time-average of Σλ over the second half of training "
            f"> {min_binding:g}); "
            if n_bind
            else f"no candidate binds (time-average of Σλ over the second half of training <= {min_binding:g} "
            "for all), so the usual rule chose among all; "
        )
    among = "binding candidates" if min_binding is not None and any(binds) else "candidates"
    why = (
        f"{bound}highest validation {what} among {among} within {max_clean_drop} clean accuracy of ERM"
        f"{eligible}: {candidates[best] or '(defaults)'!r}"
    )
    return best, rows, why


def settings_diff(settings: Mapping[str, Any], base: Mapping[str, Any]) -> str:
    """The entries of ``settings`` that differ from ``base``, as ``key=value`` words ("nothing" if none)."""
    return " ".join(f"{k}={v}" for k, v in settings.items() if base.get(k) != v) or "nothing"


@dataclass
class CandidateSelection:
    """Validation-split choice of the constrained settings (on the study's tuning seed only), never on test.

    Attributes:
        candidates: method -> DescentConfig override specs (e.g. ``"alpha_from=erm"``), applied to that
            method's own constraint; a method without an entry has the one candidate ``""``.
        follow: method -> the method whose chosen spec it takes (applied to its own constraint), e.g. the
            resilient method takes the constrained method's choice and keeps its resilience.
        criterion: ``robust``: validation accuracy averaged over the gaussian γ grid; ``clean``: clean accuracy.
        max_clean_drop: candidates losing more clean validation accuracy than this vs ERM are a last resort.
        draws: noise realisations of the validation curve.
        min_binding: when set, a candidate is eligible only if its constraint binds on its own tuning run:
            :func:`binding_level` (the time-average of Σ_l λ_l over the second half of training) >
            ``min_binding``; None: not enforced. When no candidate binds, the usual rule picks among all.
    """

    candidates: dict[str, list[str]] = field(default_factory=lambda: {"constrained": ["", "alpha_from=erm"]})
    follow: dict[str, str] = field(default_factory=lambda: {"resilient": "constrained"})
    criterion: str = "robust"
    max_clean_drop: float = 0.01
    draws: int = 1
    min_binding: float | None = None

    def __post_init__(self) -> None:
        if self.min_binding is not None and not self.min_binding >= 0:
            raise ConfigError(f"selection.min_binding must be >= 0 or null, got {self.min_binding}")


def with_reference(method: MethodConfig, reference: list[float] | None) -> MethodConfig:
    """``method`` with ``alpha_from=erm`` resolved into ``alpha_reference`` (unchanged otherwise)."""
    c = method.constraint
    if not method.constrained or c.alpha_from != "erm" or c.alpha_reference is not None:
        return method
    if reference is None:
        raise ConfigError("alpha_from=erm: the ERM validation profile is missing")
    return replace(method, constraint=replace(c, alpha_reference=list(reference)))
