"""Prompt/response data for causal-LM fine-tuning and head-to-head evaluation.

Two sources give the same example type, :class:`PromptExample` (a prompt and its reference response):

* a local instruction file in the Alpaca JSON format (a list of ``{"instruction", "input", "output"}``
  records, or JSON Lines of them), the data of the paper's AlpacaEval comparison;
* offline, continuation examples cut from running text (the Austen novels): the prompt is a passage, the
  reference is the span that follows it in the book.

:func:`encode_example` turns one into model inputs with ``labels`` on the response tokens only (``-100`` on
the prompt), so a Hugging Face causal LM's own loss trains on the response, and the likelihood judge scores
the reference continuation given the prompt. :func:`collate_causal` right-pads a list of encoded examples.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from descentlab.data.hub import check_hub_name, hub_mode
from descentlab.errors import ConfigError, DataError

IGNORE_INDEX = -100
ALPACA_IDS = ("tatsu-lab/alpaca", "yahma/alpaca-cleaned")  # hub ids in the Alpaca format

# The prompt layout of the Stanford Alpaca data, paraphrased; only its structure (instruction, optional
# input, then the response) matters to a model fine-tuned on it.
ALPACA_HEADER = "Below is a task. Write a response that completes it."
ALPACA_HEADER_WITH_INPUT = (
    "Below is a task, paired with input that gives context. Write a response that completes it."
)


@dataclass(frozen=True)
class PromptExample:
    """A prompt and the reference response (or continuation) that should follow it."""

    prompt: str
    reference: str


def format_alpaca(instruction: str, input_text: str = "") -> str:
    """The prompt of one Alpaca record: header, instruction, optional input, then the response marker."""
    if input_text.strip():
        return (
            f"{ALPACA_HEADER_WITH_INPUT}\n\n### Instruction:\n{instruction}\n\n"
            f"### Input:\n{input_text}\n\n### Response:\n"
        )
    return f"{ALPACA_HEADER}\n\n### Instruction:\n{instruction}\n\n### Response:\n"


def load_alpaca_json(path: str | Path) -> list[PromptExample]:
    """Read an Alpaca-format instruction file (a JSON list, or JSON Lines) into prompt/reference pairs.

    Each record needs ``instruction`` and ``output``; ``input`` is optional. Records with an empty
    instruction or output are dropped (they carry nothing to train or judge on).

    Raises:
        DataError: the file is missing, not JSON, or holds no usable record.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(
            f"instruction file {path} does not exist; pass the path of an Alpaca-format JSON file"
        )
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        try:
            data = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise DataError(f"{path} is neither a JSON list nor JSON Lines: {e}") from e
    if isinstance(data, Mapping):
        data = [data]
    if not isinstance(data, list):
        raise DataError(f"{path} must hold a list of records with 'instruction' and 'output' keys")
    return alpaca_examples(data, str(path))


def alpaca_examples(records: Sequence[Any], where: str) -> list[PromptExample]:
    """Alpaca records (``instruction``, optional ``input``, ``output``) as prompt/reference pairs; records with
    an empty instruction or output are dropped. ``where`` names the source in errors."""
    out = []
    for i, rec in enumerate(records):
        if not isinstance(rec, Mapping) or "instruction" not in rec or "output" not in rec:
            raise DataError(f"{where}: record {i} lacks 'instruction' or 'output' (Alpaca format expected)")
        instruction, output = str(rec["instruction"]).strip(), str(rec["output"]).strip()
        if instruction and output:
            out.append(PromptExample(format_alpaca(instruction, str(rec.get("input") or "")), output))
    if not out:
        raise DataError(f"{where} holds no record with a non-empty instruction and output")
    return out


def load_alpaca(source: str | Path, *, online: bool | None = None) -> list[PromptExample]:
    """Alpaca-format records from a local JSON / JSON Lines file (:func:`load_alpaca_json`) or, when no such
    file exists, from a Hugging Face dataset id with those columns (``tatsu-lab/alpaca``; its ``train``
    split; from the hub only when ``online`` or ``DESCENTLAB_ONLINE=1``, else from the local cache).

    Raises:
        DataError: no such file and no such dataset, or no usable record; with the hub off, an id that is
            not cached (at once, naming the nearest known ids).
    """
    path = Path(source).expanduser()
    if path.exists() or str(source).startswith(("/", ".", "~")) or path.suffix in (".json", ".jsonl"):
        return load_alpaca_json(path)
    hub_open = check_hub_name(str(source), kind="dataset", known=ALPACA_IDS, online=online)
    import datasets

    try:
        with hub_mode(hub_open):
            records = datasets.load_dataset(str(source), split="train")
    except (OSError, ValueError) as e:  # ConnectionError and DatasetNotFoundError are OSErrors
        raise DataError(
            f"{source!r} is no local file, and the hub dataset cannot load: {e}. Offline, pass the path of "
            "an Alpaca-format JSON file"
        ) from e
    return alpaca_examples(list(records), str(source))


def split_examples(
    examples: Sequence[PromptExample], *, eval_size: int, seed: int = 0
) -> tuple[list[PromptExample], list[PromptExample]]:
    """A fixed random (train, eval) split: the last ``eval_size`` examples of a seeded shuffle are eval."""
    if not 0 < eval_size < len(examples):
        raise ConfigError(f"eval_size must lie in 1..{len(examples) - 1} for {len(examples)} examples")
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    shuffled = [examples[i] for i in order]
    return shuffled[:-eval_size], shuffled[-eval_size:]


def _token_ids(tokenizer: Any, text: str, *, special: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def encode_example(
    tokenizer: Any,
    example: PromptExample,
    *,
    max_length: int,
    add_eos: bool = True,
    label_prompt: bool = False,
) -> dict[str, list[int]]:
    """Token ids and labels of ``prompt + reference``; labels are ``-100`` on the prompt.

    The prompt is tokenised with the tokenizer's special tokens (e.g. BOS), the reference without, then
    EOS is appended when ``add_eos``. Too long: the prompt loses tokens from its *start* (its end
    conditions the response), keeping at least one; then the reference is cut at its end.

    Args:
        tokenizer: a Hugging Face tokenizer.
        example: the prompt and reference.
        max_length: total token budget.
        add_eos: end the reference with the EOS token (the model learns to stop).
        label_prompt: also put labels on the prompt (plain language modelling on the whole sequence).

    Returns:
        ``{"input_ids": [...], "labels": [...], "prompt_length": [n]}``.
    """
    if max_length < 2:
        raise ConfigError(f"max_length must be >= 2, got {max_length}")
    prompt = _token_ids(tokenizer, example.prompt, special=True)
    response = _token_ids(tokenizer, example.reference, special=False)
    if add_eos and tokenizer.eos_token_id is not None:
        response.append(int(tokenizer.eos_token_id))
    if not prompt or not response:
        raise DataError(f"empty prompt or reference after tokenisation: {example.prompt[:60]!r}")
    keep_prompt = max(1, min(len(prompt), max_length - len(response)))
    prompt = prompt[len(prompt) - keep_prompt :]
    response = response[: max_length - len(prompt)]
    labels = (prompt if label_prompt else [IGNORE_INDEX] * len(prompt)) + response
    return {"input_ids": prompt + response, "labels": labels, "prompt_length": [len(prompt)]}


def continuation_examples(
    token_ids: Sequence[int],
    *,
    prompt_tokens: int,
    continuation_tokens: int,
    max_examples: int | None = None,
    seed: int = 0,
) -> list[dict[str, list[int]]]:
    """Non-overlapping windows of running text: the passage is the prompt, the next span the reference.

    Working on token ids (not re-tokenised text) keeps every window exactly
    ``prompt_tokens + continuation_tokens`` long, so batches need no padding and the same windows can be
    scored by the likelihood judge and by :func:`descentlab.models.perplexity.evaluate_lm`.

    Args:
        token_ids: the tokenised text.
        prompt_tokens: passage length P.
        continuation_tokens: reference length C.
        max_examples: keep this many windows, drawn at random (seeded) from the whole text; None keeps all.
        seed: which windows are kept.

    Returns:
        Encoded examples with ``input_ids`` (P + C), ``labels`` (-100 on the passage) and ``prompt_length``.
    """
    if prompt_tokens < 1 or continuation_tokens < 1:
        raise ConfigError("prompt_tokens and continuation_tokens must be >= 1")
    width = prompt_tokens + continuation_tokens
    n = len(token_ids) // width
    if n == 0:
        raise DataError(f"the text has {len(token_ids)} tokens, fewer than one window of {width}")
    starts = [i * width for i in range(n)]
    if max_examples is not None and max_examples < n:
        starts = sorted(random.Random(seed).sample(starts, max_examples))
    out = []
    for s in starts:
        ids = [int(t) for t in token_ids[s : s + width]]
        labels = [IGNORE_INDEX] * prompt_tokens + ids[prompt_tokens:]
        out.append({"input_ids": ids, "labels": labels, "prompt_length": [prompt_tokens]})
    return out


def lm_windows(
    token_ids: Sequence[int], *, seq_len: int, max_examples: int | None = None, seed: int = 0
) -> list[dict[str, list[int]]]:
    """Non-overlapping training windows of ``seq_len`` tokens with labels on every token (language modelling)."""
    windows = continuation_examples(
        token_ids, prompt_tokens=1, continuation_tokens=seq_len - 1, max_examples=max_examples, seed=seed
    )
    for w in windows:
        w["labels"] = list(w["input_ids"])
        w["prompt_length"] = [0]
    return windows


def austen_examples(
    tokenizer: Any,
    *,
    seq_len: int,
    n_train: int | None,
    prompt_tokens: int,
    continuation_tokens: int,
    n_eval: int,
    eval_split: str = "test",
    max_chars: int | None = None,
    seed: int = 0,
) -> tuple[list[dict[str, list[int]]], list[dict[str, list[int]]]]:
    """The offline fine-tuning data: Austen training windows and held-out continuation examples.

    Training: :func:`lm_windows` of ``seq_len`` tokens from the training novels (labels on every token).
    Held out: :func:`continuation_examples` from ``eval_split`` (``"test"`` is Persuasion, a novel never
    trained on): a ``prompt_tokens`` passage and the ``continuation_tokens`` that follow it.

    Args:
        max_chars: read at most this many characters of each split (cheap runs); None reads everything.
    """
    from descentlab.data.lm_corpus import load_austen

    text = load_austen()
    if eval_split not in text or eval_split == "train":
        raise ConfigError(f"eval_split must be 'validation' or 'test', got {eval_split!r}")

    def ids(split: str) -> list[int]:
        return list(tokenizer(text[split][:max_chars] if max_chars else text[split])["input_ids"])

    train = lm_windows(ids("train"), seq_len=seq_len, max_examples=n_train, seed=seed)
    held = continuation_examples(
        ids(eval_split),
        prompt_tokens=prompt_tokens,
        continuation_tokens=continuation_tokens,
        max_examples=n_eval,
        seed=seed,
    )
    return train, held


def example_prompt(example: Mapping[str, Sequence[int]]) -> list[int]:
    """The prompt token ids of an encoded example (what a model generates from)."""
    return list(example["input_ids"][: example["prompt_length"][0]])


def collate_causal(examples: Sequence[Mapping[str, Sequence[int]]], pad_token_id: int) -> dict[str, Tensor]:
    """Right-pad encoded examples into ``input_ids``, ``attention_mask`` and ``labels`` (-100 on padding).

    Right padding leaves every real token at its unpadded position, so causal logits of real tokens are
    those of the example alone.
    """
    if not examples:
        raise DataError("cannot collate an empty list of examples")
    width = max(len(e["input_ids"]) for e in examples)
    ids = torch.full((len(examples), width), int(pad_token_id), dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, e in enumerate(examples):
        n = len(e["input_ids"])
        ids[i, :n] = torch.as_tensor(list(e["input_ids"]), dtype=torch.long)
        labels[i, :n] = torch.as_tensor(list(e.get("labels", e["input_ids"])), dtype=torch.long)
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


class CausalCollator:
    """A picklable ``collate_fn`` for :func:`descentlab.train.loop.fit` (DataLoader workers need pickling)."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = int(pad_token_id)

    def __call__(self, examples: Sequence[Mapping[str, Sequence[int]]]) -> dict[str, Tensor]:
        return collate_causal(examples, self.pad_token_id)


__all__ = [
    "IGNORE_INDEX",
    "CausalCollator",
    "PromptExample",
    "alpaca_examples",
    "austen_examples",
    "collate_causal",
    "continuation_examples",
    "encode_example",
    "example_prompt",
    "format_alpaca",
    "lm_windows",
    "load_alpaca",
    "load_alpaca_json",
    "split_examples",
]
