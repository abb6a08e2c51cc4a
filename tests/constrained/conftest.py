"""A small constrained problem with a known KKT point, solved exactly by cvxpy.

Parameters θ ∈ R^4, L = 3 "layers":
    f_0 = 2 (a constant: no gradient, as the embedding readout may be)
    f_1 = a_1·θ + c_1,  f_2 = a_2·θ + c_2                    (affine)
    f_3 = ½||Bθ - y||² + (μ/2)||θ||²                          (strongly convex)
so every constraint f_l - (1-α) f_{l-1} <= 0 is convex and the KKT point is unique. With this seed the
layer-2 constraint is active (λ_2 > 0) and the others are slack (λ = 0), so both cases are exercised.
"""

from __future__ import annotations

from dataclasses import dataclass

import cvxpy as cp
import numpy as np
import pytest
import torch


@dataclass
class Problem:
    A: np.ndarray
    c: np.ndarray
    B: np.ndarray
    y: np.ndarray
    c0: float = 2.0
    mu: float = 0.5
    alpha: float = 0.1

    @property
    def num_layers(self) -> int:
        return self.A.shape[0] + 1

    def losses(self, theta: torch.Tensor) -> torch.Tensor:
        """f_0..f_L as one float64 tensor, differentiable in θ."""
        A, c = torch.from_numpy(self.A), torch.from_numpy(self.c)
        B, y = torch.from_numpy(self.B), torch.from_numpy(self.y)
        last = 0.5 * (B @ theta - y).pow(2).sum() + 0.5 * self.mu * theta.pow(2).sum()
        return torch.cat([torch.tensor([self.c0], dtype=torch.float64), A @ theta + c, last[None]])

    def solve(self, penalty: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """θ*, λ* (and u*) from cvxpy.

        With a penalty a, the resilient problem min f_L + (a/2)||u||² s.t. ĝ <= u, u >= 0 is solved with u
        eliminated, min f_L + (a/2) Σ max(0, ĝ_l)², which is convex here; then u* = max(0, ĝ(θ*)) and the
        multiplier of ĝ_l <= u_l is λ*_l = a u*_l (stationarity in u).
        """
        theta = cp.Variable(self.A.shape[1])
        f = [self.c0, *[self.A[i] @ theta + self.c[i] for i in range(self.A.shape[0])]]
        f.append(0.5 * cp.sum_squares(self.B @ theta - self.y) + 0.5 * self.mu * cp.sum_squares(theta))
        g = [f[l] - (1 - self.alpha) * f[l - 1] for l in range(1, self.num_layers + 1)]
        if penalty is None:
            cons = [gl <= 0 for gl in g]
            prob = cp.Problem(cp.Minimize(f[-1]), cons)
        else:
            prob = cp.Problem(cp.Minimize(f[-1] + 0.5 * penalty * sum(cp.square(cp.pos(gl)) for gl in g)))
        prob.solve(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
        assert prob.status == "optimal", prob.status
        if penalty is None:
            return theta.value, np.array([np.asarray(k.dual_value).item() for k in cons]), None
        u = np.maximum(0.0, np.array([np.asarray(gl.value).item() for gl in g]))
        return theta.value, penalty * u, u


@pytest.fixture(scope="session")
def problem() -> Problem:
    rng = np.random.default_rng(0)
    return Problem(
        A=rng.normal(size=(2, 4)), c=np.array([1.6, 1.5]), B=rng.normal(size=(6, 4)), y=rng.normal(size=6)
    )
