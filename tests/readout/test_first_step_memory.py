"""The first readout call (which traces the model's structure and checks its head) costs no more memory
than later ones, with activation checkpointing on; the fused causal-LM readout equals the unfused one."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from descentlab.constrained import LayerwiseDescent
from descentlab.readout import CausalLMReadout, layer_losses
from tiny_models import FAMILIES, family_batch, tiny_bert, tiny_family, tiny_gpt2, tiny_llama


def transient_peak_bytes(step: Callable[[], None]) -> int:
    """High-water mark of CPU tensor bytes allocated during ``step()`` (torch.profiler memory events, as
    benchmarks/constrained_overhead.py measures it)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as fh:
            memory = [e["args"] for e in json.load(fh)["traceEvents"] if e.get("name") == "[memory]"]
    finally:
        os.unlink(path)
    start = memory[0]["Total Allocated"] - memory[0]["Bytes"]
    return max(m["Total Allocated"] for m in memory) - start


def _lm_batch(vocab: int, b: int = 4, t: int = 64) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, vocab, (b, t), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _steps(model, loss_fn) -> Callable[[], None]:
    def step() -> None:
        loss_fn().backward()
        model.zero_grad(set_to_none=True)

    return step


def test_first_constrained_step_peak_equals_later_steps_and_stays_near_erm() -> None:
    model = tiny_llama(layers=4, hidden=64, heads=4, kv_heads=2, vocab=97, positions=64, seed=0)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    batch = _lm_batch(97)
    constraint = LayerwiseDescent(4, alpha=0.05, dual_lr=0.01)
    constrained = _steps(model, lambda: constraint.lagrangian(layer_losses(model, batch)))
    erm = _steps(model, lambda: model(**batch, labels=batch["input_ids"]).loss)
    first = transient_peak_bytes(constrained)  # traces the structure and checks the head
    second = transient_peak_bytes(constrained)
    erm_peak = transient_peak_bytes(erm)
    assert first <= 1.02 * second, (first, second)
    # every layer on every token: the hidden states are the ones the checkpointed forward keeps anyway
    assert second <= 1.2 * erm_peak, (second, erm_peak)


def test_first_classifier_step_peak_equals_later_steps() -> None:
    model = tiny_bert(layers=4, hidden=64, heads=4, positions=64, seed=0)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    batch = _lm_batch(97, b=8, t=64)
    batch["labels"] = torch.tensor([0, 1] * 4)
    step = _steps(model, lambda: layer_losses(model, batch).sum())
    first = transient_peak_bytes(step)
    second = transient_peak_bytes(step)
    assert first <= 1.02 * second, (first, second)


def _grads(model, batch, readout) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    f = layer_losses(model, batch, readout=readout)
    (f.nan_to_num() * torch.arange(1.0, len(f) + 1)).sum().backward()
    return f.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"sample_tokens": 9, "chunk_size": 5},
        {"sample_tokens": 4, "chunk_size": 64},  # the sampled rows of every layer fit one chunk
        {"layers": [0, 2], "chunk_size": 16},
    ],
    ids=["auto", "sampled", "sampled-one-chunk", "subset"],
)
def test_fused_readout_equals_the_unfused_twin(family, options) -> None:
    model = (
        tiny_llama(layers=3, hidden=32, vocab=97, seed=1)
        if family == "llama"
        else tiny_gpt2(layers=3, hidden=32, heads=4, vocab=97, positions=64, seed=1)
    )
    batch = _lm_batch(97, b=3, t=20)
    batch["attention_mask"][0, 14:] = 0  # padding: those targets are ignored
    got, ref = [], []
    for fused, out in ((True, got), (False, ref)):
        gen = torch.Generator().manual_seed(0)
        readout = CausalLMReadout(fused=fused, generator=gen, **{"chunk_size": 7, **options})
        out.extend(_grads(model, batch, readout))
    torch.testing.assert_close(got[0], ref[0], rtol=0, atol=1e-5, equal_nan=True)
    assert len(got[1]) == len(ref[1])
    for a, b in zip(got[1], ref[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_the_probe_draws_no_random_numbers() -> None:
    """Tracing runs a separate small forward; with dropout on it must leave the RNG stream untouched."""
    a = tiny_gpt2(layers=2, hidden=32, heads=4, vocab=97, positions=64, seed=2, dropout=0.1).train()
    b = tiny_gpt2(layers=2, hidden=32, heads=4, vocab=97, positions=64, seed=2, dropout=0.1).train()
    batch = _lm_batch(97, b=2, t=16)
    layer_losses(a, batch)  # a is traced now
    torch.manual_seed(5)
    fa = layer_losses(a, batch)
    torch.manual_seed(5)
    fb = layer_losses(b, batch)  # b is traced inside this call
    torch.testing.assert_close(fa, fb, rtol=0, atol=0)


@pytest.mark.parametrize("name", [n for n, (kind, *_) in FAMILIES.items() if kind == "lm"])
def test_fused_equals_unfused_on_every_causal_lm_family(name: str) -> None:
    """Biased heads (Phi), logit scales (Cohere, Granite), OPT's project_out tail, tied embeddings."""
    model = tiny_family(name).train()
    batch = family_batch(name)
    got = _grads(model, batch, CausalLMReadout(chunk_size=5, sample_tokens=None))
    ref = _grads(model, batch, CausalLMReadout(chunk_size=5, fused=False, sample_tokens=None))
    torch.testing.assert_close(got[0], ref[0], rtol=0, atol=1e-5)
    for a, b in zip(got[1], ref[1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
