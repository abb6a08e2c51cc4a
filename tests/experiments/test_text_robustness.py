"""text-robustness: config validation, methods as MethodConfigs, selection, tables, and end-to-end runs on a
tiny BERT (results, claims judged from the saved arrays, report rebuilt from the run directory, resume from
the job cache, worker processes)."""

from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest
import torch

from descentlab.config import resolve_config
from descentlab.constrained.config import DescentConfig
from descentlab.errors import AssetMissingError, ConfigError
from descentlab.evaluation import RobustnessCurves
from descentlab.experiments import report_run, run_experiment
from descentlab.experiments.text_robustness import config as tr
from descentlab.experiments.text_robustness.report import is_monotone, method_block, paired_gap_rows
from descentlab.report.claims import NOT_IN_RUN, PENDING, VERDICTS
from descentlab.study.tuning_rules import (
    CandidateSelection,
    binding_level,
    candidate_methods,
    choose_candidate,
    settings_diff,
    with_reference,
)
from descentlab.train.recipe import build_frozen_recipe, build_recipe
from tiny_models import tiny_bert


def test_bad_config_is_rejected_before_anything_runs() -> None:
    cfg_cls, presets = tr.CONFIG, tr.PRESETS
    with pytest.raises(ConfigError, match="methods"):
        resolve_config(cfg_cls, presets=presets, overrides=["methods=[erm,sgd]"])
    with pytest.raises(ConfigError, match="candidate"):
        resolve_config(cfg_cls, overrides=['selection.candidates.constrained=["alpha=oops"]'])
    with pytest.raises(ConfigError, match="only constrained methods"):
        resolve_config(cfg_cls, overrides=['selection.candidates.erm=["alpha=0.2"]'])
    with pytest.raises(ConfigError, match="method spec"):
        resolve_config(cfg_cls, overrides=['specs.extra="constraint.no_such_key=1"'])
    with pytest.raises(ConfigError, match="gammas"):
        resolve_config(cfg_cls, presets=presets, overrides=["evaluation.gammas=[0.5,1.0]"])
    with pytest.raises(ConfigError, match="tune_seed=2 is also an evaluation seed"):
        resolve_config(cfg_cls, overrides=["tune_seed=2"])
    for preset in presets:
        assert resolve_config(cfg_cls, preset=preset, presets=presets).tune_seed == 1000


def test_methods_are_one_base_edited_by_specs() -> None:
    cfg = resolve_config(tr.CONFIG, preset="quick", presets=tr.PRESETS)
    methods = cfg.resolved_methods()
    assert list(methods) == [
        "erm", "erm-readout", "deep-supervision", "constrained", "resilient", "erm-noise"
    ]  # fmt: skip
    assert [m.objective for m in methods.values()] == [
        "erm", "constrained", "deep-supervision", "constrained", "constrained", "erm"
    ]  # fmt: skip
    assert cfg.frozen_zero == ["erm-readout"] and cfg.train_noise == {"erm-noise": 1.0}
    assert methods["resilient"].constraint.resilient and not methods["constrained"].constraint.resilient
    # one optimizer for every method: the quick preset's lr, AdamW decaying every tensor, no λ ceiling
    assert {(m.optimizer.name, m.optimizer.lr, m.optimizer.decay) for m in methods.values()} == {
        ("adamw", 1e-4, "all")
    }
    # the defaults cannot be gamed: f_{l-1} detached, layer 1 (input-independent layer 0) unconstrained
    assert methods["constrained"].constraint == DescentConfig(
        alpha=0.03, dual_lr=0.1, detach_prev=True, constrain_first=False, max_multiplier=None
    )
    assert cfg.pooling == "mean" and cfg.selection.candidates == {"constrained": [tr.CHOSEN]}
    # a new method is one more spec: nothing else to declare
    cfg = resolve_config(
        tr.CONFIG,
        overrides=["specs.strong=objective=constrained constraint.alpha=0.3", "methods=[erm,strong]"],
    )
    assert cfg.resolved_methods()["strong"].constraint.alpha == 0.3


def test_candidates_edit_the_methods_own_constraint() -> None:
    cfg = resolve_config(tr.CONFIG)  # the default candidates: the base settings and ERM's profile
    methods = cfg.resolved_methods()
    cands = candidate_methods("constrained", methods["constrained"], cfg.selection)
    assert [c.constraint.alpha_from for c in cands] == [None, "erm"]
    assert cfg.selection.follow == {"resilient": "constrained"}
    # alpha_from=erm becomes a per-layer schedule the reference profile meets (0 where it rises)
    ref = [0.69, 0.70, 0.68, 0.60, 0.50, 0.45, 0.45]
    resolved = with_reference(cands[1], ref).constraint
    expected = [0.0, 1 - 0.68 / 0.69, 1 - 0.60 / 0.68, 1 - 0.5 / 0.6, 1 - 0.45 / 0.5, 0.0]
    assert resolved.alphas(6) == pytest.approx(expected)
    assert with_reference(cands[0], ref) == cands[0]
    assert candidate_methods("erm", methods["erm"], cfg.selection) == [methods["erm"]]
    # the full protocol: the defaults' data and budget, 5 evaluation seeds
    cfg = resolve_config(tr.CONFIG, preset="full", presets=tr.PRESETS)
    assert (cfg.data.n_train, cfg.data.n_eval, cfg.train.epochs, len(cfg.seeds)) == (3000, 1000, 2, 5)
    assert cfg.evaluation.draws >= 2 and len(cfg.evaluation.kinds) == 4


def test_the_recipe_is_the_old_optimizer_and_constraint() -> None:
    """AdamW over model.parameters() with the experiment's lr / wd, and LayerwiseDescent without λ ceiling."""
    cfg = resolve_config(tr.CONFIG, preset="quick", presets=tr.PRESETS)
    model = tiny_bert(layers=3)
    recipe = build_recipe(cfg.resolved_methods()["resilient"], model, total_steps=10)
    inner = recipe.optimizer.optimizer
    assert type(inner) is torch.optim.AdamW and len(inner.param_groups) == 1
    group = inner.param_groups[0]
    assert [id(p) for p in group["params"]] == [id(p) for p in model.parameters()]
    assert (group["lr"], group["weight_decay"], group["betas"], group["eps"]) == (
        1e-4,
        0.01,
        (0.9, 0.999),
        1e-8,
    )
    assert recipe.constraint.num_layers == 3 and recipe.constraint.duals.max_multiplier is None
    assert recipe.constraint.resilience is not None and recipe.scheduler is None


def test_paired_gap_is_the_difference_of_curves() -> None:
    gammas = (0.0, 1.0)
    erm = RobustnessCurves("accuracy", gammas, {"gaussian": np.array([[[0.8, 0.6], [0.8, 0.5]]])})
    con = RobustnessCurves("accuracy", gammas, {"gaussian": np.array([[[0.81, 0.7], [0.81, 0.7]]])})
    rows = paired_gap_rows({"erm": erm, "constrained": con})
    assert rows == [["constrained", "gaussian", "+0.0100 ± 0.0000", "+0.1500 ± 0.0500"]]
    assert paired_gap_rows({"constrained": con}) == []
    assert is_monotone([0.7, 0.7, 0.5]) and not is_monotone([0.7, 0.71, 0.5])


def test_method_block_reports_population_spreads_over_seeds() -> None:
    values = np.array([[[0.8, 0.6]], [[0.6, 0.4]]])  # [seed, draw, γ]
    block = method_block(
        RobustnessCurves("accuracy", (0.0, 1.0), {"gaussian": values}),
        {"clean": [[0.7, 0.5], [0.7, 0.6]]},
        {"val_accuracy": [0.5, 0.7]},
        [[1.0, 3.0], [2.0, 5.0]],
        "gaussian",
    ).to_dict()
    assert block["metrics"]["accuracy"] == pytest.approx(0.7)
    assert block["metrics"]["accuracy_std"] == pytest.approx(0.1)  # ddof = 0
    assert block["metrics"]["gaussian_mean_gamma>=1"] == pytest.approx(0.5)
    assert block["metrics"]["val_accuracy"] == pytest.approx(0.6)
    assert block["layer_loss"]["clean"] == pytest.approx([0.7, 0.55])
    assert block["layer_loss_std"]["clean"] == pytest.approx([0.0, 0.05])
    assert block["layer_loss_monotone_seeds"] == {"clean": 2}
    assert block["multipliers"] == [1.5, 4.0]
    assert block["curves"]["gaussian"]["mean"] == pytest.approx([0.7, 0.5])


def test_selection_prefers_robust_among_candidates_that_keep_clean_accuracy() -> None:
    scores = [
        {"clean": 0.80, "robust": 0.60},
        {"clean": 0.70, "robust": 0.75},
        {"clean": 0.795, "robust": 0.65},
    ]
    best, rows, why = choose_candidate("constrained", ["a", "b", "c"], scores, 0.80, max_clean_drop=0.01)
    assert best == 2 and rows[2][-1] == "yes" and "'c'" in why  # b is more robust but loses 10 points clean
    assert choose_candidate("constrained", ["a", "b", "c"], scores, None)[0] == 1
    assert choose_candidate("constrained", ["a", "b", "c"], scores, 0.80, criterion="clean")[0] == 0
    best, _, why = choose_candidate("resilient", ["a", "b"], scores[1:2] * 2, 0.95)
    assert best == 0 and "no candidate" in why
    assert settings_diff({"alpha": 0.1, "dual_lr": 0.5}, {"alpha": 0.1, "dual_lr": 0.05}) == "dual_lr=0.5"


def test_binding_level_is_the_late_time_average_of_the_summed_multipliers() -> None:
    steps = [5, 10, 15, 20]  # T = 20: the second half is t > 10
    lam = [[0.0, 0.0], [1.0, 1.0], [0.2, 0.4], [0.0, 0.2]]
    assert binding_level(steps, lam) == pytest.approx((0.6 + 0.2) / 2)
    # a λ that rose early and fell back to 0 does not bind
    assert binding_level(steps, [[0.0, 0.0], [3.0, 2.0], [0.0, 0.0], [0.0, 0.0]]) == 0.0
    assert binding_level([], []) == 0.0
    with pytest.raises(ValueError, match="multiplier rows"):
        binding_level(steps, lam[:2])


def test_a_candidate_whose_constraint_does_not_bind_is_not_eligible() -> None:
    scores = [
        {"clean": 0.80, "robust": 0.70, "binding": 0.0},  # the most robust, but λ ended at 0
        {"clean": 0.80, "robust": 0.60, "binding": 0.30},
        {"clean": 0.79, "robust": 0.65, "binding": 0.04},  # binds, below the threshold
    ]
    best, rows, why = choose_candidate("constrained", ["a", "b", "c"], scores, 0.80, min_binding=0.05)
    assert best == 1 and rows[1][-1] == "yes" and rows[1][-2] == 0.30
    assert "1 of 3 candidates bind" in why and "'b'" in why
    # not enforced unless set: the usual rule picks the most robust
    assert choose_candidate("constrained", ["a", "b", "c"], scores, 0.80)[0] == 0
    assert choose_candidate("constrained", ["a", "b", "c"], scores, 0.80, min_binding=0.03)[0] == 2
    # none binds: said so, and the usual rule chooses among all
    best, _, why = choose_candidate("constrained", ["a", "b", "c"], scores, 0.80, min_binding=0.5)
    assert best == 0 and "no candidate binds" in why
    with pytest.raises(ConfigError, match="min_binding"):
        CandidateSelection(min_binding=-0.1)


def test_alpha_fraction_scales_the_descent_of_the_erm_reference() -> None:
    ref = [0.70, 0.60, 0.62, 0.45, 0.44]  # rises at layer 2: running min 0.60 there
    running = [0.70, 0.60, 0.60, 0.45, 0.44]
    own = [1 - running[i] / running[i - 1] for i in range(1, 5)]
    base = DescentConfig(alpha_reference=ref)
    assert base.alphas(4) == pytest.approx(own)
    doubled = DescentConfig(alpha_reference=ref, alpha_fraction=2.0, alpha_cap=0.45)
    assert doubled.alphas(4) == pytest.approx([min(0.45, 2 * a) for a in own])
    assert doubled.alphas(4)[2] == 0.45  # 2 x 0.25 = 0.5, capped
    # the reference meets its own chain (gap 0), and misses the doubled one by (F - 1)(r̃_{l-1} - r̃_l)
    for layer in (1, 2, 4):  # uncapped layers
        gap = running[layer] - (1 - doubled.alphas(4)[layer - 1]) * running[layer - 1]
        assert gap == pytest.approx(running[layer - 1] - running[layer])
        assert running[layer] - (1 - base.alphas(4)[layer - 1]) * running[layer - 1] == pytest.approx(0.0)
    with pytest.raises(ConfigError, match="alpha_fraction"):
        DescentConfig(alpha_from="erm").with_overrides("alpha_fraction=0")


def test_the_full_preset_asks_for_a_constraint_that_binds() -> None:
    cfg = resolve_config(tr.CONFIG, preset="full", presets=tr.PRESETS)
    assert cfg.methods == ["erm", "erm-readout", "constrained", "erm-noise"]
    assert cfg.seeds == [100, 101, 102, 103, 104] and cfg.tune_seed == 1000
    assert cfg.tune_seed not in cfg.seeds
    assert cfg.selection.min_binding == 0.05 and cfg.frozen_zero == ["erm-readout"]
    methods = cfg.resolved_methods()
    cands = candidate_methods("constrained", methods["constrained"], cfg.selection)
    assert 3 <= len(cands) <= 4
    base = methods["constrained"].constraint
    for c in cands:  # each asks for at least ERM's own descent, or a larger fixed α than the base
        k = c.constraint
        assert (k.alpha_from == "erm" and k.alpha_fraction >= 1.0) or (
            k.alpha_from is None and k.alpha > base.alpha
        )
    # the size of the run: ERM's tuning run + the candidates on validation + every (method, seed) on test
    assert 1 + len(cands) + len(cfg.methods) * len(cfg.seeds) == 24


# a two-seed ERM-vs-constrained run on the tiny encoder, small enough for seconds
TWO_SEED_RUN = [
    "methods=[erm,constrained]",
    "seeds=[0,1]",
    "data.n_train=32",
    "data.n_eval=16",
    "data.max_length=24",
    "train.batch_size=16",
    "train.progress=false",
    "evaluation.kinds=[gaussian]",
]


@pytest.fixture(scope="module")
def tiny_encoder_dir(tmp_path_factory):
    """A 2-layer BERT classifier with the real MiniLM tokenizer, saved like any HF checkpoint."""
    from descentlab.data import load_encoder_classifier

    try:
        _, tokenizer = load_encoder_classifier("minilm")
    except AssetMissingError as e:
        pytest.skip(str(e))
    path = tmp_path_factory.mktemp("tiny-bert")
    assert tokenizer.pad_token_id == 0  # tiny_bert's padding id
    tiny_bert(vocab=tokenizer.vocab_size).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_end_to_end_on_a_tiny_encoder(tiny_encoder_dir, tmp_path) -> None:
    shift_csv = tmp_path / "shift.csv"
    with shift_csv.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        for i in range(40):
            writer.writerow([f"a {'great' if i % 2 else 'dull'} film, take {i}", i % 2])
    out = run_experiment(
        "text-robustness",
        preset="quick",
        out=tmp_path / "runs",
        overrides=[
            f"model={tiny_encoder_dir}",
            "seeds=[0,1]",
            "data.n_train=48",
            "data.n_eval=24",
            "data.max_length=32",
            f"data.shift=[{shift_csv}]",
            "train.batch_size=16",
            "train.progress=false",
            "evaluation.gammas=[0.0,1.0,3.0]",
            "evaluation.kinds=[gaussian,uniform,discrete]",
            "methods=[erm,erm-readout,constrained,resilient]",
            'selection.candidates.constrained=["alpha=0.1", "alpha_from=erm"]',
            "selection.min_binding=0.0",
            "tune_seed=7",
        ],
    )
    res = json.loads((out / "results.json").read_text())
    assert set(res["methods"]) == {"erm", "erm-readout", "constrained", "resilient"}
    # the claims are judged from the saved arrays: the primary first, with a seed-level interval
    claims = res["claims"]
    primary = [c for c in claims if c["role"] == "primary"]
    assert [(c["name"], c["method"], c["reference"], c["at"]) for c in primary] == [
        ("graceful-gaussian", "constrained", "erm-readout", "gaussian, γ >= 1")
    ]
    assert primary[0]["seeds"] == 2 and primary[0]["examples"] == 24
    assert primary[0]["verdict"] in VERDICTS and primary[0]["verdict"] != PENDING
    rows = {(c["name"], c["method"], c["reference"], c["at"]) for c in claims}
    graceful = {(m, at) for name, m, ref, at in rows if name == "graceful"}
    assert graceful == {
        ("constrained", "uniform, γ >= 1"), ("constrained", "discrete, γ >= 1"),
        ("resilient", "gaussian, γ >= 1"), ("resilient", "uniform, γ >= 1"), ("resilient", "discrete, γ >= 1"),
    }  # fmt: skip
    assert {(m, ref) for name, m, ref, _ in rows if name == "clean-parity"} == {
        (m, ref) for m in ("constrained", "resilient") for ref in ("erm", "erm-readout")
    }
    assert {(m, ref) for name, m, ref, _ in rows if name == "monotone"} == {
        ("constrained", "erm"), ("resilient", "erm")
    }  # fmt: skip
    # erm-noise and deep-supervision were not trained: neither control is in this run, and the baseline's
    # row names the arm the run lacks
    verdicts = {c["name"]: c["verdict"] for c in claims}
    assert (verdicts["positive-control"], verdicts["beats-deep-supervision"]) == (NOT_IN_RUN, NOT_IN_RUN)
    assert "no deep-supervision arm" in next(
        c["reason"] for c in claims if c["name"] == "beats-deep-supervision"
    )
    assert all(c["holm_verdict"] for c in claims if c["role"] == "secondary")
    assert not any("Claims" in t["title"] for t in res["tables"])  # the report renders the claims itself
    assert "follows constrained" in res["protocol"]["selection"]["resilient"]
    assert res["protocol"]["seeds"] == [0, 1] and res["protocol"]["n_eval"] == 24
    assert "validation" in res["protocol"]["selection"]["constrained"]
    assert "tuning seed 7" in res["protocol"]["selection"]["constrained"]
    for block in res["methods"].values():
        assert set(block["curves"]) == {"gaussian", "uniform", "discrete"}
        for curve in block["curves"].values():
            assert curve["x"] == [0.0, 1.0, 3.0] and len(curve["mean"]) == len(curve["std"]) == 3
            assert all(0.0 <= v <= 1.0 for v in curve["mean"])
        assert set(block["layer_loss"]) == {"clean"} and len(block["layer_loss_ci"]) == 3
        assert all(len(v) == 3 for v in block["layer_loss"].values())  # layers 0..2
        assert block["metrics"]["accuracy"] == pytest.approx(block["curves"]["gaussian"]["mean"][0])
        assert 0.0 <= block["metrics"][f"shift:{shift_csv}"] <= 1.0
    assert len(res["methods"]["constrained"]["multipliers"]) == 2
    assert res["methods"]["resilient"]["constraint"]["resilient"] is True
    titles = [t["title"] for t in res["tables"]]
    assert any("Selection" in t for t in titles) and any("Dataset shift" in t for t in titles)
    selection = next(t for t in res["tables"] if "Selection" in t["title"])
    assert [r[-1] for r in selection["rows"] if r[0] == "constrained"].count("yes") == 1
    assert "tuning seed 7" in selection["title"]
    assert "binding" in selection["columns"][-2]
    assert "second half of training > 0" in res["protocol"]["selection"]["constrained"]
    # λ per constrained layer at every log step: each evaluation run of each trained constrained method,
    # and each candidate's tuning run; the notes give the end-of-training λ
    lam = np.load(out / "arrays" / "lambda.npz")
    assert set(lam.files) == {"constrained", "constrained__steps", "resilient", "resilient__steps"}
    assert lam["constrained"].shape == (2, len(lam["constrained__steps"]), 2)  # [seed, T, L]
    assert lam["constrained__steps"][-1] == 3 and (lam["constrained"] >= 0).all()  # 48 / 16 steps
    tuning = np.load(out / "arrays" / "lambda-selection.npz")
    assert set(tuning.files) == {f"constrained__cand{i}{s}" for i in (0, 1) for s in ("", "__steps")}
    assert tuning["constrained__cand0"].shape == (len(tuning["constrained__cand0__steps"]), 2)
    for i in (0, 1):
        cand = json.loads((out / "jobs" / f"constrained-cand{i}-seed7-validation.json").read_text())
        assert cand["binding"] == pytest.approx(
            binding_level(tuning[f"constrained__cand{i}__steps"], tuning[f"constrained__cand{i}"])
        )
    assert sum(n.startswith("constrained: λ at the end of training") for n in res["notes"]) == 1
    # the claims' cells and their design record: methods, noise kinds, seeds, reviews, γ grid, ERM's profile
    design = json.loads((out / "arrays" / "design.json").read_text())
    assert design["arms"] == ["erm", "erm-readout", "constrained", "resilient"]
    assert design["conditions"] == ["gaussian", "uniform", "discrete"] and design["seeds"] == [0, 1]
    assert design["examples"] == 24 and design["extra"]["gammas"] == [0.0, 1.0, 3.0]
    assert design["extra"]["erm_val_profile"] == pytest.approx(
        json.loads((out / "jobs" / "erm-seed7-validation.json").read_text())["val_profile"]
    )
    cells = np.load(out / "arrays" / "cells.npz")
    assert cells["correct/constrained/uniform"].shape == (2, 2, 3, 24)  # [seed, draw, γ, review]
    assert cells["loss/erm"].shape == (2, 3, 24)  # [seed, L+1, review]
    # the selection trains ERM and every candidate from the tuning seed 7 (validation only); the chosen
    # candidate then trains afresh on each evaluation seed: no tuning run is an evaluation run
    tags = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert tags == sorted(
        [
            "erm-seed0",
            "erm-seed1",
            "erm-seed7",
            "erm-readout-seed0",
            "erm-readout-seed1",
            "constrained-cand0-seed7",
            "constrained-cand1-seed7",
            "constrained-seed0",
            "constrained-seed1",
            "resilient-seed0",
            "resilient-seed1",
        ]
    )
    jobs = {p.name for p in (out / "jobs").iterdir() if not p.name.startswith(".")}
    assert {j for j in jobs if "seed7" in j} == {
        "erm-seed7-validation.json", "constrained-cand0-seed7-validation.json",
        "constrained-cand1-seed7-validation.json",
    }  # fmt: skip
    # alpha_from=erm, if chosen, takes ERM's validation profile on the tuning seed
    erm7 = json.loads((out / "jobs" / "erm-seed7-validation.json").read_text())
    assert len(erm7["val_profile"]) == 3 and 0.0 <= erm7["clean"] <= 1.0
    report = (out / "report.md").read_text()
    assert "gaussian: accuracy vs gamma" in report and "figures/paired-gap.png" in report
    assert "**Primary endpoint.** primary graceful-gaussian" in report
    figures = {p.name: p.read_bytes() for p in (out / "figures").iterdir()}
    assert set(figures) == {
        "curves.png", "layer-loss.png", "paired-gap.png", "accuracy-ci.png", "layer-loss-ci.png",
        "lambda-trajectory.png", "training-curves.png",
    }  # fmt: skip

    # the report is a function of the run directory: deleting it and the figures, `descentlab report`
    # re-judges the same claims and restores the same files
    shutil.rmtree(out / "figures")
    (out / "report.md").unlink()
    assert report_run(out).read_text() == report
    assert json.loads((out / "results.json").read_text())["claims"] == claims
    assert {p.name: p.read_bytes() for p in (out / "figures").iterdir()} == figures

    # a resumed run reuses the cached job outputs: same numbers, nothing trained or evaluated again
    n_logged = len((out / "metrics.jsonl").read_text().splitlines())
    run_experiment("text-robustness", resume=out)
    assert json.loads((out / "results.json").read_text())["methods"] == res["methods"]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == n_logged
    # without the job cache the fits come from their checkpoints and the evaluation gives the same numbers
    shutil.rmtree(out / "jobs")
    run_experiment("text-robustness", resume=out)
    assert json.loads((out / "results.json").read_text())["methods"] == res["methods"]


def test_worker_processes_give_the_same_layout(tiny_encoder_dir, tmp_path) -> None:
    out = run_experiment(
        "text-robustness",
        preset="quick",
        out=tmp_path / "runs",
        overrides=[
            f"model={tiny_encoder_dir}",
            "workers=2",
            *TWO_SEED_RUN,
            "evaluation.gammas=[0.0,2.0]",
            'selection.candidates.constrained=["", "detach_prev=true"]',
        ],
    )
    res = json.loads((out / "results.json").read_text())
    assert set(res["methods"]) == {"erm", "constrained"}
    curve = res["methods"]["constrained"]["curves"]["gaussian"]
    assert curve["x"] == [0.0, 2.0] and len(curve["per_model"]) == 2
    logged = {r.get("tag") for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    assert {"eval-erm-seed0", "eval-erm-seed1", "eval-constrained-seed0", "eval-constrained-seed1"} <= logged
    cached = sorted(p.name for p in (out / "jobs").iterdir() if not p.name.startswith("."))  # not bookkeeping
    assert cached == sorted(
        [
            "erm-seed0-test.json",
            "erm-seed1-test.json",
            "erm-seed1000-validation.json",
            "constrained-cand0-seed1000-validation.json",
            "constrained-cand1-seed1000-validation.json",
            "constrained-seed0-test.json",
            "constrained-seed1-test.json",
        ]
    )


def test_a_search_scores_validation_and_never_test(tiny_encoder_dir, tmp_path, monkeypatch) -> None:
    from descentlab.experiments.text_robustness import jobs as text_jobs

    scored: list[tuple] = []  # (the scored batches, the validation batches, the shift sets), per call
    real = text_jobs.evaluate_classifier

    def spy(model, test, val, shift, ev, seed):
        scored.append(
            (
                [(b["input_ids"].tolist(), b["labels"].tolist()) for b in test],
                [(b["input_ids"].tolist(), b["labels"].tolist()) for b in val],
                dict(shift),
            )
        )
        return real(model, test, val, shift, ev, seed)

    monkeypatch.setattr(text_jobs, "evaluate_classifier", spy)
    out = run_experiment(
        "text-robustness",
        preset="quick",
        out=tmp_path / "runs",
        overrides=[
            f"model={tiny_encoder_dir}",
            *TWO_SEED_RUN,
            "workers=1",
            "data.n_eval=20",
            "evaluate_on=validation",
        ],
    )
    assert len(scored) == 4 and all(test == val and shift == {} for test, val, shift in scored)
    res = json.loads((out / "results.json").read_text())
    assert res["protocol"]["split"].startswith("validation (a search: no test example is scored)")
    with pytest.raises(ConfigError, match="evaluate_on"):
        resolve_config(tr.CONFIG, overrides=["evaluate_on=train"])


def test_the_moonshot_search_runs_on_tuning_seeds_only_and_names_its_held_out_task() -> None:
    from descentlab.data.text import load_text_classification

    cfg = resolve_config(tr.CONFIG, preset="moonshot-search", presets=tr.PRESETS)
    assert cfg.evaluate_on == "validation" and cfg.methods == ["erm", "constrained"]
    evaluated = set()
    for name in tr.PRESETS:
        other = resolve_config(tr.CONFIG, preset=name, presets=tr.PRESETS)
        if other.evaluate_on == "test":
            evaluated |= set(other.seeds)
    assert cfg.tune_seed not in cfg.seeds and not {cfg.tune_seed, *cfg.seeds} & evaluated
    assert cfg.data == resolve_config(tr.CONFIG, preset="full", presets=tr.PRESETS).data
    assert len(cfg.selection.candidates["constrained"]) == 4 and cfg.selection.min_binding == 0.05
    # the held-out task is a second offline text task that no study's preset trains on
    assert tr.MOONSHOT_HELD_OUT == "convention_speeches"
    for name in tr.PRESETS:
        assert resolve_config(tr.CONFIG, preset=name, presets=tr.PRESETS).data.name != tr.MOONSHOT_HELD_OUT
    held_out = load_text_classification(tr.MOONSHOT_HELD_OUT)
    assert set(held_out["test"]["label"]) == {0, 1} and len(held_out["test"]) > 400


def test_ldp_kinds_are_off_in_the_presets() -> None:
    for preset in tr.PRESETS:
        assert resolve_config(tr.CONFIG, preset=preset, presets=tr.PRESETS).evaluation.ldp_kinds == []


def test_accuracy_against_epsilon_end_to_end(tiny_encoder_dir, tmp_path) -> None:
    out = run_experiment(
        "text-robustness",
        preset="quick",
        out=tmp_path / "runs",
        overrides=[
            f"model={tiny_encoder_dir}",
            *TWO_SEED_RUN,
            "methods=[erm,erm-readout,constrained]",
            "evaluation.gammas=[0.0,1.0]",
            "evaluation.ldp_kinds=[metric_ldp,gaussian_mechanism]",
            "evaluation.epsilons=[3.0,300.0]",
        ],
    )
    res = json.loads((out / "results.json").read_text())
    ldp = res["protocol"]["ldp"]
    assert ldp["kinds"] == ["metric_ldp", "gaussian_mechanism"] and ldp["clip"] > 0
    for block in res["methods"].values():
        for kind in ldp["kinds"]:
            curve = block["curves"][kind]
            assert (
                curve["x_name"] == "epsilon" and curve["x"] == [3.0, 300.0] and len(curve["per_model"]) == 2
            )
            assert block["metrics"][f"{kind}_mean_over_epsilons"] == pytest.approx(np.mean(curve["mean"]))
    privacy = next(t for t in res["tables"] if t["title"].startswith("Privacy"))
    assert [r[:2] for r in privacy["rows"]] == [
        ["metric_ldp", 3.0],
        ["metric_ldp", 300.0],
        ["gaussian_mechanism", 3.0],
        ["gaussian_mechanism", 300.0],
    ]
    assert not any("ε" in c["at"] for c in res["claims"])  # described and drawn, not judged
    # the figure is drawn from results.json + arrays/ldp.npz, and rebuilt byte for byte
    arrays = np.load(out / "arrays" / "ldp.npz")
    assert arrays["erm__metric_ldp"].shape == (2, 2, 2, 16)  # [seed, draw (quick: 2), ε, example]
    np.testing.assert_allclose(
        arrays["constrained__gaussian_mechanism"].mean(axis=(1, 3)),
        res["methods"]["constrained"]["curves"]["gaussian_mechanism"]["per_model"],
        rtol=1e-6,
    )
    figure = (out / "figures" / "ldp-accuracy.png").read_bytes()
    report = (out / "report.md").read_text()
    assert "figures/ldp-accuracy.png" in report
    shutil.rmtree(out / "figures")
    assert report_run(out).read_text() == report
    assert (out / "figures" / "ldp-accuracy.png").read_bytes() == figure


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_model_layers_keeps_the_first_k_pretrained_layers(pooling) -> None:
    from descentlab.data import load_encoder_classifier
    from descentlab.evaluation.layer_profile import layer_loss_examples
    from descentlab.experiments.text_robustness.jobs import load_model

    cfg = tr.TextRobustnessConfig(model="minilm", pooling=pooling, model_layers=2)
    try:
        full = load_model(tr.TextRobustnessConfig(model="minilm", pooling=pooling), 2)
    except AssetMissingError as e:
        pytest.skip(str(e))
    cut = load_model(cfg, 2)
    assert cut.config.num_hidden_layers == len(cut.base_model.encoder.layer) == 2
    assert full.config.num_hidden_layers == 6
    kept = cut.base_model.encoder.state_dict()
    assert {k.split(".")[1] for k in kept if k.startswith("layer.")} == {"0", "1"}
    for name, weight in kept.items():  # the pretrained first two layers, not fresh ones
        torch.testing.assert_close(weight, full.base_model.encoder.state_dict()[name], rtol=0, atol=0)
    # the λ vector (the constrained method's and the frozen control's) and the layer profile have k layers
    methods = cfg.resolved_methods()
    assert build_recipe(methods["constrained"], cut, total_steps=4).constraint.multipliers.shape == (2,)
    frozen = build_frozen_recipe(
        methods[tr.CONTROL], cut, [0.0] * cut.config.num_hidden_layers, total_steps=4
    )
    assert frozen.constraint.multipliers.tolist() == [0.0, 0.0]
    _, tokenizer = load_encoder_classifier("minilm")
    batch = dict(tokenizer(["a fine film", "a dull and long film"], return_tensors="pt", padding=True))
    batch["labels"] = torch.tensor([1, 0])
    assert layer_loss_examples(cut, [batch]).shape == (3, 2)  # the embeddings and layers 1..k
    # deeper than the checkpoint: transformers would add fresh layers, the job refuses
    with pytest.raises(ConfigError, match="only 6 pretrained layers"):
        load_model(tr.TextRobustnessConfig(model="minilm", pooling=pooling, model_layers=7), 2)
    with pytest.raises(ConfigError, match="model_layers"):
        tr.TextRobustnessConfig(model_layers=0)
