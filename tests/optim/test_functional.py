"""The functional core against torch.optim.AdamW, a float64 closed form, and its foreach twins."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from descentlab.optim.compose import HyperbolicMirror
from descentlab.optim.functional import (
    adam_update_,
    adam_update_foreach_,
    bias_correction,
    hyperbolic_mirror,
    hyperbolic_mirror_foreach_,
    mirror_exponent,
)
from descentlab.optim.ham import ham_mirror_step


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_adam_update_is_torch_adamw_step_for_step(dtype):
    lr, betas, eps, wd = 3e-3, (0.8, 0.95), 1e-6, 0.1
    ref = torch.nn.Parameter(_randn(9, 7, seed=0).to(dtype))
    adamw = torch.optim.AdamW([ref], lr=lr, betas=betas, eps=eps, weight_decay=wd)
    p = ref.detach().clone()
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    for k in range(1, 6):
        g = _randn(9, 7, seed=k).to(dtype)
        ref.grad = g.clone()
        adamw.step()
        p = p * (1 - lr * wd) - adam_update_(g, m, v, step=k, lr=lr, betas=betas, eps=eps)
        assert torch.equal(p, ref.detach()), f"step {k}"
        assert torch.equal(m, adamw.state[ref]["exp_avg"]) and torch.equal(v, adamw.state[ref]["exp_avg_sq"])


def test_adam_update_closed_form_first_step():
    # at k = 1 the bias corrections cancel the moments' (1 - beta) factors: u = lr g / (|g| + eps)
    g = _randn(50, seed=3).double()
    m, v = torch.zeros_like(g), torch.zeros_like(g)
    u = adam_update_(g, m, v, step=1, lr=0.1, betas=(0.9, 0.999), eps=1e-8)
    np.testing.assert_allclose(u.numpy(), 0.1 * g.numpy() / (np.abs(g.numpy()) + 1e-8), rtol=1e-12)
    np.testing.assert_allclose(m.numpy(), 0.1 * g.numpy(), rtol=1e-12)
    np.testing.assert_allclose(v.numpy(), 1e-3 * g.numpy() ** 2, rtol=1e-12)
    assert bias_correction(2, lr=0.1, betas=(0.5, 0.75)) == (0.1 / 0.75, (1 - 0.75**2) ** 0.5)


def test_mirror_exponent_and_step_closed_form():
    theta, d = _randn(200, seed=4).double(), _randn(200, seed=5).double()
    alpha, lr_beta, clamp = 3.0, 0.02, 1.5
    expected = np.clip(-alpha * np.sign(theta.numpy()) * d.numpy() - lr_beta, -clamp, clamp)
    x = mirror_exponent(theta, d, alpha=alpha, lr_beta=lr_beta, clamp=clamp)
    np.testing.assert_allclose(x.numpy(), expected, rtol=1e-12, atol=1e-15)
    assert float(x.abs().max()) == clamp, "the clamp must bind for the test to cover it"
    unclamped = mirror_exponent(theta, d, alpha=alpha, lr_beta=lr_beta, clamp=None)
    assert float(unclamped.abs().max()) > clamp
    new = hyperbolic_mirror(theta, d, alpha=alpha, lr_beta=lr_beta, clamp=clamp)
    np.testing.assert_allclose(new.numpy(), theta.numpy() * np.exp(expected), rtol=1e-12)
    assert torch.equal(theta, _randn(200, seed=4).double()), "hyperbolic_mirror must not modify theta"


def test_ham_and_compose_mirror_are_the_functional_step():
    w, g, lr = _randn(6, 5, seed=6), _randn(6, 5, seed=7), 1e-2
    ham = ham_mirror_step(w, g, lr=lr, alpha=200.0, beta=1e-3, exp_clamp=5.0)
    assert torch.equal(ham, hyperbolic_mirror(w, g, alpha=200.0 * lr, lr_beta=lr * 1e-3, clamp=5.0))
    after = HyperbolicMirror(alpha=7.0, beta=0.5, exp_clamp=2.0).after(w, g, lr)
    assert torch.equal(after, hyperbolic_mirror(w, g, alpha=7.0, lr_beta=lr * 0.5, clamp=2.0))


@pytest.mark.parametrize("clamp", [5.0, None])
def test_foreach_twins_match_single_tensor(clamp):
    shapes, steps, lr, betas, eps = [(4, 3), (5,), (2, 2, 2)], [1, 3, 7], 1e-2, (0.9, 0.99), 1e-8
    grads = [_randn(*s, seed=10 + i) for i, s in enumerate(shapes)]
    ms = [_randn(*s, seed=20 + i) * 0.1 for i, s in enumerate(shapes)]
    vs = [_randn(*s, seed=30 + i).abs() * 0.01 for i, s in enumerate(shapes)]
    m_one, v_one = [m.clone() for m in ms], [v.clone() for v in vs]
    u_many = adam_update_foreach_(grads, ms, vs, steps=steps, lr=lr, betas=betas, eps=eps)
    for i, k in enumerate(steps):
        u = adam_update_(grads[i], m_one[i], v_one[i], step=k, lr=lr, betas=betas, eps=eps)
        assert torch.equal(u, u_many[i]) and torch.equal(m_one[i], ms[i]) and torch.equal(v_one[i], vs[i])
    thetas = [_randn(*s, seed=40 + i) for i, s in enumerate(shapes)]
    expected = [
        hyperbolic_mirror(t, u, alpha=50.0, lr_beta=0.1, clamp=clamp)
        for t, u in zip(thetas, u_many, strict=True)
    ]
    hyperbolic_mirror_foreach_(thetas, u_many, alpha=50.0, lr_beta=0.1, clamp=clamp)
    for got, want in zip(thetas, expected, strict=True):
        assert torch.equal(got, want)
