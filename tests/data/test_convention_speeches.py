"""The held-out text task: party from a paragraph of the 2012 convention speeches, split by speech."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from descentlab.data.assets import asset_path
from descentlab.data.text import CONVENTION_LABELS, load_text_classification


@pytest.fixture(scope="module")
def speeches() -> list[dict[str, str]]:
    # read independently of the loader: csv's default field limit is below a speech's length
    csv.field_size_limit(1 << 24)
    with open(asset_path("convention_speeches"), encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def conv():
    return load_text_classification("convention_speeches", seed=0)


def _owner(speeches: list[dict[str, str]]) -> dict[str, set[int]]:
    """Paragraph text -> the speeches it occurs in."""
    owner: dict[str, set[int]] = {}
    for i, row in enumerate(speeches):
        for line in row["text"].splitlines():
            owner.setdefault(line.strip(), set()).add(i)
    return owner


def test_every_paragraph_of_five_words_is_kept_once_with_its_speakers_party(conv, speeches) -> None:
    assert len(speeches) == 189
    kept = [t for v in conv.values() for t in v["text"]]
    expected = {line.strip() for r in speeches for line in r["text"].splitlines() if len(line.split()) >= 5}
    assert len(kept) == len(set(kept)) == len(expected) == 3032
    assert set(kept) == expected
    party = {}
    for r in speeches:
        for line in r["text"].splitlines():
            party.setdefault(line.strip(), r["party"])  # a duplicate keeps its first speech's party
    for split in conv.values():
        assert [CONVENTION_LABELS[y] for y in split["label"]] == [party[t] for t in split["text"]]


def test_no_speech_is_in_two_splits_and_each_party_is_in_every_split(conv, speeches) -> None:
    owner = _owner(speeches)
    by_split = {k: set().union(*(owner[t] for t in v["text"])) for k, v in conv.items()}
    # a duplicate paragraph maps to every speech it occurs in, so compare the unique-paragraph speeches
    unique = {k: {next(iter(owner[t])) for t in v["text"] if len(owner[t]) == 1} for k, v in conv.items()}
    assert not unique["train"] & unique["validation"] and not unique["train"] & unique["test"]
    assert not unique["validation"] & unique["test"]
    assert sum(len(s) for s in by_split.values()) >= 189
    for split in conv.values():
        assert set(split["label"]) == {0, 1}
    # about a tenth and a fifth of each party's speeches go to validation and test
    n_speeches = {k: len(v) for k, v in unique.items()}
    assert 15 <= n_speeches["validation"] <= 23 and 32 <= n_speeches["test"] <= 44


def test_the_split_is_fixed_by_its_seed_and_caps_keep_the_balance(conv) -> None:
    again = load_text_classification("convention_speeches", seed=0)
    other = load_text_classification("convention_speeches", seed=1)
    assert again["test"]["text"] == conv["test"]["text"]
    assert set(other["test"]["text"]) != set(conv["test"]["text"])
    small = load_text_classification("convention_speeches", seed=0, max_train=500, max_eval=100)
    assert [len(v) for v in small.values()] == [500, 100, 100]
    assert abs(np.mean(small["train"]["label"]) - np.mean(conv["train"]["label"])) < 0.01
