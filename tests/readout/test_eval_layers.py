"""What an evaluation reads (issue 46): ``layer_losses(..., layers="final")`` reads only the final
constraint's check beside the model's own loss (a causal LM: layers L-1 and L, two head passes where every
layer takes L+1), and ``layers="all"`` (the default, as layer profiles use it) every layer."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from descentlab.constrained.descent import descent_violations
from descentlab.errors import ConfigError
from descentlab.readout import CausalLMReadout, layer_losses
from tiny_models import classification_rows, tiny_bert, tiny_gpt2

VOCAB, LAYERS = 97, 5
MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)


class HeadPasses(TorchDispatchMode):
    """Counts the matmuls with a vocabulary-sized operand (one per head pass of one chunk)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in MATMULS and any(isinstance(a, torch.Tensor) and VOCAB in a.shape for a in args):
            self.count += 1
        return func(*args, **(kwargs or {}))


def _lm():
    model = tiny_gpt2(layers=LAYERS, hidden=32, vocab=VOCAB, positions=64, seed=0).eval()
    ids = torch.randint(0, VOCAB, (4, 33), generator=torch.Generator().manual_seed(2))
    batch = {"input_ids": ids, "labels": ids}
    with torch.no_grad():
        layer_losses(model, batch)  # the once-per-model structure probe, outside the counts
    return model, batch


def _passes(fn) -> tuple[torch.Tensor, int]:
    with torch.no_grad(), HeadPasses() as rec:
        out = fn()
    return out, rec.count


def test_final_reads_the_last_constraint_at_one_head_pass_beyond_erm() -> None:
    model, batch = _lm()
    f_all, all_passes = _passes(lambda: layer_losses(model, batch))
    f_final, final_passes = _passes(lambda: layer_losses(model, batch, layers="final"))
    _, erm_passes = _passes(lambda: model(**batch).loss)
    assert (erm_passes, final_passes, all_passes) == (1, 2, LAYERS + 1)
    torch.testing.assert_close(f_final[-2:], f_all[-2:], rtol=0, atol=0)
    assert bool(f_final[:-2].isnan().all())
    torch.testing.assert_close(f_final[-1], model(**batch).loss.detach(), rtol=1e-5, atol=0)
    # the final constraint's check is the same from either read
    alpha = torch.full((LAYERS,), 0.05, dtype=torch.float64)
    g_all, g_final = descent_violations(f_all, alpha), descent_violations(f_final, alpha)
    torch.testing.assert_close(g_final[-1], g_all[-1], rtol=0, atol=0)
    assert bool(g_final[:-1].isnan().all())


def test_a_given_readout_keeps_its_settings_and_negative_layers_count_from_L() -> None:
    model, batch = _lm()
    readout = CausalLMReadout(chunk_size=16, sample_tokens=8, generator=torch.Generator().manual_seed(1))
    f = layer_losses(model, batch, readout=readout, layers="final")  # under grad: sampled at k = 8
    assert bool(f[:-2].isnan().all()) and math.isfinite(float(f[-2].detach()))
    picked = CausalLMReadout(sample_tokens=None, layers=[-1, 0])
    with torch.no_grad():
        f = layer_losses(model, batch, readout=picked)
        full = layer_losses(model, batch)
    assert picked.last_estimate.layers == [0, LAYERS - 1]
    torch.testing.assert_close(f[[0, LAYERS - 1, LAYERS]], full[[0, LAYERS - 1, LAYERS]], rtol=0, atol=0)
    assert bool(f[1 : LAYERS - 1].isnan().all())


def test_other_families_read_every_layer_either_way_and_bad_values_are_refused() -> None:
    model = tiny_bert(layers=2).eval()
    rows = classification_rows(6, seed=0)
    batch = {k: torch.stack([r[k] for r in rows]) for k in rows[0]}
    with torch.no_grad():
        torch.testing.assert_close(layer_losses(model, batch, layers="final"), layer_losses(model, batch))
    with pytest.raises(ConfigError, match="'all' or 'final'"):
        layer_losses(model, batch, layers="last")
    with pytest.raises(ConfigError, match="layer indices"):
        CausalLMReadout(layers=[1.5])
