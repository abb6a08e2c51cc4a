"""Causal-LM readout: chunked == unchunked (values and gradients), unbiased token subsample, real SmolLM2."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2LMHeadModel

from descentlab.errors import ConfigError
from descentlab.readout import CausalLMReadout, layer_losses
from tiny_models import tiny_gpt2

V = 211


@pytest.fixture(scope="module")
def gpt2() -> GPT2LMHeadModel:
    return tiny_gpt2(
        layers=3, hidden=32, heads=4, vocab=V, positions=64, seed=0, bos_token_id=0, eos_token_id=0
    ).eval()


def _batch(b: int = 3, t: int = 40) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, V, (b, t), generator=g)
    mask = torch.ones_like(ids)
    mask[0, 30:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _grads(model, batch, readout) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    f = layer_losses(model, batch, readout=readout)
    (f * torch.arange(1.0, len(f) + 1)).sum().backward()
    return f.detach(), [p.grad.clone() for p in model.parameters()]


def test_chunked_equals_unchunked_values_and_gradients(gpt2) -> None:
    batch = _batch()
    exact = CausalLMReadout(
        chunk_size=None, sample_tokens=None
    )  # every layer on every token, all logits at once
    f_ref, g_ref = _grads(gpt2, batch, exact)
    for readout in (
        CausalLMReadout(chunk_size=7, sample_tokens=None),
        CausalLMReadout(chunk_size=16, checkpoint=False, sample_tokens=None),
    ):
        f, g = _grads(gpt2, batch, readout)
        torch.testing.assert_close(f, f_ref, rtol=0, atol=1e-5)
        for a, b in zip(g, g_ref, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    own = gpt2(**batch, labels=batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)).loss
    torch.testing.assert_close(f_ref[-1], own, rtol=0, atol=1e-5)


def test_token_subsample_is_unbiased_and_keeps_the_last_layer_exact(gpt2) -> None:
    batch = _batch(b=2, t=12)
    with torch.no_grad():
        full = layer_losses(gpt2, batch, readout=CausalLMReadout(chunk_size=None, sample_tokens=None))
        gen = torch.Generator().manual_seed(0)
        readout = CausalLMReadout(chunk_size=64, sample_tokens=3, generator=gen)
        draws = torch.stack([layer_losses(gpt2, batch, readout=readout) for _ in range(400)])
    torch.testing.assert_close(draws[:, -1], full[-1].expand(400), rtol=0, atol=1e-6)  # objective exact
    mean, se = draws[:, :-1].mean(0), draws[:, :-1].std(0) / 400**0.5
    assert (draws[:, :-1].std(0) > 1e-3).all()  # the intermediate layers really are subsampled
    assert ((mean - full[:-1]).abs() < 4 * se).all(), (mean, full, se)
    # one subset is shared by layers 0..L-1, so the differences ĝ vary much less than the losses
    spread_f = draws[:, 1].std()
    spread_g = (draws[:, 1] - 0.9 * draws[:, 0]).std()
    assert spread_g < spread_f


def test_options_are_validated() -> None:
    with pytest.raises(ConfigError):
        CausalLMReadout(chunk_size=0)
    with pytest.raises(ConfigError):
        CausalLMReadout(sample_tokens=1.5)
    with pytest.raises(ConfigError, match="'auto'"):
        CausalLMReadout(sample_tokens="all")


def test_default_readout_samples_half_a_batch_of_rows_in_training_and_is_exact_without_gradients(
    gpt2,
) -> None:
    """The default ("auto") reads layers 0..L-1 on ⌈N / 2R⌉ shared targets when a gradient is taken, so its
    cost is bounded by the batch, not the depth; evaluation (no gradients) reads every token."""
    readout = CausalLMReadout()
    assert readout.sample_tokens == "auto"
    assert readout.sample_size(2044, 8) == 128 and readout.sample_size(10, 3) == 2
    assert readout.sample_size(2044, 0) == 2044  # nothing below L is read
    with torch.no_grad():
        assert readout.sample_size(2044, 8) == 2044
    assert CausalLMReadout(sample_tokens=None).sample_size(2044, 8) == 2044
    assert CausalLMReadout(sample_tokens=5000).sample_size(2044, 8) == 2044

    batch = _batch(b=2, t=12)  # 2 x 11 targets, gpt2 has 3 layers below L (the embedding, 2 blocks): k = 4
    exact = CausalLMReadout(chunk_size=16, sample_tokens=None)
    with torch.no_grad():  # evaluation: the default is the exact readout
        torch.testing.assert_close(layer_losses(gpt2, batch), layer_losses(gpt2, batch, readout=exact))
    # training: the same draw as an explicit k = ⌈22 / 6⌉ = 4, the objective f_L exact
    auto = layer_losses(gpt2, batch, readout=CausalLMReadout(generator=torch.Generator().manual_seed(3)))
    fixed = CausalLMReadout(sample_tokens=4, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(auto, layer_losses(gpt2, batch, readout=fixed))
    full = layer_losses(gpt2, batch, readout=exact)
    torch.testing.assert_close(auto[-1], full[-1])
    assert not torch.allclose(auto[:-1], full[:-1])  # the layers below L really read a subset


@pytest.mark.slow
def test_smollm2_readout_matches_its_own_loss() -> None:
    from descentlab.data.pretrained import load_causal_lm, smollm2_cache_ready

    try:
        ready = smollm2_cache_ready()
    except Exception as exc:  # the asset package itself is missing
        pytest.skip(f"SmolLM2 is not installed: {exc}")
    if not ready:
        pytest.skip(
            "SmolLM2 safetensors cache not built (converting the GGUF takes ~25 s): run load_causal_lm once"
        )
    model, tokenizer = load_causal_lm("smollm2")
    model.eval()
    text = ["It is a truth universally acknowledged, that a single man in possession of a good fortune"]
    batch = dict(tokenizer(text, return_tensors="pt"))
    with torch.no_grad():
        f = layer_losses(model, batch, readout=CausalLMReadout(chunk_size=8, sample_tokens=None))
        f_ref = layer_losses(model, batch, readout=CausalLMReadout(chunk_size=None, sample_tokens=None))
        own = model(**batch, labels=batch["input_ids"]).loss
    assert f.shape == (model.config.num_hidden_layers + 1,)
    torch.testing.assert_close(f, f_ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(f[-1], own, rtol=0, atol=1e-5)
    assert f[-1] < f[0]  # the pretrained model predicts far better at its last layer than at its embeddings


def test_a_layer_subset_reads_those_layers_exactly_and_nan_elsewhere(gpt2) -> None:
    batch = _batch()
    full = layer_losses(gpt2, batch, readout=CausalLMReadout(chunk_size=16, sample_tokens=None))
    sub = layer_losses(gpt2, batch, readout=CausalLMReadout(chunk_size=16, layers=[1, 2], sample_tokens=None))
    torch.testing.assert_close(sub[[1, 2, 3]], full[[1, 2, 3]], rtol=0, atol=1e-6)
    assert torch.isnan(sub[0])
    only_last = layer_losses(gpt2, batch, readout=CausalLMReadout(layers=[]))
    assert torch.isnan(only_last[:-1]).all() and float(only_last[-1]) == pytest.approx(
        float(full[-1]), abs=1e-6
    )
    with pytest.raises(ConfigError):  # -1 counts from L (tests/readout/test_eval_layers.py); not a number
        CausalLMReadout(layers=["1"])
