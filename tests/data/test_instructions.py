"""Instruction and continuation examples: labels only on the response, exact windows of real text."""

from __future__ import annotations

import json

import pytest
import torch

from descentlab.data.instructions import (
    IGNORE_INDEX,
    PromptExample,
    austen_examples,
    collate_causal,
    continuation_examples,
    encode_example,
    format_alpaca,
    lm_windows,
    load_alpaca_json,
    split_examples,
)
from descentlab.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer):
    return smollm2_tokenizer


RECORDS = [
    {"instruction": "Name a primary colour.", "input": "", "output": "Red."},
    {"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour."},
    {"instruction": "", "input": "", "output": "dropped: no instruction"},
]


@pytest.mark.parametrize("jsonl", [False, True])
def test_load_alpaca_json_and_jsonl(tmp_path, jsonl: bool) -> None:
    path = tmp_path / "data.json"
    text = "\n".join(json.dumps(r) for r in RECORDS) if jsonl else json.dumps(RECORDS)
    path.write_text(text)
    examples = load_alpaca_json(path)
    assert len(examples) == 2
    assert examples[0] == PromptExample(format_alpaca("Name a primary colour."), "Red.")
    assert "### Input:\nGood morning" in examples[1].prompt
    assert examples[1].prompt.endswith("### Response:\n")


def test_load_alpaca_json_errors(tmp_path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        load_alpaca_json(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"prompt": "x"}]))
    with pytest.raises(DataError, match="Alpaca format"):
        load_alpaca_json(bad)


def test_split_is_seeded_and_disjoint() -> None:
    examples = [PromptExample(f"p{i}", f"r{i}") for i in range(20)]
    train, held = split_examples(examples, eval_size=5, seed=3)
    assert len(train) == 15 and len(held) == 5 and not set(train) & set(held)
    assert split_examples(examples, eval_size=5, seed=3) == (train, held)
    with pytest.raises(ConfigError):
        split_examples(examples, eval_size=20)


def test_encode_example_labels_only_the_response(tokenizer) -> None:
    ex = PromptExample(format_alpaca("Name a primary colour."), "Red is a primary colour.")
    enc = encode_example(tokenizer, ex, max_length=256)
    n_prompt = enc["prompt_length"][0]
    prompt_ids = tokenizer(ex.prompt)["input_ids"]
    response_ids = tokenizer(ex.reference, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert enc["input_ids"] == prompt_ids + response_ids
    assert enc["labels"] == [IGNORE_INDEX] * n_prompt + response_ids
    assert tokenizer.decode(enc["input_ids"][n_prompt:], skip_special_tokens=True) == ex.reference


def test_encode_example_truncates_the_prompt_start_first(tokenizer) -> None:
    ex = PromptExample("word " * 100 + "### Response:\n", "The answer.")
    response = tokenizer(ex.reference, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    enc = encode_example(tokenizer, ex, max_length=20)
    assert len(enc["input_ids"]) == 20
    assert enc["input_ids"][-len(response) :] == response  # the response survives whole
    tail = tokenizer(ex.prompt)["input_ids"][-(20 - len(response)) :]
    assert enc["input_ids"][: len(tail)] == tail  # the prompt kept its end
    short = encode_example(tokenizer, ex, max_length=4)
    assert len(short["input_ids"]) == 4 and short["prompt_length"] == [1]


def test_continuation_windows_are_consecutive_spans() -> None:
    ids = list(range(100, 200))
    examples = continuation_examples(ids, prompt_tokens=8, continuation_tokens=4, max_examples=3, seed=1)
    assert len(examples) == 3
    for e in examples:
        start = e["input_ids"][0] - 100
        assert start % 12 == 0  # non-overlapping windows
        assert e["input_ids"] == ids[start : start + 12]
        assert e["labels"] == [IGNORE_INDEX] * 8 + ids[start + 8 : start + 12]
    assert len(continuation_examples(ids, prompt_tokens=8, continuation_tokens=4)) == 100 // 12
    windows = lm_windows(ids, seq_len=10)
    assert all(w["labels"] == w["input_ids"] for w in windows) and len(windows) == 10
    with pytest.raises(DataError):
        continuation_examples(ids[:5], prompt_tokens=8, continuation_tokens=4)


def test_collate_right_pads() -> None:
    batch = collate_causal(
        [{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [8], "labels": [8]}], pad_token_id=0
    )
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]
    assert batch["input_ids"].dtype == torch.long


def test_austen_examples_hold_out_a_novel(tokenizer) -> None:
    from descentlab.data import load_austen

    text = load_austen()
    train, held = austen_examples(
        tokenizer, seq_len=32, n_train=6, prompt_tokens=16, continuation_tokens=8, n_eval=4, max_chars=20000
    )
    assert len(train) == 6 and len(held) == 4
    assert all(len(x["input_ids"]) == 32 for x in train)
    passage = tokenizer.decode(held[0]["input_ids"])
    assert passage in text["test"][:20000]  # held-out text comes from the test novel verbatim
    assert passage not in text["train"]
