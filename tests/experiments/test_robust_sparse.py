"""robust-sparse end to end on a small BERT (saved with MiniLM's tokenizer) and real Rotten Tomatoes reviews.

The experiment's numbers are checked against an independent evaluation: the trained weights are read back
from the run's final checkpoint, pruned with ``prune_magnitude`` and scored by a plain loop.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from descentlab.errors import AssetMissingError, ConfigError
from descentlab.experiments.base import run_experiment

OVERRIDES = [
    "data.n_train=64",
    "data.n_eval=48",
    "data.max_length=32",
    "data.eval_batch_size=16",
    "seeds=[0]",
    "lr=1e-3",
    "train.max_steps=6",
    "train.batch_size=16",
    "train.progress=false",
    "evaluation.gammas=[0.0,1.0,3.0]",
    "evaluation.draws=1",
    "pruning.sparsities=[0.0,0.6]",
]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from descentlab.data import asset_path

    try:
        source = asset_path("minilm")
    except AssetMissingError as exc:
        pytest.skip(str(exc))
    folder = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=2,
    )
    BertForSequenceClassification(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(source), local_files_only=True).save_pretrained(folder)
    return folder


def _accuracy_after_pruning(run_dir: Path, tag: str, model_dir: Path, sparsity: float) -> tuple[float, float]:
    """Independent check: checkpoint weights -> prune_magnitude -> plain batched accuracy on the test split."""
    from safetensors.torch import load_model
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from descentlab.data import load_text_classification
    from descentlab.sparsity import prune_magnitude

    (ckpt,) = sorted((run_dir / "checkpoints" / tag).glob("step-*"))[-1:]
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=2).eval()
    load_model(model, str(ckpt / "model.safetensors"))
    reached = prune_magnitude(model, sparsity, scope="layer").global_sparsity
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    test = load_text_classification("rotten_tomatoes", max_train=64, max_eval=48)["test"]
    correct = 0
    with torch.no_grad():
        for text, label in zip(test["text"], test["label"], strict=True):
            enc = tokenizer(text, truncation=True, max_length=32, return_tensors="pt")
            correct += int(model(**enc).logits.argmax(-1).item() == label)
    return correct / len(test), reached


def test_robust_sparse_runs_and_matches_an_independent_evaluation(tmp_path, tiny_model_dir) -> None:
    overrides = [f"model={tiny_model_dir}", "methods=[erm-horst,constrained-horst]", *OVERRIDES]
    run_dir = run_experiment("robust-sparse", overrides=overrides, out=tmp_path)
    results = json.loads((run_dir / "results.json").read_text())
    assert set(results["methods"]) == {"erm-horst", "constrained-horst"}
    assert results["protocol"]["n_eval"] == 48
    assert (run_dir / "report.md").is_file()
    assert (run_dir / "figures" / "accuracy_vs_gamma_by_sparsity.png").is_file()
    for method, block in results["methods"].items():
        # layer-wise pruning zeroes round(0.6 n) entries of every block Linear: 14742 of 24576 here
        assert block["sparsity"]["reached@s=0"] < 0.01
        assert block["sparsity"]["reached@s=0.6"] == 14742 / 24576
        curve = block["curves"]["gaussian@s=0.6"]
        assert curve["x"] == [0.0, 1.0, 3.0] and len(curve["mean"]) == 3
        assert len(block["layer_loss"]["clean@s=0"]) == 4
        for s in (0.0, 0.6):
            expected, reached = _accuracy_after_pruning(run_dir, f"{method}-seed0", tiny_model_dir, s)
            assert block["metrics"][f"accuracy@s={s:g}"] == pytest.approx(expected, abs=1e-9)
            assert block["sparsity"][f"reached@s={s:g}"] == reached
    lam = results["methods"]["constrained-horst"]["multipliers"]
    assert len(lam) == 3 and max(lam) > 0
    assert "multipliers" not in results["methods"]["erm-horst"]
    paired = [t for t in results["tables"] if t["title"].startswith("Accuracy difference to ERM")]
    assert paired and len(paired[0]["rows"]) == 2


def test_robust_sparse_with_acdc_trains_sparse(tmp_path, tiny_model_dir) -> None:
    overrides = [
        f"model={tiny_model_dir}",
        "methods=[constrained-horst]",
        *OVERRIDES,
        "pruning.acdc=true",
        "pruning.acdc_sparsity=0.5",
    ]
    results = json.loads(
        (run_experiment("robust-sparse", overrides=overrides, out=tmp_path) / "results.json").read_text()
    )
    block = results["methods"]["constrained-horst"]["sparsity"]
    # AC/DC ends in a compressed phase (global magnitude at 50 %); pruning to 60 % goes further
    assert block["reached@s=0"] == pytest.approx(0.5, abs=1e-4)
    assert block["reached@s=0.6"] == pytest.approx(0.6, abs=2e-3)


@pytest.mark.parametrize(
    "override",
    ["methods=[erm-sgd]", "pruning.sparsities=[1.0]", "pruning.scope=nm", "evaluation.gammas=[1.0]"],
)
def test_robust_sparse_rejects_bad_config_before_making_a_run_dir(tmp_path, override) -> None:
    with pytest.raises(ConfigError):
        run_experiment("robust-sparse", overrides=[override], out=tmp_path)
    assert not any(tmp_path.iterdir())
