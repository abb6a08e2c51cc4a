"""LayerwiseDescent: violations, Lagrangian, options, cadence, validation and divergence errors."""

from __future__ import annotations

import pytest
import torch

from descentlab.constrained import (
    LayerwiseDescent,
    Resilience,
    decay_dual_step,
    descent_violations,
    dual_ascent,
    resolve_alpha,
    slack_dual_step,
)
from descentlab.errors import ConfigError, InfeasibleConstraintError, ModelError, NumericalError


def _f(values, requires_grad=True) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64, requires_grad=requires_grad)


def test_violations_difference_and_ratio_forms() -> None:
    f = _f([2.0, 1.5, 1.6, 0.4])
    alpha = torch.tensor([0.1, 0.2, 0.5], dtype=torch.float64)
    diff = descent_violations(f, alpha)
    torch.testing.assert_close(diff, _f([1.5 - 0.9 * 2.0, 1.6 - 0.8 * 1.5, 0.4 - 0.5 * 1.6], False))
    ratio = descent_violations(f, alpha, form="ratio")
    torch.testing.assert_close(ratio, _f([1.5 / 2.0 - 0.9, 1.6 / 1.5 - 0.8, 0.4 / 1.6 - 0.5], False))


def test_lagrangian_value_and_gradients_with_and_without_detach_prev() -> None:
    lam = torch.tensor([0.5, 0.0, 2.0], dtype=torch.float64)
    for detach in (False, True):
        c = LayerwiseDescent(3, alpha=[0.1, 0.2, 0.3], dual_lr=0.1, detach_prev=detach)
        c.duals.lam = lam.clone()
        f = _f([2.0, 1.5, 1.6, 0.4])
        loss = c.lagrangian(f)
        keep = torch.tensor([0.9, 0.8, 0.7], dtype=torch.float64)
        expected = 0.4 + (lam * (f[1:] - keep * f[:-1])).sum()
        torch.testing.assert_close(loss, expected)
        loss.backward()
        # ∂L/∂f_l = λ_l - λ_{l+1}(1-α_{l+1}) (the second term vanishes with detach_prev), plus 1 at l = L
        grad = torch.zeros(4, dtype=torch.float64)
        grad[1:] += lam
        if not detach:
            grad[:-1] -= lam * keep
        grad[-1] += 1.0
        torch.testing.assert_close(f.grad, grad)


def test_alpha_schedules_and_validation() -> None:
    torch.testing.assert_close(resolve_alpha(0.1, 3), torch.full((3,), 0.1, dtype=torch.float64))
    torch.testing.assert_close(
        resolve_alpha(lambda l: 0.01 * l, 3), torch.tensor([0.01, 0.02, 0.03]).double()
    )
    with pytest.raises(ConfigError, match=r"\[0, 1\)"):
        LayerwiseDescent(3, alpha=1.0, dual_lr=0.1)
    with pytest.raises(ConfigError, match=r"\[0, 1\)"):
        LayerwiseDescent(3, alpha=[0.1, -0.1, 0.1], dual_lr=0.1)
    with pytest.raises(ConfigError, match="2 values for num_layers=3"):
        LayerwiseDescent(3, alpha=[0.1, 0.1], dual_lr=0.1)
    with pytest.raises(ConfigError, match="dual_lr"):
        LayerwiseDescent(3, alpha=0.1, dual_lr=0.0)
    with pytest.raises(ConfigError, match=r"outside 1\.\.3"):
        LayerwiseDescent(3, alpha=0.1, dual_lr=0.1, layers=[0, 2])


def test_wrong_number_of_losses_names_both_numbers() -> None:
    c = LayerwiseDescent(6, alpha=0.1, dual_lr=0.1)
    with pytest.raises(ModelError, match=r"7 losses.*num_layers=6.*\(5,\)"):
        c.lagrangian(torch.ones(5))


def test_masked_layers_keep_zero_multipliers_and_log_dict_keys() -> None:
    c = LayerwiseDescent(3, 0.1, dual_lr=1.0, constrain_first=False, layers=[1, 2])
    loss = c.lagrangian(_f([1.0, 2.0, 3.0, 4.0]))  # every constraint violated
    loss.backward()
    c.dual_step_()
    lam = c.multipliers
    assert lam[0] == 0 and lam[2] == 0 and lam[1] > 0  # only layer 2 is constrained
    logs = c.log_dict()
    assert set(logs) == {"f/0", "f/1", "f/2", "f/3", "g/1", "g/2", "g/3", "lambda/1", "lambda/2", "lambda/3"}
    assert logs["lambda/2"] == pytest.approx(3.0 - 0.9 * 2.0)
    r = LayerwiseDescent(3, 0.1, dual_lr=1.0, resilience=Resilience(2.0))
    assert {"u/1", "u/2", "u/3"} <= set(r.log_dict())


def test_evaluation_under_no_grad_does_not_move_lambda() -> None:
    c = LayerwiseDescent(2, 0.1, dual_lr=1.0)
    with torch.no_grad():
        c.lagrangian(_f([1.0, 2.0, 3.0], requires_grad=False))
    assert not c.dual_step_()
    assert float(c.multipliers.abs().sum()) == 0.0


def test_dual_every_k_uses_the_mean_violation_of_the_window() -> None:
    c = LayerwiseDescent(1, 0.0, dual_lr=1.0, dual_every=3)
    moved = []
    for value in (1.0, 2.0, 6.0):  # ĝ = f_1 - f_0 with f_0 = 0
        c.lagrangian(_f([0.0, value]))
        moved.append(c.dual_step_())
    assert moved == [False, False, True]
    assert float(c.multipliers[0]) == pytest.approx(3.0)


def test_epoch_cadence_moves_only_at_end_epoch_and_accepts_full_pass_losses() -> None:
    c = LayerwiseDescent(1, 0.0, dual_lr=1.0, dual_cadence="epoch")
    for value in (1.0, 3.0):
        c.lagrangian(_f([0.0, value]))
        assert not c.dual_step_()
    assert c.end_epoch()
    assert float(c.multipliers[0]) == pytest.approx(2.0)
    c.lagrangian(_f([0.0, 100.0]))
    c.end_epoch(f=torch.tensor([1.0, 0.5], dtype=torch.float64))  # a full pass replaces the batch estimates
    assert float(c.multipliers[0]) == pytest.approx(1.5)


def test_pure_dual_updates() -> None:
    lam = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)
    g = torch.tensor([-1.0, 0.5, -4.0], dtype=torch.float64)
    torch.testing.assert_close(dual_ascent(lam, g, 0.5), torch.tensor([0.0, 1.25, 0.0], dtype=torch.float64))
    torch.testing.assert_close(decay_dual_step(lam, g, 0.5, 2.0), torch.clamp(0.75 * lam + 0.5 * g, min=0))
    u = torch.tensor([0.2, 0.2, 0.2], dtype=torch.float64)
    lam2, u2 = slack_dual_step(lam, u, g, 0.5, 0.1, 2.0)
    torch.testing.assert_close(u2, torch.clamp(u + 0.1 * (lam - 2.0 * u), min=0))
    torch.testing.assert_close(lam2, torch.clamp(lam + 0.5 * (g - u2), min=0))


def test_infeasible_constraint_raises_naming_the_layer() -> None:
    c = LayerwiseDescent(2, 0.1, dual_lr=10.0, max_multiplier=50.0)
    with pytest.raises(InfeasibleConstraintError, match=r"layer 2.*resilience"):
        for _ in range(20):
            c.lagrangian(_f([1.0, 0.5, 2.0]))
            c.dual_step_()
    p = LayerwiseDescent(2, 0.1, dual_lr=1e-3, max_multiplier=None, divergence_patience=5)
    with pytest.raises(InfeasibleConstraintError, match=r"layer 2.*5 dual updates in a row"):
        for _ in range(5):
            p.lagrangian(_f([1.0, 0.5, 2.0]))
            p.dual_step_()


def test_non_finite_violation_raises() -> None:
    c = LayerwiseDescent(2, 0.1, dual_lr=0.1)
    c.lagrangian(_f([1.0, float("nan"), 2.0]))
    with pytest.raises(NumericalError, match="non-finite"):
        c.dual_step_()


def test_resilience_validation() -> None:
    with pytest.raises(ConfigError):
        Resilience(penalty=0.0)
    with pytest.raises(ConfigError):
        Resilience(penalty=1.0, form="hinge")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="one per layer"):
        LayerwiseDescent(3, 0.1, 0.1, Resilience(penalty=[1.0, 2.0]))


def test_profile_constraints_keep_only_descending_layers_with_alpha_from_the_drop() -> None:
    from descentlab.constrained import DescentConfig, profile_constraints

    profile = [100.0, 16.0, 18.0, 20.0, 15.0, 12.0, 12.5, 6.0]
    layers, alphas = profile_constraints(profile, alpha_scale=0.5)
    assert layers == [4, 5, 7]  # layer 1 skipped (its f_0 is the raw embedding), 2, 3, 6 rise
    assert alphas[3] == pytest.approx(0.5 * (1 - 15 / 20)) and alphas[6] == pytest.approx(0.5 * 0.52)
    assert [a for i, a in enumerate(alphas) if i + 1 not in layers] == [0.0] * 4
    # the reference meets every such constraint: f_l <= (1 - α_l) f_{l-1} with margin at scale <= 1
    for layer in layers:
        assert profile[layer] <= (1 - alphas[layer - 1]) * profile[layer - 1]
    tight = profile_constraints(profile, alpha_scale=1.0, alpha_max=0.3)[1]
    assert tight[6] == 0.3  # capped
    assert profile_constraints(profile, skip_first=False, min_drop=0.2)[0] == [1, 4, 7]
    cfg = DescentConfig(layers=layers, layer_alphas=alphas)
    c = cfg.build(len(profile) - 1)
    torch.testing.assert_close(c.alpha, torch.tensor(alphas, dtype=torch.float64))
    with pytest.raises(ConfigError):
        DescentConfig(layer_alphas=[0.1, 1.5])
    with pytest.raises(ConfigError):
        DescentConfig(layer_alphas=[0.1]).build(3)
    with pytest.raises(ConfigError):
        profile_constraints([1.0, 2.0, 3.0])  # never descends


def test_constraints_met_on_a_flat_profile_warn_once() -> None:
    """Nothing detached, every constraint holds, but the profile only descends at the last layer (layers
    near chance, α small): the defaults were gamed, and the log read says so once; the studies' settings
    (detach_prev) and a profile that descends through the layers do not warn."""
    import warnings

    from descentlab.constrained import LayerwiseDescent

    flat = torch.tensor([0.700, 0.690, 0.683, 0.300])
    steep = torch.tensor([0.700, 0.500, 0.400, 0.300])
    for f, detach, warns in ((flat, False, True), (flat, True, False), (steep, False, False)):
        c = LayerwiseDescent(num_layers=3, alpha=0.01, dual_lr=0.1, detach_prev=detach)
        c.lagrangian(f.clone().requires_grad_(True))
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            dict(c.log_values())
            dict(c.log_values())  # once
        flagged = [w for w in seen if "flat until the last layer" in str(w.message)]
        assert len(flagged) == (1 if warns else 0), (f, detach)
