"""robust-sparse against the two papers: neither runs this combination (descent constraints with HORST as
the primal optimizer, then one-shot pruning), so its settings are set beside each paper's nearest one
(rendered into docs/results/robust-sparse.md by :mod:`descentlab.experiments.fidelity`)."""

from __future__ import annotations

from descentlab.report.fidelity import Deviation, Fidelity, NotTested, lagrangian, percent, seeds
from descentlab.train.recipe import with_overrides


def _constraint(c) -> str:
    label = next(m for m in c.methods if m.startswith("constrained"))
    return lagrangian(with_overrides(c.method, c.specs[label]).constraint)


DEVIATIONS = [
    Deviation("combination", "not run by either paper", lambda c: f"{', '.join(c.methods)}"),
    Deviation(
        "model and data",
        "constrained paper: DistilBERT / RoBERTa on IMDb, MNLI",
        lambda c: (
            f"{c.model}, {c.pooling} pooling; {c.data.name}, {c.data.n_train:,} training, {c.data.n_eval:,} test examples"
        ),
        "constrained paper, contribution 3",
    ),
    Deviation(
        "Lagrangian",
        "f_L + Σ_{l=1..L} λ_l (f_l − (1 − α_l) f_{l−1}), primal-dual",
        _constraint,
        "constrained paper, method",
    ),
    Deviation(
        "primal optimizer",
        "constrained paper: stochastic gradient descent on the Lagrangian",
        lambda c: f"{c.method.optimizer.name} α = {c.method.optimizer.alpha:g}, lr {c.method.optimizer.lr:g}",
        "constrained paper, Algorithm 1",
    ),
    Deviation(
        "pruning",
        "HORST paper: one-shot layer-wise magnitude pruning (GPT-2)",
        lambda c: f"one-shot, {c.pruning.scope}-wise, at {percent(c.pruning.sparsities)}",
        "HORST paper, language model results",
    ),
    Deviation(
        "noise",
        "Gaussian, uniform, discrete embedding noise, level γ",
        lambda c: (
            f"{', '.join(c.evaluation.kinds)} at γ ∈ {{{', '.join(f'{g:g}' for g in c.evaluation.gammas)}}} × embedding RMS"
        ),
    ),
    Deviation("seeds", "not stated", lambda c: seeds(c.seeds)),
]

NOT_TESTED: list[NotTested] = []

FIDELITY = Fidelity(DEVIATIONS, NOT_TESTED)
