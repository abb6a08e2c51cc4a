"""Language-modelling corpus (Jane Austen's novels, split by novel) and the offline GPT-2 BPE.

The janeaustenr R package stores each novel as a character vector (one element per printed line) in an R
lazy-load database: ``data/Rdata.rdx`` is a gzipped serialized index ``{variables: {name: (offset,
length)}, compressed: TRUE}`` and ``data/Rdata.rdb`` holds, at each offset, a 4-byte big-endian
uncompressed length followed by a zlib stream of the serialized object. ``rdata`` parses serialized R
objects but not this container, so the container is unpacked here and each blob handed to ``rdata``.
"""

from __future__ import annotations

import base64
import bz2
import functools
import gzip
import lzma
import warnings
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

from descentlab.data.assets import asset_path
from descentlab.errors import AssetMissingError, DataError

if TYPE_CHECKING:
    import tiktoken

# Split by novel so no passage, character name or plot leaks from train into evaluation. The two later,
# shorter novels are held out: Northanger Abbey (~100k GPT-2 tokens) and Persuasion (~110k).
AUSTEN_SPLITS: dict[str, tuple[str, ...]] = {
    "train": ("sensesensibility", "prideprejudice", "mansfieldpark", "emma"),
    "validation": ("northangerabbey",),
    "test": ("persuasion",),
}

# GPT-2's pre-tokenisation regex and its single special token (tiktoken's "gpt2" encoding uses the same).
GPT2_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT2_EOT = "<|endoftext|>"
GPT2_N_RANKS = 50256


def _decompress_rdb_blob(blob: bytes, compressed: int) -> bytes:
    """Undo R's ``lazyLoadDBinsertValue`` compression (zlib, or a typed bzip2/xz/none header)."""
    size = int.from_bytes(blob[:4], "big")
    if compressed in (0, 1):
        # TRUE (1) means zlib with no type byte; R writes this for packages built with default settings.
        out = zlib.decompress(blob[4:])
    else:
        kind, payload = blob[4:5], blob[5:]
        decoders = {b"Z": zlib.decompress, b"2": bz2.decompress, b"X": lzma.decompress, b"0": bytes}
        if kind not in decoders:
            raise DataError(f"unknown R lazy-load compression type {kind!r}; reinstall r-cran-janeaustenr")
        out = decoders[kind](payload)
    if len(out) != size:
        raise DataError(f"R lazy-load blob is {len(out)} bytes, header says {size}: corrupt janeaustenr DB")
    return out


def read_r_lazyload_db(prefix: Path) -> dict[str, object]:
    """Read every object of an R lazy-load database (``prefix.rdx`` + ``prefix.rdb``) with ``rdata``.

    Args:
        prefix: Path without extension, e.g. ``.../janeaustenr/data/Rdata``.

    Returns:
        Object name -> Python value as converted by :func:`rdata.conversion.convert` (character vectors
        become numpy string arrays).
    """
    import rdata

    index_raw = prefix.with_suffix(".rdx").read_bytes()
    if index_raw[:2] == b"\x1f\x8b":
        index_raw = gzip.decompress(index_raw)
    with warnings.catch_warnings():
        # Bare serialize() output has no RDS/RDA header; rdata warns that it assumes RDS, which is right.
        warnings.simplefilter("ignore", UserWarning)
        index = rdata.conversion.convert(rdata.parser.parse_data(index_raw))
        compressed = int(index.get("compressed", [1])[0])
        db = prefix.with_suffix(".rdb").read_bytes()
        out: dict[str, object] = {}
        for name, (offset, length) in index["variables"].items():
            blob = db[int(offset) : int(offset) + int(length)]
            payload = _decompress_rdb_blob(blob, compressed)
            out[str(name)] = rdata.conversion.convert(rdata.parser.parse_data(payload))
    return out


@functools.lru_cache(maxsize=1)
def _austen_novels_cached(folder: str) -> tuple[tuple[str, str], ...]:
    objects = read_r_lazyload_db(Path(folder) / "Rdata")
    novels = []
    for name in sorted(objects):
        lines = [str(x) for x in objects[name]]
        novels.append((name, "\n".join(lines) + "\n"))
    return tuple(novels)


def austen_novels() -> dict[str, str]:
    """Return the six novels as ``{R object name: full text}`` (lines joined with newlines).

    Names: ``emma, mansfieldpark, northangerabbey, persuasion, prideprejudice, sensesensibility``.

    Raises:
        AssetMissingError: r-cran-janeaustenr is not installed (message names the apt command).
    """
    folder = asset_path("austen")
    novels = dict(_austen_novels_cached(str(folder)))
    expected = {n for names in AUSTEN_SPLITS.values() for n in names}
    if set(novels) != expected:
        raise DataError(
            f"janeaustenr holds {sorted(novels)}, expected {sorted(expected)}; reinstall r-cran-janeaustenr"
        )
    return novels


def _fallback_corpus() -> dict[str, str]:
    """Hamlet from scattertext, cut into contiguous 80/10/10 train/validation/test blocks by line."""
    text = asset_path("scattertext_hamlet").read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines(keepends=True)
    a, b = int(0.8 * len(lines)), int(0.9 * len(lines))
    return {"train": "".join(lines[:a]), "validation": "".join(lines[a:b]), "test": "".join(lines[b:])}


def load_austen(*, fallback: bool = True) -> dict[str, str]:
    """Load Jane Austen's novels as one text per split, split by novel.

    train: Sense and Sensibility, Pride and Prejudice, Mansfield Park, Emma; validation: Northanger Abbey;
    test: Persuasion (see :data:`AUSTEN_SPLITS`). Novels within a split are joined by a blank line.

    Args:
        fallback: When janeaustenr is missing, warn and return scattertext's Hamlet split 80/10/10 by
            line instead of raising.

    Returns:
        ``{"train": str, "validation": str, "test": str}``.

    Raises:
        AssetMissingError: janeaustenr is missing and ``fallback`` is False (or scattertext is missing too).
    """
    try:
        novels = austen_novels()
    except AssetMissingError as err:
        if not fallback:
            raise
        warnings.warn(f"{err} Falling back to scattertext's Hamlet as the LM corpus.", stacklevel=2)
        return _fallback_corpus()
    return {split: "\n\n".join(novels[n] for n in names) for split, names in AUSTEN_SPLITS.items()}


def _read_ranks(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
        except ValueError as e:
            raise DataError(f"{path}:{lineno}: malformed BPE rank line; reinstall openai-whisper") from e
    return ranks


@functools.lru_cache(maxsize=1)
def _gpt2_bpe_cached(path: str) -> tiktoken.Encoding:
    import tiktoken

    ranks = _read_ranks(Path(path))
    if len(ranks) != GPT2_N_RANKS or sorted(ranks.values()) != list(range(GPT2_N_RANKS)):
        raise DataError(
            f"{path} holds {len(ranks)} ranks, GPT-2 has {GPT2_N_RANKS}; reinstall openai-whisper"
        )
    return tiktoken.Encoding(
        name="gpt2",
        explicit_n_vocab=GPT2_N_RANKS + 1,
        pat_str=GPT2_PAT_STR,
        mergeable_ranks=ranks,
        special_tokens={GPT2_EOT: GPT2_N_RANKS},
    )


def gpt2_bpe() -> tiktoken.Encoding:
    """Return the GPT-2 byte-level BPE as a ``tiktoken.Encoding``, built offline.

    The 50,256 merge ranks come from ``whisper/assets/gpt2.tiktoken`` in the openai-whisper package;
    ``<|endoftext|>`` is id 50256 (vocabulary 50,257). Encodings are cached per process.

    Raises:
        AssetMissingError: openai-whisper is not installed (message names the pip command).
    """
    return _gpt2_bpe_cached(str(asset_path("gpt2_tiktoken")))
