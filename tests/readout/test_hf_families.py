"""The per-layer readout on a tiny random model of every Hugging Face family (found from its structure).

For each family of ``tiny_models.FAMILIES`` (float32, built offline from a config): f_L equals the model's
own loss to 1e-5, and every f_l equals the loss of the model cut after layer l (the final norm applied
once). The last test writes ``docs/readout-families.md`` from these results (``scripts/readout_families.py``).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from descentlab.errors import ModelError
from descentlab.readout import CausalLMReadout, Readout, layer_losses, register_readout
from descentlab.readout.custom import _REGISTRY
from tiny_models import FAMILIES, family_batch, tiny_family, tiny_llama

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "readout_families.py"
_spec = importlib.util.spec_from_file_location("readout_families", SCRIPT)
families = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("readout_families", families)  # dataclasses look their module up by name
_spec.loader.exec_module(families)

RESULTS: dict[str, object] = {}
KINDS = {kind for kind, *_ in FAMILIES.values()}


def test_the_table_covers_enough_families() -> None:
    counts = {kind: sum(k == kind for k, *_ in FAMILIES.values()) for kind in KINDS}
    assert len(FAMILIES) >= 20 and counts["text"] >= 8 and counts["lm"] >= 10 and counts["image"] >= 2
    for needed in ("DeBERTa-v2/v3", "MPNet", "ModernBERT (mean)", "ModernBERT (cls)", "OPT", "Falcon"):
        assert needed in FAMILIES


@pytest.mark.parametrize("name", list(FAMILIES))
def test_family_reads_out_its_own_loss_at_every_layer(name: str) -> None:
    row = families.check_family(name)
    RESULTS[name] = row
    assert not row.error, row.error
    assert row.own_loss_error <= 1e-5, f"{name}: |f_L - own loss| = {row.own_loss_error:.2e}"
    assert row.compared_layers and row.compared_layers[-1] == 1
    assert row.truncated_error <= 1e-5, f"{name}: |f_l - cut model| = {row.truncated_error:.2e}"


def test_family_table_is_written_from_the_results() -> None:
    if set(RESULTS) != set(FAMILIES):
        pytest.skip("only part of the families ran (-k): the table is written from a full run")
    rows = [RESULTS[name] for name in FAMILIES]
    path = families.write_table(rows)
    text = path.read_text()
    for name in FAMILIES:
        line = next(line for line in text.splitlines() if line.startswith(f"| {name} |"))
        assert "| yes |" in line and "error" not in line, line
    assert f"{len(FAMILIES)} of {len(FAMILIES)} families read out exactly" in text


def test_the_final_norm_is_not_applied_twice() -> None:
    # the cut-model check must see a norm applied twice: reading layer L-1 with the norm twice differs
    model = tiny_family("Llama")
    batch = family_batch("Llama")
    f = layer_losses(model, batch, readout=CausalLMReadout(sample_tokens=None))
    states = model.model(**batch, output_hidden_states=True).hidden_states
    norm = model.model.norm
    y = batch["input_ids"][:, 1:].masked_fill(batch["attention_mask"][:, 1:] == 0, -100)
    twice = nn.functional.cross_entropy(
        model.lm_head(norm(norm(states[1])))[:, :-1].transpose(1, 2), y, ignore_index=-100
    )
    once = nn.functional.cross_entropy(
        model.lm_head(norm(states[1]))[:, :-1].transpose(1, 2), y, ignore_index=-100
    )
    torch.testing.assert_close(f[1], once, rtol=0, atol=1e-5)
    assert abs(float((twice - once).detach())) > 1e-3


class ScaledLogitsForCausalLM(type(tiny_llama())):
    """A causal LM whose own head post-processes logits in a way no config field announces."""

    def forward(self, *args, **kwargs):
        labels = kwargs.pop("labels", None)
        out = super().forward(*args, **kwargs)
        out.logits = 3.0 * out.logits + 1.0
        if labels is not None:
            out.loss = self.loss_function(out.logits, labels, self.config.vocab_size)
        return out


def test_an_unknown_logit_transform_falls_back_to_the_models_own_head() -> None:
    torch.manual_seed(0)
    model = ScaledLogitsForCausalLM(tiny_llama().config).eval()
    batch = family_batch("Llama")
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    f = layer_losses(model, batch)
    torch.testing.assert_close(f[-1], model(**batch, labels=labels).loss, rtol=0, atol=1e-5)
    f.sum().backward()  # the replayed head is differentiable too
    assert model.model.layers[0].mlp.up_proj.weight.grad.abs().sum() > 0


class _FunctionalTail(nn.Module):
    """A backbone whose last_hidden_state is not a chain of sub-modules applied to the last block's output."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

    def forward(self, x, output_hidden_states=True, return_dict=True):
        from transformers.modeling_outputs import BaseModelOutput

        states = [x]
        for layer in self.layers:
            x = layer(x)
            states.append(x)
        return BaseModelOutput(last_hidden_state=2 * x, hidden_states=tuple(states))


class _ToyForSequenceClassification(nn.Module):
    base_model_prefix = "body"

    def __init__(self) -> None:
        super().__init__()
        self.body = _FunctionalTail()
        self.classifier = nn.Linear(4, 2)

        class _Config:
            num_hidden_layers = 2

        self.config = _Config()

    @property
    def base_model(self) -> nn.Module:
        return self.body

    def forward(self, x, labels=None):
        logits = self.classifier(self.body(x).last_hidden_state)
        return type("Out", (), {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits})()


def test_an_untraceable_final_transform_is_one_clear_error() -> None:
    model = _ToyForSequenceClassification()
    batch = {"x": torch.randn(3, 4), "labels": torch.tensor([0, 1, 0])}
    with pytest.raises(ModelError, match=r"last_hidden_state.*traced: nothing.*readout=fn"):
        layer_losses(model, batch)


def test_registered_readouts_keep_priority() -> None:
    class Constant(Readout):
        name = "constant"

        def supports(self, model: nn.Module) -> bool:
            return type(model).__name__ == "BertForSequenceClassification"

        def compute(self, model, batch, call_model):
            return torch.zeros(3)

    custom = register_readout(Constant())
    try:
        assert torch.equal(layer_losses(tiny_family("BERT"), family_batch("BERT")), torch.zeros(3))
    finally:
        _REGISTRY.remove(custom)
    assert layer_losses(tiny_family("BERT"), family_batch("BERT"))[-1] > 0


def test_the_head_replay_reaches_a_backbone_called_through_an_inner_module() -> None:
    # OPTForCausalLM calls model.decoder, not model: the replay must still hand it the state we choose
    from descentlab.readout.structure import backbone_forward, replay_head

    model = tiny_family("OPT (project_out)")
    batch = family_batch("OPT (project_out)")
    base = model.base_model
    plan, out = backbone_forward(base, lambda: base(**batch, output_hidden_states=True))
    fake = type(out)(**{**dict(out.items()), "last_hidden_state": torch.zeros_like(out.last_hidden_state)})
    logits = replay_head(model, base, fake, {"input_ids": batch["input_ids"]}, plan).logits
    torch.testing.assert_close(logits, model.lm_head(torch.zeros_like(out.last_hidden_state)))


@pytest.mark.parametrize(
    "name", [n for n in FAMILIES if n.startswith(("OPT", "ModernBERT", "DeBERTa", "Falcon"))]
)
def test_train_mode_readout_with_dropout_is_differentiable(name: str) -> None:
    import transformers

    _, config_cls, model_cls, kwargs = FAMILIES[name]
    kwargs = {k: v for k, v in kwargs.items() if "drop" not in k and k != "attn_implementation"}
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**kwargs)).train()
    f = layer_losses(model, family_batch(name))
    assert f.shape == (3,) and torch.isfinite(f).all()
    f.sum().backward()
    assert all(
        p.grad is not None for n, p in model.named_parameters() if ".layers.0." in n or ".layer.0." in n
    )
