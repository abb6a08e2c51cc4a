"""llm-robustness: one fine-tune step lowers each objective; the pipeline runs, resumes and reports on a tiny LM."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import torch

from descentlab.config import resolve_config
from descentlab.data.causal_lm import CausalLMDataConfig, prepare_causal_lm_data
from descentlab.data.instructions import collate_causal
from descentlab.errors import AssetMissingError, ConfigError
from descentlab.experiments import llm_robustness as exp
from descentlab.readout import layer_losses
from descentlab.report.build import write_report
from tiny_models import tiny_gpt2

VOCAB, PAD = 61, 0


def train_windows(n: int = 8, length: int = 24) -> list[dict[str, list[int]]]:
    g = torch.Generator().manual_seed(1)
    period = torch.randint(1, VOCAB, (5,), generator=g)
    text = period.repeat(n * length // 5 + 2)
    out = []
    for i in range(n):
        ids = text[i * 3 : i * 3 + length].tolist()
        out.append({"input_ids": ids, "labels": list(ids), "prompt_length": [0]})
    return out


def objective_value(model, batch, constraint, readout) -> float:
    """The objective at the current weights without moving the duals' estimate."""
    model.eval()
    with torch.no_grad():
        if constraint is None:
            return float(model(**batch).loss)
        return float(constraint.lagrangian(layer_losses(model, batch, readout=readout), record=False))


@pytest.mark.parametrize("label", ["erm", "constrained", "resilient"])
def test_one_fine_tune_step_lowers_the_objective(label: str) -> None:
    overrides = [
        "method.optimizer.lr=1e-3",
        "method.constraint.alpha=0.1",
        "readout.sample_tokens=null",
        "train.max_steps=1",
        "train.batch_size=8",
        "train.progress=false",
    ]
    cfg = resolve_config(exp.LlmRobustnessConfig, overrides=overrides)
    method = cfg.method_config(label)
    model, data = tiny_gpt2(layers=3, hidden=32, vocab=VOCAB, positions=64), train_windows()
    ctx = exp.Context(cfg, model, SimpleNamespace(pad_token_id=PAD), {}, data, [])
    recipe = exp.make_recipe(ctx, label)
    constraint = recipe.constraint
    assert (constraint is not None) == method.constrained
    if constraint is not None:
        constraint.duals.lam.fill_(0.5)  # so the step descends a Lagrangian with live constraint terms
    batch = collate_causal(data, PAD)
    before = objective_value(model, batch, constraint, recipe.objective.readout if constraint else None)
    facts = exp.fine_tune(ctx, recipe, seed=0)
    after = objective_value(model, batch, constraint, recipe.objective.readout if constraint else None)
    assert facts["steps"] == 1 and facts["seed"] == 0
    assert after < before - 1e-3, (label, before, after)
    if constraint is not None:
        assert len(facts["multipliers"]) == 3
        assert facts["multipliers"] != [0.5, 0.5, 0.5]  # the dual step ran after the primal step
    assert (facts.get("slacks") is not None) == (label == "resilient")


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ConfigError):
        resolve_config(exp.LlmRobustnessConfig, overrides=["methods=[constrained]"])  # no baseline
    with pytest.raises(ConfigError):
        resolve_config(exp.LlmRobustnessConfig, overrides=["methods=[erm,nope]"])  # no such spec
    with pytest.raises(ConfigError):
        resolve_config(exp.LlmRobustnessConfig, overrides=["data.source=alpaca"])  # no path
    with pytest.raises(ConfigError):
        resolve_config(exp.LlmRobustnessConfig, overrides=["eval.noise.gammas=[0.5,1.0]"])  # no clean point
    with pytest.raises(ConfigError):
        resolve_config(
            exp.LlmRobustnessConfig, overrides=["specs.bad=optimizer.nope=1", "methods=[erm,bad]"]
        ).method_config("bad")
    quick = resolve_config(exp.LlmRobustnessConfig, preset="quick", presets=exp.PRESETS)
    assert quick.train.max_steps > 0 and quick.methods == ["erm", "constrained"]


def test_methods_are_edits_of_one_base() -> None:
    cfg = resolve_config(
        exp.LlmRobustnessConfig,
        overrides=[
            "specs.detached=objective=constrained constraint.detach_prev=true",
            "methods=[erm,detached]",
        ],
    )
    erm, detached = cfg.method_config("erm"), cfg.method_config("detached")
    assert erm.objective == "erm" and not erm.constraint.detach_prev
    assert detached.objective == "constrained" and detached.constraint.detach_prev
    assert detached.optimizer == erm.optimizer == cfg.method.optimizer  # fused AdamW, decay on every tensor
    assert (cfg.method.optimizer.fused, cfg.method.optimizer.decay) == (True, "all")
    assert cfg.method_config("resilient").constraint.resilient


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory):
    """A 2-layer Llama with SmolLM2's tokenizer, saved as a local model folder."""
    from transformers import AutoTokenizer

    from descentlab.data import asset_path, cache_dir
    from descentlab.data.models import smollm2_cache_ready
    from tiny_models import tiny_llama

    try:
        gguf = asset_path("smollm2_gguf")
    except AssetMissingError as e:
        pytest.skip(f"the SmolLM2 tokenizer is needed: {e}")
    if smollm2_cache_ready():
        tok = AutoTokenizer.from_pretrained(cache_dir() / "smollm2", local_files_only=True)
    else:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    model = tiny_llama(
        layers=2,
        hidden=32,
        heads=4,
        kv_heads=2,
        vocab=len(tok),
        positions=128,
        tie=True,
        seed=0,
        pad_token_id=tok.pad_token_id or tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    folder = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_pipeline_runs_resumes_and_rebuilds_its_report(tiny_llama_dir, tmp_path) -> None:
    from descentlab.experiments import run_experiment

    overrides = [
        f"model.name={tiny_llama_dir}",
        "methods=[erm,constrained,resilient]",
        "model.gradient_checkpointing=true",
        "method.optimizer.lr=1e-3",
        "train.max_steps=2",
        "train.batch_size=2",
        "train.progress=false",
        "data.seq_len=24",
        "data.n_train=4",
        "data.prompt_tokens=12",
        "data.continuation_tokens=6",
        "data.n_eval=5",
        "data.max_chars=20000",
        "readout.sample_tokens=8",
        "eval.noise.kinds=[gaussian,discrete]",
        "eval.noise.gammas=[0.0,1.5]",
        "eval.noise.draws=2",
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
        assert [w + t + lo for w, t, lo in zip(wr["wins"], wr["ties"], wr["losses"], strict=True)] == [5, 5]
        assert f"judged_win_rate@{kind}" in con["curves"]
    # the clean point is one pass shared by every kind
    assert erm["curves"]["gaussian"]["mean"][0] == erm["curves"]["discrete"]["mean"][0]
    assert set(con["layer_loss"]) == {"clean", "gaussian@1.5"}
    assert len(con["layer_loss"]["clean"]) == 3  # layers 0..2
    assert results["protocol"]["constrained_layers"] == [1, 2]
    h2h = results["tables"][0]
    assert len(h2h["rows"]) == 2 * 2 * 2  # (constrained, resilient) x kinds x gammas
    assert [r[:2] for r in results["tables"][2]["rows"]] == [["erm", 0], ["constrained", 0], ["resilient", 0]]
    # the per-example NLLs behind the win rates are kept for re-analysis, one file per (method, seed) job
    saved = json.loads((path / "jobs" / "constrained-seed0.json").read_text())
    assert len(saved["nll"]["clean"]) == 5

    # the report is a function of the run directory: deleting it and its figures restores the same files
    report, figures = (path / "report.md").read_text(), sorted((path / "figures").iterdir())
    assert "figures/win-rate.png" in report and (path / "figures" / "win-rate.png").is_file()
    before = {f.name: f.read_bytes() for f in figures}
    shutil.rmtree(path / "figures")
    (path / "report.md").unlink()
    write_report(path)
    assert (path / "report.md").read_text() == report
    assert {f.name: f.read_bytes() for f in sorted((path / "figures").iterdir())} == before

    # resume: every job comes back from the cache, so the results are the same
    (path / "results.json").unlink()
    again = run_experiment("llm-robustness", resume=path)
    assert again == path
    assert json.loads((path / "results.json").read_text())["methods"] == results["methods"]


def test_alpaca_data_trains_on_responses_only(tiny_llama_dir, tmp_path) -> None:
    from transformers import AutoTokenizer

    records = [
        {"instruction": f"Repeat the number {i}.", "input": "", "output": f"{i} {i} {i}"} for i in range(6)
    ]
    path = tmp_path / "alpaca.json"
    path.write_text(json.dumps(records))
    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    cfg = CausalLMDataConfig(source="alpaca", path=str(path), n_eval=2, seq_len=96)
    train, held, protocol = prepare_causal_lm_data(cfg, tok)
    assert len(train) == 4 and len(held) == 2 and protocol["dataset"].startswith("alpaca:")
    for x in train + held:
        n = x["prompt_length"][0]
        assert set(x["labels"][:n]) == {-100} and -100 not in x["labels"][n:]
        assert tok.decode(x["input_ids"][n:], skip_special_tokens=True) in {r["output"] for r in records}
