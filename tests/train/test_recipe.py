"""train/recipe.py: one MethodConfig -> what fit takes, for every objective, optimizer and AC/DC."""

from __future__ import annotations

import pytest
import torch

from descentlab.constrained.config import DescentConfig
from descentlab.constrained.primal_dual import PrimalDual
from descentlab.errors import ConfigError
from descentlab.optim.config import OptimizerConfig
from descentlab.readout import layer_losses
from descentlab.sparsity import ACDC, sparsity_report
from descentlab.sparsity.config import ACDCConfig
from descentlab.train.recipe import MethodConfig, build_recipe, methods_from_specs, with_overrides
from tiny_models import tiny_bert, token_batch

BATCH = token_batch([[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16], [17, 18]], labels=[0, 1, 1, 0])


def _step(recipe, model) -> torch.Tensor:
    loss, _ = recipe.objective(model, BATCH)
    loss.backward()
    if recipe.sparsity is not None:
        recipe.sparsity.before_optimizer_step()
    recipe.optimizer.step()
    recipe.optimizer.zero_grad()
    if recipe.sparsity is not None:
        recipe.sparsity.step()
    return loss.detach()


def test_erm_is_plain_adamw_on_the_model_loss() -> None:
    model = tiny_bert()
    method = MethodConfig(optimizer=OptimizerConfig(lr=1e-3, weight_decay=0.0))
    recipe = build_recipe(method, model, total_steps=3)
    assert type(recipe.optimizer) is torch.optim.AdamW and recipe.constraint is None
    loss, _ = recipe.objective(model, BATCH)
    torch.testing.assert_close(loss, model(**BATCH).loss)

    # the same step as a hand-built AdamW on a copy of the model
    twin = tiny_bert()
    reference = torch.optim.AdamW(twin.parameters(), lr=1e-3, weight_decay=0.0)
    _step(recipe, model)
    twin(**BATCH).loss.backward()
    reference.step()
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_constrained_wraps_primal_dual_and_steps_the_duals() -> None:
    model = tiny_bert(layers=3)
    method = with_overrides(
        MethodConfig(), "objective=constrained constraint.alpha=0.5 constraint.dual_lr=1.0"
    )
    recipe = build_recipe(method, model, total_steps=2)
    assert isinstance(recipe.optimizer, PrimalDual)
    with torch.no_grad():
        f = layer_losses(model, BATCH)
    g = f[1:] - 0.5 * f[:-1]  # α = 0.5 everywhere, every layer constrained
    _step(recipe, model)
    expected = torch.clamp(g.double(), min=0.0)  # λ_0 = 0, η_λ = 1: λ = max(0, ĝ)
    torch.testing.assert_close(recipe.constraint.multipliers.double(), expected, rtol=1e-5, atol=1e-6)


def test_resilient_and_hard_constraints_differ_only_in_the_slack() -> None:
    hard, soft = methods_from_specs(
        MethodConfig(objective="constrained"), {"hard": "", "soft": "constraint.resilient=true"}
    ).values()
    assert build_recipe(hard, tiny_bert(), total_steps=1).constraint.slacks is None
    assert build_recipe(soft, tiny_bert(), total_steps=1).constraint.slacks is not None


def test_deep_supervision_is_the_mean_of_layers_one_to_L() -> None:
    model = tiny_bert(layers=3)
    recipe = build_recipe(MethodConfig(objective="deep-supervision"), model, total_steps=1)
    loss, _ = recipe.objective(model, BATCH)
    torch.testing.assert_close(loss, layer_losses(model, BATCH)[1:].mean())


def test_horst_with_acdc_reaches_the_target_sparsity() -> None:
    model = tiny_bert()
    method = MethodConfig(
        optimizer=OptimizerConfig(name="horst", lr=1e-3, alpha=10.0),
        acdc=ACDCConfig(sparsity=0.5, warmup=1, phase=1, last_decompressed=1, final=2),
    )
    recipe = build_recipe(method, model, total_steps=6)
    assert isinstance(recipe.sparsity, ACDC)
    for _ in range(6):
        _step(recipe, model)
    assert recipe.sparsity.compressed
    assert sparsity_report(model).global_sparsity > 0.0
    assert recipe.sparsity.report().global_sparsity == pytest.approx(0.5, abs=1e-3)


def test_cosine_schedule_comes_from_the_optimizer_config() -> None:
    method = MethodConfig(optimizer=OptimizerConfig(lr=1.0, schedule="cosine"))
    recipe = build_recipe(method, tiny_bert(), total_steps=4)
    lrs = []
    for _ in range(4):
        lrs.append(recipe.optimizer.param_groups[0]["lr"])
        recipe.optimizer.step()
        recipe.scheduler.step()
    assert lrs[0] == 1.0 and lrs == sorted(lrs, reverse=True) and lrs[-1] < 1.0


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("objective=sgd", "objective"),
        ("optimizer.nope=1", "bad method spec"),
        ("constraint.alpha=x", "bad method spec"),
    ],
)
def test_bad_specs_name_the_problem(spec: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        with_overrides(MethodConfig(constraint=DescentConfig()), spec)


def test_lr_alpha_grid_is_lr_major_and_keeps_everything_else() -> None:
    from descentlab.study.tuning_rules import lr_alpha_grid

    base = MethodConfig(optimizer=OptimizerConfig(name="horst", lr=1e-3, alpha=2.0, weight_decay=0.05))
    grid = lr_alpha_grid(base, [1e-3, 4e-3], [1.0, 10.0])
    assert [(m.optimizer.lr, m.optimizer.alpha) for m in grid] == [
        (1e-3, 1.0),
        (1e-3, 10.0),
        (4e-3, 1.0),
        (4e-3, 10.0),
    ]
    assert all(m.optimizer.weight_decay == 0.05 and m.optimizer.name == "horst" for m in grid)
    assert [m.optimizer.alpha for m in lr_alpha_grid(base, [1e-3, 2e-3], [])] == [2.0, 2.0]  # its own alpha
    assert base.optimizer.lr == 1e-3 and base.optimizer.alpha == 2.0  # the base is not modified
