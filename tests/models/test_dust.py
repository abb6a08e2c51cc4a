"""DUST: a layer without attention is one ISTA step; unrolled ISTA reaches the lasso solution (cvxpy)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import descentlab as dl
from descentlab.errors import ConfigError
from descentlab.models.dust import DUST, dct_dictionary, ista_step, soft_threshold
from descentlab.models.unrolled import patchify


def numpy_ista(y: np.ndarray, d: np.ndarray, theta: np.ndarray, iters: int, z0: np.ndarray | None = None):
    """Plain ISTA from the textbook formula, one signal per row; returns every iterate."""
    lc = np.linalg.norm(d, 2) ** 2
    z = np.zeros((y.shape[0], d.shape[1])) if z0 is None else z0
    out = [z]
    for k in range(iters):
        v = z + (y - z @ d.T) @ d / lc
        th = theta[k] if theta.ndim == 2 else theta
        z = np.sign(v) * np.maximum(np.abs(v) - th, 0.0)
        out.append(z)
    return out


def small_dust(**kw) -> DUST:
    args = dict(image_size=8, num_frames=3, patch_size=4, num_atoms=36, depth=4, width=16, heads=2)
    args.update(kw)
    return DUST(**args)


def test_shapes_and_one_estimate_per_layer() -> None:
    model = small_dust(image_size=(8, 12))
    out = model(torch.rand(2, 3, 8, 12))
    assert model.num_layers == 4
    assert out.final.shape == (2, 3, 8, 12)
    assert out.layer_estimates.shape == (5, 2, 3, 8, 12)
    assert torch.equal(out.layer_estimates[0], torch.zeros(2, 3, 8, 12))  # z_0 = 0 reads out as D·0
    assert torch.equal(out.layer_estimates[-1], out.final)


def test_layer_without_attention_is_one_ista_step_float64() -> None:
    torch.manual_seed(1)
    model = small_dust(attention=False, dictionary_init="random").double()
    with torch.no_grad():
        model.threshold.uniform_(0.0, 0.05)
    y = torch.rand(2, 3, 8, 8, dtype=torch.float64)
    patches = patchify(y, 4)
    z = torch.randn(*patches.shape[:3], 36, dtype=torch.float64)
    z = z * (torch.rand_like(z) > 0.5)  # a sparse iterate, as ISTA produces
    d = model.dictionary.detach().numpy()
    lc = torch.tensor(np.linalg.norm(d, 2) ** 2, dtype=torch.float64)
    for index in range(model.num_layers):
        got = model.layer(index, z, patches, lc).detach().numpy().reshape(-1, 36)
        theta = model.threshold[index].detach().numpy()
        want = numpy_ista(patches.numpy().reshape(-1, 16), d, theta, 1, z0=z.numpy().reshape(-1, 36))[1]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(model.lipschitz(), lc)


def test_forward_without_attention_is_unrolled_ista_and_decodes_with_d() -> None:
    model = small_dust(attention=False).double()
    with torch.no_grad():
        model.threshold.copy_(torch.linspace(0.005, 0.03, 4, dtype=torch.float64)[:, None].expand(4, 36))
    y = torch.rand(2, 3, 8, 8, dtype=torch.float64)
    out = model(y)
    d = model.dictionary.detach().numpy()
    codes = numpy_ista(patchify(y, 4).numpy().reshape(-1, 16), d, model.threshold.detach().numpy(), 4)
    got = patchify(out.layer_estimates.detach().reshape(5 * 2, 3, 8, 8), 4).reshape(5, -1, 16).numpy()
    for layer, z in enumerate(codes):
        np.testing.assert_allclose(got[layer], z @ d.T, rtol=0, atol=1e-12)


def test_attention_starts_as_ista_and_then_mixes_frames() -> None:
    ref = small_dust(attention=False).double()
    model = small_dust(attention=True).double()
    model.load_state_dict(ref.state_dict(), strict=False)
    y = torch.rand(1, 3, 8, 8, dtype=torch.float64)
    torch.testing.assert_close(model(y).final, ref(y).final)  # zero-initialised output projection
    for mixer in model.mixers:
        torch.nn.init.normal_(mixer.proj_out.weight, std=0.3)
    y2 = y.clone()
    y2[0, 2] += 0.3
    assert not torch.allclose(model(y).final[0, 0], model(y2).final[0, 0])  # frame 0 sees frame 2
    torch.testing.assert_close(ref(y).final[0, 0], ref(y2).final[0, 0])  # ISTA treats frames alone


def test_causal_attention_never_looks_ahead() -> None:
    model = small_dust(causal=True).double()
    for mixer in model.mixers:
        torch.nn.init.normal_(mixer.proj_out.weight, std=0.3)
    y = torch.rand(1, 3, 8, 8, dtype=torch.float64)
    y2 = y.clone()
    y2[0, 2] += 0.3
    a, b = model(y).final, model(y2).final
    torch.testing.assert_close(a[0, :2], b[0, :2])
    assert not torch.allclose(a[0, 2], b[0, 2])


def test_unrolled_ista_reaches_the_lasso_solution() -> None:
    # Reference: the lasso as a bound-constrained smooth problem (z = p - n, p, n >= 0) solved by L-BFGS-B.
    from scipy.optimize import minimize

    rng = np.random.default_rng(0)
    d = rng.standard_normal((16, 36))
    d /= np.linalg.norm(d, axis=0)
    y = d[:, [3, 17, 30]] @ np.array([1.0, -0.7, 0.4]) + 0.05 * rng.standard_normal(16)
    lam = 0.05

    def objective(w: np.ndarray) -> tuple[float, np.ndarray]:
        r = d @ (w[:36] - w[36:]) - y
        g = d.T @ r
        return 0.5 * r @ r + lam * w.sum(), np.concatenate([g + lam, -g + lam])

    res = minimize(
        objective,
        np.zeros(72),
        jac=True,
        method="L-BFGS-B",
        bounds=[(0, None)] * 72,
        options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 10_000},
    )
    z_star = res.x[:36] - res.x[36:]
    model = DUST(image_size=4, num_frames=1, patch_size=4, num_atoms=36, depth=400, attention=False).double()
    with torch.no_grad():
        model.dictionary.copy_(torch.from_numpy(d))
        model.threshold.fill_(lam / model.lipschitz().item())
    x_hat = model(torch.from_numpy(y).reshape(1, 1, 4, 4)).final.reshape(16).detach().numpy()
    np.testing.assert_allclose(x_hat, d @ z_star, atol=1e-6)
    assert np.count_nonzero(np.abs(z_star) > 1e-6) < 36  # the lasso solution is sparse


def test_soft_threshold_and_ista_step_closed_forms() -> None:
    x = torch.tensor([-2.0, -0.5, 0.0, 0.3, 1.5], dtype=torch.float64)
    torch.testing.assert_close(
        soft_threshold(x, torch.tensor(0.5)), torch.tensor([-1.5, 0.0, 0.0, 0.0, 1.0]).double()
    )
    # With an orthonormal dictionary and unit step, one ISTA step from any z is soft(Dᵀ y, θ).
    q, _ = torch.linalg.qr(torch.randn(6, 6, dtype=torch.float64))
    y, z = torch.randn(3, 6, dtype=torch.float64), torch.randn(3, 6, dtype=torch.float64)
    torch.testing.assert_close(
        ista_step(z, y, q, 1.0, torch.tensor(0.2)), soft_threshold(y @ q, torch.tensor(0.2))
    )


def test_dct_dictionary_and_config_errors() -> None:
    d = dct_dictionary(4, 36)
    assert d.shape == (16, 36)
    torch.testing.assert_close(d.norm(dim=0), torch.ones(36))
    with pytest.raises(ConfigError):
        dct_dictionary(4, 30)
    with pytest.raises(ConfigError):
        small_dust(dictionary_init="svd")
    with pytest.raises(ConfigError):
        small_dust(width=15)


def test_layer_losses_readout_and_trainable_thresholds() -> None:
    model = small_dust()
    x = torch.rand(2, 3, 8, 8)
    f = dl.layer_losses(model, {"noisy": x + 0.1 * torch.randn_like(x), "target": x})
    assert f.shape == (5,)
    f[-1].backward()
    assert model.threshold.grad is not None and model.dictionary.grad is not None
