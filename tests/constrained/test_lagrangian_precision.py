"""A bf16 f builds its Lagrangian and ĝ in fp32 (issue 31, item 8): ĝ matches fp64 from the same f."""

from __future__ import annotations

import torch

from descentlab.constrained import LayerwiseDescent, descent_violations

# bf16 losses of a deep stack whose layers drop slowly: ĝ_l = f_l - 0.95 f_{l-1} is a small difference of
# numbers near 2, which bf16 (8-bit mantissa) rounds to a step of 2^-7 ≈ 0.0078
VALUES = [2.3125, 2.2344, 2.1562, 2.0938, 2.0312, 1.9766, 1.9219, 1.8672]
ALPHA = [0.05, 0.04, 0.03, 0.02, 0.02, 0.01, 0.01]


def _bf16_f() -> torch.Tensor:
    return torch.tensor(VALUES, dtype=torch.bfloat16).requires_grad_(True)


def test_bf16_violations_match_fp64_where_bf16_arithmetic_does_not() -> None:
    f = _bf16_f()
    alpha = torch.tensor(ALPHA, dtype=torch.float64)
    reference = descent_violations(f.detach().double(), alpha)
    got = descent_violations(f, alpha)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), reference, rtol=1e-3, atol=1e-6)
    # the old path: the same formula in bf16 arithmetic is off by percents (the test would catch it)
    keep = (1.0 - alpha.to(torch.bfloat16)).to(torch.bfloat16)
    old = (f.detach()[1:] - keep * f.detach()[:-1]).double()
    assert ((old - reference).abs() / reference.abs()).max() > 1e-2


def test_bf16_lagrangian_in_fp32_with_gradients_to_f() -> None:
    lam = torch.tensor([0.3, 0.0, 1.7, 0.2, 0.9, 0.4, 1.1], dtype=torch.float64)
    c = LayerwiseDescent(7, alpha=ALPHA, dual_lr=0.1)
    c.duals.lam = lam.clone()
    ref = LayerwiseDescent(7, alpha=ALPHA, dual_lr=0.1)
    ref.duals.lam = lam.clone()
    f = _bf16_f()
    loss = c.lagrangian(f)
    f64 = f.detach().double().requires_grad_(True)
    loss64 = ref.lagrangian(f64)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(c.violations.double(), ref.violations, rtol=1e-3, atol=1e-6)
    torch.testing.assert_close(loss.double(), loss64.detach(), rtol=1e-5, atol=1e-6)
    loss.backward()
    loss64.backward()
    assert f.grad is not None and f.grad.dtype == torch.bfloat16
    torch.testing.assert_close(f.grad.double(), f64.grad, rtol=1e-2, atol=1e-2)
    # the dual step sees the fp32 ĝ: λ moves as it does from fp64
    c.dual_step_()
    ref.dual_step_()
    torch.testing.assert_close(c.multipliers, ref.multipliers, rtol=1e-5, atol=1e-7)


def test_fp64_f_stays_fp64() -> None:
    f = torch.tensor(VALUES, dtype=torch.float64, requires_grad=True)
    c = LayerwiseDescent(7, alpha=ALPHA, dual_lr=0.1)
    assert c.lagrangian(f).dtype == torch.float64
    assert c.violations.dtype == torch.float64
