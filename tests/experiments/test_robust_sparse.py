"""robust-sparse end to end on a small BERT (saved with MiniLM's tokenizer) and real Rotten Tomatoes reviews.

The experiment's numbers are checked against an independent evaluation: the trained weights are read back
from the run's final checkpoint, pruned with ``prune_magnitude`` and scored by a plain loop. A finished run
rebuilds its report and figures from results.json, and a resumed run takes its jobs from the job cache.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from descentlab.cli import main as cli_main
from descentlab.errors import AssetMissingError, ConfigError
from descentlab.evaluation import RobustnessCurves
from descentlab.experiments import run_experiment
from descentlab.experiments.robust_sparse.claims import CORRECT, clean_cells, robust_cells
from descentlab.experiments.robust_sparse.config import RobustSparseConfig
from descentlab.experiments.robust_sparse.jobs import JobResult, SweepPoint, decode_job, encode_job
from descentlab.experiments.robust_sparse.report import erm_baselines
from descentlab.report.claims import NOT_IN_RUN, ONE_SEED
from descentlab.study.cells import CellStore
from tiny_models import tiny_bert

OVERRIDES = [
    "data.n_train=64",
    "data.n_eval=48",
    "data.max_length=32",
    "data.eval_batch_size=16",
    "seeds=[0]",
    "method.optimizer.lr=1e-3",
    "train.max_steps=6",
    "train.batch_size=16",
    "train.progress=false",
    "evaluation.gammas=[0.0,1.0,3.0]",
    "evaluation.draws=2",
    "pruning.sparsities=[0.0,0.6]",
]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoTokenizer

    from descentlab.data import asset_path

    try:
        source = asset_path("minilm")
    except AssetMissingError as exc:
        pytest.skip(str(exc))
    folder = tmp_path_factory.mktemp("tiny-bert")
    tiny_bert(layers=3, vocab=30522).save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(source), local_files_only=True).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    methods = "methods=[erm-horst,constrained-horst,erm-adamw,erm-noise-horst]"
    return run_experiment(
        "robust-sparse",
        overrides=[f"model={tiny_model_dir}", methods, *OVERRIDES],
        out=tmp_path_factory.mktemp("runs"),
    )


def _accuracy_after_pruning(run_dir: Path, tag: str, model_dir: Path, sparsity: float) -> tuple[float, float]:
    """Independent check: checkpoint weights -> prune_magnitude -> plain batched accuracy on the test split."""
    from safetensors.torch import load_model
    from transformers import AutoTokenizer

    from descentlab.data import load_encoder_classifier, load_text_classification
    from descentlab.sparsity import prune_magnitude

    (ckpt,) = sorted((run_dir / "checkpoints" / tag).glob("step-*"))[-1:]
    model, _ = load_encoder_classifier(str(model_dir), num_labels=2, pooling="mean")
    model.eval()
    load_model(model, str(ckpt / "model.safetensors"))
    reached = prune_magnitude(model, sparsity, scope="layer").global_sparsity
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    test = load_text_classification("rotten_tomatoes", max_train=64, max_eval=48)["test"]
    correct = 0
    with torch.no_grad():
        for text, label in zip(test["text"], test["label"], strict=True):
            enc = tokenizer(text, truncation=True, max_length=32, return_tensors="pt")
            correct += int(model(**enc).logits.argmax(-1).item() == label)
    return correct / len(test), reached


def test_robust_sparse_runs_and_matches_an_independent_evaluation(finished_run, tiny_model_dir) -> None:
    run_dir = finished_run
    results = json.loads((run_dir / "results.json").read_text())
    assert list(results["methods"]) == ["erm-horst", "constrained-horst", "erm-adamw", "erm-noise-horst"]
    assert results["protocol"]["n_eval"] == 48
    assert (run_dir / "report.md").is_file()
    assert (run_dir / "figures" / "accuracy_vs_gamma_by_sparsity.png").is_file()
    for method, block in results["methods"].items():
        # layer-wise pruning zeroes round(0.6 n) entries of every block Linear: 14742 of 24576 here
        assert block["sparsity"]["reached@s=0"] < 0.01
        assert block["sparsity"]["reached@s=0.6"] == 14742 / 24576
        curve = block["curves"]["gaussian@s=0.6"]
        assert curve["x"] == [0.0, 1.0, 3.0] and len(curve["mean"]) == 3
        assert len(block["layer_loss"]["clean@s=0"]) == 4
        for s in (0.0, 0.6):
            expected, reached = _accuracy_after_pruning(run_dir, f"{method}-seed0", tiny_model_dir, s)
            assert block["metrics"][f"accuracy@s={s:g}"] == pytest.approx(expected, abs=1e-9)
            assert block["sparsity"][f"reached@s={s:g}"] == reached
    lam = results["methods"]["constrained-horst"]["multipliers"]
    assert len(lam) == 3 and max(lam) > 0
    assert "multipliers" not in results["methods"]["erm-horst"]
    paired = [t for t in results["tables"] if t["title"].startswith("Accuracy difference to ERM")]
    assert paired and [r[0] for r in paired[0]["rows"]] == ["constrained-horst − erm-horst"] * 2
    m = results["methods"]
    for row in paired[0]["rows"]:  # mean [CI] per γ; the mean is the difference of the two curves' means
        a, b = (
            m["constrained-horst"]["curves"][f"gaussian@s={row[1]}"],
            m["erm-horst"]["curves"][f"gaussian@s={row[1]}"],
        )
        for cell, ma, mb in zip(row[2:], a["mean"], b["mean"], strict=True):
            mean, low, high = (
                float(x) for x in cell.replace("[", "").replace(",", "").replace("]", "").split()
            )
            assert mean == pytest.approx(ma - mb, abs=1e-4) and low <= mean <= high


def test_claims_are_recomputed_from_the_saved_per_review_correctness(finished_run) -> None:
    results = json.loads((finished_run / "results.json").read_text())
    store = CellStore.load(finished_run)  # the design record and arrays/cells.npz
    assert store.design.arms == ("erm-horst", "constrained-horst", "erm-adamw", "erm-noise-horst")
    assert (
        store.design.conditions == ("0", "0.6") and store.design.seeds == (0,) and store.design.examples == 48
    )
    gammas = store.design.extra["gammas"]
    assert gammas == [0.0, 1.0, 3.0]
    m = results["methods"]
    for label, block in m.items():
        for s in (0.0, 0.6):
            cells = store.get(CORRECT, label, s)
            assert cells.shape == (1, 2, 3, 48) and set(np.unique(cells)) <= {0, 1}
            # the per-review values average to the reported curve, per γ (clean draws coincide)
            curve = block["curves"][f"gaussian@s={s:g}"]["mean"]
            assert np.allclose(cells.mean(axis=(0, 1, 3)), curve, atol=1e-12)
            assert np.array_equal(cells[:, 0, 0], cells[:, 1, 0])
    claims = {(c["name"], c["at"]): c for c in results["claims"]}
    # every declared claim has a row; constrained-adamw was not in the design, so robust-adamw is left to a
    # run that trains it
    assert {k[0] for k in claims} == {
        "robust-sparsest",
        "robust",
        "robust-adamw",
        "robust-and-sparse",
        "prunable",
        "control-noise",
        "control-pruning",
    }
    assert claims["robust-adamw", ""]["verdict"] == NOT_IN_RUN
    assert ("prunable", "sparsity 0") not in claims and ("control-pruning", "sparsity 0.6") in claims
    # the primary endpoint is at the highest sparsity, re-computed from the saved per-review correctness
    c = claims["robust-sparsest", "sparsity 0.6"]
    assert c["role"] == "primary" and (c["method"], c["reference"]) == ("constrained-horst", "erm-horst")
    a = robust_cells(store.get(CORRECT, "constrained-horst", 0.6), gammas)
    b = robust_cells(store.get(CORRECT, "erm-horst", 0.6), gammas)
    assert c["estimate"] == pytest.approx(float((a - b).mean()), abs=1e-12)
    assert c["a_mean"] == pytest.approx(a.mean()) and (c["seeds"], c["examples"]) == (1, 48)
    assert c["verdict"] == ONE_SEED  # one training seed: no verdict is drawn from examples alone
    damage = {
        k: clean_cells(store.get(CORRECT, k, 0.6)) - clean_cells(store.get(CORRECT, k, 0))
        for k in ("erm-horst", "erm-adamw")
    }
    assert claims["prunable", "sparsity 0.6"]["estimate"] == pytest.approx(
        float((damage["erm-horst"] - damage["erm-adamw"]).mean()), abs=1e-12
    )
    # the engine renders the claims: the run does not also put them in its tables or notes
    assert not any(t["title"].startswith("Claims") for t in results["tables"])
    report = (finished_run / "report.md").read_text()
    assert "**Primary endpoint.** primary robust-sparsest at sparsity 0.6" in report


def test_report_command_restores_the_report_and_figures(finished_run, tmp_path) -> None:
    run_dir = shutil.copytree(finished_run, tmp_path / "run")
    before = {p.relative_to(run_dir): p.read_bytes() for p in (run_dir / "figures").iterdir()}
    report = (run_dir / "report.md").read_text()
    assert Path("figures/accuracy_vs_gamma_by_sparsity.png") in before
    shutil.rmtree(run_dir / "figures")
    (run_dir / "report.md").unlink()
    assert cli_main(["report", str(run_dir)]) == 0
    after = {p.relative_to(run_dir): p.read_bytes() for p in (run_dir / "figures").iterdir()}
    assert after == before
    assert (run_dir / "report.md").read_text() == report
    assert "figures/accuracy_vs_gamma_by_sparsity.png" in report


def test_resume_takes_finished_jobs_from_the_cache_and_fits_from_checkpoints(finished_run, tmp_path) -> None:
    run_dir = shutil.copytree(finished_run, tmp_path / "run")
    results = json.loads((run_dir / "results.json").read_text())
    # one job's result is lost (interrupted before it was cached): its fit resumes from the final checkpoint
    (run_dir / "jobs" / "constrained-horst-seed0.json").unlink()
    lines = (run_dir / "metrics.jsonl").read_text().count("\n")
    run_experiment("robust-sparse", resume=run_dir)
    again = json.loads((run_dir / "results.json").read_text())
    assert again["methods"] == results["methods"]
    assert (run_dir / "jobs" / "constrained-horst-seed0.json").is_file()
    new = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()[lines:]]
    assert not any("loss" in x for x in new)  # no training step was taken again
    assert {x["tag"] for x in new if "tag" in x} == {"eval-constrained-horst-seed0"}


def test_robust_sparse_with_acdc_trains_sparse(tmp_path, tiny_model_dir) -> None:
    overrides = [
        f"model={tiny_model_dir}",
        "methods=[constrained-horst]",
        *OVERRIDES,
        "method.acdc={sparsity: 0.5}",
    ]
    results = json.loads(
        (run_experiment("robust-sparse", overrides=overrides, out=tmp_path) / "results.json").read_text()
    )
    block = results["methods"]["constrained-horst"]["sparsity"]
    # AC/DC ends in a compressed phase (global magnitude at 50 %); pruning to 60 % goes further
    assert block["reached@s=0"] == pytest.approx(0.5, abs=1e-4)
    assert block["reached@s=0.6"] == pytest.approx(0.6, abs=2e-3)
    assert results["protocol"]["acdc"]["constrained-horst"]["sparsity"] == 0.5


def test_methods_are_specs_of_one_base() -> None:
    cfg = RobustSparseConfig()
    methods = cfg.method_configs()
    assert list(methods) == [
        "erm-horst",
        "constrained-horst",
        "erm-adamw",
        "constrained-adamw",
        "erm-noise-horst",
    ]
    assert [m.optimizer.name for m in methods.values()] == ["horst", "horst", "adamw", "adamw", "horst"]
    assert [m.objective for m in methods.values()] == ["erm", "constrained", "erm", "constrained", "erm"]
    assert methods["erm-horst"].optimizer.alpha == 3.0 and methods["erm-adamw"].optimizer.alpha is None
    # the constraint cannot be gamed (METHODS.md 4.1): no negative loss weights, layer 1 free, no λ ceiling
    con = methods["constrained-horst"].constraint
    assert con.detach_prev and not con.constrain_first and con.alpha == 0.03
    assert all(m.constraint.max_multiplier is None for m in methods.values())
    assert cfg.pooling == "mean" and cfg.train_noise == {"erm-noise-horst": 1.0}
    assert erm_baselines(methods) == [("constrained-horst", "erm-horst"), ("constrained-adamw", "erm-adamw")]
    resilient = RobustSparseConfig(methods=["resilient-horst"]).method_configs()["resilient-horst"]
    assert resilient.constraint.resilient and resilient.objective == "constrained"


def test_job_results_survive_the_cache_exactly() -> None:
    values = {"gaussian": np.random.default_rng(0).random((1, 2, 3))}
    curve = RobustnessCurves("accuracy", (0.0, 1.0, 3.0), values, {"n_eval": 48})
    job = JobResult([SweepPoint(0.6, 14742 / 24576, curve, [0.7, 0.1 + 0.2])], [1 / 3, 2.0])
    back = decode_job(json.loads(json.dumps(encode_job(job))))
    assert back.multipliers == job.multipliers
    (point,) = back.points
    assert (point.requested, point.reached, point.profile) == (0.6, 14742 / 24576, [0.7, 0.1 + 0.2])
    assert np.array_equal(point.curve.values["gaussian"], values["gaussian"])


@pytest.mark.parametrize(
    "override",
    [
        ["methods=[erm-sgd]"],
        ["pruning.sparsities=[1.0]"],
        ["pruning.scope=nm"],
        ["evaluation.gammas=[1.0]"],
        ["specs.bad=optimizer.name=sgd", "methods=[bad]"],
        ["workers=0"],
        ["pooling=max"],
        ["pruning.sparsities=[0.5,0.7]"],
        ["evaluation.gammas=[0.0,0.5]"],
        ["train_noise={erm-noise-horst: 0.0}"],
        ["evaluation.gammas=[0.5,1.0]"],
    ],
)
def test_robust_sparse_rejects_bad_config_before_making_a_run_dir(tmp_path, override) -> None:
    with pytest.raises(ConfigError):
        run_experiment("robust-sparse", overrides=override, out=tmp_path)
    assert not any(tmp_path.iterdir())


def test_the_protocol_states_the_config_s_alpha_constraint_and_pruning_scope() -> None:
    from types import SimpleNamespace

    from descentlab.config import resolve_config
    from descentlab.experiments.robust_sparse.run import protocol

    curve = SimpleNamespace(protocol={"n_eval": 48})
    outcome = {"erm-horst": [SimpleNamespace(points=[SimpleNamespace(curve=curve)])]}
    data = SimpleNamespace(train=[0] * 64)

    def stated(*overrides: str) -> dict:
        cfg = resolve_config(RobustSparseConfig, overrides=["methods=[erm-horst]", *overrides])
        return protocol(cfg, data, outcome)

    default = stated()
    assert "alpha = 3 fixed before the run (sparse-lm's validation choice)" in default["constraint_selection"]
    assert default["constraint_selection"].startswith("text-robustness's constraint")
    assert "one threshold per matrix" in default["pruning"]
    changed = stated("method.optimizer.alpha=10", "method.constraint.alpha=0.1", "pruning.scope=global")
    assert "alpha = 10 fixed before the run; " in changed["constraint_selection"]
    assert changed["constraint_selection"].startswith("the config's constraint")
    assert "one threshold over all of them" in changed["pruning"]
