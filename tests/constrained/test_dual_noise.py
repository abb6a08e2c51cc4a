"""λ under noisy ĝ (issue 46): clamping λ at 0 turns zero-mean noise into λ > 0 on a constraint that holds.

Checked three ways: the closed form (Spitzer's identity, :func:`clamped_ascent_mean`) against Siegmund's
corrected diffusion limit; synthetic ĝ with a known mean and noise through ``LayerwiseDescent``'s own dual
update, against that closed form; and a real tiny causal LM whose sampled readout drives the dual step,
with the window chosen online by :func:`dual_window`. With the window, λ on constraints that hold stays at 0
within the stated tolerance while λ on violated ones grows by η·m per dual step.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

import descentlab as dl
from descentlab.constrained.descent import clamped_ascent_mean, dual_window
from descentlab.errors import ConfigError
from descentlab.readout import CausalLMReadout, layer_losses

if __name__ == "__main__":  # run as a script: the tests folder holds tiny_models
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_models import tiny_gpt2

# ζ(1/2) / √(2π): Siegmund's constant for the Gaussian random walk's maximum
SIEGMUND = -1.4603545088095868 / math.sqrt(2 * math.pi)


def test_the_closed_form_meets_siegmund_and_kingman() -> None:
    # drift 0.01 sd per step: Siegmund's corrected diffusion limit η(σ²/2m - 0.5826 σ), to O(m)
    got = clamped_ascent_mean(0.01, -0.01, 1.0)
    assert abs(got / (0.01 * (1.0 / 0.02 + SIEGMUND)) - 1) < 2e-4
    for sd in (0.25, 0.5, 1.0, 2.0, 4.0):  # Kingman's bound η σ² / 2m
        assert 0 < clamped_ascent_mean(0.1, -1.0, sd) <= 0.1 * sd**2 / 2
    assert clamped_ascent_mean(0.3, -1.0, 0.0) == 0.0
    with pytest.raises(ConfigError):
        clamped_ascent_mean(0.1, 0.5, 1.0)  # a violated constraint has no stationary λ


def test_dual_window() -> None:
    assert dual_window(2.0, 1.0, 0.5) == 16  # (2 / 0.5)²
    assert dual_window(torch.tensor([0.1, float("nan"), 0.3]), torch.tensor([1.0, 1.0, -1.0]), 0.5) == 1
    assert dual_window(torch.tensor([0.49, 0.3]), torch.tensor([0.5, 1.0]), 0.5) == 4  # ⌈3.84⌉
    for bad in (0.0, 1.5):
        with pytest.raises(ConfigError):
            dual_window(1.0, 1.0, bad)


def _synthetic(window: int, steps: int, chains: int = 2000, lr: float = 0.1, m: float = 1.0, sd: float = 2.0):
    """``chains`` constraints that hold (ĝ ~ N(-m, sd²)) and as many violated (N(+m, sd²)), each an independent
    layer of one LayerwiseDescent, through lagrangian + dual_step_ as PrimalDual calls them."""
    layers = 2 * chains
    constraint = dl.LayerwiseDescent(
        num_layers=layers, alpha=0.0, dual_lr=lr, dual_every=window, max_multiplier=None
    )
    mean = torch.cat([torch.full((chains,), -m), torch.full((chains,), m)]).double()
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        g = mean + sd * torch.randn(layers, generator=gen, dtype=torch.float64)
        f = torch.cat([torch.zeros(1, dtype=torch.float64), g.cumsum(0)])  # α = 0: ĝ_l = f_l - f_{l-1} = g_l
        constraint.lagrangian(f, record=True)
        constraint.dual_step_()
    lam = constraint.multipliers
    return lam[:chains], lam[chains:]


def test_noise_alone_lifts_lambda_on_a_constraint_that_holds_as_spitzer_says() -> None:
    """One step's ĝ with a standard error twice the margin (the issue's SmolLM2 regime): λ on a constraint
    that holds averages 1.06 η m, as much as one dual step of a violated constraint adds."""
    lr, m, sd = 0.1, 1.0, 2.0
    hold, violated = _synthetic(window=1, steps=300, lr=lr, m=m, sd=sd)
    expected = clamped_ascent_mean(lr, -m, sd)
    assert abs(float(hold.mean()) - expected) < 4 * float(hold.std()) / math.sqrt(hold.numel())
    assert expected > lr * m  # the noise problem: as large as a step of growth
    assert abs(float(violated.mean()) - lr * m * 300) < 4 * float(violated.std()) / math.sqrt(
        violated.numel()
    )


def test_a_window_from_dual_window_keeps_lambda_at_zero_where_the_constraint_holds() -> None:
    """The window that puts the mean ĝ's standard error at half the margin (W = 16 here): λ on constraints
    that hold is 0 in >= 95 % of the chains and averages below the stated tolerance (Spitzer's value plus 4
    Monte Carlo errors, and Kingman's η c² m / 2), while violated ones grow by η m per dual step."""
    lr, m, sd, fraction = 0.1, 1.0, 2.0, 0.5
    window = dual_window(sd, m, fraction)
    assert window == 16
    steps = 300 * window
    hold, violated = _synthetic(window=window, steps=steps, lr=lr, m=m, sd=sd)
    tolerance = clamped_ascent_mean(lr, -m, sd / math.sqrt(window))
    mc = float(hold.std()) / math.sqrt(hold.numel())
    assert float(hold.mean()) <= tolerance + 4 * mc and tolerance <= lr * fraction**2 * m / 2
    assert float((hold == 0).double().mean()) >= 0.95
    growth = lr * m * steps / window
    assert abs(float(violated.mean()) / growth - 1) < 0.01 and bool((violated > 0).all())


def _trained_lm() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """A tiny GPT-2 fitted for 40 steps to a learnable sequence, so its logit-lens profile descends."""
    model = tiny_gpt2(layers=4, hidden=32, vocab=64, positions=64, seed=0)
    ids = torch.randint(0, 64, (8, 33), generator=torch.Generator().manual_seed(3))
    ids[:, 1:] = (ids[:, :-1] * 5 + 3) % 64
    ids[:, 1::4] = torch.randint(0, 64, ids[:, 1::4].shape, generator=torch.Generator().manual_seed(4))
    batch = {"input_ids": ids, "labels": ids}
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(40):
        model(**batch).loss.backward()
        opt.step()
        opt.zero_grad()
    return model.eval(), batch


def _run(model, batch, alpha: torch.Tensor, window: int | None, steps: int, lr: float, margin: float):
    """The sampled readout (k = 16 of N = 256) drives LayerwiseDescent's dual step for ``steps`` steps;
    ``window`` None: chosen online from the first step's standard errors by dual_window."""
    readout = CausalLMReadout(sample_tokens=16, generator=torch.Generator().manual_seed(1))
    constraint = dl.LayerwiseDescent(num_layers=4, alpha=alpha.tolist(), dual_lr=lr, max_multiplier=None)
    lams, step_se = [], []
    with torch.no_grad():
        for _ in range(steps):
            f = layer_losses(model, batch, readout=readout)
            se = readout.last_estimate.violation_errors(f, constraint.alpha)
            step_se.append(se)
            if window is None:  # measured online, from this step's own draw
                window = dual_window(se, margin, 0.5)
            constraint.dual_every = window
            constraint.lagrangian(f, record=True, estimate=readout.last_estimate)
            if constraint.dual_step_():
                lams.append(constraint.multipliers.clone())
    return torch.stack(lams), window, constraint, torch.stack(step_se)


def test_on_a_real_tiny_lm_lambda_stays_at_zero_on_held_constraints_and_grows_on_violated() -> None:
    model, batch = _trained_lm()
    with torch.no_grad():
        exact = layer_losses(model, batch, readout=CausalLMReadout(sample_tokens=None))
    # α chosen from the exact profile: layers 1, 2 hold by m, layers 3, 4 are violated by m, where m is
    # about one step's standard error of ĝ (a 16 % chance of the wrong sign per step)
    margin = 0.15
    target = torch.tensor([-margin, -margin, margin, margin], dtype=torch.float64)
    alpha = 1 - (exact[1:].double() - target) / exact[:-1].double()
    assert bool(((alpha > 0) & (alpha < 1)).all()), alpha
    g_exact = exact[1:].double() - (1 - alpha) * exact[:-1].double()
    torch.testing.assert_close(g_exact, target)
    lr = 0.5

    lams, window, constraint, step_se = _run(model, batch, alpha, None, 400, lr, margin)
    sigma = step_se[:, :3].mean(0)  # ĝ_4 reads f_4 exactly: only f̂_3 varies there
    assert 2 <= window <= 8, (window, sigma)  # (σ / (m / 2))² with σ ≈ m
    # the window mean's standard error is what the readout stated, over √W
    stated = constraint.dual_standard_error[:3].float()
    torch.testing.assert_close(stated, sigma / math.sqrt(window), rtol=0.25, atol=0)
    tail = lams[len(lams) // 2 :]
    bar = constraint.dual_standard_error.double()
    for layer in (0, 1):  # held: λ is 0 on >= 80 % of the dual steps and within the stated tolerance
        tolerance = clamped_ascent_mean(lr, -margin, float(bar[layer]))
        assert float((tail[:, layer] == 0).double().mean()) >= 0.8, tail[:, layer]
        assert float(tail[:, layer].mean()) <= 5 * tolerance + 1e-3, (tail[:, layer].mean(), tolerance)
    for layer in (2, 3):  # violated: λ grows by about η m per dual step
        growth = lr * margin * len(lams)
        assert 0.6 < float(lams[-1, layer]) / growth < 1.4, (lams[-1], growth)

    # the same run with a dual step per step: the held constraints' λ leaves 0 far more often
    plain, _, _, _ = _run(model, batch, alpha, 1, 200, lr, margin)
    tail_plain = plain[len(plain) // 2 :]
    assert float(tail_plain[:, :2].mean()) > 5 * float(tail[:, :2].mean()) + 1e-3


if __name__ == "__main__":  # the figures docs/constrained.md quotes
    lr, m, sd = 0.1, 1.0, 2.0
    for window in (1, dual_window(sd, m, 0.5)):
        hold, violated = _synthetic(window=window, steps=300 * window, lr=lr, m=m, sd=sd)
        print(
            f"synthetic, g = -/+{m}, sd {sd}, eta {lr}, W = {window}: held lambda mean {float(hold.mean()):.4f} "
            f"(Spitzer {clamped_ascent_mean(lr, -m, sd / math.sqrt(window)):.4f}, Kingman "
            f"{lr * sd**2 / window / (2 * m):.4f}), P(lambda = 0) {float((hold == 0).double().mean()):.3f}; "
            f"violated lambda mean {float(violated.mean()):.2f} (eta m dual steps {lr * m * 300:.2f})"
        )
    model, batch = _trained_lm()
    with torch.no_grad():
        exact = layer_losses(model, batch, readout=CausalLMReadout(sample_tokens=None))
    margin = 0.15
    target = torch.tensor([-margin, -margin, margin, margin], dtype=torch.float64)
    alpha = 1 - (exact[1:].double() - target) / exact[:-1].double()
    print(
        "tiny GPT-2, exact f",
        [round(float(x), 4) for x in exact],
        "alpha",
        [round(float(a), 4) for a in alpha],
    )
    for window in (None, 1):
        lams, w, constraint, step_se = _run(model, batch, alpha, window, 400, 0.5, margin)
        tail = lams[len(lams) // 2 :]
        bar = constraint.dual_standard_error
        print(
            f"  W = {w}: {len(lams)} dual steps; per-step se(g) {[round(float(x), 4) for x in step_se.mean(0)]}"
        )
        print(f"    se of the dual step's mean g {[round(float(x), 4) for x in bar]}")
        print(
            "    held (layers 1, 2): P(lambda = 0)",
            [round(float((tail[:, i] == 0).double().mean()), 3) for i in (0, 1)],
            "mean lambda",
            [round(float(tail[:, i].mean()), 5) for i in (0, 1)],
            "Spitzer",
            [round(clamped_ascent_mean(0.5, -margin, float(bar[i])), 5) for i in (0, 1)],
        )
        print(
            "    violated (layers 3, 4): lambda_T",
            [round(float(lams[-1, i]), 3) for i in (2, 3)],
            "eta m dual steps",
            round(0.5 * margin * len(lams), 3),
        )
