"""Steepest operators x hyperbolic mirror map: closed forms, the two orders, and AdamW / state round-trips."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from descentlab.errors import ConfigError
from descentlab.optim.compose import (
    HyperbolicMirror,
    compose,
    coordinate_update,
    linf_update,
    normalized_gd_update,
)


def test_steepest_operators_closed_forms():
    g = torch.tensor([[0.5, -2.0], [1.5, 0.0]], dtype=torch.float64)
    assert torch.equal(
        coordinate_update(g, 0.1), torch.tensor([[0.0, -0.2], [0.0, 0.0]], dtype=torch.float64)
    )
    assert torch.equal(linf_update(g, 0.1), 0.1 * 4.0 * torch.sign(g))
    assert float(torch.linalg.vector_norm(normalized_gd_update(g, 0.3))) == pytest.approx(0.3)
    assert torch.equal(normalized_gd_update(torch.zeros(3), 0.3), torch.zeros(3))


def _one_step(steepest: str, mirror, order: str, w0: torch.Tensor, g: torch.Tensor, **kw) -> torch.Tensor:
    w = torch.nn.Parameter(w0.clone())
    opt = compose([w], steepest, mirror, order, **kw)
    w.grad = g.clone()
    opt.step()
    return w.detach()


def test_dual_gd_is_exact_hyperbolic_mirror_descent():
    rng = np.random.default_rng(0)
    w0, g = rng.standard_normal((5, 3)), rng.standard_normal((5, 3))
    lr, alpha, gamma = 0.05, 2.0, 1e-2
    mirror = HyperbolicMirror(alpha=alpha, gamma=gamma)
    got = _one_step("gd", mirror, "dual", torch.from_numpy(w0), torch.from_numpy(g), lr=lr)
    expected = gamma * np.sinh(np.arcsinh(w0 / gamma) - alpha * lr * g)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12)


def test_mirror_before_preconditions_and_sign_normalises_it_away():
    rng = np.random.default_rng(2)
    w0, g = rng.standard_normal((6, 2)), rng.standard_normal((6, 2))
    lr, alpha, gamma = 0.05, 2.0, 1e-2
    mirror = HyperbolicMirror(alpha=alpha, gamma=gamma)
    got = _one_step("gd", mirror, "mirror_before", torch.from_numpy(w0), torch.from_numpy(g), lr=lr)
    np.testing.assert_allclose(got.numpy(), w0 - lr * alpha * np.sqrt(w0**2 + gamma**2) * g, rtol=1e-12)
    # S o M with S = sign: the mirror's preconditioner is positive, so sign() erases it -> plain sign descent
    before = _one_step("sign", mirror, "mirror_before", torch.from_numpy(w0), torch.from_numpy(g), lr=lr)
    plain = _one_step("sign", None, "mirror_after", torch.from_numpy(w0), torch.from_numpy(g), lr=lr)
    assert torch.equal(before, plain)


def test_mirror_after_sign_closed_form_and_orders_differ():
    rng = np.random.default_rng(1)
    w0, g = rng.standard_normal((4, 4)), rng.standard_normal((4, 4))
    lr, alpha, beta = 0.1, 3.0, 0.5
    mirror = HyperbolicMirror(alpha=alpha, beta=beta, exp_clamp=None)
    after = _one_step("sign", mirror, "mirror_after", torch.from_numpy(w0), torch.from_numpy(g), lr=lr)
    u = lr * np.sign(g)
    half = w0 - u
    np.testing.assert_allclose(
        after.numpy(), half * np.exp(-alpha * np.sign(half) * u - lr * beta), rtol=1e-12
    )
    before = _one_step("sign", mirror, "mirror_before", torch.from_numpy(w0), torch.from_numpy(g), lr=lr)
    assert not torch.allclose(after, before)
    plain = _one_step(
        "sign", HyperbolicMirror(alpha=0.0), "mirror_after", torch.from_numpy(w0), torch.from_numpy(g), lr=lr
    )
    np.testing.assert_allclose(plain.numpy(), half, rtol=1e-12)


def test_adam_without_mirror_is_adamw_and_state_round_trips(tiny_gpt2, lm_batches, lm_loss):
    a, b, c = tiny_gpt2(), tiny_gpt2(), tiny_gpt2()
    adamw = torch.optim.AdamW(a.parameters(), lr=1e-3, weight_decay=0.01)
    comp = compose(b.parameters(), "adam", None, lr=1e-3, weight_decay=0.01)
    for k in range(4):
        for model, opt in ((a, adamw), (b, comp)):
            opt.zero_grad()
            lm_loss(model, lm_batches[k]).backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)
    buf = io.BytesIO()
    torch.save(comp.state_dict(), buf)
    buf.seek(0)
    c.load_state_dict(b.state_dict())
    comp_c = compose(c.parameters(), "adam", HyperbolicMirror(), lr=9.0)
    comp_c.load_state_dict(torch.load(buf, weights_only=True))
    for model, opt in ((b, comp), (c, comp_c)):
        opt.zero_grad()
        lm_loss(model, lm_batches[5]).backward()
        opt.step()
    for p, q in zip(b.parameters(), c.parameters(), strict=True):
        assert torch.equal(p, q)


def test_bad_names_raise():
    w = torch.nn.Parameter(torch.zeros(2, 2))
    with pytest.raises(ConfigError):
        compose([w], "lion")
    with pytest.raises(ConfigError):
        compose([w], "adam", HyperbolicMirror(), order="sandwich")
    with pytest.raises(ConfigError):
        HyperbolicMirror(gamma=0.0)
