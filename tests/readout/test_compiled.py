"""``layer_losses(torch.compile(model))`` reads the original module (``_orig_mod``): the same losses and the
same gradients as the model itself, with the compiled wrapper's parameters (issue 46)."""

from __future__ import annotations

import torch

from descentlab.readout import CausalLMReadout, layer_losses
from descentlab.readout.base import uncompiled
from tiny_models import tiny_gpt2


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}


def test_layer_losses_of_a_compiled_model_equal_the_model_s() -> None:
    model = tiny_gpt2(layers=3, hidden=32, vocab=64, positions=32, seed=0)
    compiled = torch.compile(model)
    assert compiled is not model and uncompiled(compiled) is model
    batch = _batch()
    with torch.no_grad():
        exact = layer_losses(model, batch)
        torch.testing.assert_close(layer_losses(compiled, batch), exact, rtol=0, atol=0)
    # training step, default sampled readout, the same draw: same f and same gradients on the same params
    grads = []
    for target in (model, compiled):
        model.zero_grad()
        readout = CausalLMReadout(generator=torch.Generator().manual_seed(7))
        f = layer_losses(target, batch, readout=readout)
        assert readout.last_estimate.sampled
        f.sum().backward()
        grads.append((f.detach(), [p.grad.clone() for p in compiled.parameters()]))
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=0, atol=0)
    for a, b in zip(grads[1][1], grads[0][1], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
