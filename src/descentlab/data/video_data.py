"""The data of a video-denoising experiment: its config, and the clean splits plus noisy sample frames."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from descentlab.data.video import Size, add_noise, load_clips, split_sequences
from descentlab.data.video_release import release_sequences
from descentlab.errors import ConfigError

__all__ = ["VideoDataConfig", "load_denoising_data"]


@dataclass
class VideoDataConfig:
    video: str = "vtest"  # a clip name (vtest, bikes, ...) or a file / folder (UCSD, Avenue, ShanghaiTech)
    size: int = 96  # frame height after resizing (the width keeps the aspect)
    max_frames: int | None = None  # per clip
    max_clips: int | None = None
    num_frames: int = 8  # frames per sequence T
    crop: int = 8  # sequences are crop x crop pixels
    time_stride: int = 4
    test_frac: float = 0.25  # the last quarter of every clip is the test range
    val_frac: float = 0.15  # the frames just before it are the validation range
    n_train: int | None = 8000  # random subset of the train sequences (None: all)
    n_val: int = 500
    n_test: int = 1000
    sigma_train: float = 0.1  # noise std in [0, 1] pixel units (0.1 ≈ 25/255)
    # "time": every clip cut in time (train, validation, then test frames); "release": a UCSD / Avenue /
    # ShanghaiTech folder's own training and testing clips (data/video_release.py; val_frac of each training
    # clip validates, test_frac unused)
    split: str = "time"

    def __post_init__(self) -> None:
        if self.split not in ("time", "release"):
            raise ConfigError(f"data.split must be 'time' or 'release', got {self.split!r}")


def load_denoising_data(
    video: str,
    *,
    size: Size,
    max_frames: int | None,
    max_clips: int | None,
    num_frames: int,
    crop: int,
    time_stride: int,
    test_frac: float,
    val_frac: float,
    n_train: int | None,
    n_val: int,
    n_test: int,
    sigma_train: float,
    sample_gammas: Sequence[float],
    split: str = "time",
) -> tuple[dict[str, Tensor], Tensor, dict[str, Any]]:
    """The clean ``train`` / ``val`` / ``test`` sequences of :func:`split_sequences` (``split="time"``) or of
    the release's own partition (``split="release"``, :func:`~descentlab.data.video_release.release_sequences`),
    random subsets of ``n_*`` each, drawn with seed 1234, and ``sample_noisy``: whole frames from the start of
    the first clip's test range at noise ``γ·sigma_train`` for each of ``sample_gammas`` (seed 99).

    Returns the data, the clean sample frames ``[num_frames, H, W]`` and a description of both for a
    results file's protocol (dataset, frames, split, split sizes, sigma_train).
    """
    if split == "release":
        splits, test_clips, described = release_sequences(
            video,
            size=size,
            max_frames=max_frames,
            max_clips=max_clips,
            num_frames=num_frames,
            crop=crop,
            time_stride=time_stride,
            val_frac=val_frac,
        )
        sample_clean = test_clips[0][:num_frames]
    else:
        clips = load_clips(video, size=size, max_frames=max_frames, max_clips=max_clips)
        splits = split_sequences(
            clips,
            num_frames=num_frames,
            crop=crop,
            test_frac=test_frac,
            val_frac=val_frac,
            time_stride=time_stride,
        )
        cut = round((1.0 - test_frac) * clips[0].shape[0])
        sample_clean = clips[0][cut : cut + num_frames]
        described = {
            "frames": f"{len(clips)} clip(s), resized to height {size}, {num_frames}-frame sequences of "
            f"{crop}x{crop} pixels",
            "split": f"time: first {1 - test_frac - val_frac:.0%} of each clip train, next {val_frac:.0%} "
            f"validation, last {test_frac:.0%} test",
        }
    pick = torch.Generator().manual_seed(1234)
    sizes = {"train": n_train, "val": n_val, "test": n_test}
    data = {k: splits[k][torch.randperm(len(splits[k]), generator=pick)[: sizes[k]]] for k in sizes}
    gen = torch.Generator().manual_seed(99)
    data["sample_noisy"] = torch.stack(
        [add_noise(sample_clean, g * sigma_train, generator=gen) for g in sample_gammas]
    )
    protocol = {
        "dataset": video,
        **described,
        "n_train": len(data["train"]),
        "n_val": len(data["val"]),
        "n_eval": len(data["test"]),
        "sigma_train": sigma_train,
    }
    return data, sample_clean, protocol
