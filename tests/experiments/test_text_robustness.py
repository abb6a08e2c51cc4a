"""text-robustness: config validation, constraint construction, and one end-to-end run on a tiny BERT."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from descentlab.config import resolve_config
from descentlab.errors import AssetMissingError, ConfigError
from descentlab.experiments import text_robustness as tr
from descentlab.experiments.base import run_experiment
from descentlab.experiments.text_robustness_results import (
    choose_candidate,
    is_monotone,
    paired_gap_rows,
    settings_diff,
)
from descentlab.robustness import RobustnessCurves


def test_candidates_are_typed_overrides_of_the_base_settings() -> None:
    base = tr.ConstraintSettings(alpha=0.1)
    got = tr.candidate_settings(base, "alpha=0.05 detach_prev=true layers=[2,3]")
    assert (got.alpha, got.detach_prev, got.layers, got.dual_lr) == (0.05, True, [2, 3], base.dual_lr)
    assert tr.candidate_settings(base, "") == base
    with pytest.raises(ConfigError, match="candidate"):
        tr.candidate_settings(base, "alpha=abc")
    with pytest.raises(ConfigError, match="candidate"):
        tr.candidate_settings(base, "no_such_key=1")


def test_bad_config_is_rejected_before_anything_runs() -> None:
    cfg_cls, presets = tr.CONFIG, tr.PRESETS
    with pytest.raises(ConfigError, match="methods"):
        resolve_config(cfg_cls, presets=presets, overrides=["methods=[erm,sgd]"])
    with pytest.raises(ConfigError, match="candidate"):
        resolve_config(cfg_cls, presets=presets, overrides=['selection.constrained=["alpha=oops"]'])
    with pytest.raises(ConfigError, match="gammas"):
        resolve_config(cfg_cls, presets=presets, overrides=["evaluation.gammas=[0.5,1.0]"])
    for preset in presets:
        resolve_config(cfg_cls, preset=preset, presets=presets)


def test_build_constraint_alpha_schedule_and_resilience() -> None:
    settings = tr.ConstraintSettings(alpha=0.1, early_alpha=0.0, early_layers=4, detach_prev=True)
    hard = tr.build_constraint(settings, 6, resilient=False)
    torch.testing.assert_close(hard.alpha, torch.tensor([0.0] * 4 + [0.1] * 2, dtype=torch.float64))
    assert hard.resilience is None and hard.detach_prev
    soft = tr.build_constraint(tr.ConstraintSettings(penalty=2.0), 6, resilient=True)
    assert soft.resilience.penalty == 2.0


def test_paired_gap_is_the_difference_of_curves() -> None:
    gammas = (0.0, 1.0)
    erm = RobustnessCurves("accuracy", gammas, {"gaussian": torch.tensor([[[0.8, 0.6], [0.8, 0.5]]]).numpy()})
    con = RobustnessCurves(
        "accuracy", gammas, {"gaussian": torch.tensor([[[0.81, 0.7], [0.81, 0.7]]]).numpy()}
    )
    rows = paired_gap_rows({"erm": erm, "constrained": con})
    assert rows == [["constrained", "gaussian", "+0.0100 ± 0.0000", "+0.1500 ± 0.0500"]]
    assert is_monotone([0.7, 0.7, 0.5]) and not is_monotone([0.7, 0.71, 0.5])


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


@pytest.fixture(scope="module")
def tiny_encoder_dir(tmp_path_factory):
    """A 2-layer BERT classifier with the real MiniLM tokenizer, saved like any HF checkpoint."""
    from descentlab.data import load_encoder_classifier

    try:
        _, tokenizer = load_encoder_classifier("minilm")
    except AssetMissingError as e:
        pytest.skip(str(e))
    path = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        num_labels=2,
        pad_token_id=tokenizer.pad_token_id,
    )
    BertForSequenceClassification(config).save_pretrained(path)
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
            'selection.constrained=["alpha=0.1", "alpha=0.05 detach_prev=true"]',
        ],
    )
    res = json.loads((out / "results.json").read_text())
    assert set(res["methods"]) == {"erm", "constrained", "resilient"}
    assert res["protocol"]["seeds"] == [0, 1] and res["protocol"]["n_eval"] == 24
    assert "validation" in res["protocol"]["selection"]["constrained"]
    for block in res["methods"].values():
        assert set(block["curves"]) == {"gaussian", "uniform", "discrete"}
        for curve in block["curves"].values():
            assert curve["x"] == [0.0, 1.0, 3.0] and len(curve["mean"]) == len(curve["std"]) == 3
            assert all(0.0 <= v <= 1.0 for v in curve["mean"])
        assert set(block["layer_loss"]) == {"clean", "gaussian@1"}
        assert all(len(v) == 3 for v in block["layer_loss"].values())  # layers 0..2
        assert block["metrics"]["accuracy"] == pytest.approx(block["curves"]["gaussian"]["mean"][0])
        assert 0.0 <= block["metrics"][f"shift:{shift_csv}"] <= 1.0
    assert len(res["methods"]["constrained"]["multipliers"]) == 2
    titles = [t["title"] for t in res["tables"]]
    assert any("Selection" in t for t in titles) and any("Dataset shift" in t for t in titles)
    selection = next(t for t in res["tables"] if "Selection" in t["title"])
    assert [r[-1] for r in selection["rows"] if r[0] == "constrained"].count("yes") == 1
    # the chosen first-seed candidate is evaluated from its selection checkpoint, not trained again
    tags = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert tags == sorted(
        [
            "erm-seed0",
            "erm-seed1",
            "constrained-cand0-seed0",
            "constrained-cand1-seed0",
            "constrained-seed1",
            "resilient-cand0-seed0",
            "resilient-seed1",
        ]
    )
    report = (out / "report.md").read_text()
    assert "gaussian: accuracy vs gamma" in report and (out / "figures" / "curves.png").is_file()
    # a resumed run reuses the saved job outputs: same numbers, nothing evaluated again
    n_logged = len((out / "metrics.jsonl").read_text().splitlines())
    run_experiment("text-robustness", resume=out)
    assert json.loads((out / "results.json").read_text())["methods"] == res["methods"]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == n_logged


def test_worker_processes_give_the_same_layout(tiny_encoder_dir, tmp_path) -> None:
    out = run_experiment(
        "text-robustness",
        preset="quick",
        out=tmp_path / "runs",
        overrides=[
            f"model={tiny_encoder_dir}",
            "workers=2",
            "methods=[erm,constrained]",
            "seeds=[0,1]",
            "data.n_train=32",
            "data.n_eval=16",
            "data.max_length=24",
            "train.batch_size=16",
            "train.progress=false",
            "evaluation.kinds=[gaussian]",
            "evaluation.gammas=[0.0,2.0]",
            'selection.constrained=["", "detach_prev=true"]',
        ],
    )
    res = json.loads((out / "results.json").read_text())
    assert set(res["methods"]) == {"erm", "constrained"}
    curve = res["methods"]["constrained"]["curves"]["gaussian"]
    assert curve["x"] == [0.0, 2.0] and len(curve["per_model"]) == 2
    logged = {r.get("tag") for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}
    assert {"eval-erm-seed0", "eval-erm-seed1", "eval-constrained-seed1"} <= logged
