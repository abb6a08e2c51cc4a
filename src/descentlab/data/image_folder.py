"""ImageNet-style folders read image by image, through timm's data pipeline (RGB, any image size).

A folder holds ``train/<class>/*.jpg`` and ``val/<class>/*.jpg`` (ImageNet's layout; class folders named
anything, images of mixed sizes and modes, each decoded to RGB). :func:`folder_splits` indexes it without
opening an image and returns three datasets whose items decode one image each, so a split never sits in
RAM and the decoding runs in ``fit``'s DataLoader workers (``train.loader_workers``):

* **train**: the ``train/`` images minus the validation ones (capped at ``n_train``), with the training
  transform (timm's ``create_transform(is_training=True)``: random resized crop, flip, RandAugment, random
  erasing, normalisation);
* **val**: ``n_val`` images drawn from ``train/`` (a permutation seeded by ``split_seed``, fixed across
  training seeds), with the evaluation transform; it is the split that tuning reads;
* **test**: the ``val/`` folder (ImageNet's held-out split), all of it or ``n_test`` images drawn by the same
  seeded permutation, with the evaluation transform (resize, centre crop, normalisation).

Labels are the indices of the sorted ``train/`` class folders; a ``val/`` class that ``train/`` lacks is an
error. Mixup / CutMix and label smoothing act on a whole micro-batch: :class:`MixupCollate` is ``fit``'s
``collate_fn`` and turns the integer labels into soft targets ``[B, classes]``.

Randomness. The augmentations draw from the RNG of the process that decodes (Python's ``random``, numpy
and torch): in a DataLoader worker, the worker's, which ``fit`` seeds from ``(seed, rank)`` and the worker
id. A run is therefore reproducible at a fixed ``train.loader_workers``, not across worker counts, as with
any augmenting DataLoader. The evaluation transform draws nothing: evaluation is the same with any number of
workers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from descentlab.errors import AssetMissingError, ConfigError, DataError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff")
TRAIN_FOLDER, TEST_FOLDER = "train", "val"


@dataclass(frozen=True)
class FolderIndex:
    """The images of one folder of class folders: paths and integer labels, in sorted order."""

    paths: tuple[str, ...]
    labels: tuple[int, ...]
    classes: tuple[str, ...]


def index_folder(root: Path, classes: Sequence[str] | None = None) -> FolderIndex:
    """Every image under ``root/<class>/`` (recursively), labelled by its class folder's position in
    ``classes`` (default: the sorted class folders of ``root``).

    Raises:
        AssetMissingError: ``root`` is not a folder, or holds no class folder with an image.
        DataError: a class folder that ``classes`` does not name.
    """
    if not root.is_dir():
        raise AssetMissingError(
            f"image folder {str(root)!r} does not exist: give dataset=/path/to/folder holding "
            f"{TRAIN_FOLDER}/<class>/*.jpg and {TEST_FOLDER}/<class>/*.jpg"
        )
    found = sorted(p.name for p in root.iterdir() if p.is_dir())
    classes = tuple(found if classes is None else classes)
    if unknown := sorted(set(found) - set(classes)):
        raise DataError(f"{root} has class folders {unknown[:5]} that the training folder does not have")
    position = {name: k for k, name in enumerate(classes)}
    paths: list[str] = []
    labels: list[int] = []
    for name in found:
        files = sorted(p for p in (root / name).rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
        paths += [str(p) for p in files]
        labels += [position[name]] * len(files)
    if not paths:
        raise AssetMissingError(f"no images ({', '.join(IMAGE_SUFFIXES)}) under {str(root)!r}/<class>/")
    return FolderIndex(paths=tuple(paths), labels=tuple(labels), classes=classes)


class FolderImages(Dataset):
    """Images decoded on demand: item ``i`` is ``{"pixel_values": transform(RGB image), "labels": int}``.

    It holds only the paths and labels, so it pickles small into DataLoader workers; ``classes`` names the
    labels.
    """

    def __init__(
        self,
        paths: Sequence[str],
        labels: Sequence[int],
        transform: Callable[[Any], Any],
        classes: Sequence[str] = (),
    ) -> None:
        if len(paths) != len(labels):
            raise DataError(f"{len(paths)} images but {len(labels)} labels")
        self.paths, self.labels, self.transform = list(paths), list(labels), transform
        self.classes = tuple(classes)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict[str, Any]:
        from PIL import Image

        with Image.open(self.paths[i]) as img:
            rgb = img.convert("RGB")  # greyscale, palette, CMYK and RGBA images alike
        return {"pixel_values": self.transform(rgb), "labels": torch.tensor(self.labels[i], dtype=torch.long)}

    @property
    def y(self) -> torch.Tensor:
        """All labels, ``[N]`` int64 (no image is opened)."""
        return torch.tensor(self.labels, dtype=torch.long)


def _draw(n: int, k: int | None, seed: int) -> list[int]:
    """``k`` of ``range(n)`` by a permutation seeded by ``seed``, in ascending order (all with None or k >= n)."""
    if k is None or k >= n:
        return list(range(n))
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:k]
    return sorted(order.tolist())


def folder_splits(
    root: str | Path,
    *,
    n_train: int,
    n_val: int,
    n_test: int | None,
    split_seed: int,
    train_transform: Callable[[Any], Any],
    eval_transform: Callable[[Any], Any],
) -> tuple[dict[str, FolderImages], tuple[str, ...]]:
    """The train / val / test datasets of an ImageNet-style folder (module docstring) and the class names.

    Raises:
        AssetMissingError: no ``train/`` or ``val/`` folder, or no images in one.
        ConfigError: ``n_val`` leaves no training image.
    """
    root = Path(root).expanduser()
    train = index_folder(root / TRAIN_FOLDER)
    test = index_folder(root / TEST_FOLDER, classes=train.classes)
    n = len(train.paths)
    if n_val >= n:
        raise ConfigError(f"n_val={n_val} leaves no training image of the {n} in {root / TRAIN_FOLDER}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(split_seed)).tolist()
    val_idx = sorted(order[:n_val])
    train_idx = sorted(order[n_val : n_val + n_train])
    test_idx = _draw(len(test.paths), n_test, split_seed + 1)

    def subset(index: FolderIndex, rows: list[int], transform: Callable[[Any], Any]) -> FolderImages:
        rows_paths, rows_labels = [index.paths[i] for i in rows], [index.labels[i] for i in rows]
        return FolderImages(rows_paths, rows_labels, transform, classes=train.classes)

    data = {
        "train": subset(train, train_idx, train_transform),
        "val": subset(train, val_idx, eval_transform),
        "test": subset(test, test_idx, eval_transform),
    }
    return data, train.classes


def posterize_any_bits(img: Any, bits_to_keep: int, **_: Any) -> Any:
    """timm's ``posterize`` with Pillow < 13's result at 0 bits: a black image (Pillow 13 raises instead).

    ``ImageOps.posterize(img, b)`` keeps the ``b`` high bits of each channel, ``v & ~(2^(8 - b) - 1)``; at
    ``b = 0`` the mask is 0 and every pixel is black. timm's RandAugment asks for 0 bits at its top magnitudes
    (``PosterizeIncreasing`` at level 7.5 and up, ``Posterize`` below 2.5), which DeiT trained with.
    """
    from PIL import Image, ImageOps

    if bits_to_keep >= 8:
        return img
    if bits_to_keep <= 0:
        return Image.new(img.mode, img.size)
    return ImageOps.posterize(img, bits_to_keep)


def pillow_safe(transform: Any) -> Any:
    """``transform`` with every posterize op of its RandAugment / AutoAugment stages (timm's ``AugmentOp``)
    replaced by :func:`posterize_any_bits`; the same transform object, changed in place."""
    stages = getattr(transform, "transforms", [transform])
    for stage in stages:
        for op in getattr(stage, "ops", None) or getattr(stage, "policy", None) or []:
            for sub in op if isinstance(op, list | tuple) else [op]:
                if str(getattr(sub, "name", "")).startswith("Posterize"):
                    sub.aug_fn = posterize_any_bits
    return transform


class MixupCollate:
    """``fit``'s ``collate_fn`` for the training split: stack the images, then Mixup / CutMix the micro-batch
    and turn its labels into soft targets (timm's ``Mixup``, one λ per batch, label smoothing ``smoothing``).

    timm's ``Mixup`` pairs example ``b`` with ``B - 1 - b`` and needs an even batch; in an odd one (the last
    share of an epoch) the last example is left unmixed, with smoothed one-hot targets. With ``mixup`` and
    ``cutmix`` both 0 the targets are only smoothed.
    """

    def __init__(self, num_classes: int, *, mixup: float, cutmix: float, smoothing: float) -> None:
        if min(mixup, cutmix, smoothing) < 0 or smoothing >= 1:
            raise ConfigError(
                f"mixup={mixup} and cutmix={cutmix} must be >= 0 and label smoothing={smoothing} in [0, 1)"
            )
        self.num_classes, self.mixup, self.cutmix, self.smoothing = num_classes, mixup, cutmix, smoothing
        self._mix: Any = None

    def _mixer(self) -> Any:
        if self._mix is None and (self.mixup > 0 or self.cutmix > 0):
            from timm.data import Mixup

            self._mix = Mixup(
                mixup_alpha=self.mixup,
                cutmix_alpha=self.cutmix,
                label_smoothing=self.smoothing,
                num_classes=self.num_classes,
            )
        return self._mix

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        from timm.data.mixup import mixup_target

        x = torch.stack([it["pixel_values"] for it in items])
        y = torch.stack([it["labels"] for it in items])
        mix, even = self._mixer(), len(items) - len(items) % 2
        if mix is None or even == 0:
            return {"pixel_values": x, "labels": mixup_target(y, self.num_classes, 1.0, self.smoothing)}
        mixed, soft = mix(x[:even].clone(), y[:even])
        if even < len(items):
            last = mixup_target(y[even:], self.num_classes, 1.0, self.smoothing)
            mixed, soft = torch.cat([mixed, x[even:]]), torch.cat([soft, last])
        return {"pixel_values": mixed, "labels": soft}


__all__ = [
    "FolderImages",
    "FolderIndex",
    "MixupCollate",
    "folder_splits",
    "index_folder",
    "pillow_safe",
    "posterize_any_bits",
]
