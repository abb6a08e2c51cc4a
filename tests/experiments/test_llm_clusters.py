"""llm-robustness: the held-out passages are labelled with their chapter, and the interval uses them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from descentlab.data.causal_lm import CausalLMDataConfig
from descentlab.errors import ConfigError
from descentlab.experiments.llm_robustness import claims as llm_claims
from descentlab.experiments.llm_robustness.clusters import (
    CLUSTER_KEY,
    chapter_offsets,
    passage_chapters,
    save_clusters,
)
from descentlab.report.claims import judge
from descentlab.report.stats import paired_interval

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "results" / "llm-robustness"


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer):
    return smollm2_tokenizer


def test_chapter_headings_are_found_in_order() -> None:
    text = "Title\n\nChapter 1\n\nA.\n\nChapter 2\nB.\nnot a Chapter 3 heading\nChapter 3\n"
    offsets = chapter_offsets(text)
    assert [text[o : o + 9] for o in offsets] == ["Chapter 1", "Chapter 2", "Chapter 3"]


def test_each_label_is_the_chapter_of_the_very_window_the_run_evaluates(tokenizer) -> None:
    from descentlab.data.causal_lm import prepare_causal_lm_data
    from descentlab.data.lm_corpus import load_austen

    data = CausalLMDataConfig(n_train=1, n_eval=30, prompt_tokens=24, continuation_tokens=16, seed=3)
    _, held, _ = prepare_causal_lm_data(data, tokenizer)
    chapters = passage_chapters(tokenizer, data)
    assert chapters.shape == (30,) and chapters.min() >= 1
    text = load_austen()["test"]
    heads = chapter_offsets(text)
    # decode each held-out passage and find it in the novel: it lies in the chapter the label names
    for example, chapter in zip(held, chapters, strict=True):
        passage = tokenizer.decode(example["input_ids"][:24]).strip()
        at = text.find(passage[:60])
        assert at >= 0
        assert heads[chapter - 1] <= at and (chapter == len(heads) or at < heads[chapter])
    assert len(set(chapters.tolist())) > 5  # drawn across the novel, not from one chapter


def test_another_source_is_refused(tokenizer) -> None:
    with pytest.raises(ConfigError, match="Austen"):
        passage_chapters(tokenizer, CausalLMDataConfig(source="alpaca", path="x.json"))


def test_the_committed_runs_are_judged_with_their_chapters(tmp_path: Path) -> None:
    arrays = llm_claims.claim_arrays(COMMITTED)
    chapters = arrays[CLUSTER_KEY]
    assert chapters.shape == (80,)
    rows = {(r.name, r.method, r.at): r for r in judge(llm_claims.CLAIMS, arrays)}
    primary = next(r for r in rows.values() if r.role == "primary")
    cells = arrays["win/hard/gaussian-x3"]
    clustered = paired_interval(cells, np.full_like(cells, 0.5), clusters=chapters)
    plain = paired_interval(cells, np.full_like(cells, 0.5))
    assert (primary.low, primary.high) == pytest.approx((clustered.low, clustered.high))
    assert clustered.half_width > plain.half_width  # passages of one chapter are positively correlated
    # without the labels file the same cells are judged as independent examples
    (tmp_path / "arrays").mkdir()
    (tmp_path / "arrays" / "claims.npz").write_bytes((COMMITTED / "arrays" / "claims.npz").read_bytes())
    bare = next(r for r in judge(llm_claims.CLAIMS, llm_claims.claim_arrays(tmp_path)) if r.role == "primary")
    assert (bare.low, bare.high) == pytest.approx((plain.low, plain.high))
    save_clusters(tmp_path, chapters[:10])  # labels of another shape do not apply
    short = next(
        r for r in judge(llm_claims.CLAIMS, llm_claims.claim_arrays(tmp_path)) if r.role == "primary"
    )
    assert (short.low, short.high) == pytest.approx((plain.low, plain.high))
