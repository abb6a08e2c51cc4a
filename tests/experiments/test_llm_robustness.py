"""llm-robustness: config checks, constraints from a profile, head-to-head statistics paired by seed, the job
graph, the claims on planted arrays and on the committed one-seed result; the pipeline (2 evaluation seeds, a
tuning seed, candidates chosen on validation) runs, resumes, re-judges and reports on a tiny LM."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from descentlab.config import resolve_config
from descentlab.data.causal_lm import CausalLMDataConfig, prepare_causal_lm_data
from descentlab.errors import ConfigError
from descentlab.experiments.llm_robustness import claims as llm_claims
from descentlab.experiments.llm_robustness import config as exp
from descentlab.experiments.llm_robustness import jobs as lm_finetune
from descentlab.experiments.llm_robustness import legacy as llm_legacy
from descentlab.experiments.llm_robustness.config import condition_name
from descentlab.report.claims import NOT_IN_RUN, ONE_SEED, PENDING, UNTESTABLE, VERDICTS, judge
from descentlab.report.results import Results
from descentlab.study.cells import CellStore

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
    # seeds: at least one, each once, and the tuning seed is never one of them
    for bad in (["seeds=[]"], ["seeds=[0,0]"], ["seeds=[0,1000]"], ["seeds=[3]", "tune_seed=3"]):
        with pytest.raises(ConfigError):
            resolve_config(exp.LlmRobustnessConfig, overrides=bad)
    # the selection: constrained methods only, equal budgets, no follow, a margin in win-rate units
    for bad in (
        ["selection.candidates.erm=[a]"],
        ["selection.candidates.hard=[alpha_fraction=0.5]"],  # 1 candidate against resilient's 2
        ["selection.candidates.hard=[nope=1,alpha_fraction=0.5]"],
        ["selection.follow={resilient: hard}"],
        ["selection.max_clean_drop=0.5"],
    ):
        with pytest.raises(ConfigError):
            resolve_config(exp.LlmRobustnessConfig, overrides=bad)
    quick = resolve_config(exp.LlmRobustnessConfig, preset="quick", presets=exp.PRESETS)
    assert quick.train.max_steps > 0 and quick.methods == ["erm", "hard"] and len(quick.seeds) == 2
    full = resolve_config(exp.LlmRobustnessConfig, preset="full", presets=exp.PRESETS)
    assert full.train.max_steps >= 100 and full.data.n_eval >= 80 and full.val_every > 0
    assert set(full.methods) == {"erm", "hard", "resilient", "erm-neftune"}
    assert len(full.seeds) >= 3 and full.tune_seed == 1000 and full.tune_seed not in full.seeds
    assert [len(full.candidates(m)) for m in ("hard", "resilient")] == [2, 2]  # equal budgets
    assert {c.partition("=")[0] for c in full.candidates("resilient")} == {"penalty"}
    assert full.selection.max_clean_drop == llm_claims.MARGIN and full.selection_examples <= full.val_n
    assert full.grid.ratios_of("gaussian") == [1.5, 3.0, 10.0] and 1.5 in full.grid.extra["neftune"]
    pilot = resolve_config(exp.LlmRobustnessConfig, preset="pilot", presets=exp.PRESETS)
    assert pilot.train.max_steps == full.train.max_steps and pilot.val_every > 0
    # two pilot seeds give the per-seed spread the MDE is declared from; none is an evaluation seed
    assert len(pilot.seeds) == 2 and not set(pilot.seeds) & {*full.seeds, full.tune_seed}
    assert all(len(pilot.candidates(m)) == 1 for m in pilot.methods)  # no tuning round in the pilot


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
    # a selection candidate edits the method's constraint before the profile sets α
    tighter = lm_finetune.constrained_method(cfg, "hard", profile, "alpha_fraction=0.75")
    assert tighter.constraint.layer_alphas[3] == pytest.approx(0.75 * 0.25)
    stiffer = lm_finetune.constrained_method(cfg, "resilient", profile, "penalty=2.0")
    assert stiffer.constraint.penalty == 2.0 and stiffer.constraint.resilient
    assert (
        lm_finetune.run_tag("hard", 1000, 1) == "hard-cand1-seed1000"
        and lm_finetune.run_tag("erm", 2) == "erm-seed2"
    )
    noisy = cfg.noisy_training["erm-neftune"]
    assert noisy[0] == "neftune" and noisy[1] > 0


def test_head_to_head_statistics() -> None:
    from descentlab.experiments.llm_robustness.report import head_to_head, outcomes

    n = 400
    g = torch.Generator().manual_seed(0)
    b = torch.rand(n, generator=g).double() * 10
    a = b - 0.1  # A wins every example by 0.1 nats
    ev_a = {"nll": {"clean": a.tolist(), "gaussian@1#0": (b + 1).tolist()}, "ref_tokens": [10] * n}
    ev_b = {"nll": {"clean": b.tolist(), "gaussian@1#0": (b + 1).tolist()}, "ref_tokens": [10] * n}
    clean = head_to_head([ev_a], [ev_b], "gaussian", 0.0, draws=1)
    assert clean["win_rate"] == 1.0 and clean["wins"] == n and clean["outcomes"].shape == (1, 1, n)
    assert clean["delta_nll"] == pytest.approx(-0.01) and clean["delta_ci"][1] < 0
    tie = head_to_head([ev_a], [ev_b], "gaussian", 1.0, draws=1)
    assert tie["win_rate"] == 0.5 and tie["ties"] == n and tie["win_ci"] == [0.5, 0.5]
    assert outcomes(np.array([1.0, 2.0, 3.0]), np.array([2.0, 2.0, 2.0])).tolist() == [1.0, 0.5, 0.0]
    # a mixed record: the interval is over examples, around the win rate
    mixed = {"nll": {"clean": [0.0, 2.0] * (n // 2)}, "ref_tokens": [10] * n}
    m = head_to_head(
        [mixed], [{"nll": {"clean": [1.0] * n}, "ref_tokens": [10] * n}], "gaussian", 0.0, draws=1
    )
    assert m["win_rate"] == 0.5 and m["win_ci"][0] < 0.5 < m["win_ci"][1]
    with pytest.raises(ValueError, match="paired by seed"):
        head_to_head([ev_a, ev_a], [ev_b], "gaussian", 0.0, draws=1)


def test_seeds_pair_by_index_and_widen_the_interval() -> None:
    """Method on seed s against ERM on seed s; the interval is the seed-level one of the engine."""
    from descentlab.experiments.llm_robustness.report import head_to_head, shifted
    from descentlab.report.stats import paired_interval

    n = 300
    rng = np.random.default_rng(1)
    base = rng.normal(size=n)

    def ev(shift: float) -> dict:
        return {"nll": {"clean": (base + shift).tolist()}, "ref_tokens": [4] * n}

    # seed 0: the method wins everywhere; seed 1: loses everywhere; seed 2: wins everywhere
    erm = [ev(0.0), ev(0.0), ev(0.0)]
    method = [ev(-1.0), ev(1.0), ev(-1.0)]
    h = head_to_head(method, erm, "gaussian", 0.0, draws=1)
    assert h["per_seed"] == [1.0, 0.0, 1.0] and h["win_rate"] == pytest.approx(2 / 3)
    iv = paired_interval(h["outcomes"], np.full_like(h["outcomes"], 0.5))
    assert iv.seeds == 3 and h["win_ci"] == pytest.approx([0.5 + iv.low, 0.5 + iv.high])
    pooled = head_to_head([method[0]], [erm[0]], "gaussian", 0.0, draws=1)
    assert h["win_ci"][1] - h["win_ci"][0] > 10 * (pooled["win_ci"][1] - pooled["win_ci"][0] + 1e-9)
    # pairing is by index: swapping the order of the seeds of one arm changes the result
    swapped = head_to_head(method, [erm[1], erm[0], erm[2]], "gaussian", 0.0, draws=1)
    assert swapped["per_seed"] == h["per_seed"]  # ERM's seeds are equal here, so nothing moves ...
    other = head_to_head([method[1], method[0], method[2]], erm, "gaussian", 0.0, draws=1)
    assert other["per_seed"] == [0.0, 1.0, 1.0]  # ... while the method's order does
    assert shifted([1, 2, 3]) == [2, 3, 1]


def test_job_graph_runs_by_dependency_then_priority(tmp_path) -> None:
    from descentlab.experiments.llm_robustness.run import JobGraph
    from descentlab.study.jobs import JobRunner

    finished: list[str] = []
    with JobRunner(_echo, workers=1, cache_dir=tmp_path) as jobs:
        graph = JobGraph(jobs, 1)
        graph.add("late", "x", lambda d: ("late",), priority=3, then=finished.append)
        graph.add("a", "x", lambda d: ("a",), priority=1, then=finished.append)
        graph.add("b", "x", lambda d: (d["a"] + "+b",), deps=["a"], priority=0, then=finished.append)

        def step(d: dict) -> str:  # a step runs here, and may add jobs
            graph.add("c", "x", lambda d: (d["step"] + "+c",), priority=0, then=finished.append)
            return d["b"] + "+step"

        graph.add("step", None, step, deps=["b"])
        done = graph.run()
    # "late" was ready first but has the lowest priority: it waits for the chain a -> b -> step -> c
    assert done["c"] == "a+b+step+c" and finished == ["a", "a+b", "a+b+step+c", "late"]
    with JobRunner(_echo, workers=1) as jobs:
        graph = JobGraph(jobs, 1)
        graph.add("orphan", "x", lambda d: ("o",), deps=["nothing"])
        with pytest.raises(ValueError, match="twice"):
            graph.add("orphan", "x")
        with pytest.raises(RuntimeError, match="nothing"):
            graph.run()


def _echo(kind: str, value: str) -> str:
    return value


class _PlantedJobs:
    """A JobRunner stand-in: every job finishes at once with a planted result, and the submissions are
    recorded. On validation, ``wins[tag]`` is the candidate's NLL edge over ERM under noise (clean: a tie)."""

    def __init__(self, cfg, wins: dict[str, float]) -> None:
        self.cfg, self.wins, self.submitted = cfg, wins, []

    def submit(self, key: str, kind: str, *args):
        from concurrent.futures import Future

        from descentlab.evaluation.causal_lm import noise_key

        self.submitted.append((key, args))
        g, out = self.cfg.grid, {}
        if kind == "reference":
            out = {"val_profile": [2.0, 1.5, 1.0], "sigma_e": 0.02}
        elif kind == "train":
            out = {"tag": args[4], "candidate": args[3]}  # (inputs, label, seed, candidate, tag, reference)
        elif kind == "grid":
            out = {
                "kinds": {k: {"levels": [0.1 * (i + 1) for i in range(len(g.ratios_of(k)))]} for k in g.kinds}
            }
        elif kind == "validate":  # (inputs, tag, grid)
            edge = self.wins.get(args[1], 0.0)
            out = {
                "nll": {
                    noise_key(k, x, d): np.full(4, 1.0 - (edge if x > 0 else 0.0))
                    for k, xs in lm_finetune.validation_levels(self.cfg, args[2]).items()
                    for x in xs
                    for d in range(1 if x == 0 else self.cfg.selection.draws)
                }
            }
        future = Future()
        future.set_result(out)
        return future


def test_plan_tunes_first_and_the_choice_trains_the_chosen_candidate() -> None:
    from descentlab.experiments.llm_robustness.run import Inputs, JobGraph, plan, selection_record

    cfg = resolve_config(exp.LlmRobustnessConfig, overrides=["seeds=[0,1]", "workers=1"])
    # hard: its second candidate wins under noise; resilient: its first; every clean pass is a tie
    jobs = _PlantedJobs(cfg, {"hard-cand1-seed1000": 0.1, "resilient-cand0-seed1000": 0.1})
    graph = JobGraph(jobs, 1)
    plan(graph, Inputs(cfg, None, ["t"], ["v"], ["h"]))
    done = graph.run()

    keys = [k for k, _ in jobs.submitted]
    tuning = [k for k in keys if k.endswith("-seed1000")]
    # the reference first; every tuning-seed job (fine-tunes, grid, validations) before any evaluation seed's
    assert keys[0] == "reference" and keys.index("grid") < min(keys.index(k) for k in keys if "validate" in k)
    assert max(keys.index(k) for k in tuning) < min(
        keys.index(k) for k in keys if k.endswith(("-seed0", "-seed1"))
    )
    specs = {
        k: args[3] for k, args in jobs.submitted if k.startswith("train-") and not k.endswith("-seed1000")
    }
    assert specs == {
        **{f"train-{m}-seed{s}": "" for m in ("erm", "erm-neftune") for s in (0, 1)},
        **{f"train-hard-seed{s}": "alpha_fraction=0.5" for s in (0, 1)},
        **{f"train-resilient-seed{s}": "penalty=0.05" for s in (0, 1)},
    }
    assert {f"eval-{m}-seed{s}" for m in cfg.methods for s in (0, 1)} <= set(done)
    record = selection_record(cfg, done, examples=4)
    assert record["chosen"] == {"hard": "alpha_fraction=0.5", "resilient": "penalty=0.05"}
    assert [r[1] for r in record["rows"]] == [*cfg.candidates("hard"), *cfg.candidates("resilient")]
    assert record["scores"]["hard"][1]["robust"] == 1.0 and record["scores"]["hard"][0]["clean"] == 0.5


def test_generate_then_judge_cells_are_per_seed() -> None:
    """The judged arrays keep one row per evaluation seed, and the table's interval is seed-level."""
    from descentlab.experiments.llm_robustness.report import judged_table
    from descentlab.experiments.llm_robustness.run import judged_arrays

    wins, losses = [1.0] * 20, [0.0] * 20
    verdict = {
        "preferences": [wins, losses],  # seed 0 wins every prompt, seed 1 loses every one
        "adjusted": [wins, losses],
        "win_rate": 0.5,
        "lc_win_rate": 0.5,
        "length_coefficient": [0.0, 0.0],
        "length_controlled": True,
        "mean_tokens": 5.0,
        "baseline_mean_tokens": 5.0,
    }
    arrays = judged_arrays({"hard": {"clean": verdict}})
    assert arrays["judged/hard/clean"].shape == (2, 1, 20) and arrays["judged/hard/clean"].mean() == 0.5
    row = judged_table({"verdicts": {"hard": {"clean": verdict}}}, "erm", "judge")["rows"][0]
    low, high = (float(x) for x in row[2].split("[")[1].rstrip("]").split(","))
    assert low < 0 and high > 100  # two seeds that disagree completely: the interval spans everything


def test_last_doubling_change() -> None:
    assert lm_finetune.last_doubling_change([10, 20, 30, 40], [4.0, 2.0, 1.9, 1.9]) == pytest.approx(-0.05)
    assert lm_finetune.last_doubling_change([10, 20, 25], [3.0, 2.0, 2.0]) == pytest.approx(-1 / 3)
    assert (
        lm_finetune.last_doubling_change([5], [1.0]) is None
        and lm_finetune.last_doubling_change([], []) is None
    )


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
        for j, m in enumerate(("hard", "resilient", "erm-neftune")):
            rates = NEAR_HALF
            if c != "clean" and m in ("hard", "erm-neftune"):
                rates = WINNING
            if c == "clean" and m == "resilient":
                rates = LOSING
            arrays[llm_legacy.win_key(m, c)] = _outcomes(rates, 10 * i + j)
        arrays[llm_legacy.null_key(c)] = _outcomes(NEAR_HALF, 10 * i + 9)
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
    assert specs["paper-gamma-1.5"].kind == "untestable" and "not public" in specs["paper-gamma-1.5"].reason


def test_planted_effects_give_the_expected_verdicts() -> None:
    rows = _rows(_planted())
    assert rows[("noisy-win", "hard", "gaussian")] == "reproduced"  # the primary: hard at gaussian x3
    # resilient is at 50 % under noise: every effect of interest (>= 5 points) is excluded
    assert rows[("noisy-win-levels", "resilient", "gaussian")] == "refuted"
    assert rows[("noisy-win-levels", "hard", "neftune")] == "reproduced"
    assert rows[("clean-parity", "hard", "clean")] == "reproduced"  # 50 % +- 1 point, inside +-5
    assert rows[("clean-parity", "resilient", "clean")] == "refuted"  # 20 %: wholly outside +-5 points
    assert rows[("positive-control", "erm-neftune", "gaussian")] == "reproduced"
    nulls = {(m, v) for (n, m, _), v in rows.items() if n == "null-control"}
    assert nulls == {(llm_claims.NULL, "reproduced")}
    # the paper's γ = 1.5 read as NEFTune's α is untestable here, whatever the run measured there ...
    assert {v for (n, _, _), v in rows.items() if n == "paper-gamma-1.5"} == {UNTESTABLE}
    moved = judge(llm_claims.CLAIMS, _planted(erm_growth_at_paper_level=2.0))
    paper = [r for r in moved if r.name == "paper-gamma-1.5"]
    assert {r.verdict for r in paper} == {UNTESTABLE} and {r.method for r in paper} == {"hard", "resilient"}
    # ... and its rows keep what was measured: the interval, and ERM's growth at that level
    assert all(r.seeds == S and r.low is not None and "×2.0000" in r.at for r in paper)
    assert all(r.reason.startswith(llm_claims.PAPER_REASON) for r in paper)


def test_one_seed_and_missing_arrays() -> None:
    one = {k: v[:1] for k, v in _planted().items()}
    rows = judge(llm_claims.CLAIMS, one)
    assert {r.verdict for r in rows if r.name != "paper-gamma-1.5"} == {ONE_SEED}
    assert judge(llm_claims.CLAIMS, {})[0].verdict == PENDING
    assert {r.verdict for r in judge(llm_claims.CLAIMS, {})} == {PENDING}
    partial = {k: v for k, v in _planted().items() if not k.startswith("null/")}
    by_name = {r.name: r.verdict for r in judge(llm_claims.CLAIMS, partial)}
    assert by_name["null-control"] == PENDING and by_name["noisy-win"] == "reproduced"
    # a preset that runs only erm and hard: resilient's rows are absent, hard's are judged
    quick = {k: v for k, v in _planted().items() if "/resilient/" not in k}
    assert {r.method for r in judge(llm_claims.CLAIMS, quick) if r.name == "clean-parity"} == {"hard"}
    # no NEFTune-trained arm (full-seeds): the positive control is not in this run, not a missing array
    no_positive = {k: v for k, v in quick.items() if f"/{llm_claims.POSITIVE}/" not in k}
    control = [r for r in judge(llm_claims.CLAIMS, no_positive) if r.name == "positive-control"]
    assert [r.verdict for r in control] == [NOT_IN_RUN]
    assert "no erm-neftune arm" in control[0].reason


def test_committed_result_is_rejudged_from_its_counts() -> None:
    earlier = COMMITTED / "earlier"  # the one-seed run, kept beside the full run's page as its History
    results = json.loads((earlier / "results.json").read_text())
    arrays = llm_claims.claim_arrays(earlier)
    # the rebuilt outcomes carry the committed win rates exactly
    hard = results["methods"]["hard"]["curves"]["win_rate@gaussian"]
    grid = results["grid"]["kinds"]["gaussian"]
    ratio_of = dict(zip(grid["levels"], grid["targets"], strict=True))
    for x, rate in zip(hard["x"], hard["mean"], strict=True):
        name = condition_name("gaussian", x, ratio_of.get(x))
        assert arrays[llm_legacy.win_key("hard", name)].mean() == pytest.approx(rate)
    assert arrays["win/hard/gaussian-x3"].shape == (1, 1, 200)
    rows = judge(llm_claims.CLAIMS, arrays)
    assert {r.verdict for r in rows if r.name != "paper-gamma-1.5"} == {ONE_SEED}
    assert {r.verdict for r in rows if r.name == "paper-gamma-1.5"} == {UNTESTABLE}
    # the old null control (ERM re-seeded, another data order) is read as the null control's cells
    reseeded = results["methods"]["erm-reseed"]["curves"]["win_rate@gaussian"]
    assert arrays[f"win/{llm_claims.NULL}/gaussian-x3"].mean() == pytest.approx(
        reseeded["mean"][reseeded["x"].index(0.8516)]
    )
    assert {r.method for r in rows if r.name == "null-control"} == {llm_claims.NULL}
    assert results["config"]["seed"] == 0 and "seeds" not in results["config"]  # a config of before the seeds
    primary = next(r for r in rows if r.role == "primary")
    assert primary.method == "hard" and primary.estimate == pytest.approx(0.63 - 0.5)
    # the committed results.json holds exactly these rows
    assert results["claims"] == [r.to_dict() for r in rows]
    # a run with more than one seed or draw cannot be rebuilt from counts: pending
    assert llm_legacy.arrays_from_counts({**results, "protocol": {**results["protocol"], "draws": 2}}) == {}


def test_committed_full_run_is_judged_from_its_saved_cells() -> None:
    results = json.loads((COMMITTED / "results.json").read_text())
    arrays = llm_claims.claim_arrays(COMMITTED)
    assert arrays["win/hard/gaussian-x3"].shape[0] == len(results["config"]["seeds"]) >= 3
    assert results["claims"] == [r.to_dict() for r in judge(llm_claims.CLAIMS, arrays)]


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory, smollm2_tokenizer):
    """A 2-layer Llama with SmolLM2's tokenizer, saved as a local model folder."""
    from tiny_models import tiny_llama

    tok = smollm2_tokenizer
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
        "seeds=[0,1]",
        "tune_seed=1000",
        "selection.candidates={hard: [alpha=0.05, alpha=0.2], resilient: [penalty=0.5, penalty=2.0]}",
        "selection_examples=4",
        "val_every=2",
        "val_curve_examples=2",
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
    assert set(results["methods"]) == {"erm", "hard", "resilient", "erm-neftune"}
    assert Results.from_dict(results).to_dict() == results  # every typed key written, the figures' too
    assert results["protocol"]["seeds"] == [0, 1] == results["seeds"]
    # every method trained once per evaluation seed, and never from the tuning seed
    for block in results["methods"].values():
        assert [t["seed"] for t in block["train"]] == [0, 1] and block["seeds"] == [0, 1]
    # the tuning seed trained ERM (the levels) and every candidate, on validation only
    sel = results["selection"]
    assert sel["tune_seed"] == 1000 and sel["erm_tuning_run"]["seed"] == 1000
    tuning_runs = [r for runs in sel["candidate_runs"].values() for r in runs]
    assert len(tuning_runs) == 4 and {r["seed"] for r in tuning_runs} == {1000}
    assert not (path / "jobs" / "eval-erm-seed1000.json").exists()  # no tuning run is evaluated on held-out
    assert (path / "jobs" / "validate-erm-seed1000.json").is_file() and (
        path / "jobs" / "grid.json"
    ).is_file()
    # the chosen candidate is the one the evaluation seeds trained with, and the rule's rows name it
    for m in ("hard", "resilient"):
        assert sel["chosen"][m] in sel["candidates"][m]
        assert [t["candidate"] for t in results["methods"][m]["train"]] == [sel["chosen"][m]] * 2
        rows = [r for r in sel["rows"] if r[0] == m]
        assert len(rows) == 2 and [r[1] for r in rows if r[5] == "yes"] == [sel["chosen"][m]]
        assert all(0 <= r[2] <= 1 and 0 <= r[3] <= 1 for r in rows) and m in sel["reasons"][m]
    assert any(t["title"].startswith("Selection on validation") for t in results["tables"])
    # the convergence check: a validation loss every 2 steps and at the last
    curve = results["methods"]["erm"]["train"][0]["val_curve"]
    assert curve["steps"] == [2, 3] and len(curve["loss"]) == 2 and curve["last_doubling_change"] is None
    levels = results["protocol"]["levels"]
    assert set(levels) == {"gaussian", "neftune"} and 1.5 in levels["neftune"] and levels["gaussian"][0] == 0
    erm, hard = results["methods"]["erm"], results["methods"]["hard"]
    assert erm["curves"]["perplexity@gaussian"]["x"] == levels["gaussian"]
    for kind in ("gaussian", "neftune"):
        wr, dn = hard["curves"][f"win_rate@{kind}"], hard["curves"][f"delta_nll@{kind}"]
        assert all(lo <= m <= hi for lo, m, hi in zip(wr["ci_low"], wr["mean"], wr["ci_high"], strict=True))
        counts = [w + t + lo for w, t, lo in zip(wr["wins"], wr["ties"], wr["losses"], strict=True)]
        assert counts == [2 * 6 if x == 0 else 2 * 12 for x in wr["x"]]  # 2 seeds; 2 draws under noise
        assert all(len(p) == 2 for p in wr["per_seed"]) and len(dn["ci_low"]) == len(dn["x"])
        assert wr["mean"] == pytest.approx([sum(p) / 2 for p in wr["per_seed"]])
    # ERM's own win-rate curves: the null control, ERM against ERM on the next seed
    null = erm["curves"]["win_rate@gaussian"]
    assert null["against"] == "erm, the next seed" and null["mean"] == pytest.approx([0.5] * len(null["x"]))
    # the clean point is one pass shared by every kind
    assert erm["curves"]["perplexity@gaussian"]["mean"][0] == erm["curves"]["perplexity@neftune"]["mean"][0]
    assert set(hard["layer_loss"]) == {"clean", results["profile_condition"]}
    assert len(hard["layer_loss"]["clean"]) == 3  # layers 0..2
    trace = hard["train"][1]["lambda_trace"]
    assert trace["steps"] == [1, 2, 3] and len(trace["lambda"][0]) == 2
    assert all("slacks" in t for t in results["methods"]["resilient"]["train"])
    assert results["methods"]["erm-neftune"]["train"][0]["noisy_training"][0] == "neftune"
    # the claims: cells [seed, draw, example], judged by the engine with the seed as the unit
    cells = CellStore.load(path)
    assert cells.design.arms == ("erm", "hard", "resilient", "erm-neftune", llm_claims.NULL)
    assert (
        cells.design.seeds == (0, 1)
        and cells.design.examples == 6
        and "gaussian-x1.01" in cells.design.conditions
    )
    assert cells.get("win", "hard", "clean").shape == (2, 1, 6)
    assert cells.get("win", "hard", "gaussian-x1.01").shape == (2, 2, 6)
    assert cells.get("win", llm_claims.NULL, "clean").shape == (2, 1, 6)
    assert cells.get("perplexity_ratio", "erm", "gaussian-x1.01").shape == (2,)
    assert cells.get("win", "hard", "clean").mean() == pytest.approx(
        hard["curves"]["win_rate@gaussian"]["mean"][0]
    )
    assert np.all(cells.get("win", "erm", "gaussian-x1.01") == 0.5)  # ERM against itself: a tie on every cell
    rows = {(c["name"], c["method"], c["at"].split(",")[0]): c for c in results["claims"]}
    assert rows[("noisy-win", "", "")]["verdict"] == NOT_IN_RUN  # this grid has no x3 level
    judged = [c for c in results["claims"] if c["verdict"] not in (PENDING, NOT_IN_RUN)]
    assert judged and all(c["seeds"] == 2 for c in judged)
    assert all(c["verdict"] != ONE_SEED and " 2 seed(s) x " in c["reason"] for c in judged)
    # the null control: ERM on seed 0 against ERM on seed 1 and back; with two seeds they are complements
    null_row = rows[("null-control", llm_claims.NULL, "clean")]
    assert null_row["kind"] == "parity" and null_row["estimate"] == pytest.approx(0.0, abs=1e-12)
    assert rows[("noisy-win-levels", "resilient", "neftune")]["seeds"] == 2
    assert rows[("paper-gamma-1.5", "hard", "neftune at the fixed level 1.5")]["verdict"] == UNTESTABLE
    assert {c["verdict"] for c in results["claims"]} <= set(VERDICTS)
    assert not any("claim" in t["title"].lower() for t in results["tables"])
    # the per-example NLLs behind the win rates are kept for re-analysis, one file per method and seed
    saved = json.loads((path / "jobs" / "eval-hard-seed1.json").read_text())
    assert len(saved["nll"]["clean"]) == 6

    # the report is a function of the run directory: deleting it and its figures restores the same files
    report, figures = (path / "report.md").read_text(), sorted((path / "figures").iterdir())
    for name in ("win-rate.png", "delta-nll.png", "layer-profiles.png", "lambda.png", "val-loss.png"):
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


def test_the_fresh_seed_run_repeats_the_full_runs_choice_and_grid() -> None:
    # full-seeds: ERM and hard at what the committed full run chose, one candidate (no tuning round), on
    # seeds no other run used; data, budget, noise grid and tuning seed are the full preset's
    import json
    from pathlib import Path

    full = resolve_config(exp.LlmRobustnessConfig, preset="full", presets=exp.PRESETS)
    seeds = resolve_config(exp.LlmRobustnessConfig, preset="full-seeds", presets=exp.PRESETS)
    assert seeds.methods == ["erm", "hard"] and len(seeds.seeds) >= 7
    assert not set(seeds.seeds) & {*full.seeds, full.tune_seed, 900, 901}
    assert (seeds.data, seeds.train, seeds.grid, seeds.tune_seed, seeds.val_n) == (
        full.data,
        full.train,
        full.grid,
        full.tune_seed,
        full.val_n,
    )
    committed = Path(__file__).parents[2] / "docs" / "results" / "llm-robustness" / "results.json"
    chosen = json.loads(committed.read_text())["selection"]["chosen"]["hard"]
    assert seeds.candidates("hard") == [chosen]
    assert seeds.method_config("erm") == full.method_config("erm")
    assert seeds.method_config("hard") == full.method_config("hard")  # the candidate is applied on top
