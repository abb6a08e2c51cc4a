"""A corpus tokenized once into flat token files, read back as memory maps: the data path of a GPT-2-small run.

:func:`~descentlab.data.lm_blocks.lm_blocks` reads a split into RAM as Python strings and encodes it to
int64 at every start: for SlimPajama-6B that is tens of GB and an hour of tokenizing per run. Here each split
is encoded once, streamed document by document, into one raw file of little-endian ``uint16`` ids
(``uint32`` when the vocabulary has more than 65,536 entries), with a JSON sidecar that records what it
holds (``<file>.info``). Every run after the first opens the file as a ``numpy.memmap``: the operating system pages in the
blocks a step reads, and nothing else.

Stream. Documents are joined as :func:`~descentlab.data.lm_blocks.encode_documents` joins them: each
document's ids, then the tokenizer's end-of-text id. Block ``i`` of a :class:`MemmapBlocks` of length ``T``
is ``ids[i T : (i + 1) T]``, the same tensor as ``make_blocks(encode_documents(tok, docs), T)[i]`` (tested).

Cache key. The files sit next to the corpus, in ``<folder>/.descentlab-tokens/`` (for a hub dataset, in
``descentlab.data.cache_dir() / "tokens"``), named ``<split>-<tokenizer>-<key>.tokens``. The key hashes the
tokenizer (its name, vocabulary size, end-of-text id and the ids of a probe sentence, so two tokenizers of
one name differ), the corpus (each split file's relative path, size and modification time; a hub dataset's
id) and the character cap. A changed file or another tokenizer therefore builds a new cache; a stale one is
never read. A file is written under a temporary name and renamed when complete, so an interrupted build
leaves no file that looks finished.

Sources (:func:`token_files`):

* a local folder of ``.txt`` / ``.jsonl`` / ``.json`` / ``.parquet`` files (a ``text`` column), or one
  such file. Files whose paths name a split (``train``, ``validation`` / ``val`` / ``dev``, ``test``: e.g.
  SlimPajama-6B's parquet layout) are read split by split; otherwise every document is dealt to a split by
  its position: of each 20 consecutive documents the 19th goes to validation, the 20th to test, the rest to
  train (5 % each, decided in one streaming pass, no document count needed);
* ``hf:<dataset id>``, e.g. ``hf:DKYoon/SlimPajama-6B``: streamed from the hub with ``datasets``, allowed
  only with ``DESCENTLAB_ONLINE=1`` or ``online=True`` (:mod:`descentlab.data.hub`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from descentlab.data.bpe import TextTokenizer
from descentlab.data.hub import check_hub_name, hub_mode
from descentlab.data.lm_blocks import _BUILDERS, SPLITS, _files_for
from descentlab.errors import AssetMissingError, ConfigError, DataError

FORMAT = 1  # bump when the file layout changes: every older cache is then rebuilt
HUB_PREFIX = "hf:"
CACHE_FOLDER = ".descentlab-tokens"
# dealt by position when the files name no split: of every DEAL_PERIOD documents, these slots
DEAL_PERIOD = 20
DEAL_SLOTS = {DEAL_PERIOD - 2: "validation", DEAL_PERIOD - 1: "test"}
PROBE = "Token caches, keyed by tokenizer: naïve café — 1,234.5 ids\n\tend."
_CHUNK_DOCS = 1024


@dataclass(frozen=True)
class TokenFile:
    """One split's token file: raw little-endian ids of ``dtype``, ``tokens`` of them."""

    path: Path
    dtype: str
    tokens: int

    def array(self) -> np.ndarray:
        """The ids as a read-only memory map (one entry per token)."""
        if self.tokens == 0:
            return np.zeros(0, dtype=self.dtype)
        return np.memmap(self.path, dtype=self.dtype, mode="r", shape=(self.tokens,))


def token_dtype(vocab_size: int) -> str:
    """The narrowest unsigned type that holds every id: ``uint16`` up to 65,536 entries, else ``uint32``."""
    if vocab_size < 1:
        raise ConfigError(f"vocab_size must be positive, got {vocab_size}")
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def tokenizer_identity(tokenizer: TextTokenizer) -> dict:
    """What tells one tokenizer from another: name, vocabulary size, end-of-text id, the probe's ids."""
    return {
        "name": tokenizer.name,
        "vocab_size": int(tokenizer.vocab_size),
        "eos_id": int(tokenizer.eos_id),
        "probe": [int(i) for i in tokenizer.encode(PROBE)],
    }


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:40] or "tok"


def _file_record(root: Path, files: list[Path]) -> list[list]:
    out = []
    for p in files:
        st = p.stat()
        out.append([p.relative_to(root).as_posix() if root.is_dir() else p.name, st.st_size, st.st_mtime_ns])
    return out


def _iter_file_texts(files: list[Path]) -> Iterator[str]:
    """The non-empty ``text`` fields of the files, in file order, streamed (``datasets``' builders)."""
    from datasets import load_dataset

    builders = {_BUILDERS[p.suffix] for p in files}
    if len(builders) != 1:
        raise DataError(f"mixed file types in one split: {sorted(builders)}; keep one format per split")
    kwargs = {"sample_by": "paragraph"} if builders == {"text"} else {}
    rows = load_dataset(
        builders.pop(), data_files=[str(p) for p in files], split="train", streaming=True, **kwargs
    )
    for row in rows:
        text = row.get("text")
        if text is None:
            raise DataError(
                f"corpus files {files[0].name}... have no 'text' column: rename the text field to 'text'"
            )
        if text:
            yield text


def _iter_hub_texts(name: str, split: str, online: bool | None = None) -> Iterator[str]:
    # checked when the first text is asked for: a token cache built earlier never reads the hub id
    hub_open = check_hub_name(name, kind="dataset", online=online)
    from datasets import load_dataset

    try:
        # a stream reads the hub while it is iterated: the switch holds until the split is read
        with hub_mode(hub_open):
            for row in load_dataset(name, split=split, streaming=True):
                if text := row.get("text"):
                    yield text
    except (OSError, ValueError) as exc:  # offline (HF_DATASETS_OFFLINE=1), unknown id or split
        raise AssetMissingError(
            f"cannot stream {name!r} split {split!r}: {exc}. Run with DESCENTLAB_ONLINE=1, or download the "
            "dataset's files and pass corpus=/path/to/that/folder"
        ) from exc


def _capped(texts: Iterable[str], max_chars: int | None) -> Iterator[str]:
    """The texts until ``max_chars`` characters have been passed (the document that crosses it included)."""
    total = 0
    for text in texts:
        yield text
        total += len(text)
        if max_chars is not None and total >= max_chars:
            return


class _TokenWriter:
    """Appends documents' ids (each followed by eos) to ``<path>.partial``; ``close`` renames it into place."""

    def __init__(self, path: Path, tokenizer: TextTokenizer, dtype: str) -> None:
        self.path, self.tokenizer, self.dtype = path, tokenizer, dtype
        self.partial = path.with_name(path.name + ".partial")
        self.partial.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(self.partial, "wb")  # noqa: SIM115 (closed in close/abort)
        self.tokens = 0
        self.pending: list[str] = []

    def add(self, text: str) -> None:
        self.pending.append(text)
        if len(self.pending) >= _CHUNK_DOCS:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        ids: list[int] = []
        eos = self.tokenizer.eos_id
        for enc in self.tokenizer.encode_batch(self.pending):
            ids.extend(enc)
            ids.append(eos)
        self.pending = []
        arr = np.asarray(ids, dtype=np.int64)
        if arr.size and int(arr.max()) >= np.iinfo(self.dtype).max + 1:
            raise DataError(f"token id {int(arr.max())} does not fit {self.dtype}")
        self.fh.write(arr.astype(np.dtype(self.dtype).newbyteorder("<")).tobytes())
        self.tokens += int(arr.size)

    def close(self) -> int:
        self.flush()
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        os.replace(self.partial, self.path)
        return self.tokens

    def abort(self) -> None:
        self.fh.close()
        self.partial.unlink(missing_ok=True)


def _sidecar(path: Path) -> Path:
    # JSON, but not named .json: a corpus reader that globs the folder for .json files must not take it
    return path.with_name(path.name + ".info")


def _read_cached(path: Path, meta: dict) -> TokenFile | None:
    side = _sidecar(path)
    if not (path.is_file() and side.is_file()):
        return None
    try:
        saved = json.loads(side.read_text())
    except ValueError:
        return None
    if {k: saved.get(k) for k in meta} != meta:
        return None
    dtype, tokens = saved["dtype"], int(saved["tokens"])
    if path.stat().st_size != tokens * np.dtype(dtype).itemsize:
        return None  # truncated or overwritten: rebuild
    return TokenFile(path=path, dtype=dtype, tokens=tokens)


def _build(
    sources: dict[str, Iterable[str]] | Iterable[tuple[str, str]],
    targets: dict[str, tuple[Path, dict]],
    tokenizer: TextTokenizer,
    dtype: str,
) -> dict[str, TokenFile]:
    """Write every target split's file from its documents: ``sources`` maps a split to its texts, or is one
    stream of ``(split, text)`` pairs (documents dealt by position)."""
    writers = {split: _TokenWriter(path, tokenizer, dtype) for split, (path, _) in targets.items()}
    try:
        if isinstance(sources, dict):
            for split, texts in sources.items():
                for text in texts:
                    writers[split].add(text)
        else:
            for split, text in sources:
                writers[split].add(text)
        out = {}
        for split, writer in writers.items():
            tokens = writer.close()
            path, meta = targets[split]
            side = {**meta, "dtype": dtype, "tokens": tokens}
            _sidecar(path).write_text(json.dumps(side, indent=1))
            out[split] = TokenFile(path=path, dtype=dtype, tokens=tokens)
    except BaseException:
        for writer in writers.values():
            if not writer.fh.closed:
                writer.abort()
        raise
    return out


def _dealt(texts: Iterable[str]) -> Iterator[tuple[str, str]]:
    for k, text in enumerate(texts):
        yield DEAL_SLOTS.get(k % DEAL_PERIOD, "train"), text


def token_files(
    corpus: str | os.PathLike,
    tokenizer: TextTokenizer,
    *,
    max_chars: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    online: bool | None = None,
) -> dict[str, TokenFile]:
    """The train / validation / test token files of ``corpus``, built on the first call and reused after.

    Args:
        corpus: a local folder or file (module docstring), or ``hf:<dataset id>``.
        tokenizer: the tokenizer (its identity is part of the cache key).
        max_chars: characters read per split (a prefix; None: all); part of the key.
        cache_dir: where the files go (default: next to the corpus; for a hub id, under the descentlab cache).
        online: may a ``hf:`` id be streamed from the hub (None: :mod:`descentlab.data.hub`'s policy, off
            unless ``DESCENTLAB_ONLINE=1``); read only when its token files must be built.

    Returns:
        ``{"train", "validation", "test"}`` -> :class:`TokenFile`; a folder without a test split reuses its
        validation files as test, as :func:`~descentlab.data.lm_blocks.load_local_corpus` does.

    Raises:
        AssetMissingError: the folder does not exist or holds no text files; a hub id cannot be streamed.
        DataError: a split yields no tokens, or files without a ``text`` column; with the hub off, a hub id
            that is not cached (at once).
    """
    tok_id = tokenizer_identity(tokenizer)
    dtype = token_dtype(tok_id["vocab_size"])
    spec = str(corpus)
    if spec.startswith(HUB_PREFIX):
        name = spec[len(HUB_PREFIX) :]
        root = Path(cache_dir) if cache_dir else _hub_cache(name)
        records: dict[str, list] = {s: [name, s] for s in SPLITS}
        sources: dict[str, Iterable[str]] | Iterator[tuple[str, str]] = {
            s: _capped(_iter_hub_texts(name, s, online), max_chars) for s in SPLITS
        }
        alias: dict[str, str] = {}
    else:
        path = Path(corpus).expanduser()
        if not path.exists():
            raise AssetMissingError(
                f"corpus path {str(path)!r} does not exist: point corpus= at a folder of .txt/.jsonl/.parquet "
                "files, or use corpus=hf:<dataset id> with DESCENTLAB_ONLINE=1"
            )
        root = Path(cache_dir) if cache_dir else (path if path.is_dir() else path.parent) / CACHE_FOLDER
        by_split = {s: _files_for(path, s) for s in SPLITS} if path.is_dir() else {}
        by_split = {s: [f for f in fs if CACHE_FOLDER not in f.parts] for s, fs in by_split.items()}
        if by_split.get("train") and by_split.get("validation"):
            alias = {} if by_split["test"] else {"test": "validation"}
            records = {s: _file_record(path, fs) for s, fs in by_split.items() if fs}
            sources = {s: _capped(_iter_file_texts(fs), max_chars) for s, fs in by_split.items() if fs}
        else:
            files = (
                [p for p in sorted(path.rglob("*")) if p.is_file() and p.suffix in _BUILDERS]
                if path.is_dir()
                else [path]
            )
            files = [f for f in files if CACHE_FOLDER not in f.parts]
            if not files:
                raise AssetMissingError(f"no .txt/.jsonl/.json/.parquet files under {str(path)!r}")
            alias = {}
            record = _file_record(path, files)
            records = {s: [record, f"dealt {DEAL_SLOTS} of {DEAL_PERIOD}", s] for s in SPLITS}
            total = None if max_chars is None else 3 * max_chars  # three splits' worth, as load_local_corpus
            sources = _dealt(_capped(_iter_file_texts(files), total))

    metas = {
        split: {"format": FORMAT, "tokenizer": tok_id, "corpus": record, "max_chars": max_chars}
        for split, record in records.items()
    }
    paths = {
        split: root / f"{split}-{_slug(tokenizer.name)}-{_key(meta)}.tokens" for split, meta in metas.items()
    }
    found = {s: tf for s in metas if (tf := _read_cached(paths[s], metas[s])) is not None}
    missing = [s for s in metas if s not in found]
    if missing:
        if isinstance(sources, dict):
            sources = {s: t for s, t in sources.items() if s in missing}
        else:  # one dealt stream feeds all three splits: they are built together
            missing, found = list(metas), {}
        found |= _build(sources, {s: (paths[s], metas[s]) for s in missing}, tokenizer, dtype)
    for split, tf in found.items():
        if tf.tokens == 0:
            raise DataError(f"the {split} split of {spec!r} holds no text; check the files' 'text' column")
    return {s: found[alias.get(s, s)] for s in SPLITS}


def _key(meta: dict) -> str:
    return hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:16]


def _hub_cache(name: str) -> Path:
    from descentlab.data.assets import cache_dir

    return cache_dir() / "tokens" / _slug(name.replace("/", "--"))


class MemmapBlocks(Dataset):
    """Fixed-length blocks of a :class:`TokenFile`, read from its memory map on demand.

    Item ``i`` is ``{"input_ids": x_i, "labels": x_i}`` with ``x_i = ids[i T : (i + 1) T]`` as int64 (the
    ragged tail is dropped; ``max_blocks`` keeps a prefix), the same items as
    :class:`~descentlab.data.lm_blocks.LMBlocks` of ``make_blocks(ids, T)``. It pickles as its file's path,
    so worker processes open their own map instead of receiving the tokens.
    """

    def __init__(self, file: TokenFile, block_size: int, *, max_blocks: int | None = None) -> None:
        if block_size < 2:
            raise ConfigError(f"block_size={block_size} must be at least 2 (a causal LM predicts t+1 from t)")
        n = file.tokens // block_size
        if n == 0:
            raise DataError(
                f"{file.path.name} holds {file.tokens} tokens, fewer than one block of {block_size}: "
                "use a smaller context or more text"
            )
        self.file, self.block_size = file, block_size
        self.n = n if max_blocks is None else min(n, max_blocks)
        self._ids: np.ndarray | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_ids": None}

    @property
    def ids(self) -> np.ndarray:
        if self._ids is None:
            self._ids = self.file.array()
        return self._ids

    def __len__(self) -> int:
        return self.n

    @property
    def shape(self) -> tuple[int, int]:
        """``(blocks, block_size)``, as the ``[N, T]`` tensor of :class:`~descentlab.data.lm_blocks.LMBlocks` would have."""
        return self.n, self.block_size

    def block(self, i: int) -> torch.Tensor:
        if not 0 <= i < self.n:
            raise IndexError(f"block {i} out of range [0, {self.n})")
        t = self.block_size
        return torch.from_numpy(self.ids[i * t : (i + 1) * t].astype(np.int64))

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = self.block(int(i))
        return {"input_ids": x, "labels": x}

    def take(self, indices: Iterable[int]) -> torch.Tensor:
        """The blocks ``indices`` as one int64 tensor ``[k, T]`` (evaluation sets, in RAM)."""
        rows = [self.block(int(i)) for i in indices]
        return torch.stack(rows) if rows else torch.zeros(0, self.block_size, dtype=torch.long)

    def evenly_spaced(self, k: int | None) -> torch.Tensor:
        """``k`` blocks evenly spaced over the split (all of them with None or k >= their number), as
        :func:`~descentlab.experiments.sparse_lm.jobs.evenly_spaced` picks them from a tensor."""
        if k is None or k >= self.n:
            return self.take(range(self.n))
        return self.take(torch.linspace(0, self.n - 1, k).round().long().tolist())


__all__ = ["MemmapBlocks", "TokenFile", "token_dtype", "token_files", "tokenizer_identity"]
