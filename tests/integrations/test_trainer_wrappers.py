"""DescentTrainer through the wrappers Trainer puts around a model (issue 31, item 4).

``compute_loss`` and ``prediction_step`` receive Trainer's wrapped model: ``nn.DataParallel`` when one
process sees several GPUs, ``torch.compile``'s ``OptimizedModule`` with ``torch_compile=True``. Each wrapped
model is checked against an identical unwrapped twin: the same Lagrangian and the same gradients. On CPU,
``nn.DataParallel`` has no devices and only calls its module; over several devices it is refused with a
message that names torchrun. A compiled model (a counting backend around the eager one, so the test is
cheap) must also run compiled graphs during the readout, with the default readout and an explicit one.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import TrainingArguments

import descentlab as dl
from descentlab.integrations.hf import DescentTrainer
from tiny_models import tiny_llama


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(1, 97, (4, 12), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def _trainer(tmp_path, model: nn.Module, readout: str | None = None) -> DescentTrainer:
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, max_steps=1)
    constraint = dl.LayerwiseDescent(num_layers=2, alpha=0.3, dual_lr=0.1)
    constraint.duals.lam.fill_(0.5)  # λ > 0, so the Lagrangian depends on every f_l
    return DescentTrainer(model=model, args=args, constraint=constraint, readout=readout)


def _loss_and_grads(trainer: DescentTrainer, model: nn.Module, params: nn.Module):
    model.train()
    torch.manual_seed(0)  # the default readout's token subsample: the same draw for both twins
    loss = trainer.compute_loss(model, _batch())
    loss.backward()
    grads = {name: p.grad.clone() for name, p in params.named_parameters()}
    return loss.detach(), grads


def _assert_same(got, want) -> None:
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
    assert got[1].keys() == want[1].keys()
    for name, grad in want[1].items():
        torch.testing.assert_close(got[1][name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_data_parallel_model_gives_the_unwrapped_loss_and_gradients(tmp_path) -> None:
    plain, twin = tiny_llama(layers=2), tiny_llama(layers=2)
    wrapped = nn.DataParallel(twin)
    assert wrapped.device_ids == []  # CPU: DataParallel only calls its module
    want = _loss_and_grads(_trainer(tmp_path / "a", plain), plain, plain)
    trainer = _trainer(tmp_path / "b", twin)
    _assert_same(_loss_and_grads(trainer, wrapped, twin), want)
    # evaluation goes through the same unwrapping
    wrapped.eval()
    plain.eval()
    f_wrapped = trainer.prediction_step(wrapped, _batch(), prediction_loss_only=True)[0]
    f_plain = _trainer(tmp_path / "c", plain).prediction_step(plain, _batch(), prediction_loss_only=True)[0]
    torch.testing.assert_close(f_wrapped, f_plain)


def test_data_parallel_over_several_gpus_is_refused_naming_torchrun(tmp_path, monkeypatch) -> None:
    model = tiny_llama(layers=2)
    wrapped = nn.DataParallel(model)
    wrapped.device_ids = [0, 1]  # as on a 2-GPU machine (this one has none)
    with pytest.raises(dl.errors.ConfigError, match="torchrun --nproc_per_node=2"):
        _trainer(tmp_path / "a", model).compute_loss(wrapped, _batch())
    # Trainer wraps in DataParallel when one process sees several GPUs: refused at construction
    monkeypatch.setattr(TrainingArguments, "n_gpu", property(lambda self: 4))
    with pytest.raises(dl.errors.ConfigError, match="torchrun --nproc_per_node=4"):
        _trainer(tmp_path / "b", tiny_llama(layers=2))


class _CountingBackend:
    """A dynamo backend that runs each graph eagerly and counts the graph calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: list) -> object:
        def run(*args: object) -> object:
            self.calls += 1
            return graph.forward(*args)

        return run


@pytest.mark.parametrize("readout", [None, "causal_lm"], ids=["default-readout", "explicit-readout"])
def test_compiled_model_runs_compiled_and_matches_the_uncompiled_one(tmp_path, readout) -> None:
    torch._dynamo.reset()
    plain, twin = tiny_llama(layers=2), tiny_llama(layers=2)
    backend = _CountingBackend()
    compiled = torch.compile(twin, backend=backend)
    want = _loss_and_grads(_trainer(tmp_path / "a", plain, readout), plain, plain)
    trainer = _trainer(tmp_path / "b", twin, readout)
    _assert_same(_loss_and_grads(trainer, compiled, twin), want)
    assert "forward" not in twin.model.__dict__, "the backbone's compiled forward outlived the readout"
    # A later step (the structure and head checks are cached by then) runs compiled graphs: before the fix,
    # an explicit readout ran the backbone eagerly, only the first step's head check went through the
    # compiled wrapper.
    calls = backend.calls
    twin.zero_grad()
    _assert_same(_loss_and_grads(trainer, compiled, twin), want)
    assert backend.calls > calls, "the readout ran the backbone eagerly, not the compiled forward"
    torch._dynamo.reset()
