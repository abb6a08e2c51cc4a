"""Tokenizers for causal-LM experiments: a byte-level BPE trained on a corpus, or the real GPT-2 one.

All tokenizers here are seen through one small interface, :class:`TextTokenizer` (``encode``, ``decode``,
``vocab_size``, ``eos_id``), so that the blocks dataset and the experiments do not care whether the ids come
from Hugging Face ``tokenizers``, ``tiktoken`` or a ``transformers`` tokenizer directory.

A trained BPE is cached under ``descentlab.data.cache_dir() / "bpe"``; the cache key hashes the training
text and every training option, so a different corpus or vocabulary size never reuses a stale file.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from descentlab.errors import AssetMissingError, ConfigError, DataError

EOS_TOKEN = "<|endoftext|>"


@runtime_checkable
class TextTokenizer(Protocol):
    """What the LM data pipeline needs from a tokenizer."""

    name: str

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_id(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


@dataclass(frozen=True)
class BPEConfig:
    """Options of a byte-level BPE trained with Hugging Face ``tokenizers``.

    Attributes:
        vocab_size: target vocabulary size, including the 256 byte symbols and the end-of-text token.
        min_frequency: a pair must occur at least this often to be merged.
        lowercase: lowercase the text before the byte-level split (off: GPT-2 does not).
    """

    vocab_size: int = 4096
    min_frequency: int = 2
    lowercase: bool = False


class HFTokenizer:
    """Adapter for a ``tokenizers.Tokenizer`` (a trained BPE or a ``tokenizer.json`` file)."""

    def __init__(self, tokenizer, name: str, eos_token: str = EOS_TOKEN) -> None:
        eos = tokenizer.token_to_id(eos_token)
        if eos is None:
            raise DataError(
                f"tokenizer {name!r} has no {eos_token!r} token; "
                "pass the end-of-text token it uses as eos_token"
            )
        self._tok = tokenizer
        self._eos = int(eos)
        self.name = name

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @property
    def eos_id(self) -> int:
        return self._eos

    @property
    def backend(self):
        """The wrapped ``tokenizers.Tokenizer``."""
        return self._tok

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text).ids)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(e.ids) for e in self._tok.encode_batch(list(texts))]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)


class TiktokenTokenizer:
    """Adapter for a ``tiktoken.Encoding`` (the real GPT-2 BPE from :func:`descentlab.data.gpt2_bpe`)."""

    def __init__(self, encoding, name: str = "gpt2") -> None:
        self._enc = encoding
        self.name = name

    @property
    def vocab_size(self) -> int:
        return int(self._enc.n_vocab)

    @property
    def eos_id(self) -> int:
        return int(self._enc.eot_token)

    def encode(self, text: str) -> list[int]:
        # ordinary: a literal "<|endoftext|>" in a corpus is text, not a document boundary
        return self._enc.encode_ordinary(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._enc.encode_ordinary_batch(list(texts))

    def decode(self, ids: Sequence[int]) -> str:
        return self._enc.decode(list(ids))


class TransformersTokenizer:
    """Adapter for a ``transformers`` tokenizer (a local directory, e.g. a model's own tokenizer)."""

    def __init__(self, tokenizer, name: str) -> None:
        if tokenizer.eos_token_id is None:
            raise DataError(
                f"tokenizer {name!r} defines no eos_token; pick a tokenizer with an end-of-text token"
            )
        self._tok = tokenizer
        self.name = name

    @property
    def vocab_size(self) -> int:
        return len(self._tok)

    @property
    def eos_id(self) -> int:
        return int(self._tok.eos_token_id)

    def encode(self, text: str) -> list[int]:
        return list(self._tok(text, add_special_tokens=False)["input_ids"])

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(x) for x in self._tok(list(texts), add_special_tokens=False)["input_ids"]]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids))


def _bpe_cache_key(texts: Sequence[str], cfg: BPEConfig) -> str:
    import tokenizers

    h = hashlib.sha256()
    h.update(json.dumps({**asdict(cfg), "tokenizers": tokenizers.__version__}, sort_keys=True).encode())
    for t in texts:
        h.update(len(t).to_bytes(8, "little"))
        h.update(t.encode("utf-8"))
    return h.hexdigest()[:20]


def _new_byte_level_bpe(cfg: BPEConfig):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    if cfg.lowercase:
        tok.normalizer = normalizers.Lowercase()
    # add_prefix_space=False and the GPT-2 split regex: the same pre-tokenisation as GPT-2, so the two
    # tokenizers differ only in the learned merges and vocabulary size
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    return tok, trainer


def train_bpe(
    texts: str | Iterable[str],
    cfg: BPEConfig | None = None,
    *,
    cache: bool = True,
    cache_root: str | os.PathLike | None = None,
) -> HFTokenizer:
    """Train (or load from the cache) a byte-level BPE on ``texts``.

    Byte-level means every string round-trips: ``decode(encode(s)) == s`` for any Unicode ``s``, because the
    256 byte symbols are always in the vocabulary. The end-of-text token ``<|endoftext|>`` is id 0.

    Args:
        texts: the training text, one string or several documents.
        cfg: vocabulary size and merge options.
        cache: read and write ``<cache_root>/bpe/<key>.json``; the key hashes the text and ``cfg``.
        cache_root: defaults to :func:`descentlab.data.cache_dir`.

    Returns:
        The trained tokenizer behind the :class:`TextTokenizer` interface.
    """
    cfg = cfg or BPEConfig()
    if cfg.vocab_size < 257 + 1:
        raise ConfigError(
            f"bpe vocab_size={cfg.vocab_size} is too small: use at least 258 (256 bytes + eos + 1)"
        )
    docs = [texts] if isinstance(texts, str) else list(texts)
    if not any(d.strip() for d in docs):
        raise DataError("cannot train a BPE on empty text: pass the training split of a non-empty corpus")
    key = _bpe_cache_key(docs, cfg)
    path: Path | None = None
    if cache:
        if cache_root is None:
            from descentlab.data import cache_dir

            cache_root = cache_dir()
        path = Path(cache_root) / "bpe" / f"{key}.json"
        if path.is_file():
            from tokenizers import Tokenizer

            return HFTokenizer(Tokenizer.from_file(str(path)), name=f"bpe{cfg.vocab_size}-{key[:8]}")
    tok, trainer = _new_byte_level_bpe(cfg)
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tok.save(str(tmp))
        os.replace(tmp, path)
    return HFTokenizer(tok, name=f"bpe{cfg.vocab_size}-{key[:8]}")


def gpt2_tokenizer() -> TiktokenTokenizer:
    """The real GPT-2 BPE (50,257 ids), offline through :func:`descentlab.data.gpt2_bpe`."""
    from descentlab.data import gpt2_bpe

    return TiktokenTokenizer(gpt2_bpe(), name="gpt2")


def load_tokenizer_dir(path: str | os.PathLike) -> TextTokenizer:
    """A tokenizer saved on disk: a ``tokenizer.json`` file, or a ``transformers`` tokenizer directory."""
    p = Path(path)
    if p.is_file() and p.suffix == ".json":
        from tokenizers import Tokenizer

        return HFTokenizer(Tokenizer.from_file(str(p)), name=p.stem)
    if not p.is_dir():
        raise AssetMissingError(
            f"tokenizer path {str(p)!r} does not exist: "
            "pass a tokenizer.json file or a local tokenizer directory"
        )
    from transformers import AutoTokenizer

    return TransformersTokenizer(AutoTokenizer.from_pretrained(str(p), local_files_only=True), name=p.name)


def make_tokenizer(spec: str, train_texts: str | Iterable[str] | None = None, cfg: BPEConfig | None = None):
    """Build the tokenizer an experiment config names.

    Args:
        spec: ``"bpe"`` (train a byte-level BPE on ``train_texts``), ``"gpt2"`` (the real GPT-2 BPE), or a
            path to a ``tokenizer.json`` / local tokenizer directory.
        train_texts: the training split; required for ``"bpe"``.
        cfg: BPE options for ``"bpe"``.
    """
    if spec == "bpe":
        if train_texts is None:
            raise ConfigError("tokenizer='bpe' needs the training text to learn merges from")
        return train_bpe(train_texts, cfg)
    if spec == "gpt2":
        return gpt2_tokenizer()
    return load_tokenizer_dir(spec)


__all__ = [
    "EOS_TOKEN",
    "BPEConfig",
    "HFTokenizer",
    "TextTokenizer",
    "TiktokenTokenizer",
    "TransformersTokenizer",
    "gpt2_tokenizer",
    "load_tokenizer_dir",
    "make_tokenizer",
    "train_bpe",
]
