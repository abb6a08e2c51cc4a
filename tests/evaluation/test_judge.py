"""Head-to-head judges: scoring agrees with its slow twin and with lm_eval; preferences are symmetric."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import GPT2LMHeadModel

from descentlab.data.instructions import collate_causal
from descentlab.errors import ConfigError
from descentlab.evaluation.judge import (
    GenerativeJudge,
    LikelihoodJudge,
    Noise,
    likelihood_preferences,
    preference_summary,
    score_examples,
    score_examples_reference,
)
from descentlab.evaluation.winrate import win_rate as score_win_rate
from tiny_models import PAD, VOCAB
from tiny_models import tiny_gpt2 as _tiny_gpt2


def win_rate(p: torch.Tensor) -> float:
    return preference_summary(p).rate


def tiny_gpt2(seed: int, vocab: int = VOCAB) -> GPT2LMHeadModel:
    # GPT2Config's default dropout (0.1): one test trains a model in train mode
    return _tiny_gpt2(
        layers=2,
        hidden=32,
        vocab=vocab,
        positions=256,
        seed=seed,
        dropout=0.1,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=2,
    ).eval()


def random_examples(n: int, seed: int = 0) -> list[dict[str, list[int]]]:
    """Examples of varied lengths (so batches pad), reference = the last few tokens."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(6, 20, (1,), generator=g))
        prompt = int(torch.randint(2, length - 1, (1,), generator=g))
        ids = torch.randint(1, VOCAB, (length,), generator=g).tolist()
        out.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:], "prompt_length": [prompt]})
    return out


@pytest.mark.parametrize("noise", [None, Noise("gaussian", 1.0, seed=3), Noise("discrete", 0.5, seed=1)])
def test_batched_scores_match_unpadded_reference(noise: Noise | None) -> None:
    model, examples = tiny_gpt2(0), random_examples(9)
    fast = score_examples(
        model, examples, pad_token_id=PAD, collate_fn=collate_causal, batch_size=4, noise=noise
    )
    slow = score_examples_reference(model, examples, pad_token_id=PAD, noise=noise)
    torch.testing.assert_close(fast.reference_nll, slow.reference_nll, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(fast.all_nll, slow.all_nll, rtol=1e-5, atol=1e-4)
    assert torch.equal(fast.reference_tokens, slow.reference_tokens)
    assert torch.equal(fast.all_tokens, slow.all_tokens)


def test_noise_changes_scores_and_is_shared_across_batchings() -> None:
    model, examples = tiny_gpt2(0), random_examples(6)
    clean = score_examples(model, examples, pad_token_id=PAD, collate_fn=collate_causal)
    noisy = Noise("uniform", 2.0, seed=5)
    a = score_examples(
        model, examples, pad_token_id=PAD, collate_fn=collate_causal, batch_size=6, noise=noisy
    )
    b = score_examples(
        model, examples[::-1], pad_token_id=PAD, collate_fn=collate_causal, batch_size=1, noise=noisy
    )
    assert (a.all_nll - clean.all_nll).abs().min() > 1e-4
    torch.testing.assert_close(a.all_nll, b.all_nll.flip(0), rtol=1e-5, atol=1e-4)


def test_all_token_perplexity_matches_lm_eval() -> None:
    from descentlab.models.perplexity import evaluate_lm

    model = tiny_gpt2(1)
    blocks = torch.randint(1, VOCAB, (5, 12), generator=torch.Generator().manual_seed(2))
    examples = [{"input_ids": b.tolist(), "labels": b.tolist()} for b in blocks]
    ours = score_examples(model, examples, pad_token_id=PAD, collate_fn=collate_causal, batch_size=2)
    theirs = evaluate_lm(model, blocks, batch_size=3)
    assert int(ours.all_tokens.sum()) == theirs.tokens
    assert ours.perplexity("all") == pytest.approx(theirs.perplexity, rel=1e-5)


def test_likelihood_preferences_closed_form() -> None:
    a = torch.tensor([1.0, 2.0, 3.0, 4.0])
    b = torch.tensor([2.0, 2.0, 1.0, 4.0 + 1e-9])
    p = likelihood_preferences(a, b)
    assert p.tolist() == [1.0, 0.5, 0.0, 0.5]
    summary = preference_summary(p)
    assert (summary.rate, summary.wins, summary.ties, summary.losses) == (0.5, 1, 2, 1)
    assert summary.stderr == pytest.approx(0.25)  # sqrt(0.5 * 0.5 / 4)


def test_preferences_agree_with_robustness_win_rate() -> None:
    """The per-example rule and the shared score-based win_rate (lower NLL is better) are twins."""
    g = torch.Generator().manual_seed(0)
    a = torch.randint(0, 5, (200,), generator=g).double()  # integers: many exact ties
    b = torch.randint(0, 5, (200,), generator=g).double()
    ours = preference_summary(likelihood_preferences(a, b, tol=0.0))
    theirs = score_win_rate(a.numpy(), b.numpy(), higher_is_better=False)
    assert (ours.wins, ours.ties, ours.losses) == (theirs.wins, theirs.ties, theirs.losses)
    assert ours.rate == pytest.approx(theirs.rate, abs=1e-12)
    assert ours.stderr == pytest.approx(theirs.stderr, abs=1e-12)


@pytest.mark.parametrize("noise", [None, Noise("gaussian", 1.5, seed=0)])
def test_likelihood_judge_is_symmetric(noise: Noise | None) -> None:
    a, b, examples = tiny_gpt2(0), tiny_gpt2(1), random_examples(16)
    judge = LikelihoodJudge(pad_token_id=PAD, collate_fn=collate_causal, batch_size=8)
    p_ab = judge.preferences(a, b, examples, noise=noise)
    p_ba = judge.preferences(b, a, examples, noise=noise)
    torch.testing.assert_close(p_ba, 1.0 - p_ab)
    assert win_rate(p_ab) + win_rate(p_ba) == pytest.approx(1.0)
    assert 0.0 < win_rate(p_ab) < 1.0  # two random models: neither wins everything


@pytest.mark.parametrize("noise", [None, Noise("discrete", 1.0, seed=4)])
def test_model_against_itself_is_half(noise: Noise | None) -> None:
    model, examples = tiny_gpt2(0), random_examples(12)
    judge = LikelihoodJudge(pad_token_id=PAD, collate_fn=collate_causal)
    assert win_rate(judge.preferences(model, model, examples, noise=noise)) == 0.5
    twin = copy.deepcopy(model)  # another object, the same weights
    assert win_rate(judge.preferences(model, twin, examples, noise=noise)) == 0.5


def test_likelihood_judge_prefers_the_model_that_learned_the_text() -> None:
    """A model trained on a periodic sequence beats its untrained start on held-out windows of it."""
    period = torch.randint(1, VOCAB, (7,), generator=torch.Generator().manual_seed(9))
    text = period.repeat(40)
    trained, start = tiny_gpt2(3), tiny_gpt2(3)
    opt = torch.optim.AdamW(trained.parameters(), lr=3e-3)
    trained.train()
    for step in range(30):
        s = (step * 5) % 200
        x = text[s : s + 24].unsqueeze(0)
        trained(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    examples = [
        {"input_ids": text[s : s + 16].tolist(), "labels": [-100] * 10 + text[s + 10 : s + 16].tolist()}
        for s in range(1, 100, 9)
    ]
    judge = LikelihoodJudge(pad_token_id=PAD, collate_fn=collate_causal)
    assert win_rate(judge.preferences(trained, start, examples)) == 1.0


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer):
    """The shared SmolLM2 tokenizer (a copy: padding with its end-of-text id here changes no other test)."""
    tok = copy.deepcopy(smollm2_tokenizer)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def biased_judge(tokenizer, label: str) -> GPT2LMHeadModel:
    """A GPT-2 whose every next-token distribution puts its mass on ``label``'s tokens: total position bias."""
    model = tiny_gpt2(7, vocab=len(tokenizer))
    direction = torch.randn(model.config.n_embd, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.copy_(direction)  # final hidden state = direction at every position
        for tok in tokenizer(label, add_special_tokens=False)["input_ids"]:
            model.lm_head.weight[tok] = 20.0 * direction
    return model


def test_generative_judge_cancels_position_bias(tokenizer) -> None:
    judge = GenerativeJudge(biased_judge(tokenizer, " 1"), tokenizer, collate_fn=collate_causal)
    prompts = ["Write a greeting.", "Name a colour."]
    assert judge.verdicts(prompts, ["Hello.", "Red."], ["Goodbye.", "Blue."]).tolist() == [1.0, 1.0]
    assert judge.verdicts(prompts, ["Goodbye.", "Blue."], ["Hello.", "Red."]).tolist() == [1.0, 1.0]
    assert judge.compare_texts(prompts, ["Hello.", "Red."], ["Goodbye.", "Blue."]).tolist() == [0.5, 0.5]


def test_generative_judge_symmetric_and_self_half(tokenizer) -> None:
    judge = GenerativeJudge(
        tiny_gpt2(5, vocab=len(tokenizer)), tokenizer, collate_fn=collate_causal, batch_size=3
    )
    prompts = ["Describe the weather.", "Say something kind.", "Count to three."]
    a = ["It is raining hard today.", "You did well.", "One, two, three."]
    b = ["Sunny.", "Go away.", "1 2 3"]
    p_ab, p_ba = judge.compare_texts(prompts, a, b), judge.compare_texts(prompts, b, a)
    torch.testing.assert_close(p_ba, 1.0 - p_ab)
    assert judge.compare_texts(prompts, a, a).tolist() == [0.5, 0.5, 0.5]
    soft = GenerativeJudge(judge.model, tokenizer, collate_fn=collate_causal, soft=True)
    p = soft.compare_texts(prompts, a, b)
    assert ((p > 0) & (p < 1)).all()
    torch.testing.assert_close(soft.compare_texts(prompts, b, a), 1.0 - p)


def test_generate_then_judge_model_against_itself(tokenizer) -> None:
    gen = tiny_gpt2(2, vocab=len(tokenizer))
    judge = GenerativeJudge(tiny_gpt2(5, vocab=len(tokenizer)), tokenizer, collate_fn=collate_causal)
    examples = [
        {"input_ids": tokenizer(t)["input_ids"], "prompt_length": [len(tokenizer(t)["input_ids"])]}
        for t in ("It was a truth", "Emma Woodhouse, handsome,")
    ]
    kw = {"tokenizer": tokenizer, "noise": Noise("gaussian", 1.0, seed=0), "max_new_tokens": 5}
    p = judge.preferences(gen, copy.deepcopy(gen), examples, **kw)
    assert p.tolist() == [0.5, 0.5]


def test_generative_judge_rejects_bad_labels(tokenizer) -> None:
    with pytest.raises(ConfigError):
        GenerativeJudge(
            tiny_gpt2(0, vocab=len(tokenizer)), tokenizer, collate_fn=collate_causal, labels=(" 1", " 1")
        )
    with pytest.raises(ConfigError):
        GenerativeJudge(
            tiny_gpt2(0, vocab=len(tokenizer)),
            tokenizer,
            collate_fn=collate_causal,
            template="{prompt} {first}",
        )
