"""The general constraint API (Constraint / ConstraintSet) against cvxpy's KKT point and Cooper 1.0's iterates.

The QP (θ ∈ R^5, strongly convex; with this seed one inequality is active (λ* = 0.755) and two are slack; one
equality)::

    min ½ θᵀQθ + pᵀθ    s.t.   Aθ - b <= 0   (3 rows),   Eθ - d = 0   (1 row)
"""

from __future__ import annotations

from dataclasses import dataclass

import cooper
import cvxpy as cp
import numpy as np
import pytest
import torch

import descentlab as dl
from descentlab.constrained import (
    Constraint,
    ConstraintSet,
    ConstraintValue,
    LayerwiseDescent,
    PrimalDual,
    Resilience,
    descent_violations,
)
from descentlab.errors import ConfigError, ModelError, NumericalError


@dataclass
class QP:
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

    def solve(self, penalty: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """θ*, λ* (inequalities), μ* (equality); with a penalty, the minimiser of the quadratic-penalty problem."""
        Q, p, A, b, E, d = (t.numpy() for t in (self.Q, self.p, self.A, self.b, self.E, self.d))
        theta = cp.Variable(Q.shape[0])
        f = 0.5 * cp.quad_form(theta, Q) + p @ theta
        if penalty is not None:
            f = f + 0.5 * penalty * (cp.sum_squares(cp.pos(A @ theta - b)) + cp.sum_squares(E @ theta - d))
            cp.Problem(cp.Minimize(f)).solve(solver=cp.CLARABEL, tol_gap_abs=1e-11, tol_gap_rel=1e-11)
            return theta.value, np.zeros(3), np.zeros(1)
        ineq, eq = A @ theta <= b, E @ theta == d
        prob = cp.Problem(cp.Minimize(f), [ineq, eq])
        prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-11, tol_gap_rel=1e-11, tol_feas=1e-11)
        assert prob.status == "optimal"
        return theta.value, np.asarray(ineq.dual_value), np.asarray(eq.dual_value).reshape(-1)


@pytest.fixture(scope="module")
def qp() -> QP:
    g = torch.Generator().manual_seed(3)
    M = torch.randn(5, 5, generator=g, dtype=torch.float64)
    return QP(
        Q=M.T @ M / 5 + torch.eye(5, dtype=torch.float64),
        p=torch.randn(5, generator=g, dtype=torch.float64),
        A=torch.randn(3, 5, generator=g, dtype=torch.float64),
        b=torch.tensor([-0.5, 0.1, 2.0], dtype=torch.float64),
        E=torch.randn(1, 5, generator=g, dtype=torch.float64),
        d=torch.tensor([0.3], dtype=torch.float64),
    )


def kkt_residual(qp: QP, theta: torch.Tensor, lam: torch.Tensor, mu: torch.Tensor) -> float:
    """max of |∇_θ L|, max(0, g), |h|, |λ g|, max(0, -λ): zero exactly at a KKT point."""
    grad = qp.Q @ theta + qp.p + qp.A.T @ lam + qp.E.T @ mu
    g, h = qp.ineq(theta), qp.eq(theta)
    parts = [grad.abs(), g.clamp_min(0), h.abs(), (lam * g).abs(), (-lam).clamp_min(0)]
    return float(torch.cat(parts).max())


def qp_set(
    formulation: str = "lagrangian", dual_lr: float = 0.2, penalty: float | None = None, **kw
) -> ConstraintSet:
    return ConstraintSet(
        [
            Constraint("ineq", 3, formulation=formulation, dual_lr=dual_lr, penalty=penalty),
            Constraint("eq", 1, kind="equality", formulation=formulation, dual_lr=dual_lr, penalty=penalty),
        ],
        **kw,
    )


def run_ours(qp: QP, cs: ConstraintSet, steps: int, lr: float = 0.05, closure: bool = False):
    theta = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    opt = PrimalDual(torch.optim.SGD([theta], lr=lr), cs)
    history = []

    def step_closure() -> torch.Tensor:
        opt.zero_grad()
        loss = cs.lagrangian(qp.objective(theta), ineq=qp.ineq(theta), eq=qp.eq(theta))
        loss.backward()
        return loss

    for _ in range(steps):
        if closure:
            opt.step(step_closure)
        else:
            step_closure()
            opt.step()
        lam = [m.clone() for m in cs.multipliers.values()]
        history.append(torch.cat([theta.detach().clone(), *lam]))
    return theta.detach(), torch.stack(history)


# -- cvxpy: the KKT point ------------------------------------------------------------------------------------
def test_lagrangian_reaches_the_kkt_point_of_cvxpy(qp) -> None:
    theta_star, lam_star, mu_star = qp.solve()
    assert (lam_star > 1e-3).sum() >= 1 and (lam_star < 1e-9).sum() >= 1  # active and slack inequalities
    cs = qp_set()
    theta, _ = run_ours(qp, cs, steps=3000)
    lam, mu = cs["ineq"].multipliers, cs["eq"].multipliers
    np.testing.assert_allclose(theta.numpy(), theta_star, atol=1e-7)
    np.testing.assert_allclose(lam.numpy(), lam_star, atol=1e-7)
    np.testing.assert_allclose(mu.numpy(), mu_star, atol=1e-7)
    assert kkt_residual(qp, theta, lam, mu) < 1e-7


def test_augmented_lagrangian_reaches_the_same_kkt_point(qp) -> None:
    theta_star, lam_star, mu_star = qp.solve()
    cs = qp_set("augmented_lagrangian", dual_lr=1.0, penalty=1.0)  # method of multipliers: η = ρ
    theta, _ = run_ours(qp, cs, steps=3000)
    np.testing.assert_allclose(theta.numpy(), theta_star, atol=1e-7)
    np.testing.assert_allclose(cs["ineq"].multipliers.numpy(), lam_star, atol=1e-7)
    np.testing.assert_allclose(cs["eq"].multipliers.numpy(), mu_star, atol=1e-7)
    assert kkt_residual(qp, theta, cs["ineq"].multipliers, cs["eq"].multipliers) < 1e-7


def test_quadratic_penalty_reaches_the_penalised_minimiser(qp) -> None:
    theta_pen, _, _ = qp.solve(penalty=10.0)
    cs = qp_set("quadratic_penalty", penalty=10.0)
    assert cs.dual_parameters() == []
    theta, _ = run_ours(qp, cs, steps=4000, lr=0.02)
    np.testing.assert_allclose(theta.numpy(), theta_pen, atol=1e-6)
    theta_star, _, _ = qp.solve()
    assert np.abs(theta.numpy() - theta_star).max() > 1e-3  # a finite penalty is not the constrained optimum


# -- Cooper 1.0: the same iterates ---------------------------------------------------------------------------
class CooperQP(cooper.ConstrainedMinimizationProblem):
    def __init__(self, qp: QP, formulation: type, penalty: float | None = None) -> None:
        super().__init__()
        self.qp = qp

        def make(kind: cooper.ConstraintType, n: int) -> cooper.Constraint:
            pc = None
            if penalty is not None:
                pc = cooper.penalty_coefficients.DensePenaltyCoefficient(
                    torch.tensor(penalty, dtype=torch.float64)
                )
            mult = None
            if formulation is not cooper.formulations.QuadraticPenalty:
                mult = cooper.multipliers.DenseMultiplier(num_constraints=n, dtype=torch.float64)
            return cooper.Constraint(
                constraint_type=kind, formulation_type=formulation, multiplier=mult, penalty_coefficient=pc
            )

        self.ineq = make(cooper.ConstraintType.INEQUALITY, 3)
        self.eq = make(cooper.ConstraintType.EQUALITY, 1)

    def compute_cmp_state(self, theta: torch.Tensor) -> cooper.CMPState:
        q = self.qp
        observed = {
            self.ineq: cooper.ConstraintState(violation=q.ineq(theta)),
            self.eq: cooper.ConstraintState(violation=q.eq(theta)),
        }
        return cooper.CMPState(loss=q.objective(theta), observed_constraints=observed)


def run_cooper(qp, cmp, steps, dual_factory, primal_cls=torch.optim.SGD, optimizer_cls=None, lr=0.05):
    theta = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    optimizer_cls = optimizer_cls or cooper.optim.SimultaneousOptimizer
    coop = optimizer_cls(
        cmp=cmp,
        primal_optimizers=primal_cls([theta], lr=lr),
        dual_optimizers=dual_factory(list(cmp.dual_parameters())),
    )
    history = []
    for _ in range(steps):
        coop.roll(compute_cmp_state_kwargs={"theta": theta})
        lam = [cmp.ineq.multiplier.weight.detach().clone(), cmp.eq.multiplier.weight.detach().clone()]
        history.append(torch.cat([theta.detach().clone(), *lam]))
    return torch.stack(history)


@pytest.mark.parametrize(
    "name, ours, coop",
    [
        ("lagrangian + SGD", {}, lambda ps: torch.optim.SGD(ps, lr=0.2, maximize=True)),
        ("lagrangian + Adam", {"adam": True}, lambda ps: torch.optim.Adam(ps, lr=0.02, maximize=True)),
        (
            "augmented lagrangian",
            {"formulation": "augmented_lagrangian", "penalty": 1.0},
            lambda ps: torch.optim.SGD(ps, lr=1.0, maximize=True),
        ),
    ],
)
def test_cooper_gives_the_same_iterates(qp, name, ours, coop) -> None:
    steps = 200
    formulation = ours.get("formulation", "lagrangian")
    penalty = ours.get("penalty")
    dual = (lambda ps: torch.optim.Adam(ps, lr=0.02, maximize=True)) if ours.get("adam") else None
    if formulation == "augmented_lagrangian":
        cs = qp_set(formulation, dual_lr=1.0, penalty=penalty, dual_optimizer=dual)
        cooper_formulation = cooper.formulations.AugmentedLagrangian
    else:
        cs = qp_set(dual_optimizer=dual)
        cooper_formulation = cooper.formulations.Lagrangian
    _, mine = run_ours(qp, cs, steps)
    theirs = run_cooper(qp, CooperQP(qp, cooper_formulation, penalty), steps, coop)
    assert mine[-1, 5:8].max() > 0.1 and mine[-1, 8].abs() > 0.01  # multipliers far from their start
    np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=0, atol=1e-12, err_msg=name)


def test_extragradient_matches_coopers_extrapolation_optimizer(qp) -> None:
    steps = 150
    _, mine = run_ours(qp, qp_set(extragradient=True), steps, closure=True)
    theirs = run_cooper(
        qp,
        CooperQP(qp, cooper.formulations.Lagrangian),
        steps,
        lambda ps: cooper.optim.ExtraSGD(ps, lr=0.2, maximize=True),
        primal_cls=cooper.optim.ExtraSGD,
        optimizer_cls=cooper.optim.ExtrapolationConstrainedOptimizer,
    )
    np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=0, atol=1e-12)
    # and with Cooper's ExtraSGD as our dual optimizer (its own extrapolation()) the iterates are the same
    dual = ConstraintSet(
        [Constraint("ineq", 3), Constraint("eq", 1, kind="equality")],
        lambda ps: cooper.optim.ExtraSGD(ps, lr=0.2, maximize=True),
        extragradient=True,
    )
    _, with_extra_sgd = run_ours(qp, dual, steps, closure=True)
    np.testing.assert_allclose(with_extra_sgd.numpy(), theirs.numpy(), rtol=0, atol=1e-12)


def test_indexed_multipliers_match_coopers_indexed_multiplier() -> None:
    """Per-example constraints x_i·θ - 1 <= 0, 8 examples, 3 sampled per step (with a repeat)."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(8, 3, generator=g, dtype=torch.float64)
    target = torch.tensor([2.0, -1.0, 0.5], dtype=torch.float64)
    batches = [torch.randint(0, 8, (3,), generator=g) for _ in range(60)]

    def values(theta: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return X[idx] @ theta - 1.0

    theta = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    cs = ConstraintSet([Constraint("margin", 8, indexed=True, dual_lr=0.3)])
    opt = PrimalDual(torch.optim.SGD([theta], lr=0.1), cs)
    mine = []
    for idx in batches:
        opt.zero_grad()
        before = cs["margin"].multipliers.clone()
        loss = cs.lagrangian(
            0.5 * (theta - target).pow(2).sum(), margin=ConstraintValue(values(theta, idx), index=idx)
        )
        loss.backward()
        opt.step()
        untouched = torch.ones(8, dtype=torch.bool)
        untouched[idx] = False
        assert torch.equal(
            cs["margin"].multipliers[untouched], before[untouched]
        )  # only sampled entries move
        mine.append(torch.cat([theta.detach().clone(), cs["margin"].multipliers.clone()]))

    class CooperIndexed(cooper.ConstrainedMinimizationProblem):
        def __init__(self) -> None:
            super().__init__()
            self.margin = cooper.Constraint(
                constraint_type=cooper.ConstraintType.INEQUALITY,
                formulation_type=cooper.formulations.Lagrangian,
                multiplier=cooper.multipliers.IndexedMultiplier(num_constraints=8, dtype=torch.float64),
            )

        def compute_cmp_state(self, theta, idx):
            state = cooper.ConstraintState(violation=values(theta, idx), constraint_features=idx)
            return cooper.CMPState(
                loss=0.5 * (theta - target).pow(2).sum(), observed_constraints={self.margin: state}
            )

    cmp = CooperIndexed()
    theta_c = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    coop = cooper.optim.SimultaneousOptimizer(
        cmp=cmp,
        primal_optimizers=torch.optim.SGD([theta_c], lr=0.1),
        dual_optimizers=torch.optim.SGD(cmp.dual_parameters(), lr=0.3, maximize=True),
    )
    theirs = []
    for idx in batches:
        coop.roll(compute_cmp_state_kwargs={"theta": theta_c, "idx": idx})
        theirs.append(
            torch.cat([theta_c.detach().clone(), cmp.margin.multiplier.weight.detach().flatten().clone()])
        )
    mine_t, theirs_t = torch.stack(mine), torch.stack(theirs)
    assert mine_t[:, 3:].max() > 0.1
    assert any(len(set(idx.tolist())) < len(idx) for idx in batches)  # repeated indices were exercised
    np.testing.assert_allclose(mine_t.numpy(), theirs_t.numpy(), rtol=0, atol=1e-12)


# -- LayerwiseDescent is one instance ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "resilience", [None, Resilience(penalty=2.0, lr=0.3), Resilience(penalty=2.0, form="decay")], ids=str
)
def test_layerwise_descent_through_the_general_api_is_bit_identical(problem, resilience) -> None:
    """The descent constraint written as a user constraint (descent_violations) reproduces LayerwiseDescent's
    θ and λ trajectory bit for bit: same pure functions, same float64 dual step."""
    steps, lr, dual_lr = 200, 0.05, 0.2
    alpha = torch.full((problem.num_layers,), problem.alpha, dtype=torch.float64)

    theta_a = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    ld = LayerwiseDescent(problem.num_layers, problem.alpha, dual_lr=dual_lr, resilience=resilience)
    opt_a = PrimalDual(torch.optim.SGD([theta_a], lr=lr), ld)
    theta_b = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    cs = ConstraintSet([Constraint("descent", problem.num_layers, dual_lr=dual_lr, resilience=resilience)])
    opt_b = PrimalDual(torch.optim.SGD([theta_b], lr=lr), cs)
    for _ in range(steps):
        opt_a.zero_grad()
        ld.lagrangian(problem.losses(theta_a)).backward()
        opt_a.step()
        opt_b.zero_grad()
        f = problem.losses(theta_b)
        cs.lagrangian(f[-1], descent=descent_violations(f, alpha)).backward()
        opt_b.step()
        assert torch.equal(theta_a, theta_b)
        assert torch.equal(ld.multipliers, cs["descent"].multipliers)
        if resilience is not None:
            assert torch.equal(ld.slacks, cs["descent"].slacks)
    assert ld.multipliers.max() > 0.5


# -- behaviour ------------------------------------------------------------------------------------------------
def test_the_dual_step_uses_the_strict_twin_and_the_primal_the_proxy() -> None:
    theta = torch.tensor([0.5], dtype=torch.float64, requires_grad=True)
    cs = ConstraintSet([Constraint("rate", 1, dual_lr=0.5)])
    cs["rate"].multiplier.data.fill_(2.0)
    proxy = torch.sigmoid(10 * theta) - 0.5  # differentiable surrogate
    strict = torch.tensor([-0.25], dtype=torch.float64)  # the exact (non-differentiable) value
    loss = cs.lagrangian(theta.sum() * 0, rate=ConstraintValue(proxy, strict=strict))
    loss.backward()
    expected_grad = 2.0 * 10 * torch.sigmoid(10 * theta) * (1 - torch.sigmoid(10 * theta))
    torch.testing.assert_close(theta.grad, expected_grad.detach())
    cs.dual_step_()
    assert float(cs["rate"].multipliers) == pytest.approx(2.0 + 0.5 * -0.25)  # from strict, not proxy


def test_gradient_accumulation_averages_the_recorded_violations() -> None:
    cs = ConstraintSet([Constraint("c", 2, kind="equality", dual_lr=1.0)])
    x = torch.zeros(1, requires_grad=True)
    for v in ([1.0, 2.0], [3.0, -2.0]):
        cs.lagrangian(x.sum(), c=torch.tensor(v) + x)
    cs.dual_step_()
    torch.testing.assert_close(cs["c"].multipliers, torch.tensor([2.0, 0.0], dtype=torch.float64))
    with torch.no_grad():  # an evaluation pass records nothing
        cs.lagrangian(x.sum(), c=torch.tensor([5.0, 5.0]))
    assert not cs.dual_step_()


def test_state_dict_round_trip_resumes_exactly(qp) -> None:
    dual = lambda ps: torch.optim.Adam(ps, lr=0.02, maximize=True)  # noqa: E731
    _, full = run_ours(qp, qp_set(dual_optimizer=dual), steps=40)

    cs = qp_set(dual_optimizer=dual)
    theta = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    opt = PrimalDual(torch.optim.SGD([theta], lr=0.05), cs)
    for _ in range(20):
        opt.zero_grad()
        cs.lagrangian(qp.objective(theta), ineq=qp.ineq(theta), eq=qp.eq(theta)).backward()
        opt.step()
    state, saved_theta = opt.state_dict(), theta.detach().clone()

    cs2 = qp_set(dual_optimizer=dual)
    theta2 = saved_theta.clone().requires_grad_(True)
    opt2 = PrimalDual(torch.optim.SGD([theta2], lr=0.05), cs2)
    opt2.load_state_dict(state)
    for _ in range(20):
        opt2.zero_grad()
        cs2.lagrangian(qp.objective(theta2), ineq=qp.ineq(theta2), eq=qp.eq(theta2)).backward()
        opt2.step()
    got = torch.cat([theta2.detach(), *cs2.multipliers.values()])
    assert torch.equal(got, full[-1])


def test_a_non_finite_violation_raises_and_leaves_lambda(qp) -> None:
    cs = qp_set()
    theta = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    opt = PrimalDual(torch.optim.SGD([theta], lr=0.05), cs, check_finite=False)
    cs.lagrangian(qp.objective(theta), ineq=qp.ineq(theta), eq=qp.eq(theta)).backward()
    opt.step()
    before = cs["ineq"].multipliers.clone()
    bad = qp.ineq(theta).detach().clone()
    bad[1] = float("nan")
    cs.lagrangian(qp.objective(theta), ineq=ConstraintValue(qp.ineq(theta), strict=bad), eq=qp.eq(theta))
    cs.dual_step_()  # deferred under PrimalDual: recorded, not read
    assert torch.equal(cs["ineq"].multipliers, before)
    with pytest.raises(NumericalError, match="ineq"):
        cs.check_health()


def test_primal_dual_names_the_non_finite_entry(qp) -> None:
    cs = qp_set()
    theta = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    opt = PrimalDual(torch.optim.SGD([theta], lr=0.05), cs)
    bad = torch.tensor([0.0, float("inf"), 0.0], dtype=torch.float64)
    cs.lagrangian(
        qp.objective(theta), ineq=ConstraintValue(qp.ineq(theta), strict=bad), eq=qp.eq(theta)
    ).backward()
    with pytest.raises(NumericalError, match=r"ineq\[1\]"):
        opt.step()


def test_bad_configurations_are_refused() -> None:
    with pytest.raises(ConfigError, match="maximize=True"):
        ConstraintSet([Constraint("c")], lambda ps: torch.optim.SGD(ps, lr=0.1))
    with pytest.raises(ConfigError, match="penalty"):
        Constraint("c", formulation="augmented_lagrangian")
    with pytest.raises(ConfigError, match="resilience"):
        Constraint("c", kind="equality", resilience=Resilience(1.0))
    with pytest.raises(ConfigError, match="unknown constraint"):
        ConstraintSet([Constraint("c")]).lagrangian(torch.zeros(()), d=torch.zeros(1))
    with pytest.raises(ModelError, match="size 2"):
        ConstraintSet([Constraint("c", 2)]).lagrangian(torch.zeros(()), c=torch.zeros(3))
    with pytest.raises(ModelError, match="indexed"):
        ConstraintSet([Constraint("c", 4, indexed=True)]).lagrangian(torch.zeros(()), c=torch.zeros(2))
    with pytest.raises(ConfigError, match="closure"):
        cs = ConstraintSet([Constraint("c")], extragradient=True)
        PrimalDual(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1), cs).step()


def test_both_constraint_kinds_satisfy_the_protocol() -> None:
    assert isinstance(LayerwiseDescent(2, 0.1, dual_lr=0.1), dl.constrained.DualProblem)
    assert isinstance(ConstraintSet([Constraint("c")]), dl.constrained.DualProblem)


def test_the_dual_step_does_not_sync_the_host(qp) -> None:
    from constrained.test_host_syncs import SyncCounter

    cs = ConstraintSet(
        [Constraint("ineq", 3, resilience=Resilience(1.0)), Constraint("ex", 4, indexed=True)],
        # SGD with momentum: torch's own CPU Adam reads its step counter (a CPU tensor, no GPU sync) with .item()
        lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9, maximize=True),
    )
    cs.defer_checks = True  # as PrimalDual sets it
    theta = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    idx = torch.tensor([0, 2])
    with SyncCounter() as counter:
        for _ in range(3):
            loss = cs.lagrangian(
                qp.objective(theta), ineq=qp.ineq(theta), ex=ConstraintValue(qp.A[:2] @ theta, index=idx)
            )
            loss.backward()
            cs.dual_step_()
            cs.log_values()  # built, not read
    assert counter.total == 0, dict(counter.counts)


def test_layerwise_descent_alpha_as_a_string_is_one_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"alpha must be a number.*'0\.1' \(a str\)"):
        LayerwiseDescent(num_layers=3, alpha="0.1", dual_lr=0.1)
    with pytest.raises(ConfigError, match=r"alpha\[1\] must be a number"):
        LayerwiseDescent(num_layers=2, alpha=[0.1, "0.2"], dual_lr=0.1)
    assert isinstance(ConfigError("x"), ValueError)
