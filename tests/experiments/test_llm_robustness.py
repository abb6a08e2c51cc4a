"""llm-robustness: config checks, constraints from a profile, head-to-head statistics; the pipeline runs,
resumes and reports on a tiny LM."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from descentlab.config import resolve_config
from descentlab.data.causal_lm import CausalLMDataConfig, prepare_causal_lm_data
from descentlab.errors import AssetMissingError, ConfigError
from descentlab.experiments import llm_robustness as exp
from descentlab.report.build import write_report
from descentlab.train import lm_finetune


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ConfigError):
        resolve_config(exp.LlmRobustnessConfig, overrides=["methods=[hard]"])  # no baseline
    with pytest.raises(ConfigError):
        resolve_config(exp.LlmRobustnessConfig, overrides=["methods=[erm,nope]"])  # no such spec
    with pytest.raises(ConfigError):
        resolve_config(exp.LlmRobustnessConfig, overrides=["data.source=alpaca"])  # no path
    with pytest.raises(ConfigError):
        resolve_config(exp.LlmRobustnessConfig, overrides=["grid.ratios=[0.5]"])  # not a growth
    with pytest.raises(ConfigError):
        resolve_config(exp.LlmRobustnessConfig, overrides=["grid.kinds=[substitute]"])
    with pytest.raises(ConfigError):
        resolve_config(exp.LlmRobustnessConfig, overrides=["eval.judge=generate"])  # no judge LM here
    with pytest.raises(ConfigError):
        resolve_config(exp.LlmRobustnessConfig, overrides=["specs.bad=optimizer.nope=1", "methods=[erm,bad]"])
    quick = resolve_config(exp.LlmRobustnessConfig, preset="quick", presets=exp.PRESETS)
    assert quick.train.max_steps > 0 and quick.methods == ["erm", "hard"]
    full = resolve_config(exp.LlmRobustnessConfig, preset="full", presets=exp.PRESETS)
    assert full.train.max_steps >= 250 and full.data.n_eval >= 200
    assert set(full.methods) == {"erm", "hard", "resilient", "erm-neftune", "erm-reseed"}
    assert full.grid.ratios_of("gaussian") == [1.5, 3.0, 10.0] and 1.5 in full.grid.extra["neftune"]


def test_constraints_come_from_the_pretrained_profile() -> None:
    cfg = resolve_config(exp.LlmRobustnessConfig)
    profile = [100.0, 16.0, 18.0, 20.0, 15.0, 12.0, 12.5, 6.0]
    hard = lm_finetune.constrained_method(cfg, "hard", profile)
    resilient = lm_finetune.constrained_method(cfg, "resilient", profile)
    assert hard.constraint.layers == resilient.constraint.layers == [4, 5, 7]
    assert hard.constraint.detach_prev and not hard.constraint.constrain_first
    # hard: half the pretrained drop (met with a margin); resilient: all of it (tight), relaxed by slacks
    assert hard.constraint.layer_alphas[3] == pytest.approx(0.5 * 0.25)
    assert resilient.constraint.layer_alphas[3] == pytest.approx(0.25) and resilient.constraint.resilient
    assert lm_finetune.constrained_method(cfg, "erm", profile) == cfg.method_config("erm")
    assert lm_finetune.read_layers(hard, 7) == [3, 4, 5, 6]  # l and l-1 of each constrained l, layer L apart
    noisy = cfg.noisy_training["erm-neftune"]
    assert noisy[0] == "neftune" and noisy[1] > 0


def test_head_to_head_statistics() -> None:
    from descentlab.report.llm_claims import head_to_head
    from descentlab.report.stats import BootstrapCI, parity_verdict

    n = 400
    g = torch.Generator().manual_seed(0)
    b = torch.rand(n, generator=g).double() * 10
    a = b - 0.1  # A wins every example by 0.1 nats
    ev_a = {"nll": {"clean": a.tolist(), "gaussian@1#0": (b + 1).tolist()}, "ref_tokens": [10] * n}
    ev_b = {"nll": {"clean": b.tolist(), "gaussian@1#0": (b + 1).tolist()}, "ref_tokens": [10] * n}
    clean = head_to_head(ev_a, ev_b, "gaussian", 0.0, draws=1, n_boot=200)
    assert clean["win_rate"] == 1.0 and clean["wins"] == n
    assert clean["delta_nll"] == pytest.approx(-0.01) and clean["delta_ci"][1] < 0
    tie = head_to_head(ev_a, ev_b, "gaussian", 1.0, draws=1, n_boot=200)
    assert tie["win_rate"] == 0.5 and tie["ties"] == n and tie["win_ci"] == [0.5, 0.5]
    assert parity_verdict(BootstrapCI(0.01, -0.04, 0.06, n, (n,))).outcome == "reproduced"
    assert parity_verdict(BootstrapCI(0.1, 0.05, 0.15, n, (n,))).outcome == "refuted"


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
        "workers=1",
        "method.optimizer.lr=1e-3",
        "train.max_steps=3",
        "train.batch_size=2",
        "lambda_every=1",
        "data.seq_len=24",
        "data.n_train=6",
        "data.prompt_tokens=12",
        "data.continuation_tokens=6",
        "data.n_eval=6",
        "data.max_chars=20000",
        "val_n=4",
        "constraints.val_examples=4",
        "constraints.select=config",  # a random 2-layer model has no descending profile to choose from
        "method.constraint.alpha=0.05",
        "readout.sample_tokens=8",
        "grid.ratios=[1.01]",
        "grid.start={gaussian: 1.0, neftune: 50.0}",
        "grid.iters=1",
        "grid.val_examples=4",
        "grid.draws=2",
        "grid.profile_ratio=1.01",
        "eval.layer_examples=2",
        "eval.n_boot=50",
    ]
    path = run_experiment("llm-robustness", overrides=overrides, out=tmp_path)
    results = json.loads((path / "results.json").read_text())
    assert set(results["methods"]) == {"erm", "hard", "resilient", "erm-neftune", "erm-reseed"}
    assert (
        results["methods"]["erm-reseed"]["train"]["seed"] == 1 != results["methods"]["erm"]["train"]["seed"]
    )
    levels = results["protocol"]["levels"]
    assert set(levels) == {"gaussian", "neftune"} and 1.5 in levels["neftune"] and levels["gaussian"][0] == 0
    erm, hard = results["methods"]["erm"], results["methods"]["hard"]
    assert erm["curves"]["perplexity@gaussian"]["x"] == levels["gaussian"]
    for kind in ("gaussian", "neftune"):
        wr, dn = hard["curves"][f"win_rate@{kind}"], hard["curves"][f"delta_nll@{kind}"]
        assert all(lo <= m <= hi for lo, m, hi in zip(wr["ci_low"], wr["mean"], wr["ci_high"], strict=True))
        counts = [w + t + lo for w, t, lo in zip(wr["wins"], wr["ties"], wr["losses"], strict=True)]
        assert counts == [6 if x == 0 else 12 for x in wr["x"]]  # 2 draws under noise
        assert len(dn["ci_low"]) == len(dn["x"])
    # the clean point is one pass shared by every kind
    assert erm["curves"]["perplexity@gaussian"]["mean"][0] == erm["curves"]["perplexity@neftune"]["mean"][0]
    assert set(hard["layer_loss"]) == {"clean", results["profile_condition"]}
    assert len(hard["layer_loss"]["clean"]) == 3  # layers 0..2
    trace = hard["train"]["lambda_trace"]
    assert trace["steps"] == [1, 2, 3] and len(trace["lambda"][0]) == 2
    assert "slacks" in results["methods"]["resilient"]["train"]
    assert results["methods"]["erm-neftune"]["train"]["noisy_training"][0] == "neftune"
    claims = {(c["method"], c["claim"]) for c in results["claims"]}
    assert ("hard", "clean-parity") in claims and ("resilient", "paper-1.5") in claims
    assert ("erm-neftune", "noisy-nll") in claims
    assert all(c["verdict"] in ("reproduced", "refuted", "inconclusive") for c in results["claims"])
    # every claim is also judged against the re-seeded ERM (the null), except the null's own
    assert all(("vs_null" in c) == (c["method"] != "erm-reseed") for c in results["claims"])
    both = [c for c in results["claims"] if "vs_null" in c]
    assert all(c["verdict_both"] in (c["verdict"], "inconclusive") for c in both)
    # the per-example NLLs behind the win rates are kept for re-analysis, one file per method
    saved = json.loads((path / "jobs" / "eval-hard.json").read_text())
    assert len(saved["nll"]["clean"]) == 6

    # the report is a function of the run directory: deleting it and its figures restores the same files
    report, figures = (path / "report.md").read_text(), sorted((path / "figures").iterdir())
    for name in ("win-rate.png", "delta-nll.png", "layer-profiles.png", "lambda.png"):
        assert f"figures/{name}" in report and (path / "figures" / name).is_file()
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
