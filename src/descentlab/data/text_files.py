"""Local copies of IMDb and MNLI in their released on-disk formats, read into the splits the hub gives.

:func:`load_local_text` reads, from a folder or one file:

* IMDb as released (Maas et al. 2011, ``aclImdb_v1.tar.gz``): ``aclImdb/{train,test}/{neg,pos}/<id>_<rating>.txt``,
  one review per file; the unlabelled ``unsup/`` folder is skipped. The folder given may be ``aclImdb`` or
  the one holding it.
* A folder of split files, each named by its split: Hugging Face's parquet exports
  (``plain_text/train-00000-of-00001.parquet``; GLUE's ``mnli/validation_matched-00000-of-00001.parquet``),
  GLUE's MNLI folder (``train.tsv``, ``dev_matched.tsv``, ``dev_mismatched.tsv``, ``test_*.tsv``), MultiNLI
  1.0's jsonl (``multinli_1.0_dev_mismatched.jsonl``), or csv / json files with ``text,label`` columns.
  ``dev`` is read as ``validation``, so a local MNLI has the hub's split names (``validation_matched``,
  ``validation_mismatched``).
* One such file alone: it is the ``train`` split (the caller carves validation and test from it).

Columns come out as the hub names them: ``text`` (IMDb) or ``premise`` / ``hypothesis`` (MNLI; the
release's ``sentence1`` / ``sentence2``), and an integer ``label`` (the release's ``gold_label``). String
labels are mapped onto the hub's ids, so a local copy and the hub copy agree: IMDb ``neg`` 0, ``pos`` 1;
MNLI ``entailment`` 0, ``neutral`` 1, ``contradiction`` 2. MultiNLI's ``-`` (no annotator consensus) and
GLUE's hidden test labels become -1, which :func:`descentlab.data.text.load_text_classification` drops.
"""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from descentlab.errors import DataError

if TYPE_CHECKING:
    import datasets

IMDB_LABELS = ("neg", "pos")  # stanfordnlp/imdb: 0 = neg, 1 = pos
MNLI_LABELS = ("entailment", "neutral", "contradiction")  # nyu-mll/glue, mnli
# string labels of a known vocabulary -> the hub's ids; -1 marks a row without a usable label
_LABEL_IDS: tuple[dict[str, int], ...] = (
    {name: i for i, name in enumerate(IMDB_LABELS)} | {"negative": 0, "positive": 1},
    {name: i for i, name in enumerate(MNLI_LABELS)} | {"-": -1, "": -1},
)
_RENAME = {"sentence1": "premise", "sentence2": "hypothesis", "gold_label": "label"}
_RELEASE_COLUMNS = {"gold_label", "pairID", "sentence1_binary_parse"}
SUFFIXES = (".parquet", ".csv", ".tsv", ".json", ".jsonl")
# a split's name inside a file stem, longest first (``dev_matched`` before ``dev``); dev is validation
_SPLIT = re.compile(
    r"(?<![a-z])(train|unsupervised|(?:validation|dev|test)(?:_mismatched|_matched)?|validation|valid|dev|test)"
    r"(?![a-z])"
)


def is_aclimdb(path: Path) -> Path | None:
    """The ``aclImdb`` folder at or directly under ``path`` (one with ``train/pos`` and ``train/neg``)."""
    for root in (path, path / "aclImdb"):
        if (root / "train" / "pos").is_dir() and (root / "train" / "neg").is_dir():
            return root
    return None


def split_of(file: Path) -> str | None:
    """The split a file's name gives (``dev_matched.tsv`` -> ``validation_matched``), None when none."""
    found = _SPLIT.search(file.stem.lower())
    if found is None:
        return None
    name = found.group(1)
    return "validation" + name[3:] if name.startswith("dev") else "validation" if name == "valid" else name


def split_files(folder: Path) -> dict[str, list[Path]]:
    """Data files below ``folder`` grouped by the split their names give (files naming none are left out)."""
    groups: dict[str, list[Path]] = {}
    for f in sorted(folder.rglob("*")):
        if f.is_file() and f.suffix.lower() in SUFFIXES and not f.name.startswith("."):
            split = split_of(f)
            if split is not None:
                groups.setdefault(split, []).append(f)
    return groups


def can_read(path: Path) -> bool:
    """Whether :func:`load_local_text` takes ``path``: an ``aclImdb`` folder, a folder of split-named data
    files, or one data file."""
    if path.is_file():
        return path.suffix.lower() in SUFFIXES
    return path.is_dir() and (is_aclimdb(path) is not None or bool(split_files(path)))


def _read_aclimdb_split(root: Path, split: str) -> dict[str, list[Any]]:
    texts: list[str] = []
    labels: list[int] = []
    for label, name in enumerate(IMDB_LABELS):
        folder = root / split / name
        if not folder.is_dir():
            raise DataError(f"{folder} is missing: an aclImdb folder has {split}/neg and {split}/pos")
        for f in sorted(folder.glob("*.txt")):
            texts.append(f.read_text(encoding="utf-8"))
            labels.append(label)
    return {"text": texts, "label": labels}


def _read_rows(file: Path) -> list[dict[str, Any]] | Any:
    """A file's rows: a pandas DataFrame (parquet, csv, json) or a list of dicts (GLUE's unquoted tsv)."""
    import pandas as pd

    suffix = file.suffix.lower()
    if suffix == ".parquet":
        return pd.read_parquet(file)
    if suffix == ".csv":
        return pd.read_csv(file, keep_default_na=False)
    if suffix == ".tsv":  # GLUE's tsv quotes nothing: a quote character is text
        csv.field_size_limit(sys.maxsize)
        with file.open(encoding="utf-8", newline="") as fh:
            return list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))
    with file.open(encoding="utf-8") as fh:
        head = fh.read(1024).lstrip()
    if head.startswith("["):  # one JSON list (Alpaca-style export) rather than JSON lines
        return pd.DataFrame(json.loads(file.read_text(encoding="utf-8")))
    return pd.read_json(file, lines=True, dtype=False)


def _labels(values: list[Any]) -> list[Any]:
    """Integer labels as they are; strings of a known vocabulary as the hub's ids; other strings kept."""
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return [int(v) for v in values]
    strings = [str(v).strip() for v in values]
    for ids in _LABEL_IDS:
        if set(strings) <= set(ids):
            return [ids[s] for s in strings]
    if all(re.fullmatch(r"-?\d+", s) for s in strings):
        return [int(s) for s in strings]
    return strings  # an unknown vocabulary: load_text_classification sorts it into ids


def _read_file(file: Path) -> dict[str, list[Any]]:
    """One data file as columns: the MNLI release's renamed to the hub's names, its parse trees dropped,
    every other column kept (``text_fields`` may name it); a file without labels gets label -1."""
    import pandas as pd

    rows = _read_rows(file)
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    # the MNLI / SNLI release (its test files have the pair ids and parse trees, not gold_label)
    if _RELEASE_COLUMNS & set(frame.columns) and not {"premise", "label"} & set(frame.columns):
        frame = frame.drop(columns=[c for c in frame.columns if c.endswith("_parse")])
        frame = frame.rename(columns={k: v for k, v in _RENAME.items() if k in frame.columns})
    elif "labels" in frame.columns and "label" not in frame.columns:
        frame = frame.rename(columns={"labels": "label"})
    columns = {str(c): frame[c].tolist() for c in frame.columns if c != "label"}
    if not columns:
        raise DataError(f"{file}: no column besides the label")
    columns["label"] = _labels(frame["label"].tolist()) if "label" in frame.columns else [-1] * len(frame)
    return columns


def _concat(parts: list[dict[str, list[Any]]], files: list[Path]) -> dict[str, list[Any]]:
    keys = set(parts[0])
    if any(set(p) != keys for p in parts):
        raise DataError(f"the files of one split have different columns: {[str(f) for f in files]}")
    return {k: [v for p in parts for v in p[k]] for k in parts[0]}


def load_local_text(path: str | Path) -> datasets.DatasetDict:
    """IMDb or MNLI (or any text,label data) from a local folder or file in its released format.

    Returns:
        A ``DatasetDict`` of the splits found (``train``, ``test``, ``validation_matched``, ...), columns as
        the hub names them (module docs), labels integer where the vocabulary is known.

    Raises:
        DataError: nothing readable at ``path``, a split folder missing, no text column, or files of one
            split with different columns.
    """
    import datasets

    path = Path(path).expanduser()
    if path.is_file():
        if path.suffix.lower() not in SUFFIXES:
            raise DataError(f"{path}: not a {'/'.join(SUFFIXES)} file")
        return datasets.DatasetDict(train=datasets.Dataset.from_dict(_read_file(path)))
    root = is_aclimdb(path) if path.is_dir() else None
    if root is not None:
        splits = {s: _read_aclimdb_split(root, s) for s in ("train", "test") if (root / s).is_dir()}
        return datasets.DatasetDict({s: datasets.Dataset.from_dict(c) for s, c in splits.items()})
    groups = split_files(path) if path.is_dir() else {}
    groups.pop("unsupervised", None)
    if not groups:
        raise DataError(
            f"{path} holds no aclImdb folder and no data file named by its split (train, test, dev/validation, "
            f"with _matched/_mismatched; {', '.join(SUFFIXES)})"
        )
    out = {}
    for split, files in groups.items():
        out[split] = datasets.Dataset.from_dict(_concat([_read_file(f) for f in files], files))
    return datasets.DatasetDict(out)


__all__ = ["IMDB_LABELS", "MNLI_LABELS", "can_read", "is_aclimdb", "load_local_text", "split_of"]
