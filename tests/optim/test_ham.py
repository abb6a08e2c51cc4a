"""HAM: the raw-gradient mirror step after any base optimizer, shared groups, exact state round-trips."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from descentlab.errors import ConfigError
from descentlab.optim.ham import HAM


def test_ham_after_sgd_matches_closed_form():
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 4)
    w0, b0 = lin.weight.detach().double().numpy().copy(), lin.bias.detach().double().numpy().copy()
    x, y = torch.randn(16, 6), torch.randn(16, 4)
    lr, alpha, beta = 0.1, 200.0, 1e-3
    opt = HAM(torch.optim.SGD(lin.parameters(), lr=lr), alpha=alpha, beta=beta)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(lin(x), y)
        loss.backward()
        return loss

    assert opt.step(closure) is not None
    gw, gb = lin.weight.grad.double().numpy(), lin.bias.grad.double().numpy()
    w_half = w0 - lr * gw
    expected_w = w_half * np.exp(np.clip(lr * (-alpha * np.sign(w_half) * gw - beta), -5, 5))
    np.testing.assert_allclose(lin.weight.detach().double().numpy(), expected_w, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(lin.bias.detach().double().numpy(), b0 - lr * gb, rtol=1e-6, atol=1e-7)
    assert (lr * alpha * np.abs(gw)).max() > 5, "the clamp must be exercised"


def test_groups_are_shared_with_the_base(tiny_gpt2):
    model = tiny_gpt2()
    base = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt = HAM(base, alpha=10.0)
    assert opt.param_groups[0] is base.param_groups[0] and opt.state is base.state
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5**step)
    opt.step()  # no gradients yet: a no-op, but it keeps the scheduler's call order
    sched.step()
    assert base.param_groups[0]["lr"] == pytest.approx(5e-4)
    assert base.param_groups[0]["alpha"] == 10.0
    with pytest.raises(ConfigError):
        HAM(base, alpha=-1.0)
    with pytest.raises(ConfigError):
        HAM(model)  # type: ignore[arg-type]


def _train(model, opt, batches, lm_loss, steps):
    for k in range(steps):
        opt.zero_grad()
        lm_loss(model, batches[k % len(batches)]).backward()
        opt.step()


def test_mirror_off_group_is_plain_base(tiny_gpt2, lm_batches, lm_loss):
    a, b = tiny_gpt2(), tiny_gpt2()
    ref = torch.optim.AdamW(a.parameters(), lr=1e-3)
    opt = HAM(torch.optim.AdamW(b.parameters(), lr=1e-3), mirror=False)
    _train(a, ref, lm_batches, lm_loss, 5)
    _train(b, opt, lm_batches, lm_loss, 5)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)


def test_state_dict_round_trip_is_exact(tiny_gpt2, lm_batches, lm_loss):
    a = tiny_gpt2()
    opt_a = HAM(torch.optim.AdamW(a.parameters(), lr=1e-3), alpha=50.0)
    _train(a, opt_a, lm_batches, lm_loss, 3)
    buf = io.BytesIO()
    torch.save(opt_a.state_dict(), buf)
    buf.seek(0)
    b = tiny_gpt2()
    b.load_state_dict(a.state_dict())
    opt_b = HAM(torch.optim.AdamW(b.parameters(), lr=1.0), alpha=1.0)
    opt_b.load_state_dict(torch.load(buf, weights_only=True))
    assert opt_b.param_groups[0]["alpha"] == 50.0 and opt_b.param_groups is opt_b.base_optimizer.param_groups
    _train(a, opt_a, lm_batches[3:], lm_loss, 3)
    _train(b, opt_b, lm_batches[3:], lm_loss, 3)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)
        assert torch.equal(opt_a.state[p]["exp_avg_sq"], opt_b.state[q]["exp_avg_sq"])
