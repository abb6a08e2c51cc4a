"""layer_loss_profile: example-weighted mean of layer_losses; stacked draws agree with one pass per draw."""

from __future__ import annotations

import torch

from descentlab.evaluation import layer_loss_profile
from descentlab.perturbations import perturb_embeddings
from descentlab.readout import layer_losses


def test_clean_profile_is_the_weighted_mean_of_batch_losses(tiny_bert, make_batch, random_rows) -> None:
    rows = random_rows(10, 4, 9, seed=8)
    labels = [i % 2 for i in range(10)]
    batches = [make_batch(rows[:7], labels[:7]), make_batch(rows[7:], labels[7:])]
    with torch.no_grad():
        expected = (7 * layer_losses(tiny_bert, batches[0]) + 3 * layer_losses(tiny_bert, batches[1])) / 10
        whole = layer_losses(tiny_bert, make_batch(rows, labels))
    got = torch.tensor(layer_loss_profile(tiny_bert, batches), dtype=expected.dtype)
    assert got.shape == (tiny_bert.config.num_hidden_layers + 1,)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got, whole, rtol=1e-4, atol=1e-5)  # padding does not matter


def test_noisy_profile_averages_draws_like_separate_passes(tiny_bert, make_batch, random_rows) -> None:
    rows = random_rows(6, 4, 9, seed=9)
    batch = make_batch(rows, [i % 2 for i in range(6)])
    stacked = layer_loss_profile(tiny_bert, [batch], kind="uniform", gamma=2.0, draws=2, seed=3)
    separate = []
    with torch.no_grad():
        for draw in range(2):
            with perturb_embeddings(tiny_bert, "uniform", 2.0, seed=3, draw=draw):
                separate.append(layer_losses(tiny_bert, batch))
    torch.testing.assert_close(
        torch.tensor(stacked), torch.stack(separate).mean(0).float(), rtol=1e-5, atol=1e-6
    )
    clean = layer_loss_profile(tiny_bert, [batch])
    assert stacked != clean
