"""llm-robustness: one fine-tune step lowers each objective; the whole pipeline runs on a tiny causal LM."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from descentlab.config import resolve_config
from descentlab.errors import AssetMissingError, ConfigError
from descentlab.experiments import llm_robustness as exp
from descentlab.readout import layer_losses

VOCAB, PAD = 61, 0


def tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=VOCAB,
        n_positions=64,
        n_embd=32,
        n_layer=3,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        pad_token_id=PAD,
    )
    return GPT2LMHeadModel(cfg)


def train_windows(n: int = 8, length: int = 24) -> list[dict[str, list[int]]]:
    g = torch.Generator().manual_seed(1)
    period = torch.randint(1, VOCAB, (5,), generator=g)
    text = period.repeat(n * length // 5 + 2)
    out = []
    for i in range(n):
        ids = text[i * 3 : i * 3 + length].tolist()
        out.append({"input_ids": ids, "labels": list(ids), "prompt_length": [0]})
    return out


def objective_value(objective, model, batch, constraint) -> float:
    """The objective at the current weights without moving the duals' estimate."""
    model.eval()
    with torch.no_grad():
        if constraint is None:
            return float(model(**batch).loss)
        return float(
            constraint.lagrangian(layer_losses(model, batch, readout=objective.readout), record=False)
        )


@pytest.mark.parametrize("method", ["erm", "constrained", "resilient"])
def test_one_fine_tune_step_lowers_the_objective(method: str) -> None:
    cfg = resolve_config(
        exp.LlmRobustnessConfig,
        overrides=["lr=1e-3", "train.max_steps=1", "train.batch_size=8", "train.progress=false"],
    )
    cfg.constraint.layers = None
    cfg.constraint.alpha = 0.1
    cfg.constraint.sample_tokens = None
    model, data = tiny_gpt2(), train_windows()
    objective, constraint = exp.make_objective(method, cfg, model.config.n_layer)
    if constraint is not None:
        constraint.duals.lam.fill_(0.5)  # so the step descends a Lagrangian with live constraint terms
    batch = exp.CausalCollator(PAD)(data)
    before = objective_value(objective, model, batch, constraint)
    facts = exp.fine_tune(model, objective, constraint, data, cfg, seed=0, pad=PAD)
    after = objective_value(objective, model, batch, constraint)
    assert facts["steps"] == 1
    assert after < before - 1e-3, (method, before, after)
    if constraint is not None:
        assert len(facts["multipliers"]) == 3
        assert facts["multipliers"] != [0.5, 0.5, 0.5]  # the dual step ran after the primal step
        assert (facts.get("slacks") is not None) == (method == "resilient")


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ConfigError):
        resolve_config(exp.LlmRobustnessConfig, overrides=["methods=[constrained]"])  # no baseline
    with pytest.raises(ConfigError):
        resolve_config(exp.LlmRobustnessConfig, overrides=["data.source=alpaca"])  # no path
    with pytest.raises(ConfigError):
        resolve_config(exp.LlmRobustnessConfig, overrides=["eval.gammas=[0.5,1.0]"])  # no clean point
    assert resolve_config(exp.LlmRobustnessConfig, preset="quick", presets=exp.PRESETS).train.max_steps > 0


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory):
    """A 2-layer Llama with SmolLM2's tokenizer, saved as a local model folder."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from descentlab.data import asset_path, cache_dir
    from descentlab.data.models import smollm2_cache_ready

    try:
        gguf = asset_path("smollm2_gguf")
    except AssetMissingError as e:
        pytest.skip(f"the SmolLM2 tokenizer is needed: {e}")
    if smollm2_cache_ready():
        tok = AutoTokenizer.from_pretrained(cache_dir() / "smollm2", local_files_only=True)
    else:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id or tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    folder = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_pipeline_runs_end_to_end(tiny_llama_dir, tmp_path) -> None:
    from descentlab.experiments.base import run_experiment

    overrides = [
        f"model.name={tiny_llama_dir}",
        "methods=[erm,constrained,resilient]",
        "model.gradient_checkpointing=true",
        "lr=1e-3",
        "train.max_steps=2",
        "train.batch_size=2",
        "train.progress=false",
        "data.seq_len=24",
        "data.n_train=4",
        "data.prompt_tokens=12",
        "data.continuation_tokens=6",
        "data.n_eval=5",
        "data.max_chars=20000",
        "constraint.layers=null",
        "constraint.sample_tokens=8",
        "eval.kinds=[gaussian,discrete]",
        "eval.gammas=[0.0,1.5]",
        "eval.draws=2",
        "eval.layer_examples=3",
        "eval.judge=generate",
        f"eval.judge_model={tiny_llama_dir}",
        "eval.judge_examples=2",
        "eval.max_new_tokens=3",
    ]
    path = run_experiment("llm-robustness", overrides=overrides, out=tmp_path)
    results = json.loads((path / "results.json").read_text())
    assert set(results["methods"]) == {"erm", "constrained", "resilient"}
    erm, con = results["methods"]["erm"], results["methods"]["constrained"]
    assert set(erm["curves"]) == {"gaussian", "discrete"}
    assert erm["curves"]["gaussian"]["metric"] == "perplexity"
    assert len(erm["curves"]["gaussian"]["mean"]) == 2
    for kind in ("gaussian", "discrete"):
        wr = con["curves"][f"win_rate@{kind}"]
        assert wr["metric"] == "win_rate" and all(0.0 <= v <= 1.0 for v in wr["mean"])
        assert f"judged_win_rate@{kind}" in con["curves"]
    # the clean point is one pass shared by every kind
    assert erm["curves"]["gaussian"]["mean"][0] == erm["curves"]["discrete"]["mean"][0]
    assert set(con["layer_loss"]) == {"clean", "gaussian@1.5"}
    assert len(con["layer_loss"]["clean"]) == 3  # layers 0..2
    assert results["protocol"]["constrained_layers"] == [1, 2]
    assert (path / "report.md").is_file() and (path / "figures" / "win-rate.png").is_file()
    # the per-example NLLs behind the win rates are kept for re-analysis
    saved = json.loads((path / "eval-constrained-seed0.json").read_text())
    assert len(saved["nll"]["clean"]) == 5


def test_alpaca_data_trains_on_responses_only(tiny_llama_dir, tmp_path) -> None:
    from transformers import AutoTokenizer

    records = [
        {"instruction": f"Repeat the number {i}.", "input": "", "output": f"{i} {i} {i}"} for i in range(6)
    ]
    path = tmp_path / "alpaca.json"
    path.write_text(json.dumps(records))
    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    cfg = exp.DataConfig(source="alpaca", path=str(path), n_eval=2, seq_len=96)
    train, held, protocol = exp.build_data(cfg, tok)
    assert len(train) == 4 and len(held) == 2 and protocol["dataset"].startswith("alpaca:")
    for x in train + held:
        n = x["prompt_length"][0]
        assert set(x["labels"][:n]) == {-100} and -100 not in x["labels"][n:]
        assert tok.decode(x["input_ids"][n:], skip_special_tokens=True) in {r["output"] for r in records}
