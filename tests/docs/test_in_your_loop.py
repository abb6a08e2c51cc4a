"""Every snippet of docs/in-your-loop.md runs as written, and does what the page says it does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import descentlab as dl
from descentlab.errors import AssetMissingError

DOC = Path(__file__).resolve().parents[2] / "docs" / "in-your-loop.md"
FENCE = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def snippets() -> list[str]:
    return FENCE.findall(DOC.read_text())


@pytest.fixture(autouse=True)
def _needs_minilm_vocab() -> None:
    from descentlab.data import asset_path

    try:
        asset_path("minilm")
    except AssetMissingError as exc:
        pytest.skip(str(exc))


def _run(index: int, cwd: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.chdir(cwd)
    namespace: dict = {"__name__": f"in_your_loop_{index}"}
    exec(compile(snippets()[index], f"{DOC.name}[snippet {index + 1}]", "exec"), namespace)
    return namespace


def test_the_page_has_the_four_snippets() -> None:
    blocks = snippets()
    assert len(blocks) == 4
    assert "DescentTrainer" in blocks[1] and "Accelerator" in blocks[2] and "DescentModule" in blocks[3]


def test_plain_loop_snippet(tmp_path, monkeypatch) -> None:
    ns = _run(0, tmp_path, monkeypatch)
    assert (ns["constraint"].multipliers > 0).any()
    saved = torch.load(tmp_path / "state.pt", weights_only=True)
    assert torch.equal(saved["optimizer"]["descent"]["duals"]["lambda"], ns["constraint"].multipliers)
    assert saved["acdc"]["masks"] is not None  # the schedule ends compressed
    assert dl.sparsity_report(ns["model"]).global_sparsity == pytest.approx(0.5, abs=1e-3)


def test_hf_trainer_snippet(tmp_path, monkeypatch) -> None:
    ns = _run(1, tmp_path, monkeypatch)
    trainer = ns["trainer"]
    assert trainer.state.global_step == 8
    logged = [entry for entry in trainer.state.log_history if "descent/lambda/1" in entry]
    assert logged and "sparsity/global" in logged[-1]
    assert (tmp_path / "out" / "trainer" / "checkpoint-8" / "descentlab_sparsity.pt").is_file()
    assert (trainer.constraint.multipliers > 0).any()


def test_accelerate_snippet(tmp_path, monkeypatch) -> None:
    ns = _run(2, tmp_path, monkeypatch)
    assert (ns["constraint"].multipliers > 0).any()
    assert ns["acdc"].masks is not None
    assert any((tmp_path / "out" / "accelerate").glob("custom_checkpoint_0.*"))  # the registered AC/DC state


def test_lightning_snippet(tmp_path, monkeypatch) -> None:
    pytest.importorskip(
        "lightning", reason="lightning is not installed (pip install 'descentlab[lightning]')"
    )
    ns = _run(3, tmp_path, monkeypatch)
    assert ns["trainer"].global_step == 8
    lam = ns["module"].constraint.multipliers
    assert (lam > 0).any()
    saved = torch.load(tmp_path / "out" / "lightning.ckpt", weights_only=False, map_location="cpu")
    assert torch.equal(saved["optimizer_states"][0]["descent"]["duals"]["lambda"], lam)
    logged = (tmp_path / "out" / "lightning" / "version_0" / "metrics.csv").read_text().splitlines()[0]
    assert "descent/lambda_mean" in logged and "task_loss_step" in logged and "descent/f/2" in logged
