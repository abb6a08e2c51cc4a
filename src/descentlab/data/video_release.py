"""The released train / test partition of the surveillance video datasets, read for denoising.

The folder given is one dataset as its release unpacks, holding a training and a testing folder:

* UCSD Ped1 / Ped2 (``UCSD_Anomaly_Dataset.v1p2/UCSDped2``): ``Train/Train001/001.tif``,
  ``Test/Test001/001.tif`` (the ``Test001_gt/`` masks skipped);
* CUHK Avenue (``Avenue Dataset``): ``training_videos/01.avi``, ``testing_videos/01.avi`` (``ground_truth_demo/``
  and ``testing_label_mask/`` skipped);
* ShanghaiTech Campus (``shanghaitech``): ``training/videos/01_001.avi`` and ``testing/frames/01_0014/000.jpg``
  (``testing/test_frame_mask/`` and ``test_pixel_mask/`` skipped).

Every video file and every folder of frames is one clip (:func:`descentlab.data.video.load_clips`). Training
clips give the training sequences, the last ``val_frac`` of each training clip the validation sequences, and
the testing clips, whole, the test sequences: no test frame, and no test scene's clip, is trained on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from descentlab.data.video import Size, clip_sequences, load_clips
from descentlab.errors import AssetMissingError, DataError

__all__ = ["partition_folders", "release_sequences"]


def _annotation(name: str) -> bool:
    """Ground truth shipped beside the clips (Avenue's ``testing_label_mask/``, ``ground_truth_demo/``) and
    hidden folders: never a training or testing part."""
    name = name.lower()
    return name.startswith(".") or name.endswith("_gt") or "mask" in name or "ground_truth" in name


def partition_folders(root: str | Path) -> tuple[Path, Path]:
    """``(training folder, testing folder)``: the sub-folders of ``root`` named ``train*`` / ``test*``
    (``Train`` / ``Test``, ``training_videos`` / ``testing_videos``, ``training`` / ``testing``).

    Raises:
        AssetMissingError: ``root`` does not exist.
        DataError: not exactly one training and one testing folder under ``root``.
    """
    root = Path(root).expanduser()
    if not root.is_dir():
        raise AssetMissingError(
            f"video dataset folder {root} does not exist; give the unpacked release's folder"
        )
    children = sorted(p for p in root.iterdir() if p.is_dir() and not _annotation(p.name))
    found = {part: [p for p in children if p.name.lower().startswith(part)] for part in ("train", "test")}
    if any(len(v) != 1 for v in found.values()):
        raise DataError(
            f"{root} needs one training and one testing folder (Train/Test, training_videos/testing_videos, "
            f"training/testing), found {[p.name for p in children]}; data.split=time splits every clip in time"
        )
    return found["train"][0], found["test"][0]


def release_sequences(
    root: str | Path,
    *,
    size: Size,
    max_frames: int | None,
    max_clips: int | None,
    num_frames: int,
    crop: int,
    time_stride: int,
    val_frac: float,
) -> tuple[dict[str, Tensor], list[Tensor], dict[str, Any]]:
    """Train / val / test sequences ``[N, num_frames, crop, crop]`` from the release's partition (module docs).

    ``max_frames`` and ``max_clips`` cap each clip and the number of clips of each part. Returns the
    sequences, the testing clips ``[T, H, W]`` and a description for a results file's protocol.

    Raises:
        DataError: no training or testing sequence (clips shorter than ``num_frames``), or ``val_frac``
            outside (0, 1).
    """
    if not 0.0 < val_frac < 1.0:
        raise DataError(f"val_frac must lie in (0, 1) with the release's partition, got {val_frac}")
    train_dir, test_dir = partition_folders(root)
    kw = {"size": size, "max_frames": max_frames, "max_clips": max_clips}
    train_clips, test_clips = load_clips(train_dir, **kw), load_clips(test_dir, **kw)
    cut_kw = {"num_frames": num_frames, "crop": crop, "time_stride": time_stride}
    parts: dict[str, list[Tensor]] = {"train": [], "val": [], "test": []}
    for clip in train_clips:
        v = round((1.0 - val_frac) * clip.shape[0])
        parts["train"].append(clip_sequences(clip[:v], **cut_kw))
        parts["val"].append(clip_sequences(clip[v:], **cut_kw))
    parts["test"] = [clip_sequences(clip, **cut_kw) for clip in test_clips]
    out = {k: torch.cat(v) for k, v in parts.items()}
    empty = [k for k, v in out.items() if len(v) == 0]
    if empty:
        raise DataError(
            f"no {empty} sequences of {num_frames} frames in {root}: clips too short; lower num_frames or val_frac"
        )
    frames = {
        k: sum(c.shape[0] for c in clips) for k, clips in (("train", train_clips), ("test", test_clips))
    }
    described = {
        "frames": f"{len(train_clips)} training and {len(test_clips)} testing clip(s) ({frames['train']} and "
        f"{frames['test']} frames), resized to height {size}, {num_frames}-frame sequences of {crop}x{crop} "
        "pixels",
        "split": f"the release's partition: {train_dir.name}/ trains (its clips' last {val_frac:.0%} "
        f"validate), {test_dir.name}/ tests",
    }
    return out, test_clips, described
