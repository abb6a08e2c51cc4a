"""sparse-lm end to end on a tiny model: tuning on validation only, claims re-judged from the saved per-block
test NLLs, pruning read back from the checkpoint, figures rebuilt from the run directory, resume from the cache."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

from descentlab.errors import AssetMissingError, ConfigError
from descentlab.report.claims import ONE_SEED, UNDERPOWERED

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
    "test_blocks=10",
    "eval_batch_size=4",
    "sparsities=[0.5,0.9]",
    "smollm2=false",
]
TUNE_SEED = 1000  # the config's default tuning seed, never an evaluation seed
TUNED_COMMON = ["seeds=[0,1]", "tune=true", "tune_lr=[1e-3,3e-3]", "tune_alpha.horst=[1.0,10.0]"]
# the joint grid with equal budgets: 2 lrs x (AdamW: 2 weight decays; HORST, HAM: 2 alphas)
TUNED = [*TUNED_COMMON, "lr_from=null", "tune_alpha.ham=[50.0,200.0]", "tune_weight_decay.adamw=[0.1,0.5]"]


def _run(tmp_path, *extra: str):
    from descentlab.experiments import run_experiment

    try:
        path = run_experiment("sparse-lm", overrides=[*TINY, *extra], out=tmp_path)
    except AssetMissingError as exc:
        pytest.skip(f"no offline LM corpus: {exc}")
    return path, json.loads((path / "results.json").read_text())


@pytest.fixture(scope="module")
def seq_run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("runs"), *TUNED)


def _claim(res, name):
    (row,) = [c for c in res["claims"] if c["name"] == name]
    return row


def test_results_have_test_curves_with_cis_and_exact_sparsity(seq_run):
    path, res = seq_run
    assert set(res["methods"]) == {"adamw", "horst", "ham"}
    assert res["protocol"]["n_test_blocks"] == 10 and res["protocol"]["split"].startswith("test")
    for name, block in res["methods"].items():
        curve = block["curves"]["layerwise"]
        assert curve["x"] == [0.0, 0.5, 0.9] and len(curve["per_seed"]) == 2
        for lo, m, hi in zip(curve["ci_low"], curve["mean"], curve["ci_high"], strict=True):
            assert math.isfinite(m) and lo < m < hi, name
        assert block["metrics"]["test_perplexity_dense"] == curve["mean"][0]
        for s in (0.5, 0.9):  # layer-wise pruning reaches the request up to rounding of each matrix
            assert block["sparsity"][f"reached@{s:g}"] == pytest.approx(s, abs=1e-3)
    report = (path / "report.md").read_text()
    assert "Claims:" in report and "Seed-spread check" in report and "**Primary endpoint.**" in report
    assert (path / "figures" / "perplexity-vs-sparsity.png").stat().st_size > 0
    assert (path / "figures" / "weight-histograms.png").stat().st_size > 0
    # every trained run records its NaN guard's count; none of these needed it, so no note names one
    jobs = [json.loads(f.read_text()) for f in (path / "jobs").glob("*.json")]
    assert jobs and all(j["nan_reverted"] == 0 for j in jobs if "x" in j)
    assert not any("NaN guard" in n for n in res["notes"])


def test_runs_whose_nan_guard_reverted_updates_are_named_in_the_notes():
    from descentlab.experiments.sparse_lm.report import nan_guard_notes

    final = {
        "adamw": [{"seed": 0, "nan_reverted": 0}, {"seed": 1, "nan_reverted": 0}],
        "horst-a30": [{"seed": 0, "nan_reverted": 0}, {"seed": 1, "nan_reverted": 1063680}],
    }
    (note,) = nan_guard_notes(final)
    assert note.startswith("horst-a30: the NaN guard reverted") and "1 of 2 runs" in note
    assert "seeds 1 (1,063,680) elements" in note
    assert nan_guard_notes({"adamw": [{"seed": 0}]}) == []  # runs saved before the count existed


def test_claims_are_judged_from_the_saved_per_block_test_nlls(seq_run):
    """The claims come from the cell store (the per-block test NLLs of ``arrays/nll-*.npz``): redo the cells
    by hand and compare."""
    from descentlab.experiments.sparse_lm.claims import grid_slope
    from descentlab.io import load_arrays
    from descentlab.report.stats import paired_interval
    from descentlab.study.cells import CellStore

    path, res = seq_run
    cells = {
        k: np.stack([load_arrays(path / f)["test"] for f in files])
        for k, files in res["arrays"]["nll"].items()
    }
    assert cells["horst"].shape == (2, 3, 10)  # seeds x levels x test blocks
    h, a = cells["horst"], cells["adamw"]
    row = _claim(res, "horst-adamw")
    assert row["role"] == "primary" and row["at"] == "sparsity 90 %"
    iv = paired_interval(h[:, 2], a[:, 2])
    assert row["estimate"] == pytest.approx(float((h[:, 2] - a[:, 2]).mean()), abs=1e-12)
    assert [row["low"], row["high"]] == pytest.approx([iv.low, iv.high], abs=1e-12)
    assert row["seeds"] == 2 and row["examples"] == 10
    assert row["verdict"] in ("reproduced", "refuted", "inconclusive", UNDERPOWERED)
    gap = _claim(res, "gap-widens")
    assert gap["estimate"] == pytest.approx(
        float(((h[:, 2] - a[:, 2]) - (h[:, 1] - a[:, 1])).mean()), abs=1e-12
    )
    control = _claim(res, "control")
    assert control["estimate"] == pytest.approx(float((a[:, 2] - a[:, 1]).mean()), abs=1e-12)
    not_pruned = _claim(res, "horst-adamw-80")  # 80 % was not a level here: no re-run of this config helps
    assert not_pruned["verdict"] == "not in this run" and "measured no condition 0.8" in not_pruned["reason"]
    # the per-level means the jobs report are the block means of the same arrays
    curve = res["methods"]["adamw"]["curves"]["layerwise"]
    assert curve["per_seed"][1] == pytest.approx(np.exp(a[1].mean(1)).tolist(), rel=1e-12)
    # matched-ols: the slope of the 90 % validation NLL on the dense one over the tuning runs (seed 0)
    runs = res["runs"]
    assert len(runs) == 18  # 3 methods x 4 candidates on the tuning seed + 3 methods x 2 evaluation seeds
    assert res["protocol"]["candidates"] == {"adamw": 4, "horst": 4, "ham": 4}
    grid = [r for r in runs if r["seed"] == TUNE_SEED]
    assert len(grid) == 12 and {r["seed"] for r in runs} == {0, 1, TUNE_SEED}
    k = grid_slope(np.asarray([r["val_nll"] for r in grid]), np.asarray([r["label"] for r in grid]), 2)
    ols = _claim(res, "matched-ols")
    adjusted = (h[:, 2] - k * h[:, 0]) - (a[:, 2] - k * a[:, 0])
    assert ols["estimate"] == pytest.approx(float(adjusted.mean()), abs=1e-10) and f"k = {k:.3g}" in ols["at"]
    # the cell store holds the same cells under the design record; the weight shape per block matrix
    store = CellStore.load(path)
    assert store.design.arms == ("adamw", "horst", "ham") and store.design.conditions == ("0", "0.5", "0.9")
    assert (
        store.design.seeds == (0, 1)
        and store.design.examples == 10
        and len(store.design.extra["grid"]["label"]) == 12
    )
    assert np.array_equal(store.get("nll", "horst", 0.9), h[:, 2])
    shape = {k: store[k] for k in store if k.startswith(("kurtosis/", "frac_below/"))}
    assert shape["kurtosis/horst"].shape == (2, 8)  # 2 seeds x 8 block matrices (2 layers x 4)
    peaked = _claim(res, "horst-peaked")
    assert peaked["estimate"] == pytest.approx(
        float((shape["frac_below/horst"] - shape["frac_below/adamw"]).mean())
    )
    (spread,) = [c for c in res["checks"] if c["method"] == "horst"]
    chosen = res["protocol"]["alpha"]["horst"]
    ppl = [
        math.exp(r["val_nll"][0])
        for r in runs
        if r["label"] == "horst" and r["alpha"] == chosen and r["seed"] != TUNE_SEED
    ]
    assert spread["spread"] == pytest.approx((max(ppl) - min(ppl)) / np.mean(ppl), rel=1e-12)


def test_tune_on_dense_picks_the_best_dense_validation_model(tmp_path):
    from descentlab.experiments.sparse_lm.jobs import tune_score

    assert tune_score([3.0, 4.0, 6.0], [0.0, 0.5, 0.9], None) == 5.0  # mean over the pruned levels
    assert tune_score([3.0, 4.0, 6.0], [0.0, 0.5, 0.9], 0.0) == 3.0
    assert tune_score([3.0, 4.0, 6.0], [0.0, 0.5, 0.9], 0.9) == 6.0
    _, res = _run(tmp_path, *TUNED, "tune_on=0")
    dense = {
        (r["label"], r["lr"], r["alpha"], r["weight_decay"]): r["val_nll"][0]
        for r in res["runs"]
        if r["seed"] == TUNE_SEED
    }
    for label, sel in res["selection"].items():
        for g in sel["grid"]:  # every candidate was scored by its dense validation log-ppl
            key = (label, g["lr"], g["alpha"], g.get("weight_decay", 0.1))
            assert g["val"] == pytest.approx(math.exp(dense[key]), rel=1e-9)
        assert sel["chosen"]["val"] == min(g["val"] for g in sel["grid"]), label
    assert "at 0 % sparsity" in res["protocol"]["tuning"]


def test_choose_only_lets_near_best_dense_models_compete():
    from descentlab.experiments.sparse_lm.run import choose

    jobs = [  # val_nll[0]: dense validation log-ppl; tune_score: the criterion at a pruned level
        {"val_nll": [3.00, 5.0], "tune_score": 5.0},
        {"val_nll": [3.02, 4.5], "tune_score": 4.5},  # 2.0 % worse dense
        {"val_nll": [3.20, 3.5], "tune_score": 3.5},  # 22 % worse dense, most prunable
    ]
    assert choose("horst", jobs) == 2
    assert choose("horst", jobs, dense_within=0.03) == 1
    assert choose("horst", jobs, dense_within=0.01) == 0
    assert choose("horst", jobs, dense_within=0.3) == 2


def test_tune_dense_within_picks_among_near_best_dense_models(tmp_path):
    """lr_first: each method's lr at its own alpha, then its alpha at that lr; the choice is the best of all
    it ran among the candidates within 0.5 % of the best dense validation perplexity."""
    from descentlab.experiments.sparse_lm.run import choose

    _, res = _run(
        tmp_path, *TUNED_COMMON, "lr_from=null", "lr_first=true", "tune_on=0.9", "tune_dense_within=0.005"
    )
    horst = [r for r in res["runs"] if r["label"] == "horst" and r["seed"] == TUNE_SEED]
    stage1 = [r for r in horst if r["alpha"] == 10.0 and r["lr"] in (1e-3, 3e-3)]  # the spec's alpha
    lr1 = stage1[choose("horst", stage1, 0.005)]["lr"]
    expected = {(1e-3, 10.0), (3e-3, 10.0), (lr1, 1.0)}
    assert {(g["lr"], g["alpha"]) for g in res["selection"]["horst"]["grid"]} == expected
    assert {(r["lr"], r["alpha"]) for r in horst} == expected  # one job each: the repeat is the same job
    (grid_table,) = [t for t in res["tables"] if t["title"].startswith("Validation grid")]
    assert "within 0.5 % of the grid's best dense ppl" in grid_table["title"]
    runs = {(r["label"], r["lr"], r["alpha"]): r for r in res["runs"] if r["seed"] == TUNE_SEED}
    for label, sel in res["selection"].items():
        cands = [runs[label, g["lr"], g["alpha"]] for g in sel["grid"]]
        best = min(r["val_nll"][0] for r in cands)
        ok = [r for r in cands if r["val_nll"][0] <= best + math.log1p(0.005)]
        chosen = runs[label, sel["chosen"]["lr"], sel["chosen"]["alpha"]]
        assert chosen in ok and chosen["tune_score"] == min(r["tune_score"] for r in ok), label
        assert chosen["tune_score"] == pytest.approx(chosen["val_nll"][2])  # the 90 % level's log-ppl
    eligible = [row[6] for row in grid_table["rows"]]
    assert (
        "yes" in eligible
        and "no (dense)" in eligible
        and len(eligible) == sum(len(s["grid"]) for s in res["selection"].values())
    )


def test_tuning_never_reads_the_test_novel(seq_run, tmp_path, monkeypatch):
    """A different test novel changes every test number and no choice: the grid reads validation only."""
    import descentlab.experiments.sparse_lm.jobs as slm

    _, res = seq_run
    for label, sel in res["selection"].items():  # the pick is the best validation criterion of the grid
        assert sel["chosen"]["val"] == min(g["val"] for g in sel["grid"]), label
    real = slm.load_corpus
    monkeypatch.setattr(slm, "load_corpus", lambda cfg: {**real(cfg), "test": real(cfg)["validation"][::-1]})
    _, other = _run(tmp_path, *TUNED)
    assert other["selection"] == res["selection"] and other["protocol"]["lr"] == res["protocol"]["lr"]
    before = res["methods"]["horst"]["curves"]["layerwise"]["per_seed"]
    after = other["methods"]["horst"]["curves"]["layerwise"]["per_seed"]
    assert all(x != pytest.approx(y, rel=1e-6) for x, y in zip(before[0], after[0], strict=True))


def test_a_diverged_grid_candidate_loses_the_grid_without_stopping_the_run(tmp_path, monkeypatch):
    import descentlab.experiments.sparse_lm.jobs as jobs
    from descentlab.errors import NumericalError

    real = jobs.fit

    def fit(model, data, *, tag, **kw):
        if "-a10-" in tag:
            raise NumericalError("loss is not finite")
        return real(model, data, tag=tag, **kw)

    monkeypatch.setattr(jobs, "fit", fit)
    _, res = _run(tmp_path, *TUNED)
    horst = res["selection"]["horst"]
    assert horst["chosen"]["alpha"] == 1.0 and max(g["val"] for g in horst["grid"]) > 1e300
    assert all(r["alpha"] != 10.0 for r in res["runs"])  # the slope's sample holds the runs that trained


def test_reported_nlls_are_reproduced_from_the_saved_checkpoint(seq_run):
    """Rebuild horst seed 1 from its final checkpoint, prune 90 % layer-wise and score the same test blocks."""
    from descentlab.config import load_config_yaml
    from descentlab.data.bpe import BPEConfig, make_tokenizer
    from descentlab.data.lm_blocks import lm_blocks
    from descentlab.experiments.sparse_lm.config import SparseLMConfig
    from descentlab.experiments.sparse_lm.jobs import evenly_spaced, load_corpus
    from descentlab.io import load_arrays
    from descentlab.models.gpt2 import build_gpt2
    from descentlab.models.perplexity import block_nlls
    from descentlab.sparsity.pruning import prune_magnitude
    from descentlab.train.checkpoint import load_latest

    path, res = seq_run
    cfg = load_config_yaml(SparseLMConfig, (path / "config.yaml").read_text())
    splits = load_corpus(cfg)
    tok = make_tokenizer("bpe", splits["train"], BPEConfig(vocab_size=cfg.bpe_vocab))
    test = evenly_spaced(lm_blocks(tok, splits["test"], cfg.model.n_positions).blocks, cfg.test_blocks)
    model = build_gpt2(cfg.model, tok.vocab_size, eos_id=tok.eos_id, seed=123)
    (tag,) = [r["tag"] for r in res["runs"] if r["label"] == "horst" and r["seed"] == 1]
    ckpt = load_latest(path / "checkpoints" / tag)
    assert ckpt is not None and ckpt.step == 12
    ckpt.load_model_(model)
    saved = load_arrays(path / res["arrays"]["nll"]["horst"][1])["test"]
    assert block_nlls(model, test).numpy() == pytest.approx(saved[0], rel=1e-6)
    prune_magnitude(model, 0.9, scope="layer")
    assert block_nlls(model, test).numpy() == pytest.approx(saved[2], rel=1e-6)


def test_horst_without_mirror_is_adamw_and_workers_do_not_change_results(seq_run, tmp_path):
    """HORST with alpha = beta = 0 is AdamW: same init, data order and schedule give the same curves.

    Run untuned in two worker processes on the tuning seed; AdamW's numbers must match the tuned run's grid
    candidate at the same settings (lr 3e-3, weight decay 0.1).
    """
    _, res = _run(
        tmp_path,
        f"seeds=[{TUNE_SEED}]",
        "specs.horst0=optimizer.name=horst optimizer.alpha=0 optimizer.beta=0",
        "methods=[adamw,horst0]",
        "workers=2",
    )
    assert list(res["methods"]) == ["adamw", "horst0"]
    adamw = res["methods"]["adamw"]["curves"]["layerwise"]["per_seed"][0]
    assert res["methods"]["horst0"]["curves"]["layerwise"]["per_seed"][0] == pytest.approx(adamw, rel=1e-4)
    (grid,) = [
        r
        for r in seq_run[1]["runs"]
        if (r["label"], r["lr"], r["weight_decay"], r["seed"]) == ("adamw", 3e-3, 0.1, TUNE_SEED)
    ]
    assert adamw == pytest.approx([math.exp(v) for v in grid["test_nll"]], rel=1e-4)
    # no "horst" among the methods: its claims are not in this run; the AdamW-only control has one seed
    assert _claim(res, "horst-adamw")["verdict"] == _claim(res, "matched-ols")["verdict"] == "not in this run"
    assert "no horst arm (it trained adamw, horst0)" in _claim(res, "horst-adamw")["reason"]
    assert _claim(res, "control")["verdict"] == ONE_SEED
    assert [c["verdict"] for c in res["checks"]] == ["untested (one seed)"] * 2


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
    assert len(list((path / "jobs").glob("*.json"))) == 18
    shutil.rmtree(path / "checkpoints")  # a job that ran again would write its checkpoint back
    run_experiment("sparse-lm", resume=path)
    assert not (path / "checkpoints").exists() or not any((path / "checkpoints").iterdir())
    resumed = json.loads((path / "results.json").read_text())
    assert resumed["methods"] == seq_run[1]["methods"] and resumed["claims"] == seq_run[1]["claims"]


def test_config_errors_are_clear():
    from descentlab.config import resolve_config
    from descentlab.experiments.sparse_lm.config import SparseLMConfig

    cases = {
        "bad method spec": ["specs.sgd=optimizer.name=sgd"],
        "at least one": ["methods=[]"],
        "methods names unknown methods": ["methods=[adamw,lion]"],
        "tune_alpha names unknown": ["tune_alpha.lion=[1.0]"],
        "labels": ["specs.h@1=optimizer.name=horst"],
        "sparsities must lie": ["sparsities=[0.5,1.0]"],
        "claim_high=0.9 is not in sparsities": ["sparsities=[0.5,0.8]"],
        "claim_low=0.7 must be below": ["claim_low=0.7", "claim_high=0.6"],
        "test_blocks": ["test_blocks=0"],
        "lr_from='ham' must be one of methods": ["tune=true", "lr_from=ham", "methods=[adamw,horst]"],
        "seed_spread": ["seed_spread=3"],
        "tune_on=0.65 must be 0": ["tune_on=0.65"],
        "lr_first=true tunes every method's own lr": ["lr_first=true"],
        "tune_dense_within=0.0 must be > 0": ["tune_dense_within=0"],
        "tune_seed=1 is also an evaluation seed": ["tune=true", "tune_seed=1", "seeds=[0,1]"],
        "unequal tuning budgets": ["tune=true", "lr_from=null", "tune_alpha.ham=[200.0]"],
        "tune_weight_decay is for the joint grid": ["tune_weight_decay.adamw=[0.1]", "lr_from=adamw"],
        "tune_lr_by names unknown methods": ["tune_lr_by.lion=[1e-3]"],
        "tune_lr_by must list positive": ["tune_lr_by.adamw=[0.0]"],
        "unknown config key 'optimizers'": ["optimizers=[adamw]"],
    }
    for message, overrides in cases.items():
        with pytest.raises(ConfigError, match=message):
            resolve_config(SparseLMConfig, overrides=overrides)
    methods = resolve_config(SparseLMConfig, overrides=["methods=[adamw,horst,adamw-l2]"]).method_configs()
    assert list(methods) == ["adamw", "horst", "adamw-l2"]
    # one budget: the methods differ in the optimizer's name, mirror strength and (l2) weight decay only
    assert methods["horst"].optimizer.lr == methods["adamw"].optimizer.lr
    assert methods["horst"].optimizer.decay == "matrices" and methods["horst"].optimizer.alpha == 10.0
    assert methods["adamw-l2"].optimizer.weight_decay > methods["adamw"].optimizer.weight_decay


def test_presets_resolve():
    from descentlab.config import resolve_config
    from descentlab.experiments.sparse_lm.config import PRESETS, SparseLMConfig

    quick = resolve_config(SparseLMConfig, preset="quick", presets=PRESETS)
    full = resolve_config(SparseLMConfig, preset="full", presets=PRESETS)
    pilot = resolve_config(SparseLMConfig, preset="pilot", presets=PRESETS)
    assert quick.train.max_steps < full.train.max_steps and full.tune and len(full.seeds) >= 8
    # the protocol: a tuning seed of its own, equal budgets (the joint grid), pilot seeds apart from both
    assert full.tune_seed not in full.seeds and full.lr_from is None and not full.lr_first
    assert set(full.candidate_counts().values()) == {4}
    assert not set(pilot.seeds) & {*full.seeds, full.tune_seed} and not pilot.tune
    assert pilot.model == full.model and pilot.train == full.train
    assert full.tune_on == full.claim_high and full.tune_dense_within == full.seed_spread
    assert {0.5, 0.9} <= set(full.sparsities) and full.test_blocks >= 256
    assert [m.optimizer.name for m in full.method_configs().values()] == ["adamw", "horst", "ham"]


def test_the_large_alpha_run_repeats_the_full_runs_choices_on_fresh_seeds():
    # full-a30: no tuning, AdamW and HORST at what the committed full run chose on its tuning seed, HORST
    # at alpha 30 beside them, on seeds no other run used; everything else is the full preset's
    import json
    from pathlib import Path

    from descentlab.config import resolve_config
    from descentlab.experiments.sparse_lm.claims import LARGE_ALPHA
    from descentlab.experiments.sparse_lm.config import PRESETS, SparseLMConfig

    full = resolve_config(SparseLMConfig, preset="full", presets=PRESETS)
    a30 = resolve_config(SparseLMConfig, preset="full-a30", presets=PRESETS)
    assert not a30.tune and a30.methods == ["adamw", "horst", LARGE_ALPHA]
    assert not set(a30.seeds) & {*full.seeds, full.tune_seed, 900, 901, 902} and len(a30.seeds) == 8
    assert (a30.model, a30.train, a30.sparsities, a30.test_blocks) == (
        full.model,
        full.train,
        full.sparsities,
        full.test_blocks,
    )
    committed = Path(__file__).parents[2] / "docs" / "results" / "sparse-lm" / "results.json"
    chosen = json.loads(committed.read_text())["selection"]
    methods = a30.method_configs()
    for label in ("adamw", "horst"):
        opt = methods[label].optimizer
        assert (opt.lr, opt.alpha or 0.0, opt.weight_decay) == tuple(
            chosen[label]["chosen"][k] for k in ("lr", "alpha", "weight_decay")
        )
    large = methods[LARGE_ALPHA].optimizer
    assert large.name == "horst" and large.alpha == 30.0 and large.lr == methods["horst"].optimizer.lr
