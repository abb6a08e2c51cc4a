"""text-robustness's ``paper`` preset end to end on CPU: a tiny RoBERTa built from a ``RobertaConfig`` (with a
byte-level BPE tokenizer in RoBERTa's own files) trained on IMDb as released (the ``aclImdb`` folder) and
tested on MNLI as GLUE ships it (matched test, mismatched shift set), through the preset's own path: the
[CLS] head, 512 tokens, bf16 autocast, activation checkpointing, gradient accumulation and DataLoader
workers. Each run writes a report whose claims are judged from the saved arrays."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from descentlab.config import resolve_config
from descentlab.experiments import run_experiment
from descentlab.experiments.text_robustness import config as tr
from descentlab.experiments.text_robustness.report import largest_rise
from descentlab.report.claims import VERDICTS
from tiny_tokenizers import roberta_tokenizer

LAYERS = 3
NLI = ("entailment", "neutral", "contradiction")


def write_aclimdb(root: Path, per_class: int) -> list[str]:
    """``aclImdb/{train,test}/{neg,pos}/<id>_<rating>.txt`` (and ``unsup/``), as the release unpacks."""
    texts = []
    for split in ("train", "test"):
        for label, name in enumerate(("neg", "pos")):
            folder = root / "aclImdb" / split / name
            folder.mkdir(parents=True)
            for i in range(per_class):
                word = ("dreadful", "wonderful")[label]
                text = f"A {word} film, {('dull', 'moving')[label]} acting.<br /><br />Seen in {split}, take {i}."
                (folder / f"{i}_{7 + i % 4 if label else 1 + i % 4}.txt").write_text(text)
                texts.append(text)
    (root / "aclImdb" / "train" / "unsup").mkdir()
    (root / "aclImdb" / "train" / "unsup" / "0_0.txt").write_text("unlabelled")
    return texts


def write_glue_mnli(root: Path, n_train: int, n_dev: int) -> list[str]:
    """GLUE's ``MNLI/`` folder: unquoted tsv, the release's columns, hidden test labels."""
    header = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
              "sentence1_parse", "sentence2_parse", "sentence1", "sentence2"]  # fmt: skip
    texts = []
    folder = root / "MNLI"
    folder.mkdir(parents=True)
    for name, n, labels in (
        ("train.tsv", n_train, ["label1", "gold_label"]),
        ("dev_matched.tsv", n_dev, ["label1", "label2", "label3", "label4", "label5", "gold_label"]),
        ("dev_mismatched.tsv", n_dev, ["label1", "label2", "label3", "label4", "label5", "gold_label"]),
        ("test_matched.tsv", 4, []),
    ):
        lines = ["\t".join(header + labels)]
        for i in range(n):
            gold = NLI[i % 3]
            premise = f'The "{name[:3]}" speaker talks, case {i}.'
            hypothesis = f"{('Someone talks', 'Maybe it rains', 'Nobody talks')[i % 3]} here."
            texts += [premise, hypothesis]
            lines.append("\t".join([str(i), "1", f"{i}e", "fiction", "(", "(", "(", "(", premise, hypothesis]
                                   + [gold] * len(labels)))  # fmt: skip
        (folder / name).write_text("\n".join(lines) + "\n")
    return texts


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, Path]:
    from transformers import RobertaConfig, RobertaForMaskedLM

    root = tmp_path_factory.mktemp("paper-text")
    texts = write_aclimdb(root / "imdb", per_class=12) + write_glue_mnli(root / "glue", n_train=30, n_dev=9)
    model_dir = root / "tiny-roberta"
    tok = roberta_tokenizer(texts, model_dir)
    config = RobertaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=514,  # RoBERTa's 512 tokens + the padding offset of 2
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    # saved as the hub's roberta-base is, a masked LM: every task gets a fresh classification head
    RobertaForMaskedLM(config).save_pretrained(model_dir)
    return {"model": model_dir, "imdb": root / "imdb", "mnli": root / "glue" / "MNLI"}


# The preset as a user runs it, shrunk in size only: fewer methods, seeds, examples, draws and levels.
SHRINK = [
    "methods=[erm,erm-readout,constrained]",
    "seeds=[1,2]",
    "data.n_eval=12",
    "data.eval_batch_size=8",
    "train.epochs=1",
    "train.batch_size=4",
    "train.loader_workers=1",
    "evaluation.kinds=[gaussian]",
    "evaluation.gammas=[0.0,1.0,2.0]",
    "evaluation.draws=1",
    "selection.candidates.constrained=['']",
]


def test_the_paper_preset_is_the_papers_setting() -> None:
    cfg = resolve_config(tr.CONFIG, preset="paper", presets=tr.PRESETS)
    assert cfg.model == "roberta-base" and cfg.pooling == "cls" and cfg.data.name == "imdb"
    assert cfg.data.max_length == 512 and cfg.data.n_train is None
    t = cfg.train
    assert (t.mixed_precision, t.grad_accum_steps, t.step_size) == ("bf16", 2, 32)
    assert t.loader_workers > 0 and cfg.activation_checkpointing and cfg.workers == 1
    assert len(cfg.seeds) >= 5


def _claims(run_dir: Path) -> list[dict]:
    results = json.loads((run_dir / "results.json").read_text())
    assert (run_dir / "report.md").is_file()
    rows = results["claims"]
    assert rows and {r["verdict"] for r in rows} <= set(VERDICTS)
    assert sum(r["role"] == "primary" for r in rows) == 1
    return rows


def test_imdb_as_released_through_the_paper_path(corpora, tmp_path) -> None:
    run_dir = run_experiment(
        "text-robustness",
        preset="paper",
        out=tmp_path,
        overrides=[f"model={corpora['model']}", f"data.name={corpora['imdb']}", *SHRINK],
    )
    results = json.loads((run_dir / "results.json").read_text())
    assert results["protocol"]["n_train"] + results["protocol"]["n_val"] == 24  # aclImdb/train, unsup skipped
    rows = _claims(run_dir)
    primary = next(r for r in rows if r["role"] == "primary")
    assert primary["method"] == "constrained" and primary["reference"] == "erm-readout"
    assert primary["verdict"] != "pending re-run"  # judged from what this run saved
    # the per-layer loss at every layer 0..L of every seed, and its figure
    cells = np.load(run_dir / "arrays" / "cells.npz")  # the cell store: loss/<method> [seed, L+1, review]
    assert cells["loss/erm"].shape[:2] == (2, LAYERS + 1)
    figures = (run_dir / "report.md").read_text()
    assert "figures/layer-loss-ci.png" in figures and (run_dir / "figures" / "layer-loss-ci.png").is_file()
    # the preset's training path ran: two micro-batches of 4 per step, the [CLS] head of RoBERTa
    log = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = max(r["step"] for r in log if r.get("tag") == "erm-seed1" and "step" in r)
    assert steps == -(-results["protocol"]["n_train"] // 8)
    config = results["config"]
    assert config["train"]["grad_accum_steps"] == 2 and config["activation_checkpointing"]


def test_mnli_matched_and_mismatched_as_glue_ships_them(corpora, tmp_path) -> None:
    run_dir = run_experiment(
        "text-robustness",
        preset="paper",
        out=tmp_path,
        overrides=[
            f"model={corpora['model']}",
            f"data.name={corpora['mnli']}",
            f"data.shift=[{corpora['mnli']}@validation_mismatched]",
            "methods=[erm,erm-readout,constrained]",
            *SHRINK[1:],
        ],
    )
    results = json.loads((run_dir / "results.json").read_text())
    assert results["protocol"]["n_eval"] == 9  # dev_matched is the test set
    shift = [k for k in results["methods"]["erm"]["metrics"] if k.startswith("shift:")]
    assert len(shift) == 1 and "validation_mismatched" in shift[0]
    _claims(run_dir)


def test_largest_rise_finds_a_planted_spike() -> None:
    mean = np.array([0.7, 0.69, 0.68, 0.75, 0.6])  # rises at layer 3
    losses = np.broadcast_to(mean[None, :, None], (2, 5, 4))
    assert largest_rise(losses) == (3, pytest.approx(0.07))
    assert largest_rise(np.broadcast_to(np.sort(mean)[::-1][None, :, None], (2, 5, 4))) is None
