"""sparse-vit: end to end on real Fashion-MNIST images (micro sizes), through the framework."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from descentlab.errors import AssetMissingError, ConfigError
from descentlab.experiments.base import run_experiment

MICRO = [
    "n_train=256",
    "n_val=64",
    "n_test=128",
    "vit.hidden_size=16",
    "vit.num_layers=1",
    "vit.num_heads=2",
    "vit.mlp_ratio=2",
    "train.epochs=2",
    "train.batch_size=32",
    "sparsities=[0.5,0.9]",
    "seeds=[0]",
    "tune=true",
    "lr_grid=[0.003]",
    "alpha_grid={horst: [1.0], ham: [200.0]}",
    "acdc.warmup=0.5",
    "acdc.phase=0.25",
    "acdc.last_decompressed=0.25",
    "acdc.final=0.5",
]


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_runs_end_to_end_and_checkpoints_are_exactly_sparse(tmp_path) -> None:
    try:
        path = run_experiment("sparse-vit", overrides=MICRO, out=tmp_path)
    except AssetMissingError as exc:
        pytest.skip(f"no image dataset installed: {exc}")
    results = json.loads((path / "results.json").read_text())
    methods = results["methods"]
    assert set(methods) == {"adamw", "horst", "ham", "adamw-dense"}
    for name in ("adamw", "horst", "ham"):
        curve = methods[name]["curves"]["test_accuracy"]
        assert curve["x"] == [0.5, 0.9] and all(0.0 <= a <= 1.0 for a in curve["mean"])
        # read back from the saved safetensors: exactly the requested global sparsity (up to rounding)
        assert methods[name]["sparsity"]["checkpoint@0.9"] == pytest.approx(0.9, abs=1e-4)
        assert methods[name]["sparsity"]["checkpoint@0.5"] == pytest.approx(0.5, abs=1e-4)
    assert methods["adamw-dense"]["sparsity"]["checkpoint"] < 0.01
    titles = [t["title"] for t in results["tables"]]
    assert any(t.startswith("Test accuracy") for t in titles) and any(t.startswith("Tuning") for t in titles)
    assert (path / "figures" / "weight-histograms.png").stat().st_size > 10_000
    assert "HORST" in " ".join(results["notes"])
    assert (path / "report.md").read_text().count("Sparsity read back") == 1

    # an independent count on one checkpoint file: block Linear weights only, exact zeros
    ckpt = next((path / "checkpoints").glob("horst-s90*/step-*/model.safetensors"))
    weights = load_file(str(ckpt))
    block = [v for k, v in weights.items() if ".layers.0." in k and k.endswith("weight") and v.dim() == 2]
    zeros = sum(int((v == 0).sum()) for v in block)
    assert zeros == round(0.9 * sum(v.numel() for v in block))
    assert all(int((v == 0).sum()) == 0 for k, v in weights.items() if "classifier" in k or "norm" in k)


def test_bad_config_is_rejected_before_running(tmp_path) -> None:
    with pytest.raises(ConfigError, match="sparsities"):
        run_experiment("sparse-vit", overrides=["sparsities=[0.7,1.0]"], out=tmp_path)
    with pytest.raises(ConfigError, match="unknown optimizers"):
        run_experiment("sparse-vit", overrides=["optimizers=[adamw,lion]"], out=tmp_path)
    assert not any(tmp_path.iterdir())
