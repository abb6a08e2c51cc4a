"""HORST and HAM validate their hyper-parameters as torch.optim.AdamW does, on every implementation path;
HORST takes AdamW's ``fused`` / ``foreach`` keywords; a batch its NaN guard reverts is reported (issue 33)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from descentlab.errors import ConfigError
from descentlab.optim import HAM, HORST
from descentlab.optim._horst_kernel import load_kernel

NAN, INF = float("nan"), float("inf")
IMPLS = ["auto", "foreach", "reference"]
BAD = [
    ("lr", NAN),
    ("lr", INF),
    ("eps", NAN),
    ("eps", -1.0),
    ("weight_decay", INF),
    ("weight_decay", NAN),
    ("alpha", NAN),
    ("alpha", INF),
    ("beta", NAN),
    ("beta", -INF),
    ("betas", (NAN, 0.999)),
    ("betas", (0.9, INF)),
    ("exp_clamp", NAN),
]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


def _step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    opt.zero_grad()
    model(torch.randn(16, 4)).pow(2).mean().backward()
    opt.step()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("key", "value"), BAD, ids=lambda v: str(v))
def test_horst_rejects_non_finite_or_out_of_range_hyper_parameters(impl, key, value) -> None:
    with pytest.raises(ValueError, match=key) as info:
        HORST(_model().parameters(), impl=impl, **{key: value})
    assert isinstance(info.value, ConfigError) and "\n" not in str(info.value)


@pytest.mark.parametrize(("key", "value"), BAD[:10], ids=lambda v: str(v))
def test_horst_rejects_a_bad_value_in_a_param_group(key, value) -> None:
    model = _model()
    with pytest.raises(ConfigError, match=key):
        HORST([{"params": model[0].parameters(), key: value}, {"params": model[2].parameters()}])


@pytest.mark.parametrize("impl", IMPLS)
def test_horst_rejects_a_non_finite_value_set_after_construction_before_touching_the_weights(impl) -> None:
    model = _model()
    opt = HORST(model.parameters(), lr=1e-2, impl=impl)
    _step(model, opt)
    before = [p.detach().clone() for p in model.parameters()]
    opt.param_groups[0]["alpha"] = NAN
    with pytest.raises(ConfigError, match="alpha"):
        _step(model, opt)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))


@pytest.mark.parametrize(
    ("key", "value"), [("alpha", NAN), ("beta", INF), ("alpha", INF), ("exp_clamp", NAN)]
)
def test_ham_rejects_non_finite_alpha_beta(key, value) -> None:
    base = torch.optim.AdamW(_model().parameters(), lr=1e-3)
    with pytest.raises(ConfigError, match=key):
        HAM(base, **{key: value})


def test_horst_accepts_adamws_fused_and_foreach_keywords() -> None:
    model = _model()
    for kwargs in ({"foreach": True}, {"foreach": False}, {"fused": False}, {"fused": None, "foreach": None}):
        opt = HORST(model.parameters(), lr=1e-2, **kwargs)
        _step(model, opt)
    assert HORST(model.parameters(), foreach=True).param_groups[0]["impl"] == "foreach"
    assert HORST(model.parameters(), foreach=False).param_groups[0]["impl"] == "reference"
    with pytest.raises(ConfigError, match=r"fused.*foreach"):
        HORST(model.parameters(), fused=True, foreach=True)


def test_horst_foreach_keyword_matches_the_foreach_impl() -> None:
    a, b = _model(), _model()
    opt_a = HORST(a.parameters(), lr=1e-2, alpha=5.0, foreach=True)
    opt_b = HORST(b.parameters(), lr=1e-2, alpha=5.0, impl="foreach")
    for _ in range(3):
        torch.manual_seed(1)
        _step(a, opt_a)
        torch.manual_seed(1)
        _step(b, opt_b)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_horst_fused_true_that_cannot_be_honoured_raises() -> None:
    model = _model().double()  # the fused CPU kernel is float32 only
    with pytest.raises(ConfigError, match="fused=True"):
        HORST(model.parameters(), fused=True)


@pytest.mark.skipif(load_kernel() is None, reason="fused C kernel unavailable")
def test_horst_fused_true_on_float32_cpu_takes_the_kernel_and_records_fallbacks() -> None:
    model = _model()
    opt = HORST(model.parameters(), lr=1e-2, fused=True)
    _step(model, opt)
    assert opt.fused_fallbacks == 0
    # a non-contiguous parameter cannot take the kernel: it falls back, with one warning, and is counted
    w = torch.randn(6, 4).t().requires_grad_()
    opt = HORST([w], lr=1e-2, fused=True)
    with pytest.warns(RuntimeWarning, match="fused"):
        for _ in range(3):
            opt.zero_grad()
            (w**2).sum().backward()
            opt.step()
    assert opt.fused_fallbacks == 3


@pytest.mark.parametrize("impl", IMPLS)
def test_nan_guard_reverts_are_counted_in_state_and_warned_once(impl) -> None:
    model = _model()
    opt = HORST(model.parameters(), lr=1e-2, impl=impl)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(16, 4)).pow(2).mean().backward()
            model[0].weight.grad[0, 0] = INF  # the update of this element is not finite
            opt.step()
    reverted = [w for w in caught if "NaN guard" in str(w.message)]
    assert len(reverted) == 1, [str(w.message) for w in caught]
    assert opt.reverted >= 1 and opt.reverted_total >= 3
    # the counter lives in the optimizer state, so it is checkpointed with it
    state = opt.state_dict()
    again = HORST(_model().parameters(), lr=1e-2, impl=impl)
    again.load_state_dict(state)
    assert again.reverted_total == opt.reverted_total
    assert all(math.isfinite(float(p.detach().abs().max())) for p in model.parameters())


@pytest.mark.skipif(load_kernel() is None, reason="fused C kernel unavailable")
def test_impl_fused_tensor_the_kernel_cannot_take_warns_once_and_is_recorded() -> None:
    w = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)  # the CPU kernel is float32 only
    opt = HORST([w], lr=1e-2, impl="fused")
    with pytest.warns(RuntimeWarning, match="impl='fused'") as record:
        for _ in range(3):
            opt.zero_grad()
            (w**2).sum().backward()
            opt.step()
    assert sum("impl='fused'" in str(r.message) for r in record) == 1
    assert opt.fallbacks == {"fused_impl": 3}
    assert opt.state_dict()["param_groups"][0]["fallbacks"] == 3
