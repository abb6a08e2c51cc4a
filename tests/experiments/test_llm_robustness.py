"""llm-robustness: config checks, constraints from a profile, head-to-head statistics, the claims on planted
arrays and on the committed result; the pipeline runs, resumes, re-judges and reports on a tiny LM."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from descentlab.config import resolve_config
from descentlab.data.causal_lm import CausalLMDataConfig, prepare_causal_lm_data
from descentlab.errors import AssetMissingError, ConfigError
from descentlab.experiments.llm_robustness import claims as llm_claims
from descentlab.experiments.llm_robustness import config as exp
from descentlab.experiments.llm_robustness import jobs as lm_finetune
from descentlab.report.claims import ONE_SEED, PENDING, UNTESTABLE, judge

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "results" / "llm-robustness"


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
    from descentlab.experiments.llm_robustness.headtohead import head_to_head, outcomes

    n = 400
    g = torch.Generator().manual_seed(0)
    b = torch.rand(n, generator=g).double() * 10
    a = b - 0.1  # A wins every example by 0.1 nats
    ev_a = {"nll": {"clean": a.tolist(), "gaussian@1#0": (b + 1).tolist()}, "ref_tokens": [10] * n}
    ev_b = {"nll": {"clean": b.tolist(), "gaussian@1#0": (b + 1).tolist()}, "ref_tokens": [10] * n}
    clean = head_to_head(ev_a, ev_b, "gaussian", 0.0, draws=1)
    assert clean["win_rate"] == 1.0 and clean["wins"] == n and clean["outcomes"].shape == (1, n)
    assert clean["delta_nll"] == pytest.approx(-0.01) and clean["delta_ci"][1] < 0
    tie = head_to_head(ev_a, ev_b, "gaussian", 1.0, draws=1)
    assert tie["win_rate"] == 0.5 and tie["ties"] == n and tie["win_ci"] == [0.5, 0.5]
    assert outcomes(np.array([1.0, 2.0, 3.0]), np.array([2.0, 2.0, 2.0])).tolist() == [1.0, 0.5, 0.0]
    # a mixed record: the interval is over examples, around the win rate
    mixed = {"nll": {"clean": [0.0, 2.0] * (n // 2)}, "ref_tokens": [10] * n}
    m = head_to_head(mixed, {"nll": {"clean": [1.0] * n}, "ref_tokens": [10] * n}, "gaussian", 0.0, draws=1)
    assert m["win_rate"] == 0.5 and m["win_ci"][0] < 0.5 < m["win_ci"][1]


# -- claims on planted arrays ------------------------------------------------------------------------------

S, E = 5, 1000
CONDITIONS = ["clean", "gaussian-x1.5", "gaussian-x3", "neftune-x3", "neftune@1.5"]


def _outcomes(rates: list[float], seed: int) -> np.ndarray:
    """[seeds, 1 draw, E] judged outcomes with exactly ``rates[s]`` wins per seed, examples shuffled."""
    rng = np.random.default_rng(seed)
    rows = [rng.permutation(np.r_[np.ones(round(r * E)), np.zeros(E - round(r * E))]) for r in rates]
    return np.asarray(rows)[:, None, :]


NEAR_HALF = [0.49, 0.51, 0.50, 0.50, 0.50]
WINNING = [0.78, 0.80, 0.82, 0.79, 0.81]  # win rate 0.80: an effect far beyond the SESOI
LOSING = [0.20, 0.21, 0.19, 0.20, 0.20]


def _planted(erm_growth_at_paper_level: float = 1.001) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    for i, c in enumerate(CONDITIONS):
        arrays[f"level/{c}"] = np.asarray([0.0 if c == "clean" else 1.0])
        arrays[f"erm_ratio/{c}"] = np.full(S, erm_growth_at_paper_level if c == "neftune@1.5" else 3.0)
        for j, m in enumerate(("hard", "resilient", "erm-neftune", "erm-reseed")):
            rates = NEAR_HALF
            if c != "clean" and m in ("hard", "erm-neftune"):
                rates = WINNING
            if c == "clean" and m == "resilient":
                rates = LOSING
            arrays[llm_claims.win_key(m, c)] = _outcomes(rates, 10 * i + j)
    return arrays


def _rows(arrays: dict[str, np.ndarray]) -> dict[tuple[str, str, str], str]:
    return {
        (r.name, r.method, r.at.split(",")[0].split(" at")[0]): r.verdict
        for r in judge(llm_claims.CLAIMS, arrays)
    }


def test_claims_declare_one_primary_win_rate_endpoint() -> None:
    specs = {s.name: s for s in llm_claims.CLAIMS}
    assert [s.name for s in llm_claims.CLAIMS if s.primary] == ["noisy-win"]
    assert specs["noisy-win"].kind == "directional" and specs["noisy-win"].sesoi == pytest.approx(0.05)
    assert specs["null-control"].kind == specs["clean-parity"].kind == "parity"
    assert specs["paper-gamma-1.5"].size == pytest.approx(0.1993)


def test_planted_effects_give_the_expected_verdicts() -> None:
    rows = _rows(_planted())
    assert rows[("noisy-win", "hard", "gaussian")] == "reproduced"  # the primary: hard at gaussian x3
    # resilient is at 50 % under noise: every effect of interest (>= 5 points) is excluded
    assert rows[("noisy-win-levels", "resilient", "gaussian")] == "refuted"
    assert rows[("noisy-win-levels", "hard", "neftune")] == "reproduced"
    assert rows[("clean-parity", "hard", "clean")] == "reproduced"  # 50 % +- 1 point, inside +-5
    assert rows[("clean-parity", "resilient", "clean")] == "refuted"  # 20 %: wholly outside +-5 points
    assert rows[("positive-control", "erm-neftune", "gaussian")] == "reproduced"
    assert {v for (n, _, _), v in rows.items() if n == "null-control"} == {"reproduced"}
    # NEFTune's 1.5 leaves ERM's perplexity x1.001: the paper's reading is untestable here ...
    assert {v for (n, _, _), v in rows.items() if n == "paper-gamma-1.5"} == {UNTESTABLE}
    # ... and is judged as a sized claim where the level moves ERM: hard's 80 % lies beyond 69.93 %
    moved = _rows(_planted(erm_growth_at_paper_level=2.0))
    assert moved[("paper-gamma-1.5", "hard", "neftune")] == "reproduced"
    assert moved[("paper-gamma-1.5", "resilient", "neftune")] == "refuted"


def test_one_seed_and_missing_arrays() -> None:
    one = {k: v[:1] for k, v in _planted().items()}
    rows = judge(llm_claims.CLAIMS, one)
    assert {r.verdict for r in rows if r.name != "paper-gamma-1.5"} == {ONE_SEED}
    assert judge(llm_claims.CLAIMS, {})[0].verdict == PENDING
    assert {r.verdict for r in judge(llm_claims.CLAIMS, {})} == {PENDING}
    partial = {k: v for k, v in _planted().items() if not k.startswith("win/erm-reseed/")}
    by_name = {r.name: r.verdict for r in judge(llm_claims.CLAIMS, partial)}
    assert by_name["null-control"] == PENDING and by_name["noisy-win"] == "reproduced"
    # a preset that runs only erm and hard: resilient's rows are absent, hard's are judged
    quick = {k: v for k, v in _planted().items() if "/resilient/" not in k}
    assert {r.method for r in judge(llm_claims.CLAIMS, quick) if r.name == "clean-parity"} == {"hard"}


def test_committed_result_is_rejudged_from_its_counts() -> None:
    results = json.loads((COMMITTED / "results.json").read_text())
    arrays = llm_claims.claim_arrays(COMMITTED)
    # the rebuilt outcomes carry the committed win rates exactly
    hard = results["methods"]["hard"]["curves"]["win_rate@gaussian"]
    grid = results["grid"]["kinds"]["gaussian"]
    ratio_of = dict(zip(grid["levels"], grid["targets"], strict=True))
    for x, rate in zip(hard["x"], hard["mean"], strict=True):
        name = llm_claims.condition_name("gaussian", x, ratio_of.get(x))
        assert arrays[llm_claims.win_key("hard", name)].mean() == pytest.approx(rate)
    assert arrays["win/hard/gaussian-x3"].shape == (1, 1, 200)
    rows = judge(llm_claims.CLAIMS, arrays)
    assert {r.verdict for r in rows if r.name != "paper-gamma-1.5"} == {ONE_SEED}
    assert {r.verdict for r in rows if r.name == "paper-gamma-1.5"} == {UNTESTABLE}
    primary = next(r for r in rows if r.role == "primary")
    assert primary.method == "hard" and primary.estimate == pytest.approx(0.63 - 0.5)
    # the committed results.json holds exactly these rows
    assert results["claims"] == [r.to_dict() for r in rows]
    # a run with more than one seed or draw cannot be rebuilt from counts: pending
    assert llm_claims.arrays_from_counts({**results, "protocol": {**results["protocol"], "draws": 2}}) == {}


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
    from descentlab.experiments import report_run, run_experiment

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
    # the claims: judged by the engine from the outcomes the run saved, one seed per method
    cells = np.load(path / "arrays" / "claims.npz")
    assert cells["win/hard/clean"].shape == (1, 1, 6) and cells["win/hard/gaussian-x1.01"].shape == (1, 2, 6)
    assert cells["win/hard/clean"].mean() == pytest.approx(hard["curves"]["win_rate@gaussian"]["mean"][0])
    rows = {(c["name"], c["method"], c["at"].split(",")[0]): c for c in results["claims"]}
    assert rows[("noisy-win", "", "")]["verdict"] == PENDING  # this grid has no x3 level
    assert rows[("noisy-win-levels", "resilient", "neftune")]["verdict"] == ONE_SEED
    assert rows[("null-control", "erm-reseed", "clean")]["verdict"] == ONE_SEED
    assert rows[("positive-control", "erm-neftune", "gaussian")]["verdict"] == ONE_SEED
    assert {c["verdict"] for c in results["claims"]} <= {ONE_SEED, PENDING, UNTESTABLE}
    assert not any("claim" in t["title"].lower() for t in results["tables"])
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
    report_run(path)  # re-judges the claims from the saved arrays, then rebuilds
    assert (path / "report.md").read_text() == report
    assert json.loads((path / "results.json").read_text())["claims"] == results["claims"]
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
