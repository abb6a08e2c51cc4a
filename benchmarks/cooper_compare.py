"""descentlab's general constraint API side by side with Cooper 1.0.1 (``cooper-optim``) on three problems.

Each problem is solved twice from the same start, on the same batches, with the same primal and dual step
sizes: once with ``dl.ConstraintSet`` / ``dl.LayerwiseDescent`` under ``dl.PrimalDual``, once with Cooper's
``ConstrainedMinimizationProblem`` under its ``SimultaneousOptimizer`` (primal step and dual step from the same
point). Per problem the script prints

* agreement: the largest |difference| between the two runs' iterates (primal parameters and multipliers) over
  the whole trajectory, and what the solution is checked against;
* step time: the median wall time of one step of each library, measured in this process, the two libraries'
  steps interleaved (ours, Cooper's, ours, ...) after a warm-up that is not timed, and the ratio
  descentlab / Cooper (below 1: ours is faster).

The problems (their data are generated here, seeded; ``tests/constrained/test_cooper_compare.py`` imports
these builders and asserts the agreement within the tolerances stated there):

(a) ``qp``: a strongly convex QP in R^5 with 3 inequalities (one active at the optimum, two slack) and one
    equality; the optimum (θ*, λ*, μ*) comes from cvxpy (Clarabel, tolerances 1e-11). SGD primal, projected
    gradient ascent dual; float64.
(b) ``fairness``: logistic regression under demographic parity. Three groups; for each group z the positive
    prediction rate r_z = P(ŷ = 1 | z) must stay within ε = 0.05 of the overall rate r:
    r_z - r <= ε and r - r_z <= ε (6 inequalities). The primal sees a differentiable proxy (rates of
    sigmoid(logit)); the dual step reads the strict rates (of 1[logit > 0]), Cooper's ``strict_violation``.
    Mini-batches of 500 from a fixed, seeded order; SGD primal, SGD (maximize) dual; float64.
(c) ``descent``: the layer-wise descent constraint f_l <= (1 - α) f_{l-1} on a 4-layer BERT classifier built
    from a config (hidden 32, random weights), per-layer losses from ``dl.layer_losses``. AdamW primal, dual
    step 0.5; the model in float32, multipliers in float64 (Cooper sees ĝ in float64, ours rounds λ to f's
    float32 in the primal term, so the two runs agree to float32 rounding, not bit for bit).

Usage: python benchmarks/cooper_compare.py [--only qp|fairness|descent] [--repeats N] [--warmup N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import cooper
import torch

import descentlab as dl
from descentlab.constrained import (
    Constraint,
    ConstraintSet,
    ConstraintValue,
    LayerwiseDescent,
    PrimalDual,
    descent_violations,
)

Step = Callable[[], None]
Snapshot = Callable[[], torch.Tensor]


@dataclass
class Runner:
    """One library's run of a problem: ``step()`` takes one primal-dual step, ``snapshot()`` returns the
    iterate (primal parameters, then multipliers) as one flat float64 tensor."""

    step: Step
    snapshot: Snapshot
    model: torch.nn.Module | None = None


def trajectory(runner: Runner, steps: int) -> torch.Tensor:
    """The iterates after each of ``steps`` steps, [steps, size]."""
    rows = []
    for _ in range(steps):
        runner.step()
        rows.append(runner.snapshot())
    return torch.stack(rows)


def _cooper_constraint(kind: cooper.ConstraintType, n: int, dtype: torch.dtype) -> cooper.Constraint:
    return cooper.Constraint(
        constraint_type=kind,
        formulation_type=cooper.formulations.Lagrangian,
        multiplier=cooper.multipliers.DenseMultiplier(num_constraints=n, dtype=dtype),
    )


# -- (a) a convex QP with equality and inequality constraints -----------------------------------------------
@dataclass
class QP:
    """min ½ θᵀQθ + pᵀθ  s.t.  Aθ - b <= 0 (3 rows),  Eθ - d = 0 (1 row)."""

    Q: torch.Tensor
    p: torch.Tensor
    A: torch.Tensor
    b: torch.Tensor
    E: torch.Tensor
    d: torch.Tensor

    def objective(self, theta: torch.Tensor) -> torch.Tensor:
        return 0.5 * theta @ self.Q @ theta + self.p @ theta

    def ineq(self, theta: torch.Tensor) -> torch.Tensor:
        return self.A @ theta - self.b

    def eq(self, theta: torch.Tensor) -> torch.Tensor:
        return self.E @ theta - self.d


QP_LR, QP_DUAL_LR = 0.05, 0.2


def make_qp(seed: int = 3) -> QP:
    g = torch.Generator().manual_seed(seed)
    M = torch.randn(5, 5, generator=g, dtype=torch.float64)
    return QP(
        Q=M.T @ M / 5 + torch.eye(5, dtype=torch.float64),
        p=torch.randn(5, generator=g, dtype=torch.float64),
        A=torch.randn(3, 5, generator=g, dtype=torch.float64),
        b=torch.tensor([-0.5, 0.1, 2.0], dtype=torch.float64),
        E=torch.randn(1, 5, generator=g, dtype=torch.float64),
        d=torch.tensor([0.3], dtype=torch.float64),
    )


def qp_optimum(qp: QP) -> torch.Tensor:
    """(θ*, λ*, μ*) from cvxpy, flat, in the order of :func:`qp_ours`'s snapshot."""
    import cvxpy as cp

    Q, p, A, b, E, d = (t.numpy() for t in (qp.Q, qp.p, qp.A, qp.b, qp.E, qp.d))
    theta = cp.Variable(Q.shape[0])
    ineq, eq = A @ theta <= b, E @ theta == d
    prob = cp.Problem(cp.Minimize(0.5 * cp.quad_form(theta, Q) + p @ theta), [ineq, eq])
    prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)
    if prob.status != "optimal":
        raise RuntimeError(f"cvxpy did not solve the QP: {prob.status}")
    parts = (theta.value, ineq.dual_value, eq.dual_value)
    return torch.cat([torch.as_tensor(v, dtype=torch.float64).reshape(-1) for v in parts])


def qp_ours(qp: QP) -> Runner:
    theta = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    cs = ConstraintSet(
        [Constraint("ineq", 3, dual_lr=QP_DUAL_LR), Constraint("eq", 1, kind="equality", dual_lr=QP_DUAL_LR)]
    )
    opt = PrimalDual(torch.optim.SGD([theta], lr=QP_LR), cs, check_finite=False)

    def step() -> None:
        opt.zero_grad()
        cs.lagrangian(qp.objective(theta), ineq=qp.ineq(theta), eq=qp.eq(theta)).backward()
        opt.step()

    return Runner(step, lambda: torch.cat([theta.detach(), *cs.multipliers.values()]).clone())


class CooperQP(cooper.ConstrainedMinimizationProblem):
    def __init__(self, qp: QP) -> None:
        super().__init__()
        self.qp = qp
        self.ineq = _cooper_constraint(cooper.ConstraintType.INEQUALITY, 3, torch.float64)
        self.eq = _cooper_constraint(cooper.ConstraintType.EQUALITY, 1, torch.float64)

    def compute_cmp_state(self, theta: torch.Tensor) -> cooper.CMPState:
        observed = {
            self.ineq: cooper.ConstraintState(violation=self.qp.ineq(theta)),
            self.eq: cooper.ConstraintState(violation=self.qp.eq(theta)),
        }
        return cooper.CMPState(loss=self.qp.objective(theta), observed_constraints=observed)


def qp_cooper(qp: QP) -> Runner:
    theta = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    cmp = CooperQP(qp)
    opt = cooper.optim.SimultaneousOptimizer(
        cmp=cmp,
        primal_optimizers=torch.optim.SGD([theta], lr=QP_LR),
        dual_optimizers=torch.optim.SGD(cmp.dual_parameters(), lr=QP_DUAL_LR, maximize=True),
    )
    kwargs = {"theta": theta}

    def snapshot() -> torch.Tensor:
        lam = [cmp.ineq.multiplier.weight.detach(), cmp.eq.multiplier.weight.detach()]
        return torch.cat([theta.detach(), *lam]).clone()

    return Runner(lambda: opt.roll(compute_cmp_state_kwargs=kwargs), snapshot)


# -- (b) fairness-constrained logistic regression (demographic parity) --------------------------------------
GROUPS = 3
EPSILON = 0.05  # |r_z - r| <= ε
FAIR_LR, FAIR_DUAL_LR, FAIR_BATCH, FAIR_ADAM_LR = 1.0, 0.5, 500, 0.02


@dataclass
class FairnessData:
    """Features x (with the group's one-hot), labels y, group z, and a fixed order of mini-batches."""

    x: torch.Tensor  # [n, 6 + GROUPS] float64
    y: torch.Tensor  # [n] float64 in {0, 1}
    group: torch.Tensor  # [n] long in 0..GROUPS-1
    batches: list[torch.Tensor]  # index tensors, the same for both libraries


def make_fairness(n: int = 3000, epochs: int = 30, seed: int = 0) -> FairnessData:
    """Three groups (shares 0.5, 0.3, 0.2) whose base rates differ (a group bias in the label), so an
    unconstrained classifier predicts very different positive rates per group."""
    g = torch.Generator().manual_seed(seed)
    group = torch.multinomial(torch.tensor([0.5, 0.3, 0.2]), n, replacement=True, generator=g)
    shift = torch.tensor([[0.6, 0.0], [0.0, 0.0], [-0.6, 0.3]], dtype=torch.float64)
    features = torch.randn(n, 6, generator=g, dtype=torch.float64)
    features[:, :2] += shift[group]
    bias = torch.tensor([0.8, -0.2, -1.0], dtype=torch.float64)[group]
    score = features[:, 0] + 0.5 * features[:, 1] - 0.3 * features[:, 2] + bias
    y = (score + 0.5 * torch.randn(n, generator=g, dtype=torch.float64) > 0).double()
    x = torch.cat([features, torch.nn.functional.one_hot(group, GROUPS).double()], dim=1)
    batches = [b for _ in range(epochs) for b in torch.randperm(n, generator=g).split(FAIR_BATCH)]
    return FairnessData(x, y, group, batches)


def parity_gaps(rates: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """[r_z - r - ε for z] + [r - r_z - ε for z] (<= 0: met), from per-example rates (probabilities or 0/1).

    r_z is the mean rate over group z's examples, r over all of them (a group absent from the batch counts as
    meeting its constraints: its rate is taken to be r)."""
    onehot = torch.nn.functional.one_hot(group, GROUPS).to(rates.dtype)
    counts = onehot.sum(0)
    overall = rates.mean()
    per_group = torch.where(counts > 0, rates @ onehot / counts.clamp_min(1), overall)
    gap = per_group - overall
    return torch.cat([gap - EPSILON, -gap - EPSILON])


def fairness_state(model: torch.nn.Linear, data: FairnessData, idx: torch.Tensor):
    """(loss, proxy gaps, strict gaps) on the mini-batch ``idx``."""
    logits = model(data.x[idx]).squeeze(-1)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, data.y[idx])
    proxy = parity_gaps(torch.sigmoid(logits), data.group[idx])
    strict = parity_gaps((logits > 0).to(logits.dtype), data.group[idx]).detach()
    return loss, proxy, strict


def fairness_model() -> torch.nn.Linear:
    model = torch.nn.Linear(6 + GROUPS, 1).double()
    torch.nn.init.zeros_(model.weight)
    torch.nn.init.zeros_(model.bias)
    return model


def _batch_cycle(data: FairnessData) -> Callable[[], torch.Tensor]:
    state = {"i": 0}

    def next_batch() -> torch.Tensor:
        idx = data.batches[state["i"] % len(data.batches)]
        state["i"] += 1
        return idx

    return next_batch


def _flat(model: torch.nn.Module, *multipliers: torch.Tensor) -> torch.Tensor:
    parts = [p.detach().reshape(-1).double() for p in model.parameters()]
    return torch.cat([*parts, *(m.detach().reshape(-1).double() for m in multipliers)]).clone()


def _adam(params: list[torch.Tensor]) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=FAIR_ADAM_LR, maximize=True)


def fairness_ours(data: FairnessData, adam_dual: bool = False) -> Runner:
    """Projected ascent with step ``FAIR_DUAL_LR`` (the default dual step), or Adam on the multipliers."""
    model = fairness_model()
    dual = _adam if adam_dual else None
    cs = ConstraintSet([Constraint("parity", 2 * GROUPS, dual_lr=FAIR_DUAL_LR)], dual_optimizer=dual)
    opt = PrimalDual(torch.optim.SGD(model.parameters(), lr=FAIR_LR), cs, check_finite=False)
    next_batch = _batch_cycle(data)

    def step() -> None:
        opt.zero_grad()
        loss, proxy, strict = fairness_state(model, data, next_batch())
        cs.lagrangian(loss, parity=ConstraintValue(proxy, strict=strict)).backward()
        opt.step()

    return Runner(step, lambda: _flat(model, cs["parity"].multipliers), model)


class CooperFairness(cooper.ConstrainedMinimizationProblem):
    def __init__(self, data: FairnessData) -> None:
        super().__init__()
        self.data = data
        self.parity = _cooper_constraint(cooper.ConstraintType.INEQUALITY, 2 * GROUPS, torch.float64)

    def compute_cmp_state(self, model: torch.nn.Linear, idx: torch.Tensor) -> cooper.CMPState:
        loss, proxy, strict = fairness_state(model, self.data, idx)
        state = cooper.ConstraintState(violation=proxy, strict_violation=strict)
        return cooper.CMPState(loss=loss, observed_constraints={self.parity: state})


def fairness_cooper(data: FairnessData, adam_dual: bool = False) -> Runner:
    """Cooper's SGD (maximize) on the multipliers with ``FAIR_DUAL_LR``, or Adam."""
    model = fairness_model()
    cmp = CooperFairness(data)
    duals = list(cmp.dual_parameters())
    dual = _adam(duals) if adam_dual else torch.optim.SGD(duals, lr=FAIR_DUAL_LR, maximize=True)
    opt = cooper.optim.SimultaneousOptimizer(
        cmp=cmp, primal_optimizers=torch.optim.SGD(model.parameters(), lr=FAIR_LR), dual_optimizers=dual
    )
    next_batch = _batch_cycle(data)

    def step() -> None:
        opt.roll(compute_cmp_state_kwargs={"model": model, "idx": next_batch()})

    return Runner(step, lambda: _flat(model, cmp.parity.multiplier.weight), model)


def strict_parity_gap(model: torch.nn.Linear, data: FairnessData) -> float:
    """max_z |r_z - r| of the strict predictions on the whole data set."""
    with torch.no_grad():
        predicted = (model(data.x).squeeze(-1) > 0).double()
        return float(parity_gaps(predicted, data.group).max() + EPSILON)


def accuracy(model: torch.nn.Linear, data: FairnessData) -> float:
    with torch.no_grad():
        return float(((model(data.x).squeeze(-1) > 0).double() == data.y).double().mean())


def train_unconstrained(data: FairnessData, steps: int) -> torch.nn.Linear:
    """The same logistic regression without the constraints (the baseline whose gap the constraints close)."""
    model = fairness_model()
    opt = torch.optim.SGD(model.parameters(), lr=FAIR_LR)
    next_batch = _batch_cycle(data)
    for _ in range(steps):
        opt.zero_grad()
        fairness_state(model, data, next_batch())[0].backward()
        opt.step()
    return model


# -- (c) the layer-wise descent constraint on a small transformer -------------------------------------------
DESCENT_LAYERS, DESCENT_ALPHA, DESCENT_DUAL_LR, DESCENT_LR = 4, 0.05, 0.5, 1e-3


def descent_model() -> torch.nn.Module:
    """A 4-layer BERT sequence classifier from a config (hidden 32, 2 heads, vocabulary 97, no dropout)."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=97,
        hidden_size=32,
        num_hidden_layers=DESCENT_LAYERS,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=2,
        pad_token_id=0,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertForSequenceClassification(config)


def descent_batches(count: int = 8, batch: int = 16, length: int = 16) -> list[dict[str, torch.Tensor]]:
    """Token batches whose label is whether most tokens lie in the lower half of the vocabulary."""
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(count):
        ids = torch.randint(1, 97, (batch, length), generator=g)
        labels = ((ids < 49).double().mean(1) > 0.5).long()
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})
    return out


def descent_constraint() -> LayerwiseDescent:
    # every layer constrained, gradients through f_{l-1}: stated, so a change of the class's defaults does
    # not change this comparison
    return LayerwiseDescent(
        DESCENT_LAYERS,
        DESCENT_ALPHA,
        dual_lr=DESCENT_DUAL_LR,
        constrain_first=True,
        detach_prev=False,
        form="difference",
    )


def descent_ours(batches: list[dict[str, torch.Tensor]]) -> Runner:
    model = descent_model()
    model.train()
    constraint = descent_constraint()
    opt = PrimalDual(torch.optim.AdamW(model.parameters(), lr=DESCENT_LR), constraint, check_finite=False)
    state = {"i": 0}

    def step() -> None:
        batch = batches[state["i"] % len(batches)]
        state["i"] += 1
        opt.zero_grad()
        constraint.lagrangian(dl.layer_losses(model, batch)).backward()
        opt.step()

    return Runner(step, lambda: _flat(model, constraint.multipliers))


class CooperDescent(cooper.ConstrainedMinimizationProblem):
    def __init__(self) -> None:
        super().__init__()
        self.alpha = torch.full((DESCENT_LAYERS,), DESCENT_ALPHA, dtype=torch.float64)
        self.descent = _cooper_constraint(cooper.ConstraintType.INEQUALITY, DESCENT_LAYERS, torch.float64)

    def compute_cmp_state(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> cooper.CMPState:
        f = dl.layer_losses(model, batch)
        g = descent_violations(f, self.alpha).double()  # Cooper's einsum needs λ's dtype
        return cooper.CMPState(
            loss=f[-1], observed_constraints={self.descent: cooper.ConstraintState(violation=g)}
        )


def descent_cooper(batches: list[dict[str, torch.Tensor]]) -> Runner:
    model = descent_model()
    model.train()
    cmp = CooperDescent()
    opt = cooper.optim.SimultaneousOptimizer(
        cmp=cmp,
        primal_optimizers=torch.optim.AdamW(model.parameters(), lr=DESCENT_LR),
        dual_optimizers=torch.optim.SGD(cmp.dual_parameters(), lr=DESCENT_DUAL_LR, maximize=True),
    )
    state = {"i": 0}

    def step() -> None:
        batch = batches[state["i"] % len(batches)]
        state["i"] += 1
        opt.roll(compute_cmp_state_kwargs={"model": model, "batch": batch})

    return Runner(step, lambda: _flat(model, cmp.descent.multiplier.weight))


# -- measurement --------------------------------------------------------------------------------------------
def step_times(ours: Runner, theirs: Runner, repeats: int, warmup: int) -> tuple[float, float]:
    """Median seconds per step of each runner, steps interleaved, the first ``warmup`` of each untimed."""
    for _ in range(warmup):
        ours.step()
        theirs.step()
    a, b = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        ours.step()
        a.append(time.perf_counter() - start)
        start = time.perf_counter()
        theirs.step()
        b.append(time.perf_counter() - start)
    return statistics.median(a), statistics.median(b)


def agreement(name: str) -> dict[str, float]:
    """The agreement figures of one problem (the test asserts them against its tolerances)."""
    if name == "qp":
        qp = make_qp()
        mine, theirs = trajectory(qp_ours(qp), 3000), trajectory(qp_cooper(qp), 3000)
        return {
            "max |ours - Cooper| over 3000 steps": float((mine - theirs).abs().max()),
            "max |ours - cvxpy (θ*, λ*, μ*)| at step 3000": float((mine[-1] - qp_optimum(qp)).abs().max()),
        }
    if name == "fairness":
        data = make_fairness()
        steps = len(data.batches)
        ours = fairness_ours(data)
        mine, theirs = trajectory(ours, steps), trajectory(fairness_cooper(data), steps)
        adam_mine = trajectory(fairness_ours(data, adam_dual=True), steps)
        adam_theirs = trajectory(fairness_cooper(data, adam_dual=True), steps)
        plain = train_unconstrained(data, steps)
        return {
            f"max |ours - Cooper| over {steps} steps": float((mine - theirs).abs().max()),
            f"same, Adam as the dual optimizer, {steps} steps": float((adam_mine - adam_theirs).abs().max()),
            "max_z |r_z - r|, strict, constrained (ε = 0.05)": strict_parity_gap(ours.model, data),
            "max_z |r_z - r|, strict, unconstrained": strict_parity_gap(plain, data),
            "accuracy, constrained": accuracy(ours.model, data),
            "accuracy, unconstrained": accuracy(plain, data),
        }
    batches = descent_batches()
    mine, theirs = trajectory(descent_ours(batches), 24), trajectory(descent_cooper(batches), 24)
    lam = slice(-DESCENT_LAYERS, None)
    return {
        "max |ours - Cooper| weights over 24 steps": float(
            (mine[:, : lam.start] - theirs[:, : lam.start]).abs().max()
        ),
        "max |ours - Cooper| λ over 24 steps": float((mine[:, lam] - theirs[:, lam]).abs().max()),
        "max λ at step 24": float(mine[-1, lam].max()),
    }


BUILDERS: dict[str, Callable[[], tuple[Runner, Runner]]] = {
    "qp": lambda: (qp_ours(make_qp()), qp_cooper(make_qp())),
    "fairness": lambda: (fairness_ours(d := make_fairness()), fairness_cooper(d)),
    "descent": lambda: (descent_ours(b := descent_batches()), descent_cooper(b)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(BUILDERS), action="append")
    parser.add_argument("--repeats", type=int, default=200, help="timed steps per library")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps per library first")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"torch {torch.__version__}, cooper {cooper.__version__ if hasattr(cooper, '__version__') else '?'}, "
        f"descentlab {dl.__version__}, 1 thread"
    )
    rows = []
    for name in args.only or list(BUILDERS):
        figures = agreement(name)
        ours, theirs = BUILDERS[name]()
        t_ours, t_cooper = step_times(ours, theirs, args.repeats, args.warmup)
        rows.append((name, t_ours, t_cooper, figures))
    print(f"\n{'problem':<10} {'descentlab ms':>14} {'Cooper ms':>10} {'ratio':>6}")
    for name, t_ours, t_cooper, _ in rows:
        print(f"{name:<10} {1e3 * t_ours:>14.3f} {1e3 * t_cooper:>10.3f} {t_ours / t_cooper:>6.2f}")
    print(
        f"(median of {args.repeats} interleaved steps each, after {args.warmup} untimed; ratio = descentlab / Cooper)"
    )
    for name, _, _, figures in rows:
        print(f"\n{name}:")
        for key, value in figures.items():
            print(f"  {key:<52} {value:.3g}")


if __name__ == "__main__":
    main()
