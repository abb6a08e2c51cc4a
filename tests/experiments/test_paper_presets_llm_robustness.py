"""llm-robustness's ``paper`` preset end to end on CPU, in one process: a tiny Llama built from a
``LlamaConfig`` (a byte-level BPE tokenizer in a Llama-3-style ``tokenizer.json``), fine-tuned on an
Alpaca-format JSON written here with the preset's path (bf16 autocast, activation checkpointing, gradient
accumulation, DataLoader workers), judged by the likelihood judge (the claims) and by generate-then-judge
with a second tiny Llama as the judge LM (raw and length-controlled win rates)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from descentlab.config import resolve_config
from descentlab.errors import ConfigError
from descentlab.experiments import run_experiment
from descentlab.experiments.llm_robustness import config as llm
from descentlab.report.claims import NOT_IN_RUN, ONE_SEED, PENDING, VERDICTS
from tiny_tokenizers import llama_tokenizer

TOPICS = ("the sea", "a garden", "trains", "the moon", "bread", "rain", "a violin", "winter")


def alpaca_records(n: int) -> list[dict[str, str]]:
    """Alpaca's own layout: instruction, optional input, output."""
    out = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        out.append(
            {
                "instruction": f"Write one sentence about {topic}.",
                "input": "" if i % 3 else f"Mention the number {i}.",
                "output": f"Here is a sentence about {topic}: it is calm and plain, number {i}.",
            }
        )
    return out


def tiny_llama_folder(folder: Path, tok, seed: int, pretrain_on: list[str] = ()) -> Path:
    """A 2-layer Llama from a ``LlamaConfig``; ``pretrain_on`` texts: a few hundred AdamW steps of language
    modelling first, so that its perplexity is far below chance and noise can triple it (as it can a
    pretrained model's)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    if pretrain_on:
        batch = tok(list(pretrain_on), return_tensors="pt", padding=True)
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(150):
            model(**batch, labels=labels).loss.backward()
            opt.step()
            opt.zero_grad()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    from descentlab.data.instructions import format_alpaca

    root = tmp_path_factory.mktemp("paper-llm")
    records = alpaca_records(48)
    (root / "alpaca_data.json").write_text(json.dumps(records, indent=1))
    texts = [format_alpaca(r["instruction"], r["input"]) + r["output"] for r in records]
    texts.append("Two assistants answered the same prompt. Which response is better, 1 or 2? Answer: 1 2")
    tok = llama_tokenizer(texts, root / "tok")
    return {
        "data": root / "alpaca_data.json",
        "model": tiny_llama_folder(root / "policy", tok, seed=0, pretrain_on=texts),
        "judge": tiny_llama_folder(root / "judge", tok, seed=1),
    }


def test_the_paper_preset_is_the_papers_setting() -> None:
    cfg = resolve_config(llm.CONFIG, preset="paper", presets=llm.PRESETS)
    assert cfg.model.name == "meta-llama/Llama-3.1-8B-Instruct" and cfg.model.gradient_checkpointing
    assert cfg.data.source == "alpaca" and cfg.data.n_eval == 805  # AlpacaEval's size
    t = cfg.train
    assert (
        (t.mixed_precision, t.step_size) == ("bf16", 64) and t.grad_accum_steps > 1 and t.loader_workers > 0
    )
    assert cfg.eval.judge == "likelihood" and cfg.generative.model  # both judges
    assert "gaussian-x3" in cfg.generative.conditions  # the primary endpoint's condition is judged too
    with pytest.raises(ConfigError, match=r"generative\.conditions"):
        resolve_config(llm.CONFIG, overrides=["generative.conditions=[gaussian x3]"])


def test_the_paper_preset_can_judge_its_primary() -> None:
    # a verdict needs a seed-level interval: two evaluation seeds at least, and both of the primary's arms
    from descentlab.experiments.llm_robustness.claims import PRIMARY_CONDITION, PRIMARY_METHOD

    cfg = resolve_config(llm.CONFIG, preset="paper", presets=llm.PRESETS)
    assert len(cfg.seeds) >= 5  # the sizing in the preset's comment (the full-seeds run's sd, 805 prompts)
    assert {PRIMARY_METHOD, cfg.baseline} <= set(cfg.methods) and cfg.baseline == "erm"
    kind, ratio = PRIMARY_CONDITION.split("-x")
    assert kind in cfg.grid.kinds and float(ratio) in cfg.grid.ratios
    assert cfg.tune_seed not in cfg.seeds
    assert PRIMARY_CONDITION in cfg.generative.conditions  # the generated win rate is read there too


def test_alpaca_through_the_paper_path_with_both_judges(setup, tmp_path) -> None:
    run_dir = run_experiment(
        "llm-robustness",
        preset="paper",
        out=tmp_path,
        overrides=[
            f"model.name={setup['model']}",
            f"data.path={setup['data']}",
            f"generative.model={setup['judge']}",
            "generative.dtype=float32",
            "generative.conditions=[clean,gaussian-x3]",
            "generative.examples=6",
            "generative.max_new_tokens=8",
            # sized down only: two of the preset's seeds, so the rows get a seed-level interval
            "seeds=[0,1]",
            "methods=[erm,hard]",
            "data.seq_len=64",
            "data.n_eval=8",
            "val_n=6",
            "constraints.val_examples=6",
            "constraints.select=config",  # a random 2-layer model has no descending profile to choose from
            "method.constraint.alpha=0.05",
            "grid.val_examples=6",
            "grid.ratios=[3.0]",
            "grid.kinds=[gaussian]",
            "grid.iters=1",
            "grid.draws=1",
            "eval.layer_examples=2",
            "readout.sample_tokens=8",
            "train.max_steps=3",
            "train.batch_size=2",
            "train.grad_accum_steps=2",
            "train.loader_workers=1",
            "train.checkpoint_every=2",
            "torch_threads=1",
        ],
    )
    results = json.loads((run_dir / "results.json").read_text())
    assert results["protocol"]["dataset"] == f"alpaca:{setup['data']}"
    assert results["protocol"]["n_eval"] == 8 and results["methods"]["hard"]["train"][0]["steps"] == 3
    # the likelihood judge's claims, the primary among them, judged from this run's arrays
    rows = results["claims"]
    assert (run_dir / "report.md").is_file() and rows and {r["verdict"] for r in rows} <= set(VERDICTS)
    primary = [r for r in rows if r["role"] == "primary"]
    assert len(primary) == 1 and primary[0]["seeds"] == 2
    assert primary[0]["verdict"] not in (PENDING, NOT_IN_RUN, ONE_SEED)
    # generate then judge: both orders, raw and length-controlled, per example
    judged = np.load(run_dir / "arrays" / "judged.npz")
    assert sorted(judged.files) == [
        "judged/hard/clean", "judged/hard/gaussian-x3", "judged_lc/hard/clean", "judged_lc/hard/gaussian-x3"
    ]  # fmt: skip
    raw = judged["judged/hard/clean"]
    assert raw.shape == (2, 1, 6) and set(np.unique(raw)) <= {0.0, 0.5, 1.0}
    table = next(t for t in results["tables"] if t["title"].startswith("Generate then judge"))
    assert {(r[0], r[1]) for r in table["rows"]} == {("hard", "clean"), ("hard", "gaussian-x3")}
    assert "generative_judge" in results["protocol"]
    verdicts = json.loads((run_dir / "jobs" / "judge.json").read_text())["verdicts"]["hard"]["clean"]
    assert verdicts["win_rate"] == pytest.approx(raw.mean())
    # the LC cells average to the LC win rate (or are the raw ones when nothing could be fitted)
    lc = judged["judged_lc/hard/clean"]
    assert lc.mean() == pytest.approx(verdicts["lc_win_rate"], abs=1e-9)
    gens = json.loads((run_dir / "jobs" / "generate-erm-seed0.json").read_text())["conditions"]
    assert len(gens["clean"]["texts"]) == 6 and max(gens["clean"]["tokens"]) <= 8
    assert "Generate then judge" in (run_dir / "report.md").read_text()


def test_held_out_prompts_from_an_alpacaeval_file(setup, tmp_path) -> None:
    from transformers import AutoTokenizer

    from descentlab.data.causal_lm import CausalLMDataConfig, prepare_causal_lm_data

    # AlpacaEval's file: instruction and output (the reference model's), no input
    evaluation = [
        {"instruction": f"Name a colour, {i}.", "output": "Blue.", "generator": "ref"} for i in range(5)
    ]
    (tmp_path / "alpaca_eval.json").write_text(json.dumps(evaluation))
    tok = AutoTokenizer.from_pretrained(setup["model"])
    cfg = CausalLMDataConfig(
        source="alpaca", path=str(setup["data"]), eval_path=str(tmp_path / "alpaca_eval.json"), n_eval=4
    )
    train, held, protocol = prepare_causal_lm_data(cfg, tok)
    assert len(train) == 48 and len(held) == 4  # every training record trains; the first 4 prompts held out
    assert "Name a colour, 0." in tok.decode(held[0]["input_ids"]) and "alpaca_eval.json" in protocol["split"]
    with pytest.raises(ConfigError, match="eval_path"):
        CausalLMDataConfig(eval_path=str(tmp_path / "alpaca_eval.json"))
