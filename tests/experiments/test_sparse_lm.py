"""sparse-lm end to end on a tiny model: results shape, fairness of the budget, pruning read back from disk,
figures rebuilt from the run directory, resume from the job cache."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from descentlab.errors import AssetMissingError, ConfigError

TINY = [
    "threads=1",
    "corpus_max_chars=60000",
    "bpe_vocab=320",
    "model.n_layer=2",
    "model.n_embd=32",
    "model.n_head=2",
    "model.n_positions=32",
    "train.max_steps=12",
    "train.batch_size=8",
    "train.progress=false",
    "eval_blocks=8",
    "eval_batch_size=4",
    "sparsities=[0.25,0.5,0.9]",
    "smollm2=false",
]


def _run(tmp_path, *extra: str):
    from descentlab.experiments import run_experiment

    try:
        path = run_experiment("sparse-lm", overrides=[*TINY, *extra], out=tmp_path)
    except AssetMissingError as exc:
        pytest.skip(f"no offline LM corpus: {exc}")
    return path, json.loads((path / "results.json").read_text())


@pytest.fixture(scope="module")
def seq_run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("runs"), "seeds=[0,1]")


def test_results_have_perplexity_curves_per_optimizer_and_exact_sparsity(seq_run):
    path, res = seq_run
    assert set(res["methods"]) == {"adamw", "horst", "ham"}
    for name, block in res["methods"].items():
        curve = block["curves"]["layerwise"]
        assert curve["x_name"] == "sparsity" and curve["metric"] == "perplexity"
        assert curve["x"] == [0.0, 0.25, 0.5, 0.9]
        assert len(curve["mean"]) == len(curve["std"]) == 4 and len(curve["per_seed"]) == 2
        assert all(math.isfinite(p) and p > 1 for p in curve["mean"]), name
        assert block["metrics"]["perplexity_dense"] == curve["mean"][0]
        assert 0.0 < block["metrics"]["weights_below_0.1_rms"] < 0.5
        assert math.isfinite(block["metrics"]["weight_excess_kurtosis"])
        # layer-wise pruning reaches the request up to rounding of each matrix (never more than 1 entry off)
        for s in (0.25, 0.5, 0.9):
            assert block["sparsity"][f"reached@{s:g}"] == pytest.approx(s, abs=1e-3)
        # 90 % of the block weights gone hurts a trained model more than 25 %
        assert curve["mean"][3] > curve["mean"][1]
    report = (path / "report.md").read_text()
    assert "Validation perplexity after one-shot layer-wise pruning" in report
    assert "horst vs adamw" in report and "horst vs ham" in report
    assert (path / "figures" / "perplexity-vs-sparsity.png").stat().st_size > 0
    assert (path / "figures" / "weight-histograms.png").stat().st_size > 0


def test_reported_perplexity_is_reproduced_from_the_saved_checkpoint(seq_run):
    """Rebuild the model from the run's final checkpoint, prune 50 % layer-wise and re-evaluate."""
    from descentlab.data.bpe import BPEConfig, make_tokenizer
    from descentlab.data.lm_blocks import lm_blocks
    from descentlab.experiments.sparse_lm import load_corpus
    from descentlab.models.gpt2 import build_gpt2
    from descentlab.models.lm_eval import perplexity
    from descentlab.sparsity.pruning import prune_magnitude
    from descentlab.train.checkpoint import load_latest

    path, res = seq_run
    from descentlab.config import load_config_yaml
    from descentlab.experiments.sparse_lm import SparseLMConfig

    cfg = load_config_yaml(SparseLMConfig, (path / "config.yaml").read_text())
    splits = load_corpus(cfg)
    tok = make_tokenizer("bpe", splits["train"], BPEConfig(vocab_size=cfg.bpe_vocab))
    val = lm_blocks(tok, splits["validation"], cfg.model.n_positions, max_blocks=cfg.eval_blocks)
    model = build_gpt2(cfg.model, tok.vocab_size, eos_id=tok.eos_id, seed=123)
    ckpt = load_latest(path / "checkpoints" / "horst-seed1")
    assert ckpt is not None and ckpt.step == 12
    ckpt.load_model_(model)
    dense = perplexity(model, val)
    prune_magnitude(model, 0.5, scope="layer")
    curve = res["methods"]["horst"]["curves"]["layerwise"]["per_seed"][1]
    assert dense == pytest.approx(curve[0], rel=1e-5)
    assert perplexity(model, val) == pytest.approx(curve[2], rel=1e-5)


def test_same_budget_horst_without_mirror_is_adamw_and_workers_do_not_change_results(seq_run, tmp_path):
    """HORST with alpha = beta = 0 is AdamW: with the same init, data order and schedule the curves agree.

    Run in two worker processes; the AdamW numbers must match the sequential run of the fixture.
    """
    _, res = _run(
        tmp_path,
        "seeds=[0]",
        "specs.horst0=optimizer.name=horst optimizer.alpha=0 optimizer.beta=0",
        "methods=[adamw,horst0]",
        "workers=2",
    )
    assert list(res["methods"]) == ["adamw", "horst0"]
    adamw = res["methods"]["adamw"]["curves"]["layerwise"]["mean"]
    horst0 = res["methods"]["horst0"]["curves"]["layerwise"]["mean"]
    assert horst0 == pytest.approx(adamw, rel=1e-4)
    sequential = seq_run[1]["methods"]["adamw"]["curves"]["layerwise"]["per_seed"][0]
    assert adamw == pytest.approx(sequential, rel=1e-4)


def _files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_report_rebuilds_the_same_figures_and_report(seq_run, tmp_path):
    from descentlab.cli import main

    path = tmp_path / "run"
    shutil.copytree(seq_run[0], path)
    figures, report = _files(path / "figures"), (path / "report.md").read_bytes()
    assert {"perplexity-vs-sparsity.png", "weight-histograms.png"} <= {p.name for p in figures}
    shutil.rmtree(path / "figures")
    (path / "report.md").unlink()
    assert main(["report", str(path)]) == 0
    assert _files(path / "figures") == figures
    assert (path / "report.md").read_bytes() == report


def test_resume_takes_finished_jobs_from_the_cache(seq_run, tmp_path):
    """A resumed run trains nothing that had finished: no checkpoint is rewritten, the numbers are the same."""
    from descentlab.experiments import run_experiment

    path = tmp_path / "run"
    shutil.copytree(seq_run[0], path)
    assert len(list((path / "jobs").glob("*.json"))) == 6  # 3 methods x 2 seeds
    shutil.rmtree(path / "checkpoints")  # a job that ran again would write its checkpoint back
    run_experiment("sparse-lm", resume=path)
    assert not (path / "checkpoints").exists() or not any((path / "checkpoints").iterdir())
    resumed = json.loads((path / "results.json").read_text())
    assert resumed["methods"] == seq_run[1]["methods"] and resumed["tables"] == seq_run[1]["tables"]


def test_config_errors_are_clear():
    from descentlab.config import resolve_config
    from descentlab.experiments.sparse_lm import SparseLMConfig

    with pytest.raises(ConfigError, match="bad method spec"):
        resolve_config(SparseLMConfig, overrides=["specs.sgd=optimizer.name=sgd"])
    with pytest.raises(ConfigError, match="at least one"):
        resolve_config(SparseLMConfig, overrides=["methods=[]"])
    with pytest.raises(ConfigError, match="unknown methods"):
        resolve_config(SparseLMConfig, overrides=["methods=[adamw,lion]"])
    with pytest.raises(ConfigError, match="labels"):
        resolve_config(SparseLMConfig, overrides=["specs.h@1=optimizer.name=horst"])
    with pytest.raises(ConfigError, match="sparsities"):
        resolve_config(SparseLMConfig, overrides=["sparsities=[0.5,1.0]"])
    with pytest.raises(ConfigError, match="unknown config key 'optimizers'"):
        resolve_config(SparseLMConfig, overrides=["optimizers=[adamw]"])
    methods = resolve_config(SparseLMConfig, overrides=["methods=[adamw,horst]"]).method_configs()
    assert list(methods) == ["adamw", "horst"]
    # one budget: the methods differ in the optimizer's name and mirror strength only
    assert methods["horst"].optimizer.lr == methods["adamw"].optimizer.lr
    assert methods["horst"].optimizer.decay == "matrices" and methods["horst"].optimizer.alpha == 1.0


def test_presets_resolve():
    from descentlab.config import resolve_config
    from descentlab.experiments.sparse_lm import PRESETS, SparseLMConfig

    quick = resolve_config(SparseLMConfig, preset="quick", presets=PRESETS)
    full = resolve_config(SparseLMConfig, preset="full", presets=PRESETS)
    assert quick.train.max_steps < full.train.max_steps and len(full.seeds) >= 3
    names = [m.optimizer.name for m in full.method_configs().values()]
    assert {"adamw", "ham"} <= set(names) and names.count("horst") == 2
    assert full.method_configs()["horst-alpha10"].optimizer.alpha == 10.0
