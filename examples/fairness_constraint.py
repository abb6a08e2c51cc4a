"""A constraint of your own: demographic parity for a logistic regression, under each of the three formulations.

The constraint is written by the user, not shipped with descentlab: for every group z, the rate of positive
predictions r_z = P(ŷ = 1 | z) must stay within ε of the overall rate r,

    r_z - r - ε <= 0   and   r - r_z - ε <= 0        (2 inequalities per group)

A 0/1 rate has no gradient, so the model sees a differentiable proxy (the rates of sigmoid(logit)) and the
multipliers move with the strict rates (of 1[logit > 0]): ``dl.ConstraintValue(proxy, strict=strict)``.
The same constraint is solved three ways, each with a different ``torch.optim`` optimizer on the
multipliers (``maximize=True``: the dual ascends):

    lagrangian            ψ = Σ λ_i g_i                                   dual: RMSprop
    augmented_lagrangian  ψ = Σ (max(0, λ_i + ρ g_i)² - λ_i²) / (2ρ)        dual: SGD with step ρ (method of
                                                                              multipliers)
    quadratic_penalty     ψ = ½ ρ Σ max(0, g_i)²                          no multipliers

Momentum on the multipliers makes them overshoot: with Adam at its default β1 = 0.9 (lr 0.02) the last
iterate's parity gap here swings between 0.03 and 0.26 over the last epochs; RMSprop (no momentum) settles.

    python examples/fairness_constraint.py --tiny     # seconds
    python examples/fairness_constraint.py            # more data, more epochs
"""

from __future__ import annotations

import argparse

import torch
from torch.nn.functional import binary_cross_entropy_with_logits, one_hot

import descentlab as dl

GROUPS, EPSILON = 3, 0.05


def synthetic_data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Features (with the group's one-hot), labels, groups; the groups' base rates differ."""
    g = torch.Generator().manual_seed(seed)
    group = torch.multinomial(torch.tensor([0.5, 0.3, 0.2]), n, replacement=True, generator=g)
    x = torch.randn(n, 6, generator=g)
    x[:, 0] += torch.tensor([0.6, 0.0, -0.6])[group]
    score = x[:, 0] + 0.5 * x[:, 1] - 0.3 * x[:, 2] + torch.tensor([0.8, -0.2, -1.0])[group]
    y = (score + 0.5 * torch.randn(n, generator=g) > 0).float()
    return torch.cat([x, one_hot(group, GROUPS).float()], dim=1), y, group


def parity_violations(rates: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """The user's constraint values: [r_z - r - ε] + [r - r_z - ε] over the groups (<= 0 where met)."""
    members = one_hot(group, GROUPS).to(rates.dtype)
    counts = members.sum(0)
    overall = rates.mean()
    per_group = torch.where(counts > 0, rates @ members / counts.clamp_min(1), overall)
    return torch.cat([per_group - overall - EPSILON, overall - per_group - EPSILON])


# the dual optimizer of each formulation: any torch.optim optimizer, built with maximize=True (the dual ascends)
DUALS = {
    "lagrangian": lambda params: torch.optim.RMSprop(params, lr=0.01, maximize=True),
    "augmented_lagrangian": lambda params: torch.optim.SGD(params, lr=1.0, maximize=True),  # step = ρ
    "quadratic_penalty": None,  # no multipliers, nothing to ascend
}
PENALTY = {"augmented_lagrangian": 1.0, "quadratic_penalty": 100.0}


def train(
    formulation: str, data, epochs: int, batch: int, dual=None
) -> tuple[torch.nn.Linear, dl.ConstraintSet]:
    """Logistic regression under the parity constraint; ``dual`` (params -> optimizer) replaces DUALS'."""
    x, y, group = data
    parity = dl.Constraint("parity", 2 * GROUPS, formulation=formulation, penalty=PENALTY.get(formulation))
    constraints = dl.ConstraintSet([parity], dual_optimizer=dual or DUALS[formulation])

    torch.manual_seed(0)
    model = torch.nn.Linear(x.shape[1], 1)
    optimizer = dl.PrimalDual(torch.optim.SGD(model.parameters(), lr=1.0), constraints)
    order = torch.Generator().manual_seed(1)
    for _ in range(epochs):
        for idx in torch.randperm(len(y), generator=order).split(batch):
            logits = model(x[idx]).squeeze(-1)
            loss = binary_cross_entropy_with_logits(logits, y[idx])
            value = dl.ConstraintValue(
                parity_violations(torch.sigmoid(logits), group[idx]),  # the model follows this proxy
                strict=parity_violations((logits > 0).float(), group[idx]),  # the multipliers follow this
            )
            constraints.lagrangian(loss, parity=value).backward()
            optimizer.step()  # primal step, then the dual step
            optimizer.zero_grad()
    return model, constraints


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="fewer examples and epochs (seconds)")
    args = parser.parse_args()
    n, epochs = (3000, 30) if args.tiny else (30000, 30)
    data = synthetic_data(n)
    x, y, group = data

    print(f"{'formulation':<22} {'dual':<8} {'max |r_z - r|':>14} {'accuracy':>9}  max λ")
    for formulation in ("none", "lagrangian", "augmented_lagrangian", "quadratic_penalty"):
        if formulation == "none":  # the unconstrained baseline: the same loop without constraint values
            torch.manual_seed(0)
            model = torch.nn.Linear(x.shape[1], 1)
            opt = torch.optim.SGD(model.parameters(), lr=1.0)
            order = torch.Generator().manual_seed(1)
            for _ in range(epochs):
                for idx in torch.randperm(n, generator=order).split(500):
                    binary_cross_entropy_with_logits(model(x[idx]).squeeze(-1), y[idx]).backward()
                    opt.step()
                    opt.zero_grad()
            constraints = None
        else:
            model, constraints = train(formulation, data, epochs, batch=500)
        with torch.no_grad():
            predicted = (model(x).squeeze(-1) > 0).float()
            gap = float(parity_violations(predicted, group).max()) + EPSILON
            acc = float((predicted == y).float().mean())
        dual = "-"
        lam = "-"
        if constraints is not None and constraints["parity"].multipliers is not None:
            dual = type(constraints.dual_optimizer).__name__
            lam = f"{float(constraints['parity'].multipliers.max()):.3f}"
        print(f"{formulation:<22} {dual:<8} {gap:>14.3f} {acc:>9.3f}  {lam}")
    print(f"(ε = {EPSILON}; strict rates of 1[logit > 0] on all {n} examples)")


if __name__ == "__main__":
    main()
