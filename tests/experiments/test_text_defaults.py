"""text-robustness's default constraint cannot be gamed: no loss weight is negative, f_0 carries none, and
training with it does not raise f_0 above ERM's, where the old setting did."""

from __future__ import annotations

import torch

from descentlab.experiments.text_robustness import config as tr
from descentlab.readout import layer_losses
from descentlab.train.recipe import build_recipe, with_overrides
from tiny_models import tiny_bert


def test_default_lagrangian_weights_are_never_negative() -> None:
    constraint = tr.base_method().constraint.build(4)
    constraint.duals.lam = torch.tensor([0.7, 0.9, 0.2, 1.5], dtype=torch.float64)
    f = torch.tensor([0.69, 0.68, 0.6, 0.55, 0.5], requires_grad=True)
    constraint.lagrangian(f).backward()
    weights = f.grad.tolist()
    assert weights[0] == 0.0  # f_0 has no weight at all: layer 1 is unconstrained, f_{l-1} detached
    assert all(w >= 0.0 for w in weights)
    assert weights[-1] == 1.0 + 1.5
    # the non-detached difference form gives f_0 (and middle layers) negative weights
    old = with_overrides(tr.base_method(), "constraint.detach_prev=false constraint.constrain_first=true")
    gamed = old.constraint.build(4)
    gamed.duals.lam = constraint.duals.lam.clone()
    g = torch.tensor(f.detach().tolist(), requires_grad=True)
    gamed.lagrangian(g).backward()
    assert g.grad[0] < 0


def _train(spec: str, steps: int = 60) -> float:
    """f_0 on held-out data after training a tiny [CLS]-readout BERT on a token-presence task."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 97, (256, 12), generator=gen)
    ids[:, 0] = 2  # a [CLS]-like first token: the layer-0 [CLS] state is the same for every input
    labels = (ids[:, 1:] < 30).any(1).long()
    model = tiny_bert(layers=3, seed=0)
    method = with_overrides(tr.base_method(), f"optimizer.lr=3e-3 {spec}")
    recipe = build_recipe(method, model, total_steps=steps)
    torch.manual_seed(0)
    for step in range(steps):
        rows = torch.arange(step * 16, step * 16 + 16) % 192
        batch = {"input_ids": ids[rows], "attention_mask": torch.ones_like(ids[rows]), "labels": labels[rows]}
        loss, _ = recipe.objective(model, batch)
        loss.backward()
        recipe.optimizer.step()
        recipe.optimizer.zero_grad()
    model.eval()
    held = {"input_ids": ids[192:], "attention_mask": torch.ones_like(ids[192:]), "labels": labels[192:]}
    with torch.no_grad():
        return float(layer_losses(model, held)[0])


def test_constrained_defaults_do_not_raise_f0_above_erm() -> None:
    erm = _train("")
    default = _train("objective=constrained constraint.dual_lr=1.0 constraint.alpha=0.3")
    gamed = _train(
        "objective=constrained constraint.dual_lr=1.0 constraint.alpha=0.3 "
        "constraint.detach_prev=false constraint.constrain_first=true"
    )
    # f_0 is the loss of a constant predictor (the layer-0 [CLS] state is the same for every input)
    assert default <= erm + 5e-3
    assert (
        gamed > erm + 0.2
    )  # the old, non-detached setting does game f_0 (0.61 vs 0.02): the test can see it
