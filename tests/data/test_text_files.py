"""IMDb and MNLI in their released on-disk formats (written here, tiny) load into the hub's splits and ids."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from descentlab.data.text import load_text_classification, split_selector
from descentlab.data.text_files import can_read, load_local_text, split_of
from descentlab.errors import ConfigError, DataError

GLUE_TRAIN = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
              "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"]  # fmt: skip
GLUE_DEV = [*GLUE_TRAIN[:10], "label1", "label2", "label3", "label4", "label5", "gold_label"]
GLUE_TEST = GLUE_TRAIN[:10]
NLI = ("entailment", "neutral", "contradiction")


def write_aclimdb(root: Path, per_class: int = 6) -> Path:
    """``aclImdb/{train,test}/{neg,pos}/<id>_<rating>.txt`` plus an ``unsup`` folder, as released."""
    for split in ("train", "test"):
        for label, name in enumerate(("neg", "pos")):
            folder = root / "aclImdb" / split / name
            folder.mkdir(parents=True)
            for i in range(per_class):
                rating = 7 + i % 4 if label else 1 + i % 4
                word = "wonderful" if label else "dreadful"
                (folder / f"{i}_{rating}.txt").write_text(f"A {word} film.<br /><br />Take {split} {i}.")
    (root / "aclImdb" / "train" / "unsup").mkdir()
    (root / "aclImdb" / "train" / "unsup" / "0_0.txt").write_text("no label here")
    return root


def write_glue_mnli(root: Path, n_train: int = 12, n_dev: int = 6) -> Path:
    """GLUE's ``MNLI/`` folder: unquoted tsv files, a quote character inside a sentence, hidden test labels."""
    folder = root / "MNLI"
    folder.mkdir(parents=True)

    def write(name: str, header: list[str], n: int, labelled: bool) -> None:
        with (folder / name).open("w", newline="", encoding="utf-8") as fh:
            fh.write("\t".join(header) + "\n")
            for i in range(n):
                gold = NLI[i % 3]
                row = {k: "x" for k in header}
                row.update(
                    index=str(i), genre="fiction", sentence1=f'He said "hi {i}', sentence2=f"{gold} {i}"
                )
                if labelled:
                    row.update({k: gold for k in header if k.startswith("label") or k == "gold_label"})
                fh.write("\t".join(row[k] for k in header) + "\n")

    write("train.tsv", GLUE_TRAIN, n_train, True)
    write("dev_matched.tsv", GLUE_DEV, n_dev, True)
    write("dev_mismatched.tsv", GLUE_DEV, n_dev + 3, True)
    write("test_matched.tsv", GLUE_TEST, 4, False)
    write("test_mismatched.tsv", GLUE_TEST, 4, False)
    return folder


def test_aclimdb_folder_reads_as_the_hub_splits(tmp_path: Path) -> None:
    write_aclimdb(tmp_path)
    for root in (tmp_path, tmp_path / "aclImdb"):
        ds = load_local_text(root)
        assert sorted(ds) == ["test", "train"]  # unsup skipped
        assert len(ds["train"]) == len(ds["test"]) == 12
        for text, label in zip(ds["train"]["text"], ds["train"]["label"], strict=True):
            assert ("wonderful" in text) == (label == 1)  # neg 0, pos 1, as stanfordnlp/imdb
    splits = load_text_classification(str(tmp_path), seed=0, val_frac=0.25)
    assert len(splits["test"]) == 12 and len(splits["train"]) + len(splits["validation"]) == 12
    assert set(splits["validation"]["label"]) == {0, 1}


def test_glue_mnli_tsv_folder_matched_and_mismatched(tmp_path: Path) -> None:
    folder = write_glue_mnli(tmp_path)
    ds = load_local_text(folder)
    assert sorted(ds) == [
        "test_matched", "test_mismatched", "train", "validation_matched", "validation_mismatched"
    ]  # fmt: skip
    assert ds["train"]["premise"][1] == 'He said "hi 1'  # unquoted tsv: the quote is text
    assert ds["train"]["label"][:3] == [0, 1, 2]  # GLUE's ids
    assert set(ds["test_matched"]["label"]) == {-1}  # hidden labels
    assert not any(c.endswith("_parse") for c in ds["train"].column_names)
    matched = load_text_classification(str(folder), seed=0, val_frac=0.25)
    assert len(matched["test"]) == 6 and matched["test"]["text_pair"][0] == "entailment 0"
    mismatched = load_text_classification(f"{folder}@validation_mismatched", seed=0, val_frac=0.25)
    assert len(mismatched["test"]) == 9
    assert len(mismatched["train"]) + len(mismatched["validation"]) == 12  # validation carved from train
    with pytest.raises(DataError, match="no labelled split 'test_matched'"):
        load_text_classification(f"{folder}@test_matched")


def test_multinli_jsonl_and_hub_style_jsonl(tmp_path: Path) -> None:
    release = tmp_path / "multinli_1.0"
    release.mkdir()
    for split, n in (("train", 9), ("dev_matched", 4), ("dev_mismatched", 5)):
        with (release / f"multinli_1.0_{split}.jsonl").open("w") as fh:
            for i in range(n):
                gold = "-" if i == 0 else NLI[i % 3]  # "-": no annotator consensus
                fh.write(json.dumps({"sentence1": f"p{i}", "sentence2": f"h{i}", "gold_label": gold}) + "\n")
    ds = load_text_classification(f"{release}@validation_mismatched", seed=0, val_frac=0.34)
    assert len(ds["test"]) == 4  # the "-" row dropped
    assert sorted(ds["test"]["label"]) == [
        0,
        1,
        1,
        2,
    ]  # rows 1-4: neutral, contradiction, entailment, neutral
    hub_style = tmp_path / "mnli.jsonl"
    hub_style.write_text(
        "".join(
            json.dumps({"premise": f"p{i}", "hypothesis": f"h{i}", "label": i % 3}) + "\n" for i in range(30)
        )
    )
    one = load_text_classification(str(hub_style), seed=0)  # one file: validation and test carved
    assert sum(len(v) for v in one.values()) == 30 and set(one["train"].column_names) == {
        "text",
        "text_pair",
        "label",
    }


def test_hub_parquet_export_folders(tmp_path: Path) -> None:
    import pandas as pd

    imdb = tmp_path / "imdb" / "plain_text"
    imdb.mkdir(parents=True)
    for split, label in (("train", [0, 1] * 4), ("test", [0, 1] * 3), ("unsupervised", [-1] * 5)):
        pd.DataFrame({"text": [f"r{i}" for i in range(len(label))], "label": label}).to_parquet(
            imdb / f"{split}-00000-of-00001.parquet"
        )
    assert sorted(load_local_text(tmp_path / "imdb")) == ["test", "train"]
    glue = tmp_path / "glue" / "mnli"
    glue.mkdir(parents=True)
    for split in ("train", "validation_matched", "validation_mismatched", "test_matched"):
        n = 9 if split == "train" else 3
        label = [-1] * n if split.startswith("test") else [i % 3 for i in range(n)]
        frame = pd.DataFrame({"premise": ["p"] * n, "hypothesis": ["h"] * n, "label": label, "idx": range(n)})
        frame.to_parquet(glue / f"{split}-00000-of-00001.parquet")
    ds = load_text_classification(f"{tmp_path / 'glue'}@validation_mismatched", seed=0, val_frac=0.34)
    assert len(ds["test"]) == 3  # not merged with validation_matched, as datasets' own split inference would


def test_file_names_give_their_split() -> None:
    names = {
        "dev_matched.tsv": "validation_matched",
        "multinli_1.0_dev_mismatched.jsonl": "validation_mismatched",
        "validation_matched-00000-of-00001.parquet": "validation_matched",
        "train-00000-of-00001.parquet": "train",
        "test.csv": "test",
        "dev.tsv": "validation",
        "reviews.csv": None,
        "contest.csv": None,  # "test" inside a word is no split
    }
    for name, split in names.items():
        assert split_of(Path(name)) == split, name


def test_plain_csv_with_other_columns_keeps_them(tmp_path: Path) -> None:
    path = tmp_path / "reviews.csv"
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["review", "stars", "label"])
        writer.writerows([[f"review {i}", i, "pos" if i % 2 else "neg"] for i in range(20)])
    assert can_read(path)
    ds = load_text_classification(str(path), text_fields="review", seed=0)
    assert set(ds["train"]["label"]) == {0, 1}
    assert not can_read(tmp_path / "nothing.txt") and not can_read(tmp_path)


def test_selector_errors() -> None:
    assert split_selector("mnli@validation_mismatched") == ("mnli", "validation_mismatched")
    assert split_selector("imdb") == ("imdb", None)
    with pytest.raises(ConfigError, match="<dataset>@<split>"):
        split_selector("mnli@")
