"""video-denoising's ``paper`` preset end to end on CPU: a UCSD Ped2 folder as its release unpacks (``Train/``
and ``Test/`` frame folders of .tif images, ground-truth masks beside them), trained on its training clips and
tested on its testing clips, with tiny UT models; the CUHK Avenue (.avi videos) and ShanghaiTech (videos to
train on, .jpg frames to test on) layouts load into the same partition."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from descentlab.config import resolve_config
from descentlab.data.video_release import partition_folders, release_sequences
from descentlab.errors import AssetMissingError, ConfigError, DataError
from descentlab.experiments import run_experiment
from descentlab.experiments.video_denoising import config as video
from descentlab.report.claims import VERDICTS

H, W = 24, 36  # UCSD Ped2's 240 x 360, scaled down ten times


def scene(t: int, clip: int) -> np.ndarray:
    """A moving bright blob on a textured background: uint8 [H, W]."""
    y, x = np.mgrid[:H, :W]
    frame = 90 + 40 * np.sin(x / 3.0 + clip) * np.cos(y / 4.0)
    frame += 100 * np.exp(-((x - (3 + 2 * t + clip) % W) ** 2 + (y - 12) ** 2) / 18.0)
    return frame.clip(0, 255).astype(np.uint8)


def write_frames(folder: Path, frames: int, clip: int, suffix: str, width: int = 3) -> None:
    from PIL import Image

    folder.mkdir(parents=True)
    for t in range(frames):
        Image.fromarray(scene(t, clip)).save(folder / f"{t + 1:0{width}d}{suffix}")


def write_video(path: Path, frames: int, clip: int) -> None:
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mjpeg", rate=25)
        stream.width, stream.height, stream.pix_fmt = W, H, "yuvj420p"
        for t in range(frames):
            rgb = np.repeat(scene(t, clip)[..., None], 3, axis=2)
            for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def write_ucsd(root: Path) -> Path:
    """``UCSDped2/Train/Train001/001.tif`` ... and ``Test/Test001/001.tif`` with ``Test001_gt/`` masks."""
    ped2 = root / "UCSD_Anomaly_Dataset.v1p2" / "UCSDped2"
    for i in range(3):
        write_frames(ped2 / "Train" / f"Train{i + 1:03d}", 30, clip=i, suffix=".tif")
    for i in range(2):
        write_frames(ped2 / "Test" / f"Test{i + 1:03d}", 20, clip=10 + i, suffix=".tif")
        write_frames(ped2 / "Test" / f"Test{i + 1:03d}_gt", 20, clip=99, suffix=".bmp")  # masks: skipped
    return ped2


def test_the_paper_preset_is_the_papers_setting() -> None:
    cfg = resolve_config(video.CONFIG, preset="paper", presets=video.PRESETS)
    assert cfg.data.split == "release" and "UCSDped2" in cfg.data.video
    assert cfg.train.mixed_precision == "bf16" and cfg.train.max_steps == 16_000
    assert len(cfg.seeds) == 5 and cfg.tune_seed not in cfg.seeds
    assert {len(cfg.candidates(label)) for label in cfg.trained_labels} == {4}  # equal tuning budgets
    assert cfg.data.crop == cfg.model.patch_size
    with pytest.raises(ConfigError, match=r"data\.split"):
        resolve_config(video.CONFIG, overrides=["data.split=random"])


def test_ucsd_ped2_as_released_through_the_paper_path(tmp_path: Path) -> None:
    ped2 = write_ucsd(tmp_path / "data")
    run_dir = run_experiment(
        "video-denoising",
        preset="paper",
        out=tmp_path / "runs",
        overrides=[
            f"data.video={ped2}",
            # sized down only
            "data.size=24",
            "data.num_frames=4",
            "data.crop=8",
            "data.time_stride=4",
            "data.val_frac=0.2",
            "data.n_val=24",
            "data.n_test=48",
            "model.patch_size=8",
            "model.depth=2",
            "model.width=16",
            "model.heads=2",
            "model.num_atoms=16",
            "architectures=[ut]",
            "methods=[erm,constrained]",
            "seeds=[0,1]",
            "train.max_steps=6",
            "train.batch_size=16",
            "train.checkpoint_every=3",
            "val_every=3",
            "eval_batch_size=64",
            "lr_grid=[0.003]",
            "constraint_grid=[constraint.dual_lr=0.05]",
            "unconstrained_lr_grid=[0.003]",
            "baselines=[gaussian]",
            "baseline_grid={gaussian: {sigma_t: [0.5]}}",
            "torch_threads=1",
        ],
    )
    results = json.loads((run_dir / "results.json").read_text())
    protocol = results["protocol"]
    assert "Train/ trains" in protocol["split"] and "Test/ tests" in protocol["split"]
    assert "3 training and 2 testing clip(s) (90 and 40 frames)" in protocol["frames"]  # masks skipped
    # every training sequence: 3 clips x 6 windows (the first 24 of 30 frames; the last 6 validate) x 3 x 4
    # crops of 8 pixels; the test sequences (2 clips x 5 windows x 12 crops = 120) capped at n_test
    assert (protocol["n_train"], protocol["n_eval"]) == (3 * 6 * 12, 48)
    rows = results["claims"]
    assert (run_dir / "report.md").is_file() and rows and {r["verdict"] for r in rows} <= set(VERDICTS)
    primary = [r for r in rows if r["role"] == "primary"]
    assert len(primary) == 1 and primary[0]["method"] == "ut-constrained"
    assert primary[0]["verdict"] != "pending re-run"


def test_avenue_and_shanghaitech_layouts_load_as_their_partition(tmp_path: Path) -> None:
    avenue = tmp_path / "Avenue Dataset"
    for i in range(2):
        write_video(avenue / "training_videos" / f"{i + 1:02d}.avi", 16, clip=i)
        write_video(avenue / "testing_videos" / f"{i + 1:02d}.avi", 12, clip=5 + i)
    (avenue / "testing_label_mask").mkdir()
    (avenue / "ground_truth_demo" / "testing_label_mask").mkdir(parents=True)
    shanghai = tmp_path / "shanghaitech"
    write_video(shanghai / "training" / "videos" / "01_001.avi", 16, clip=0)
    write_frames(shanghai / "testing" / "frames" / "01_0014", 12, clip=3, suffix=".jpg")
    (shanghai / "testing" / "test_frame_mask").mkdir(parents=True)
    np.save(shanghai / "testing" / "test_frame_mask" / "01_0014.npy", np.zeros(12))
    kw = {"size": None, "max_frames": None, "max_clips": None, "num_frames": 4, "crop": 12, "time_stride": 4}
    seqs, test_clips, described = release_sequences(avenue, val_frac=0.25, **kw)
    assert [c.shape for c in test_clips] == [(12, H, W)] * 2
    # training clips: 16 frames -> 12 train (3 windows) + 4 validation (1 window), 2 x 3 crops of 12 each
    assert (len(seqs["train"]), len(seqs["val"]), len(seqs["test"])) == (2 * 3 * 6, 2 * 1 * 6, 2 * 3 * 6)
    assert "training_videos/ trains" in described["split"]
    seqs, test_clips, _ = release_sequences(shanghai, val_frac=0.25, **kw)
    assert len(test_clips) == 1 and len(seqs["test"]) == 3 * 6  # the frames folder; the mask .npy ignored
    assert float(seqs["test"].max()) <= 1.0 and seqs["test"].dtype.is_floating_point


def test_partition_errors(tmp_path: Path) -> None:
    with pytest.raises(AssetMissingError):
        partition_folders(tmp_path / "missing")
    (tmp_path / "clips").mkdir()
    with pytest.raises(DataError, match="one training and one testing folder"):
        partition_folders(tmp_path)
