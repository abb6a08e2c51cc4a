"""PrimalDual reaches the exact KKT point, tracks Cooper's λ step for step, and the resilient forms agree."""

from __future__ import annotations

import cooper
import numpy as np
import pytest
import torch

from descentlab.constrained import LayerwiseDescent, PrimalDual, Resilience

PRIMAL_LR, DUAL_LR = 0.05, 0.2


def _run(problem, constraint: LayerwiseDescent, steps: int) -> tuple[torch.Tensor, list[np.ndarray]]:
    theta = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    opt = PrimalDual(torch.optim.SGD([theta], lr=PRIMAL_LR), constraint)
    trajectory = []
    for _ in range(steps):
        opt.zero_grad()
        constraint.lagrangian(problem.losses(theta)).backward()
        opt.step()
        trajectory.append(constraint.multipliers.clone().numpy())
    return theta.detach(), trajectory


def test_primal_dual_reaches_the_kkt_point(problem) -> None:
    theta_star, lam_star, _ = problem.solve()
    assert lam_star[1] > 0.5 and lam_star[0] < 1e-9 and lam_star[2] < 1e-9  # one active, two slack
    constraint = LayerwiseDescent(problem.num_layers, problem.alpha, dual_lr=DUAL_LR)
    theta, _ = _run(problem, constraint, steps=500)
    np.testing.assert_allclose(theta.numpy(), theta_star, atol=1e-7)
    np.testing.assert_allclose(constraint.multipliers.numpy(), lam_star, atol=1e-7)
    g = constraint.violations.numpy()
    assert g.max() < 1e-7 and abs(g[1]) < 1e-7  # feasible, complementary slackness on the active layer


class _CooperDescent(cooper.ConstrainedMinimizationProblem):
    """The same problem in Cooper's formulation: loss f_L, inequality ĝ <= 0, one dense multiplier."""

    def __init__(self, problem) -> None:
        super().__init__()
        self.problem = problem
        multiplier = cooper.multipliers.DenseMultiplier(
            num_constraints=problem.num_layers, dtype=torch.float64
        )
        self.descent = cooper.Constraint(
            constraint_type=cooper.ConstraintType.INEQUALITY,
            formulation_type=cooper.formulations.Lagrangian,
            multiplier=multiplier,
        )

    def compute_cmp_state(self, theta: torch.Tensor) -> cooper.CMPState:
        f = self.problem.losses(theta)
        g = f[1:] - (1 - self.problem.alpha) * f[:-1]
        return cooper.CMPState(
            loss=f[-1], observed_constraints={self.descent: cooper.ConstraintState(violation=g)}
        )


def test_cooper_gives_the_same_lambda_trajectory(problem) -> None:
    steps = 300
    ours = LayerwiseDescent(problem.num_layers, problem.alpha, dual_lr=DUAL_LR)
    theta_ours, lam_ours = _run(problem, ours, steps)

    theta = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    cmp = _CooperDescent(problem)
    coop = cooper.optim.SimultaneousOptimizer(
        cmp=cmp,
        primal_optimizers=torch.optim.SGD([theta], lr=PRIMAL_LR),
        dual_optimizers=torch.optim.SGD(cmp.dual_parameters(), lr=DUAL_LR, maximize=True),
    )
    lam_coop = []
    for _ in range(steps):
        coop.roll(compute_cmp_state_kwargs={"theta": theta})
        lam_coop.append(cmp.descent.multiplier.weight.detach().clone().numpy())
    np.testing.assert_allclose(np.stack(lam_ours), np.stack(lam_coop), rtol=0, atol=1e-12)
    np.testing.assert_allclose(theta_ours.numpy(), theta.detach().numpy(), rtol=0, atol=1e-12)
    assert np.stack(lam_ours)[:, 1].max() > 0.5  # the trajectory is not trivially zero


@pytest.mark.parametrize("penalty", [1.0, 4.0])
def test_resilience_reaches_the_resilient_optimum_in_both_forms(problem, penalty: float) -> None:
    theta_star, lam_star, u_star = problem.solve(penalty=penalty)
    assert lam_star.max() > 0.1 and u_star.max() > 0.01  # the relaxation is active
    results = {}
    for form, slack_lr in (("slack", 0.3), ("decay", None)):
        constraint = LayerwiseDescent(
            problem.num_layers, problem.alpha, dual_lr=DUAL_LR, resilience=Resilience(penalty, slack_lr, form)
        )
        theta, _ = _run(problem, constraint, steps=500)
        np.testing.assert_allclose(theta.numpy(), theta_star, atol=1e-7)
        np.testing.assert_allclose(constraint.multipliers.numpy(), lam_star, atol=1e-7)
        u = constraint.slacks.numpy()
        np.testing.assert_allclose(u, constraint.multipliers.numpy() / penalty, atol=1e-7)  # u = λ/a
        results[form] = constraint.multipliers.numpy()
    np.testing.assert_allclose(results["slack"], results["decay"], atol=1e-7)


def test_slack_form_with_step_one_over_a_is_the_decay_form_step_for_step(problem) -> None:
    penalty = 2.0
    slack = LayerwiseDescent(
        problem.num_layers, problem.alpha, DUAL_LR, Resilience(penalty, 1 / penalty, "slack")
    )
    decay = LayerwiseDescent(problem.num_layers, problem.alpha, DUAL_LR, Resilience(penalty, form="decay"))
    _, lam_slack = _run(problem, slack, steps=200)
    _, lam_decay = _run(problem, decay, steps=200)
    np.testing.assert_allclose(np.stack(lam_slack), np.stack(lam_decay), rtol=0, atol=1e-13)
    # ...while another slack step moves along a different path to the same fixed point.
    other = LayerwiseDescent(problem.num_layers, problem.alpha, DUAL_LR, Resilience(penalty, 0.1, "slack"))
    _, lam_other = _run(problem, other, steps=200)
    assert np.abs(np.stack(lam_other) - np.stack(lam_decay)).max() > 1e-3
