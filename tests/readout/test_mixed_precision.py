"""The causal-LM readout under bf16 autocast with fp32 weights (``fit``'s mixed_precision="bf16"): its head
matmuls run in bf16, as the model's own head does, and its losses and gradients match the fp32 readout
within bf16 tolerance (issue 46, "mixed precision like ERM")."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from descentlab.readout import CausalLMReadout, layer_losses
from tiny_models import tiny_gpt2

VOCAB = 97  # no other dimension of the model shares it
MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.addmm_.default)


class HeadMatmuls(TorchDispatchMode):
    """The dtypes of every matmul with a vocabulary-sized operand."""

    def __init__(self) -> None:
        super().__init__()
        self.dtypes: list[set[torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in MATMULS:
            mats = [a for a in args if isinstance(a, torch.Tensor) and a.dim() == 2]
            if any(VOCAB in a.shape for a in mats):
                self.dtypes.append({a.dtype for a in mats})
        return func(*args, **(kwargs or {}))


def _case():
    model = tiny_gpt2(layers=3, hidden=32, vocab=VOCAB, positions=64, seed=0)
    ids = torch.randint(0, VOCAB, (4, 33), generator=torch.Generator().manual_seed(2))
    batch = {"input_ids": ids, "labels": ids}
    with torch.no_grad():  # the once-per-model structure probe and head check, outside the counts
        layer_losses(model, batch)
    return model, batch


def _step(model, batch, readout, autocast: bool):
    model.zero_grad()
    with HeadMatmuls() as rec:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            f = layer_losses(model, batch, readout=readout)
        (f * torch.arange(1.0, f.numel() + 1)).sum().backward()  # every layer weighted, as a Lagrangian
    return f.detach(), model.lm_head.weight.grad.clone(), rec.dtypes


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_the_fused_readout_runs_its_head_in_bf16_under_autocast() -> None:
    """Every layer on every token through the fused linear cross-entropy, 8 chunks of 16 rows per layer."""
    model, batch = _case()
    readout = CausalLMReadout(sample_tokens=None, chunk_size=16)
    f32, g32, dtypes32 = _step(model, batch, readout, autocast=False)
    assert dtypes32 and all(d == {torch.float32} for d in dtypes32)
    f16, g16, dtypes16 = _step(model, batch, readout, autocast=True)
    assert len(dtypes16) == len(dtypes32) and all(d == {torch.bfloat16} for d in dtypes16), dtypes16
    assert f16.dtype == torch.float32 and g16.dtype == torch.float32
    # stated bf16 tolerance (the body runs in bf16 too): losses 1e-3 relative, head gradient 1e-2
    # (measured 7e-6 and 2.1e-3; the sampled readout below 1.7e-5 and 2.5e-3)
    assert _rel(f16, f32) < 1e-3 and _rel(g16, g32) < 1e-2, (_rel(f16, f32), _rel(g16, g32))
    # f_L is the model's own loss under the same autocast (its head in bf16 as well)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        own = model(**batch).loss
    torch.testing.assert_close(f16[-1], own.float(), rtol=2e-3, atol=0)


def test_the_default_sampled_readout_runs_its_head_in_bf16_under_autocast() -> None:
    model, batch = _case()
    f32, g32, _ = _step(model, batch, CausalLMReadout(generator=torch.Generator().manual_seed(4)), False)
    f16, g16, dtypes = _step(model, batch, CausalLMReadout(generator=torch.Generator().manual_seed(4)), True)
    assert dtypes and all(d == {torch.bfloat16} for d in dtypes), dtypes
    assert _rel(f16, f32) < 1e-3 and _rel(g16, g32) < 1e-2, (_rel(f16, f32), _rel(g16, g32))
