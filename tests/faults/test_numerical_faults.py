"""A NaN tensor ``lr`` set in a HORST param group after construction: one clear error, with the NaN guard on
or off, and the weights and state untouched (issue 45, items 6 and 7; before: with the guard off the
parameters became NaN). Reuses the optimizer tests' model and step."""

from __future__ import annotations

import pytest
import torch

from descentlab.errors import ConfigError
from descentlab.optim import HORST
from optim.test_hyper_validation import IMPLS, _model, _step


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("nan_guard", [True, False])
def test_a_nan_tensor_lr_in_a_horst_group_is_one_clear_error_before_any_weight_moves(impl, nan_guard) -> None:
    model = _model()
    opt = HORST(model.parameters(), lr=torch.tensor(1e-2), impl=impl, nan_guard=nan_guard)
    _step(model, opt)  # a real step first: state exists, the tensor lr was accepted
    before = [p.detach().clone() for p in model.parameters()]
    state = {k: v.clone() for k, v in opt.state[next(iter(model.parameters()))].items() if torch.is_tensor(v)}
    opt.param_groups[0]["lr"] = torch.tensor(float("nan"))
    with pytest.raises(ConfigError, match=r"HORST: invalid lr=tensor\(nan\)") as info:
        _step(model, opt)
    assert "\n" not in str(info.value)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    after = opt.state[next(iter(model.parameters()))]
    assert all(torch.equal(after[k], v) for k, v in state.items())
