"""perturb_embeddings / perturb_inputs: variances, exact no-op at γ=0, hook hygiene, reproducibility."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from descentlab.errors import ConfigError, DataError, ModelError
from descentlab.perturbations import (
    embedding_rms,
    perturb_embeddings,
    perturb_inputs,
    substitution_probability,
)


def _embedding_output(model, batch, **perturbation) -> torch.Tensor:
    """The (possibly perturbed) output of the input-embedding module for ``batch``."""
    seen = {}
    module = model.get_input_embeddings()
    with perturb_embeddings(model, **perturbation):
        handle = module.register_forward_hook(lambda m, a, out: seen.setdefault("out", out.detach().clone()))
        try:
            model(**batch)
        finally:
            handle.remove()
    return seen["out"]


@pytest.mark.parametrize("kind", ["gaussian", "uniform", "discrete"])
@pytest.mark.parametrize("gamma", [0.5, 2.0])
def test_each_kind_has_variance_gamma_sigma_squared(tiny_bert, make_batch, random_rows, kind, gamma) -> None:
    batch = make_batch(random_rows(32, 40, 40, seed=1))
    clean = _embedding_output(tiny_bert, batch, kind=kind, gamma=0.0)
    noisy = _embedding_output(tiny_bert, batch, kind=kind, gamma=gamma, seed=3)
    delta = (noisy - clean).double()
    sigma_e = tiny_bert.bert.embeddings.word_embeddings.weight.double().pow(2).mean().sqrt().item()
    target = (gamma * sigma_e) ** 2
    assert abs(delta.mean().item()) < 0.02 * gamma * sigma_e
    assert delta.var().item() == pytest.approx(target, rel=0.03)
    if kind == "discrete":
        torch.testing.assert_close(delta.abs(), torch.full_like(delta, gamma * sigma_e), rtol=1e-5, atol=1e-6)
    if kind == "uniform":
        assert delta.abs().max().item() <= gamma * sigma_e * 3**0.5 + 1e-6


def test_sigma_e_is_the_rms_of_the_embedding_matrix(tiny_bert) -> None:
    w = tiny_bert.get_input_embeddings().weight.detach().double()
    assert embedding_rms(tiny_bert.get_input_embeddings()) == pytest.approx(w.pow(2).mean().sqrt().item())


@pytest.mark.parametrize("kind", ["gaussian", "uniform", "discrete", "substitute"])
def test_gamma_zero_is_bitwise_noop(tiny_bert, make_batch, random_rows, kind) -> None:
    batch = make_batch(random_rows(6, 3, 12, seed=2))
    with torch.no_grad():
        clean = tiny_bert(**batch).logits
        with perturb_embeddings(tiny_bert, kind, 0.0, seed=5) as record:
            same = tiny_bert(**batch).logits
    assert torch.equal(clean, same)
    assert record.calls == 1


def test_hook_removed_on_exit_and_on_exception(tiny_bert, make_batch) -> None:
    module = tiny_bert.get_input_embeddings()
    batch = make_batch([[5, 6, 7]])
    clean = tiny_bert(**batch).logits.detach()
    with perturb_embeddings(tiny_bert, "gaussian", 1.0):
        assert len(module._forward_hooks) == 1
    assert len(module._forward_hooks) == 0
    with pytest.raises(RuntimeError, match="boom"), perturb_embeddings(tiny_bert, "substitute", 2.0):
        raise RuntimeError("boom")
    assert len(module._forward_hooks) == 0
    assert torch.equal(tiny_bert(**batch).logits.detach(), clean)


def test_same_seed_same_noise_other_seed_or_draw_differs(tiny_bert, make_batch, random_rows) -> None:
    batch = make_batch(random_rows(4, 5, 9, seed=3))
    a = _embedding_output(tiny_bert, batch, kind="gaussian", gamma=1.0, seed=11)
    b = _embedding_output(tiny_bert, batch, kind="gaussian", gamma=1.0, seed=11)
    c = _embedding_output(tiny_bert, batch, kind="gaussian", gamma=1.0, seed=12)
    d = _embedding_output(tiny_bert, batch, kind="gaussian", gamma=1.0, seed=11, draw=1)
    assert torch.equal(a, b)
    assert not torch.allclose(a, c) and not torch.allclose(a, d)


def test_noise_does_not_depend_on_batch_composition_or_padding(tiny_bert, make_batch, random_rows) -> None:
    rows = random_rows(5, 3, 15, seed=4)
    target = rows[2]
    alone = make_batch([target])
    together = make_batch(rows)
    reordered = make_batch([rows[4], target, rows[0]])
    n = len(target)
    kw = {"kind": "uniform", "gamma": 1.5, "seed": 9}
    e_alone = _embedding_output(tiny_bert, alone, **kw)[0, :n]
    torch.testing.assert_close(_embedding_output(tiny_bert, together, **kw)[2, :n], e_alone)
    torch.testing.assert_close(_embedding_output(tiny_bert, reordered, **kw)[1, :n], e_alone)
    with torch.no_grad(), perturb_embeddings(tiny_bert, **kw):
        logit_alone = tiny_bert(**alone).logits[0]
        logit_batched = tiny_bert(**together).logits[2]
    torch.testing.assert_close(logit_alone, logit_batched, rtol=1e-4, atol=1e-5)


def test_sequence_keying_follows_row_index(tiny_bert, make_batch) -> None:
    batch = make_batch([[4, 4, 4], [4, 4, 4]])
    content = _embedding_output(tiny_bert, batch, kind="gaussian", gamma=1.0, key="content")
    sequence = _embedding_output(tiny_bert, batch, kind="gaussian", gamma=1.0, key="sequence")
    assert torch.equal(content[0], content[1])  # same tokens, same noise
    assert not torch.allclose(sequence[0], sequence[1])


def test_replicas_give_each_copy_its_own_draw(tiny_bert, make_batch, random_rows) -> None:
    batch = make_batch(random_rows(3, 4, 8, seed=5))
    stacked = {k: torch.cat([v] * 3) for k, v in batch.items()}
    out = _embedding_output(tiny_bert, stacked, kind="gaussian", gamma=1.0, seed=2, replicas=3)
    for j in range(3):
        single = _embedding_output(tiny_bert, batch, kind="gaussian", gamma=1.0, seed=2, draw=j)
        torch.testing.assert_close(out[3 * j : 3 * j + 3], single)
    with pytest.raises(DataError), perturb_embeddings(tiny_bert, "gaussian", 1.0, replicas=2):
        tiny_bert(**batch)


@pytest.mark.parametrize("gamma", [0.4, 2.0, 4.0, 6.0])
def test_substitute_replaces_tokens_with_vocabulary_rows(tiny_bert, make_batch, random_rows, gamma) -> None:
    batch = make_batch(random_rows(40, 50, 50, seed=6))
    clean = _embedding_output(tiny_bert, batch, kind="gaussian", gamma=0.0)
    noisy = _embedding_output(tiny_bert, batch, kind="substitute", gamma=gamma, seed=1)
    changed = (noisy != clean).any(dim=-1)
    p = substitution_probability(gamma)
    assert p == min(1.0, gamma / 4)
    # a substitute can draw the token it replaces (1/97 here): allow for it
    assert changed.double().mean().item() == pytest.approx(p * (1 - 1 / 97), abs=0.025)
    table = tiny_bert.get_input_embeddings().weight.detach()
    gap = (noisy[changed][:, None, :] - table[None]).abs().amax(dim=-1)
    assert torch.all(gap.min(dim=1).values == 0)


def test_errors_are_clear(tiny_bert) -> None:
    with pytest.raises(ConfigError, match="kind"), perturb_embeddings(tiny_bert, "salt", 1.0):
        pass
    with pytest.raises(ConfigError, match="gamma"), perturb_embeddings(tiny_bert, "gaussian", -1.0):
        pass
    with (
        pytest.raises(ModelError, match="perturb_inputs"),
        perturb_embeddings(nn.Linear(3, 3), "gaussian", 1.0),
    ):
        pass
    with pytest.raises(ConfigError), perturb_inputs(nn.Linear(3, 3), "substitute", 1.0, sigma=1.0):
        pass


class _PixelNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.Tensor] = []

    def forward(self, pixel_values: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        self.seen.append(pixel_values.detach().clone())
        return pixel_values.flatten(1).sum(1) * scale


@pytest.mark.parametrize("kind", ["gaussian", "uniform", "discrete"])
def test_perturb_inputs_variance_noop_and_cleanup(kind) -> None:
    net = _PixelNet()
    x = torch.rand(16, 3, 32, 32, dtype=torch.float64)
    with perturb_inputs(net, kind, 0.0, sigma=0.1) as record:
        net(pixel_values=x)
    assert torch.equal(net.seen[-1], x) and record.calls == 1
    with perturb_inputs(net, kind, 2.0, seed=1, sigma=0.1):
        net(pixel_values=x, scale=2.0)
        net(x)  # positional
    delta_kw, delta_pos = net.seen[-2] - x, net.seen[-1] - x
    assert delta_kw.var().item() == pytest.approx(0.04, rel=0.05)
    torch.testing.assert_close(delta_kw, delta_pos)
    assert not net._forward_pre_hooks
    with perturb_inputs(net, kind, 3.0, sigma=0.5, clamp=(0.0, 1.0)):
        net(x)
    assert net.seen[-1].min() >= 0 and net.seen[-1].max() <= 1


def test_neftune_kind_has_neftunes_scale_per_example(tiny_bert, make_batch, random_rows) -> None:
    """NEFTune: uniform noise of half-width α/√(n d), n = the example's real tokens (padding excluded)."""
    rows = random_rows(24, 10, 40, seed=4)
    batch = make_batch(rows)
    alpha = 5.0
    clean = _embedding_output(tiny_bert, batch, kind="neftune", gamma=0.0)
    noisy = _embedding_output(tiny_bert, batch, kind="neftune", gamma=alpha, seed=1, pad_token_id=0)
    delta = (noisy - clean).double()
    d = delta.shape[-1]
    for i, row in enumerate(rows):
        half = alpha / (len(row) * d) ** 0.5
        real = delta[i, : len(row)]
        assert real.abs().max().item() <= half * (1 + 1e-5)
        assert real.abs().max().item() > 0.9 * half
    pooled = torch.cat(
        [delta[i, : len(r)].flatten() / (alpha / (len(r) * d) ** 0.5) for i, r in enumerate(rows)]
    )
    assert pooled.var().item() == pytest.approx(1 / 3, rel=0.03)  # U(-1, 1)
    # an example's noise does not depend on its batch (content keyed, its own length)
    alone = _embedding_output(
        tiny_bert, make_batch(rows[:1]), kind="neftune", gamma=alpha, seed=1, pad_token_id=0
    )
    base = _embedding_output(tiny_bert, make_batch(rows[:1]), kind="neftune", gamma=0.0)
    n0 = len(rows[0])
    torch.testing.assert_close((alone - base)[0, :n0], (noisy - clean)[0, :n0], rtol=0, atol=1e-6)
