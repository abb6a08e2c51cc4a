"""The L_p steepest-descent operator (``lp_direction`` / ``lp_update``) against its numerical twin, the
convex program argmax_{||d||_p <= 1} <g, d> solved by cvxpy, and against the operators it continues at p = 2
and p = inf."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from descentlab.errors import ConfigError
from descentlab.optim.compose import (
    gd_update,
    linf_update,
    lp_direction,
    lp_update,
    normalized_gd_update,
    sign_update,
)


def _lp_direction_cvxpy(g: np.ndarray, p: float) -> np.ndarray:
    """The slow reference: maximise <g, d> subject to ||d||_p <= 1, solved numerically (no closed form)."""
    cp = pytest.importorskip("cvxpy")
    d = cp.Variable(g.size)
    problem = cp.Problem(cp.Maximize(g.reshape(-1) @ d), [cp.norm(d, p) <= 1])
    # tight tolerances: the objective is flat to second order at the maximiser, so a duality gap e moves d by
    # about sqrt(e); at the default 1e-8 d is off by 1e-4, at 1e-10 by about 1e-5 (tighter ends "inaccurate")
    problem.solve(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10, tol_feas=1e-10)
    assert problem.status == cp.OPTIMAL, problem.status
    return np.asarray(d.value).reshape(g.shape)


@pytest.mark.parametrize("p", [3.0, 4.0, 8.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_closed_form_is_the_convex_programs_maximiser(p, seed):
    rng = np.random.default_rng(seed)
    # a matrix with entries over three decades, so the powers |g_i|^(q-1) differ from g's own shape
    g = rng.standard_normal((6, 4)) * 10.0 ** rng.uniform(-1.5, 1.5, (6, 4))
    got = lp_direction(torch.from_numpy(g), p).numpy()
    reference = _lp_direction_cvxpy(g, p)
    # the solver's own accuracy is about 1e-5 (above); a wrong exponent or norm moves entries by 1e-1
    np.testing.assert_allclose(got, reference, rtol=0, atol=5e-5)
    # Hölder's equality case: unit L_p norm, and <g, d> is the dual norm ||g||_q, at least the solver's value
    q = p / (p - 1)
    dual_norm = np.linalg.norm(g.ravel(), q)
    assert np.linalg.norm(got.ravel(), p) == pytest.approx(1.0, rel=1e-12)
    assert float((g * got).sum()) == pytest.approx(dual_norm, rel=1e-12)
    assert np.linalg.norm(reference.ravel(), p) <= 1 + 1e-8
    assert float((g * got).sum()) >= float((g * reference).sum()) - 1e-9 * dual_norm


def test_p2_and_p_inf_are_the_existing_operators():
    g = torch.from_numpy(np.random.default_rng(3).standard_normal(50))
    # u = lr d_p: normalised GD at p = 2, sign descent at p = inf
    torch.testing.assert_close(lp_update(g, 0.3, 2.0), normalized_gd_update(g, 0.3), rtol=1e-14, atol=0)
    assert torch.equal(lp_update(g, 0.3, math.inf), sign_update(g, 0.3))
    # u = lr ||g||_q d_p: plain GD at p = 2, L_inf steepest descent scaled by ||g||_1 at p = inf
    torch.testing.assert_close(
        lp_update(g, 0.3, 2.0, dual_scaled=True), gd_update(g, 0.3), rtol=1e-14, atol=0
    )
    torch.testing.assert_close(lp_update(g, 0.3, math.inf, dual_scaled=True), linf_update(g, 0.3))


def test_finite_p_approaches_sign_descent():
    g = torch.from_numpy(np.random.default_rng(4).standard_normal(50))
    # d_i = sign(g_i) (|g_i| / ||g||_q)^(1/(p-1)): the gap to sign(g) shrinks like log(...) / p
    gaps = [float((lp_update(g, 1.0, p) - sign_update(g, 1.0)).abs().max()) for p in (8.0, 64.0, 1e4)]
    assert gaps[0] > gaps[1] > gaps[2] and gaps[2] < 2e-3
    dual = lp_update(g, 1.0, 1e6, dual_scaled=True)
    torch.testing.assert_close(dual, linf_update(g, 1.0), rtol=1e-4, atol=0)


def test_direction_is_scale_free_and_guards_its_edges():
    g = torch.tensor([3.0, -1e-3, 0.0, 2.0], dtype=torch.float64)
    d = lp_direction(g, 4.0)
    # raw |g|^(q-1) would underflow at 1e-300 scale; the max-normalised form gives the same direction
    torch.testing.assert_close(lp_direction(g * 1e-300, 4.0), d, rtol=1e-12, atol=0)
    torch.testing.assert_close(lp_direction(g * 1e300, 4.0), d, rtol=1e-12, atol=0)
    assert float(d[2]) == 0.0 and float(d[1]) < 0 < float(d[0])
    assert torch.equal(
        lp_direction(torch.zeros(5, dtype=torch.float64), 3.0), torch.zeros(5, dtype=torch.float64)
    )
    with pytest.raises(ConfigError):
        lp_direction(g, 1.0)
