"""Local DP on embeddings: sampler distributions, analytic-Gaussian calibration against the authors' values,
privacy loss on neighbouring inputs, composition against closed forms, the hook and the ε curves."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from descentlab.errors import ConfigError
from descentlab.evaluation import EmbeddingGeometry, NoiseEvalConfig, print_gamma_epsilon, robustness_curve
from descentlab.evaluation import accounting as acc
from descentlab.perturbations import ldp, perturb_embeddings
from descentlab.perturbations import noise as nz
from tiny_models import tiny_bert

D = 384  # MiniLM's width: the regime the docs talk about


def _keys(n: int, salt: int = 0) -> torch.Tensor:
    return nz.fold_key(salt, torch.arange(n, dtype=torch.int64))


def _metric_draws(n: int, d: int, epsilon: float, chunk: int = 10_000) -> tuple[np.ndarray, np.ndarray]:
    """(‖z‖, r) of n metric-LDP draws (one token per row) and the Gamma radii they were built from."""
    norms, radii = [], []
    for start in range(0, n, chunk):
        keys = _keys(min(chunk, n - start), salt=start + 1)
        z = ldp.metric_ldp_noise(keys, (len(keys), 1, d), epsilon)
        norms.append(z.norm(dim=-1).flatten().numpy())
        radii.append(ldp.gamma_radius(keys, 1, d, epsilon).flatten().numpy())
    return np.concatenate(norms), np.concatenate(radii)


def test_metric_noise_norm_has_mean_d_over_epsilon_and_a_gamma_radius() -> None:
    eps = 50.0
    norms, radii = _metric_draws(100_000, D, eps)
    np.testing.assert_allclose(norms, radii, rtol=1e-9)  # z = r·u with a unit direction
    assert abs(norms.mean() / (D / eps) - 1) < 0.01
    target = stats.gamma(a=D, scale=1 / eps)
    assert stats.kstest(radii, target.cdf).pvalue > 0.01
    # the test has power: a radius of the wrong shape (d + 1, a 0.26 % shift of the mean) is rejected
    assert stats.kstest(radii, stats.gamma(a=D + 1, scale=1 / eps).cdf).pvalue < 1e-6


def test_metric_noise_direction_is_uniform_on_the_sphere() -> None:
    d, n = 8, 50_000
    z = ldp.metric_ldp_noise(_keys(n), (n, 1, d), 1.0).reshape(n, d)
    u = z / z.norm(dim=1, keepdim=True)
    assert u.mean(dim=0).abs().max() < 4 / math.sqrt(n)  # E u = 0
    np.testing.assert_allclose((u**2).mean(dim=0).numpy(), 1 / d, atol=4 * math.sqrt(2 / d**2 / n))
    # per-coordinate variance (d + 1)/ε², the number γ is matched on
    np.testing.assert_allclose(float((z**2).mean()), ldp.metric_ldp_std(1.0, d) ** 2, rtol=0.02)


def test_analytic_gaussian_sigma_matches_balle_and_wang() -> None:
    # values of calibrateAnalyticGaussianMechanism(ε, δ, GS=1) from Balle & Wang's reference code (ICML 2018)
    published = {
        (1.0, 1e-5): 3.730631634944469,
        (0.5, 1e-5): 7.031826674729583,
        (0.1, 1e-5): 30.74956598384496,
    }
    published |= {(5.0, 1e-5): 0.8918682674886989, (1.0, 1e-3): 2.5746570184940873}
    for (eps, delta), sigma in published.items():
        assert ldp.gaussian_sigma(eps, delta) == pytest.approx(sigma, rel=1e-7)
        assert ldp.gaussian_sigma(eps, delta, 3.0) == pytest.approx(3.0 * sigma, rel=1e-7)  # σ ∝ Δ
    for eps in (0.1, 0.5, 0.9):  # the classical bound holds for ε < 1 and is looser
        assert ldp.classical_gaussian_sigma(eps, 1e-5) > 1.2 * ldp.gaussian_sigma(eps, 1e-5)
    # the calibration is tight, and gaussian_epsilon inverts it, also far out where e^ε overflows naively
    for eps in (0.3, 3.0, 300.0, 5000.0):
        sigma = ldp.gaussian_sigma(eps, 1e-5, 2.0)
        assert ldp.gaussian_delta(sigma, eps, 2.0) == pytest.approx(1e-5, rel=1e-6)
        assert ldp.gaussian_epsilon(sigma, 1e-5, 2.0) == pytest.approx(eps, rel=1e-8)


def test_metric_privacy_loss_is_at_most_epsilon_times_the_distance() -> None:
    d, eps, n = 16, 3.0, 20_000
    g = torch.Generator().manual_seed(0)
    x, x2 = torch.randn(d, generator=g, dtype=torch.float64), torch.randn(d, generator=g, dtype=torch.float64)
    y = x + ldp.metric_ldp_noise(_keys(n), (n, 1, d), eps).reshape(n, d)
    loss = ldp.metric_ldp_log_density(y - x, eps) - ldp.metric_ldp_log_density(y - x2, eps)
    bound = eps * float((x - x2).norm())
    assert float(loss.abs().max()) <= bound + 1e-9
    assert float(loss.max()) > 0.5 * bound  # not vacuous: sampled outputs come close to the bound
    # the bound is attained on the ray from x through x'
    ray = x2 + 2.0 * (x2 - x) / (x2 - x).norm()
    attained = ldp.metric_ldp_log_density(ray - x2, eps) - ldp.metric_ldp_log_density(ray - x, eps)
    assert float(attained) == pytest.approx(bound, rel=1e-12)
    # the normaliser, against the closed forms in d = 1 (Laplace) and d = 2
    z1, z2 = torch.tensor([[0.7]]), torch.tensor([[0.3, 0.4]])
    assert float(ldp.metric_ldp_log_density(z1, eps)) == pytest.approx(math.log(eps / 2) - eps * 0.7)
    assert float(ldp.metric_ldp_log_density(z2, eps)) == pytest.approx(
        math.log(eps**2 / (2 * math.pi)) - eps * 0.5
    )


def _hockey_stick(sigma: float, x: torch.Tensor, x2: torch.Tensor, eps: float, clip: float, n: int) -> float:
    """Monte Carlo δ(ε) = E_{y ~ M(x)} [(1 - e^{ε - L(y)})_+] of the clipped Gaussian mechanism on x vs x'."""
    keys = _keys(n, salt=7)
    y = x + sigma * nz.standard_noise("gaussian", keys, (n, 1, x.numel())).reshape(n, -1)
    cx, cx2 = ldp.clip_rows(x.double(), clip), ldp.clip_rows(x2.double(), clip)
    y = y - x + cx  # the mechanism's output: clip, then noise
    loss = ((y - cx2).pow(2).sum(1) - (y - cx).pow(2).sum(1)) / (2 * sigma**2)
    return float(torch.clamp(1 - torch.exp(eps - loss), min=0).mean())


def test_gaussian_mechanism_meets_its_delta_on_the_worst_neighbours() -> None:
    d, eps, delta, clip, n = 8, 1.0, 0.05, 1.0, 200_000
    x = torch.full((d,), 3.0, dtype=torch.float64)  # norm > C: clipping matters; x' = -x is at distance 2C
    sigma = ldp.gaussian_sigma(eps, delta, 2 * clip)
    estimate = _hockey_stick(sigma, x, -x, eps, clip, n)
    se = math.sqrt(delta / n)  # the hockey-stick integrand lies in [0, 1]
    assert abs(estimate - delta) < 5 * se  # tight: the worst pair meets δ exactly
    # the privatize path adds exactly that noise to the clipped token
    keys = _keys(4, salt=7)
    out = ldp.privatize("gaussian_mechanism", x.repeat(4, 1, 1), keys, eps, delta=delta, clip=clip)
    xi = nz.standard_noise("gaussian", keys, (4, 1, d))
    torch.testing.assert_close(out, ldp.clip_rows(x, clip) + sigma * xi)
    # power: 30 % less noise breaks δ by far more than the Monte Carlo error
    assert _hockey_stick(0.7 * sigma, x, -x, eps, clip, n) > delta + 20 * se


def test_composition_against_closed_forms() -> None:
    assert acc.basic_composition(0.5, 1e-6, 10) == (5.0, pytest.approx(1e-5))
    eps, delta = acc.advanced_composition(0.1, 1e-6, 100, 1e-5)
    assert eps == pytest.approx(0.1 * math.sqrt(200 * math.log(1e5)) + 100 * 0.1 * math.expm1(0.1))
    assert eps == pytest.approx(5.8502, abs=1e-4) and delta == pytest.approx(1.1e-4)
    assert eps < 100 * 0.1  # advanced beats basic for many small steps
    assert acc.advanced_composition(800.0, 0.0, 2, 1e-5)[0] == math.inf  # useless there, not wrong
    # k Gaussians (σ, Δ) are one Gaussian of sensitivity √k Δ; for k = 1 the single mechanism
    sigma = ldp.gaussian_sigma(1.0, 1e-5, 2.0)
    assert acc.gaussian_composition_epsilon(sigma, 2.0, 1, 1e-5) == pytest.approx(1.0, rel=1e-8)
    assert acc.gaussian_composition_epsilon(sigma, 2.0, 16, 1e-5) == pytest.approx(
        ldp.gaussian_epsilon(sigma / 4, 1e-5, 2.0), rel=1e-8
    )
    geometry = EmbeddingGeometry(d=4, sigma_e=0.5, max_norm=1.0, rms_norm=1.0)
    seq = acc.sequence_epsilon("gaussian_mechanism", 1.0, 16, geometry, delta=1e-5, clip=1.0)
    assert seq["gdp"] < seq["basic"] == 16.0 and seq["best"] == seq["gdp"]
    assert seq["best_delta"] == pytest.approx(16e-5)
    metric = acc.sequence_epsilon("metric_ldp", 0.5, 10, geometry)
    assert metric["basic"] == pytest.approx(10 * 0.5 * 2.0) and metric["basic_delta"] == 0.0
    with pytest.raises(ConfigError, match="no privacy"):
        acc.sequence_epsilon("gaussian_mechanism", 1.0, 10**6, geometry, delta=1e-5, clip=1.0)


def _ids(rows: list[list[int]], width: int | None = None) -> torch.Tensor:
    width = width or max(map(len, rows))
    return torch.tensor([r + [0] * (width - len(r)) for r in rows])


@pytest.mark.parametrize("kind", ldp.LDP_KINDS)
def test_hook_noise_is_keyed_by_content(kind: str) -> None:
    model = tiny_bert(layers=1).eval()
    emb = model.get_input_embeddings()
    row = [5, 17, 3, 44]
    with perturb_embeddings(model, kind, seed=3, epsilon=20.0) as rec:
        alone = emb(_ids([row]))
        batched = emb(_ids([[9, 9], row], width=7))
    torch.testing.assert_close(alone[0], batched[1, :4])  # same tokens, same noise: any batch, any padding
    assert rec.calls == 2 and rec.epsilon == 20.0 and math.isfinite(rec.gamma)
    with perturb_embeddings(model, kind, seed=4, epsilon=20.0):
        other_seed = emb(_ids([row]))
    assert not torch.allclose(alone, other_seed)
    clean = emb(_ids([row]))
    if kind == "metric_ldp":
        # absolute noise: a model with other weights receives the very same z
        other = tiny_bert(layers=1, seed=1).eval().get_input_embeddings()
        with perturb_embeddings(model, kind, seed=3, epsilon=20.0, module=other):
            noisy_other = other(_ids([row]))
        torch.testing.assert_close(noisy_other - other(_ids([row])), alone - clean)
        assert rec.gamma == pytest.approx(math.sqrt(33) / 20.0 / rec.sigma)
    else:
        assert rec.clip == pytest.approx(float(emb.weight.detach().norm(dim=1).max()))
        sigma = ldp.gaussian_sigma(20.0, 1e-5, 2 * rec.clip)
        assert rec.gamma == pytest.approx(sigma / rec.sigma)
        # a small C clips every token to norm C before the noise: at a huge ε only the clipping is left
        with perturb_embeddings(model, kind, epsilon=1e7, clip=0.05):
            clipped = emb(_ids([row]))
        torch.testing.assert_close(clipped.norm(dim=-1), torch.full((1, 4), 0.05), atol=1e-4, rtol=0)


def test_hook_arguments_are_checked() -> None:
    model = tiny_bert(layers=1)
    with pytest.raises(ConfigError, match="epsilon"), perturb_embeddings(model, "metric_ldp"):
        pass
    with (
        pytest.raises(ConfigError, match="not by gamma"),
        perturb_embeddings(model, "metric_ldp", 1.0, epsilon=1),
    ):
        pass
    with (
        pytest.raises(ConfigError, match="epsilon must be"),
        perturb_embeddings(model, "metric_ldp", epsilon=0.0),
    ):
        pass
    with (
        pytest.raises(ConfigError, match="delta"),
        perturb_embeddings(model, "gaussian_mechanism", epsilon=1, delta=2),
    ):
        pass


def test_epsilon_curves_keep_examples_and_pair_with_the_slow_twin() -> None:
    model = tiny_bert(layers=1).eval()
    g = torch.Generator().manual_seed(0)
    batches = [
        {
            "input_ids": torch.randint(1, 97, (6, 9), generator=g),
            "labels": torch.randint(0, 2, (6,), generator=g),
        }
        for _ in range(2)
    ]
    for b in batches:
        b["attention_mask"] = torch.ones_like(b["input_ids"])
    kw = {"kinds": list(ldp.LDP_KINDS), "epsilons": [1.0, 30.0], "draws": 2, "keep_examples": True}
    fast = robustness_curve(model, batches, **kw)
    slow = robustness_curve(model, batches, stack_draws=False, **kw)
    assert fast.x_name == "epsilon" and fast.protocol["epsilons"] == [1.0, 30.0]
    for kind in ldp.LDP_KINDS:
        np.testing.assert_allclose(fast.values[kind], slow.values[kind])
        assert fast.examples[kind].shape == (1, 2, 2, 12)
        np.testing.assert_allclose(fast.examples[kind].mean(axis=-1), fast.values[kind])
        assert fast.curves()[kind]["x_name"] == "epsilon"
    again = type(fast).from_dict(fast.to_dict())
    assert again.x_name == "epsilon" and np.array_equal(
        again.examples["metric_ldp"], fast.examples["metric_ldp"]
    )
    joined = type(fast).concat([fast, fast])
    assert joined.examples["gaussian_mechanism"].shape == (2, 2, 2, 12)
    with pytest.raises(ConfigError, match="mixes"):
        robustness_curve(model, batches, kinds=["gaussian", "metric_ldp"], epsilons=[1.0])
    with pytest.raises(ConfigError, match="epsilons"):
        robustness_curve(model, batches, kinds=["metric_ldp"])


def test_noise_eval_config_checks_the_ldp_fields() -> None:
    assert NoiseEvalConfig().ldp_kinds == []  # off unless asked for
    NoiseEvalConfig(ldp_kinds=["metric_ldp", "gaussian_mechanism"], epsilons=[10.0])
    for bad in (
        {"ldp_kinds": ["laplace"]},
        {"ldp_kinds": ["metric_ldp", "metric_ldp"]},
        {"ldp_kinds": ["metric_ldp"], "epsilons": []},
        {"epsilons": [0.0]},
        {"epsilons": [math.inf]},
        {"delta": 0.0},
        {"clip": -1.0},
    ):
        with pytest.raises(ConfigError):
            NoiseEvalConfig(**bad)


def test_gamma_epsilon_mapping_of_a_model(capsys) -> None:
    model = tiny_bert(layers=1)
    geometry = EmbeddingGeometry.of(model)
    rows = print_gamma_epsilon(model, gammas=[0.5, 2.0], tokens=10)
    printed = capsys.readouterr().out
    assert f"d = {geometry.d}" in printed and len(printed.splitlines()) == 2 + 4
    assert [(r["gamma"], r["kind"]) for r in rows] == [
        (0.5, "metric_ldp"),
        (0.5, "gaussian_mechanism"),
        (2.0, "metric_ldp"),
        (2.0, "gaussian_mechanism"),
    ]
    for r in rows:  # the ε of each row gives back per-coordinate noise γ σ_E
        std = ldp.mechanism_std(r["kind"], r["epsilon"], geometry.d, delta=1e-5, clip=geometry.max_norm)
        assert std == pytest.approx(r["gamma"] * geometry.sigma_e, rel=1e-6)
        assert r["tokens"] == 10 and r["sequence_epsilon"] > r["token_epsilon"]
    metric = rows[0]
    assert metric["noise_norm"] == pytest.approx(geometry.d / metric["epsilon"])
    assert metric["token_epsilon"] == pytest.approx(metric["epsilon"] * 2 * geometry.max_norm)
    assert rows[2]["epsilon"] == pytest.approx(rows[0]["epsilon"] / 4)  # metric ε ∝ 1/γ
