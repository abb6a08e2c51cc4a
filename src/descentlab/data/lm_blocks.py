"""Causal-LM data: text splits -> token ids -> fixed-length blocks.

Every step is deterministic: documents are encoded in order, joined with the tokenizer's end-of-text id, and
cut into consecutive blocks of ``block_size`` tokens (the ragged tail is dropped). Shuffling belongs to the
data loader, so the same corpus and tokenizer always give the same tensor of blocks.

:func:`load_local_corpus` reads a corpus from local text files (``.txt``, ``.jsonl``/``.json`` or ``.parquet``
with a ``text`` column), e.g. a SlimPajama-6B download, into the ``{"train", "validation", "test"}`` shape
that :func:`descentlab.data.load_austen` returns.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from torch.utils.data import Dataset

from descentlab.data.bpe import TextTokenizer
from descentlab.errors import AssetMissingError, ConfigError, DataError

SPLITS = ("train", "validation", "test")
_BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def encode_documents(
    tokenizer: TextTokenizer, docs: str | Iterable[str], *, eos_between: bool = True, chunk_docs: int = 1024
) -> torch.Tensor:
    """Encode documents in order into one int64 stream, with ``eos_id`` after each document.

    The separator lets the model learn document boundaries and is what GPT-2 training streams use.
    Documents are encoded ``chunk_docs`` at a time and packed into tensors chunk by chunk, so a large corpus
    never exists as one Python list of ints (about 36 bytes per token instead of 8).
    """
    docs = [docs] if isinstance(docs, str) else [d for d in docs if d]
    if not docs:
        raise DataError("no text to encode: the corpus split is empty")
    parts: list[torch.Tensor] = []
    for start in range(0, len(docs), chunk_docs):
        ids: list[int] = []
        for enc in tokenizer.encode_batch(docs[start : start + chunk_docs]):
            ids.extend(enc)
            if eos_between:
                ids.append(tokenizer.eos_id)
        parts.append(torch.tensor(ids, dtype=torch.long))
    return torch.cat(parts)


def make_blocks(
    ids: torch.Tensor, block_size: int, *, stride: int | None = None, max_blocks: int | None = None
):
    """Cut a 1-D id stream into blocks ``[N, block_size]``; block ``i`` starts at token ``i * stride``.

    Args:
        ids: 1-D integer tensor.
        block_size: tokens per block (the model's context).
        stride: distance between block starts; ``block_size`` (default) gives non-overlapping blocks.
        max_blocks: keep the first ``max_blocks`` blocks (a prefix, so smaller evaluations are nested).
    """
    if ids.ndim != 1:
        raise DataError(f"expected a 1-D token stream, got shape {tuple(ids.shape)}")
    if block_size < 2:
        raise ConfigError(
            f"block_size={block_size} must be at least 2 (a causal LM predicts token t+1 from t)"
        )
    stride = block_size if stride is None else stride
    if stride < 1:
        raise ConfigError(f"stride={stride} must be positive")
    if ids.numel() < block_size:
        raise DataError(
            f"the corpus has {ids.numel()} tokens, fewer than one block of {block_size}: "
            "use a smaller context"
        )
    blocks = ids.unfold(0, block_size, stride)
    if max_blocks is not None:
        blocks = blocks[:max_blocks]
    return blocks.contiguous()


class LMBlocks(Dataset):
    """Fixed-length blocks for causal-LM training; item ``i`` is ``{"input_ids": x_i, "labels": x_i}``.

    Labels equal the inputs because Hugging Face causal LMs shift them internally.
    """

    def __init__(self, blocks: torch.Tensor) -> None:
        if blocks.ndim != 2 or blocks.dtype != torch.long:
            raise DataError(
                f"blocks must be an int64 tensor [N, T], got {blocks.dtype} {tuple(blocks.shape)}"
            )
        self.blocks = blocks

    def __len__(self) -> int:
        return self.blocks.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = self.blocks[i]
        return {"input_ids": x, "labels": x}

    @property
    def block_size(self) -> int:
        return self.blocks.shape[1]

    @property
    def num_tokens(self) -> int:
        return self.blocks.numel()


def lm_blocks(
    tokenizer: TextTokenizer,
    text: str | Sequence[str],
    block_size: int,
    *,
    max_blocks: int | None = None,
    stride: int | None = None,
) -> LMBlocks:
    """Tokenise a corpus split and cut it into an :class:`LMBlocks` dataset."""
    ids = encode_documents(tokenizer, text)
    return LMBlocks(make_blocks(ids, block_size, stride=stride, max_blocks=max_blocks))


def _files_for(root: Path, split: str) -> list[Path]:
    found = [
        p
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.suffix in _BUILDERS and split in p.relative_to(root).as_posix().lower()
    ]
    # SlimPajama and most hub datasets name the validation split "validation"; some use "val" or "dev"
    if not found and split == "validation":
        for alias in ("val", "dev", "valid"):
            found = [
                p
                for p in sorted(root.rglob("*"))
                if p.is_file() and p.suffix in _BUILDERS and alias in p.name
            ]
            if found:
                break
    return found


def _read_texts(files: list[Path], max_chars: int | None) -> list[str]:
    from datasets import load_dataset

    builders = {_BUILDERS[p.suffix] for p in files}
    if len(builders) != 1:
        raise DataError(f"mixed file types in one split: {sorted(builders)}; keep one format per split")
    kwargs = {"sample_by": "paragraph"} if builders == {"text"} else {}
    ds = load_dataset(
        builders.pop(), data_files=[str(p) for p in files], split="train", streaming=True, **kwargs
    )
    texts: list[str] = []
    total = 0
    for row in ds:
        t = row.get("text")
        if t is None:
            raise DataError(
                f"corpus files {files[0].name}... have no 'text' column: rename the text field to 'text'"
            )
        if not t:
            continue
        texts.append(t)
        total += len(t)
        if max_chars is not None and total >= max_chars:
            break
    if not texts:
        raise DataError(f"no text read from {[str(p) for p in files[:3]]}")
    return texts


def load_local_corpus(
    path: str | os.PathLike, *, max_chars: dict[str, int] | int | None = None, holdout_frac: float = 0.05
) -> dict[str, list[str]]:
    """Read a local corpus into ``{"train", "validation", "test"}`` lists of documents.

    A directory whose file paths name the splits (``train``, ``validation``/``val``, ``test``; e.g. the
    SlimPajama-6B parquet layout) is read split by split. A single file, or a directory without split names,
    is split by document: the last ``2 * holdout_frac`` of the documents become validation and test.

    Args:
        path: a file or a directory of ``.txt`` / ``.jsonl`` / ``.json`` / ``.parquet`` files.
        max_chars: stop reading a split after this many characters (per split, or one cap for all).
        holdout_frac: validation (and test) fraction when the files carry no split names.
    """
    root = Path(path).expanduser()
    if not root.exists():
        raise AssetMissingError(
            f"corpus path {str(root)!r} does not exist: point corpus= at local text files"
        )
    caps = max_chars if isinstance(max_chars, dict) else dict.fromkeys(SPLITS, max_chars)
    if root.is_dir():
        by_split = {s: _files_for(root, s) for s in SPLITS}
        if by_split["train"] and by_split["validation"]:
            out = {s: _read_texts(f, caps.get(s)) for s, f in by_split.items() if f}
            out.setdefault("test", out["validation"])
            return out
        files = [p for p in sorted(root.rglob("*")) if p.is_file() and p.suffix in _BUILDERS]
    else:
        files = [root]
    if not files:
        raise AssetMissingError(f"no .txt/.jsonl/.json/.parquet files under {str(root)!r}")
    total_cap = None if caps.get("train") is None else sum(v for v in caps.values() if v is not None)
    docs = _read_texts(files, total_cap)
    n_hold = max(1, int(len(docs) * holdout_frac))
    if len(docs) < 3 * n_hold:
        raise DataError(f"{len(docs)} documents are too few to hold out validation and test sets")
    return {
        "train": docs[: len(docs) - 2 * n_hold],
        "validation": docs[len(docs) - 2 * n_hold : len(docs) - n_hold],
        "test": docs[len(docs) - n_hold :],
    }


__all__ = ["LMBlocks", "encode_documents", "lm_blocks", "load_local_corpus", "make_blocks"]
