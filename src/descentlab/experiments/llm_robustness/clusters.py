"""The clusters of the held-out passages: which chapter of *Persuasion* each one comes from.

Passages from one chapter share its scene, speakers and vocabulary, so their outcomes are not independent:
an interval that treats them as independent under-covers (0.66 instead of 0.95 in the simulated clustered
regime of the results index). Labelled with their chapter, :func:`~descentlab.report.stats.paired_interval`
estimates the example piece from chapter totals instead (``clusters=``).

The labels are a pure function of the data config and the tokenizer: the held-out windows are chosen by
:func:`~descentlab.data.instructions.continuation_examples` from the tokenised test novel, and the same call
on the token *positions* ``0 … N−1`` returns each window's first position. A run saves them beside its
claim arrays (:data:`CLUSTER_FILE`); a run saved before that file existed gets it from :func:`main`:

    python -m descentlab.experiments.llm_robustness.clusters docs/results/llm-robustness
"""

from __future__ import annotations

import bisect
import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

CLUSTER_KEY = "cluster/chapter"
CLUSTER_FILE = "arrays/clusters.npz"
_CHAPTER = re.compile(r"(?m)^Chapter \d+\s*$")


def chapter_offsets(text: str) -> list[int]:
    """The character offset of every ``Chapter k`` heading, in order (the first chapter is 1)."""
    return [m.start() for m in _CHAPTER.finditer(text)]


def passage_chapters(tokenizer: Any, data: Any) -> np.ndarray:
    """The chapter (1-based) of each held-out passage of an Austen ``data`` config, in the order the run
    evaluates them; ``data`` has the fields of :class:`~descentlab.data.causal_lm.CausalLMDataConfig`."""
    from descentlab.data.instructions import continuation_examples
    from descentlab.data.lm_corpus import load_austen
    from descentlab.errors import ConfigError

    if data.source != "austen":
        raise ConfigError(
            f"chapters label the Austen passages only; this run's data source is {data.source!r}"
        )
    text = load_austen()["test"]
    text = text[: data.max_chars] if data.max_chars else text
    # the very call austen_examples makes, with the offsets of each token
    encoded = tokenizer(text, return_offsets_mapping=True)
    positions = list(range(len(encoded["input_ids"])))
    windows = continuation_examples(
        positions,
        prompt_tokens=data.prompt_tokens,
        continuation_tokens=data.continuation_tokens,
        max_examples=data.n_eval,
        seed=data.seed,
    )
    headings = chapter_offsets(text)
    if not headings:
        raise ConfigError("no 'Chapter k' heading in the held-out novel: cannot label passages")
    starts = [encoded["offset_mapping"][w["input_ids"][0]][0] for w in windows]
    return np.asarray([max(1, bisect.bisect_right(headings, s)) for s in starts], dtype=np.int64)


def save_clusters(run_dir: Path | str, chapters: np.ndarray) -> Path:
    """Write ``chapters`` as :data:`CLUSTER_KEY` into ``run_dir/CLUSTER_FILE``."""
    from descentlab.io import save_arrays

    path = Path(run_dir) / CLUSTER_FILE
    save_arrays(path, **{CLUSTER_KEY: np.asarray(chapters)})
    return path


def main(argv: list[str] | None = None) -> int:
    """Label the held-out passages of a saved run (and its companion runs) from its own config."""
    from descentlab.data.causal_lm import CausalLMDataConfig
    from descentlab.data.pretrained import load_causal_lm

    args = sys.argv[1:] if argv is None else argv
    tokenizers: dict[str, Any] = {}
    for arg in args:
        for body in [Path(arg) / "results.json", *sorted(Path(arg).glob("*/results.json"))]:
            if body.parent.name == "earlier" or not body.is_file():
                continue
            config = json.loads(body.read_text())["config"]
            data, model = CausalLMDataConfig(**config["data"]), config["model"]["name"]
            if data.source != "austen":
                continue
            if model not in tokenizers:
                tokenizers[model] = load_causal_lm(model)[1]
            chapters = passage_chapters(tokenizers[model], data)
            print(save_clusters(body.parent, chapters), f"{len(set(chapters.tolist()))} chapters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
