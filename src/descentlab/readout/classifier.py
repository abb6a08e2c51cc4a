"""Classifiers of any Hugging Face family: the model's own pooler, head and loss on every layer.

f_l = loss of head(pool(tail(Φ_l)))    l = 0..L

where ``tail`` is what the backbone applies after its last block (a final norm, or nothing), ``pool`` its
pooler (BERT, ALBERT) if it has one, and ``head`` everything the task model does with the backbone output:
DeBERTa's ContextPooler, ModernBERT's head with its norm and its ``classifier_pooling`` (mean or cls),
RoBERTa/MPNet's classification head, DistilBERT's pre-classifier, GPT-2's last-token score, ViT's
classifier on the CLS token, and the model's loss rule (``problem_type``). The tail and pooler are traced
from the model's structure (:mod:`descentlab.readout.structure`), once per model, on a separate forward of
one row and two positions without gradients, so the training forward runs without hooks. The head is
*replayed*: the task model's forward runs with its backbone returning layer l's output, so nothing of it
is re-implemented and f_L is the model's own loss. The backbone runs once; the head runs L+1 times on B rows each.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from descentlab.readout.base import (
    Batch,
    InnerCall,
    Readout,
    accepts,
    hidden_states_of,
    model_inputs,
    require_labels,
    unwrap,
)
from descentlab.readout.structure import (
    backbone_forward,
    backbone_of,
    layer_output,
    loss_of,
    minimal_inputs,
    replay_head,
)


class ClassifierReadout(Readout):
    """Per-layer loss of a Hugging Face task model whose class name ends with one of ``suffixes``.

    Needs ``batch['labels']``. Families are recognised by their structure (a backbone returning L+1 hidden
    states, a head that reads its output), not by a list of classes.
    """

    name = "classifier"
    suffixes: tuple[str, ...] = ("ForSequenceClassification", "ForImageClassification")

    def supports(self, model: nn.Module) -> bool:
        base = getattr(model, "base_model", None)
        return (
            type(model).__name__.endswith(self.suffixes) and isinstance(base, nn.Module) and base is not model
        )

    def compute(self, model: nn.Module, batch: Batch, call_model: InnerCall) -> Tensor:
        labels = require_labels(batch)
        outs = self._replay(model, batch, call_model, labels)
        return torch.stack([loss_of(o, type(model).__name__).reshape(()) for o in outs])

    def layer_logits(self, model: nn.Module, batch: Batch) -> Tensor:
        """The logits the model would output if it ended at each layer, ``[L+1, B, C]`` (no labels needed).

        The per-example view of :meth:`compute`: the same backbone pass and head replays, so
        ``loss(layer_logits[l], labels)`` is f_l. Evaluation only (call under ``torch.no_grad``).
        """
        outs = self._replay(unwrap(model), batch, unwrap(model), None)
        return torch.stack([o.logits for o in outs])

    def _replay(self, model: nn.Module, batch: Batch, call_model: InnerCall, labels: Tensor | None) -> list:
        base = backbone_of(model)
        inputs = model_inputs(base, batch)
        if accepts(base, "use_cache"):
            inputs["use_cache"] = False

        def run(small: dict | None = None):
            return base(**(inputs if small is None else small), output_hidden_states=True, return_dict=True)

        plan, out = backbone_forward(base, run, lambda tokens: run(minimal_inputs(inputs, tokens)))
        states = hidden_states_of(out, getattr(model.config, "num_hidden_layers", None), model)
        head_inputs = model_inputs(model, batch)
        if labels is not None:
            head_inputs["labels"] = labels
        outs = []
        for layer, state in enumerate(states):
            layer_out = out if layer == len(states) - 1 else layer_output(out, plan, base, state)
            outs.append(replay_head(call_model, base, layer_out, head_inputs, plan))
        return outs
