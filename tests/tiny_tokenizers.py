"""Tiny byte-level BPE tokenizers trained here on a test's own texts (nothing to download), saved in the
formats of the real families: RoBERTa's ``vocab.json`` + ``merges.txt``, and a Llama-style ``tokenizer.json``
that prepends BOS. ``from tiny_tokenizers import roberta_tokenizer`` (tests/conftest.py puts this folder on
``sys.path``)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any


def _train_byte_bpe(texts: Iterable[str], vocab_size: int, special: list[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer)
    return tok


def roberta_tokenizer(texts: Iterable[str], folder: Path, vocab_size: int = 400) -> Any:
    """A ``RobertaTokenizerFast`` (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3, ``<mask>`` 4) saved in ``folder``."""
    from transformers import RobertaTokenizerFast

    tok = _train_byte_bpe(texts, vocab_size, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    folder.mkdir(parents=True, exist_ok=True)
    tok.model.save(str(folder))  # vocab.json and merges.txt, RoBERTa's own files
    roberta = RobertaTokenizerFast(
        vocab_file=str(folder / "vocab.json"), merges_file=str(folder / "merges.txt"), model_max_length=512
    )
    roberta.save_pretrained(folder)
    return roberta


def llama_tokenizer(texts: Iterable[str], folder: Path, vocab_size: int = 400) -> Any:
    """A fast tokenizer that prepends ``<|begin_of_text|>`` and ends turns with ``<|eot_id|>`` (also the pad
    token), as Llama 3's, saved in ``folder`` as ``tokenizer.json``."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    bos, eos = "<|begin_of_text|>", "<|eot_id|>"
    tok = _train_byte_bpe(texts, vocab_size, [bos, eos])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, tok.token_to_id(bos))]
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=eos)
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(folder)
    return fast
