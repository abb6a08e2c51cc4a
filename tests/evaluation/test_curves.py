"""robustness_curve: reproducibility, fast (stacked draws) vs slow path, closed forms, real MiniLM."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from descentlab.errors import ModelError
from descentlab.evaluation import RobustnessCurves, robustness_curve, token_nll_metric
from descentlab.perturbations import perturb_embeddings, perturb_inputs
from descentlab.perturbations.hooks import embedding_rms
from tiny_models import tiny_gpt2

GAMMAS = (0.0, 0.5, 2.0)


@pytest.fixture
def batches(make_batch, random_rows):
    rows = random_rows(24, 4, 14, seed=7)
    labels = [i % 2 for i in range(24)]
    return [make_batch(rows[i : i + 8], labels[i : i + 8]) for i in range(0, 24, 8)]


def _label_prob(model, batch):
    """A continuous metric (mean probability of the true label), so paths can be compared tightly."""
    probs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.softmax(-1)
    p = probs.gather(1, batch["labels"][:, None])[:, 0].double()
    return p, torch.ones_like(p)


def test_same_seed_same_curve_and_block_shape(tiny_bert, batches) -> None:
    kw = {"gammas": GAMMAS, "draws": 2, "seed": 4, "kinds": ("gaussian", "substitute")}
    a = robustness_curve(tiny_bert, batches, **kw)
    b = robustness_curve(tiny_bert, batches, **kw)
    c = robustness_curve(tiny_bert, batches, **{**kw, "seed": 5, "metric": _label_prob})
    d = robustness_curve(tiny_bert, batches, **{**kw, "seed": 4, "metric": _label_prob})
    for kind in kw["kinds"]:
        np.testing.assert_array_equal(a.values[kind], b.values[kind])
    assert not np.array_equal(c.values["gaussian"], d.values["gaussian"])
    block = a.curves()["gaussian"]
    assert block["x_name"] == "gamma" and block["x"] == list(GAMMAS) and block["metric"] == "accuracy"
    assert len(block["mean"]) == len(block["std"]) == 3
    assert block["std"][0] == 0.0  # γ=0 is deterministic, one model
    assert a.protocol["n_eval"] == 24 and a.protocol["draws"] == 2
    assert a.summary()["gaussian"] == pytest.approx(np.mean(block["mean"]))


def test_dict_round_trip_and_concat(tiny_bert, batches) -> None:
    a = robustness_curve(tiny_bert, batches, gammas=GAMMAS, draws=2, kinds=("uniform",), model_seeds=[3])
    back = RobustnessCurves.from_dict(json.loads(json.dumps(a.to_dict())))
    np.testing.assert_array_equal(back.values["uniform"], a.values["uniform"])
    assert back.curves() == a.curves() and back.protocol == a.protocol
    both = RobustnessCurves.concat([a, back])
    assert both.values["uniform"].shape == (2, 2, 3) and both.protocol["model_seeds"] == [3, 3]


def test_clean_point_is_plain_accuracy(tiny_bert, batches) -> None:
    with torch.no_grad():
        correct = sum(
            (
                tiny_bert(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.argmax(-1)
                == b["labels"]
            )
            .sum()
            .item()
            for b in batches
        )
    result = robustness_curve(tiny_bert, batches, gammas=(0.0,), draws=1, kinds=("uniform",))
    assert result.curves()["uniform"]["mean"][0] == correct / 24


def test_stacked_draws_agree_with_one_pass_per_draw(tiny_bert, batches) -> None:
    kw = {"metric": _label_prob, "gammas": GAMMAS, "draws": 3, "kinds": ("uniform", "discrete")}
    fast = robustness_curve(tiny_bert, batches, stack_draws=True, **kw)
    slow = robustness_curve(tiny_bert, batches, stack_draws=False, **kw)
    for kind in kw["kinds"]:
        np.testing.assert_allclose(fast.values[kind], slow.values[kind], rtol=1e-5, atol=1e-6)
        assert fast.values[kind][0, :, 1:].std(axis=0).min() > 0  # draws really differ


def test_several_models_are_paired_and_enter_the_std(tiny_bert, batches) -> None:
    other = type(tiny_bert)(tiny_bert.config).eval()
    kw = {"metric": _label_prob, "gammas": GAMMAS, "draws": 2, "kinds": ("gaussian",)}
    both = robustness_curve([tiny_bert, other], batches, model_seeds=[0, 1], **kw)
    alone = robustness_curve(other, batches, **kw)
    np.testing.assert_allclose(both.values["gaussian"][1], alone.values["gaussian"][0], rtol=1e-6)
    assert both.protocol["model_seeds"] == [0, 1]
    assert both.curves()["gaussian"]["std"][0] > 0  # two models disagree on clean data


def test_hook_that_never_fires_is_an_error(tiny_bert, batches) -> None:
    def via_inputs_embeds(model, batch):
        emb = model.get_input_embeddings()(batch["input_ids"])
        logits = model(inputs_embeds=emb, attention_mask=batch["attention_mask"]).logits
        ok = (logits.argmax(-1) == batch["labels"]).double()
        return ok, torch.ones_like(ok)

    handle = tiny_bert.get_input_embeddings()
    assert handle is not None
    # the metric itself calls the embedding module, so the hook fires: no error
    robustness_curve(tiny_bert, batches, metric=via_inputs_embeds, gammas=(0.0, 1.0), draws=1)

    class Frozen(nn.Module):
        def forward(self, input_ids, attention_mask=None):
            return type("Out", (), {"logits": torch.zeros(input_ids.shape[0], 2)})()

        def get_input_embeddings(self):
            return nn.Embedding(3, 2)

    with pytest.raises(ModelError, match="never ran"):
        robustness_curve(Frozen(), batches, gammas=(0.0,), draws=1)


class _Passthrough(nn.Module):
    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return frames * 1.0


def test_input_noise_rmse_matches_closed_form() -> None:
    """Identity model + RMSE to the clean frames: the curve must be γσ for every kind."""
    frames = torch.rand(8, 4, 16, 16, dtype=torch.float64)
    data = [{"frames": frames[:4]}, {"frames": frames[4:]}]

    def sq_error(model, batch):
        out = model(batch["frames"])
        clean = batch["frames"]
        err = (out - clean).pow(2).flatten(1).sum(1)
        return err, torch.full_like(err, clean[0].numel())

    sigma = 0.2
    result = robustness_curve(
        _Passthrough(),
        data,
        metric=sq_error,
        transform=math.sqrt,
        gammas=(0.0, 0.5, 1.0, 3.0),
        draws=2,
        perturb=perturb_inputs,
        perturb_kwargs={"sigma": sigma},
    )
    for kind, block in result.curves().items():
        np.testing.assert_allclose(block["mean"], [0.0, 0.1, 0.2, 0.6], rtol=0.02, err_msg=kind)


def test_token_nll_metric_matches_hf_loss() -> None:
    lm = tiny_gpt2(layers=1, heads=2, hidden=16, vocab=50, positions=32, seed=0).eval()
    ids = torch.randint(0, 50, (3, 12))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with torch.no_grad():
        num, den = token_nll_metric(lm, batch)
        ref = lm(input_ids=ids, labels=ids).loss
    assert (num.sum() / den.sum()).item() == pytest.approx(ref.item(), rel=1e-6)
    result = robustness_curve(lm, [batch], metric="perplexity", gammas=(0.0, 1.0), draws=1)
    assert result.curves()["gaussian"]["mean"][0] == pytest.approx(math.exp(ref.item()), rel=1e-6)


def test_real_minilm_noise_scale_and_padding_independence() -> None:
    from descentlab.data import load_encoder_classifier
    from descentlab.errors import AssetMissingError

    try:
        model, tok = load_encoder_classifier("minilm")
    except AssetMissingError as e:
        pytest.skip(str(e))
    model.eval()
    emb = model.get_input_embeddings()
    sigma_e = embedding_rms(emb)
    assert sigma_e == pytest.approx(emb.weight.detach().double().pow(2).mean().sqrt().item())
    texts = ["a gorgeous, witty, seductive movie.", "the plot is paper-thin and the acting wooden, sadly."]
    alone = tok(texts[:1], return_tensors="pt")
    batch = tok(texts, padding=True, return_tensors="pt")
    seen = []
    with torch.no_grad(), perturb_embeddings(model, "gaussian", 1.0, seed=0):
        hook = emb.register_forward_hook(lambda m, a, out: seen.append(out.clone()))
        logits_alone = model(**alone).logits[0]
        logits_batch = model(**batch).logits[0]
        hook.remove()
    torch.testing.assert_close(logits_alone, logits_batch, rtol=1e-4, atol=1e-5)
    n = alone["input_ids"].shape[1]
    torch.testing.assert_close(seen[0][0], seen[1][0, :n])
    clean = emb(batch["input_ids"]).detach()
    mask = batch["attention_mask"].bool()
    delta = (seen[1] - clean)[mask]
    assert delta.var().item() == pytest.approx(sigma_e**2, rel=0.05)
