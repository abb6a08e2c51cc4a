"""The heterogeneous-scale problem of implicit-bias: its construction, its LP references on cases solvable by
hand, and the optimizer facts its claims rest on (HORST at alpha -> 0 is Adam; HAM's exponent sees the
gradient's scale, HORST's does not)."""

from __future__ import annotations

import pytest
import torch

from descentlab.data import synthetic as syn
from descentlab.errors import ConfigError
from descentlab.experiments.implicit_bias.config import ImplicitBiasConfig
from descentlab.experiments.implicit_bias.jobs import fit_classification, make_optimizer


def test_scales_are_log_uniform_over_the_spread_and_keep_the_data():
    s = syn.column_scales(100, 4.0, seed=3)
    logs = torch.sort(torch.log10(s)).values
    torch.testing.assert_close(logs, 4.0 * ((torch.arange(100, dtype=torch.float64) + 0.5) / 100 - 0.5))
    assert float(s.max() / s.min()) == pytest.approx(10 ** (4.0 * 99 / 100))
    z0 = syn.make_classification(10, 100, 3, seed=3)
    z, s2 = syn.make_heterogeneous_classification(10, 100, 3, seed=3, decades=4.0)
    torch.testing.assert_close(z, z0 * s)  # same points and labels, columns rescaled
    torch.testing.assert_close(syn.make_heterogeneous_classification(10, 100, 3, 3, 0.0)[0], z0)
    # the large-scale half is the same set of columns at every spread
    assert torch.equal(syn.upper_half(100, 3), s2 > 1) and int(syn.upper_half(100, 3).sum()) == 50


def test_lp_margins_on_hand_solvable_cases():
    # one point: max_{|w|_1 <= 1} <z, w> = ||z||_inf and max_{|w|_inf <= 1} <z, w> = ||z||_1
    z = torch.tensor([[0.5, -3.0, 0.01]], dtype=torch.float64)
    m = syn.optimal_margins(z)
    assert m["l1"] == pytest.approx(3.0) and m["linf"] == pytest.approx(3.51)
    w = syn.l1_max_margin_separator(z)
    torch.testing.assert_close(w, torch.tensor([0.0, -1 / 3, 0.0], dtype=torch.float64))
    # two points that share a small column and each have a large private one: with scales (c, 1, 1),
    # z1 = (c, 1, 0), z2 = (c, 0, 1). For c > 1/2 the L1 optimum puts everything on column 0 (margin c);
    # below, it splits (0, 1/2, 1/2) (margin 1/2): the LP follows the scales, as the study needs.
    for c, margin in ((2.0, 2.0), (0.3, 0.5)):
        z = torch.tensor([[c, 1.0, 0.0], [c, 0.0, 1.0]], dtype=torch.float64)
        assert syn.optimal_margins(z)["l1"] == pytest.approx(margin)
        w = syn.l1_max_margin_separator(z)
        assert syn.normalized_margin(w, z, 1) == pytest.approx(margin)


def test_lp_separator_is_feasible_and_optimal_on_the_study_problem():
    z, s = syn.make_heterogeneous_classification(20, 50, 3, seed=0, decades=3.0)
    w = syn.l1_max_margin_separator(z)
    assert float((z @ w).min()) >= 1 - 1e-7
    best = syn.optimal_margins(z)
    assert syn.normalized_margin(w, z, 1) == pytest.approx(best["l1"], rel=1e-6)
    # weak duality: the teacher, rescaled to these columns, is a separator, so it cannot beat the LP
    teacher = torch.zeros(50, dtype=torch.float64)
    teacher[:3] = 1.0 / s[:3]
    assert syn.normalized_margin(teacher, z, 1) <= best["l1"] + 1e-12
    # and the L1 optimum leans on the large-scale columns
    assert syn.l1_share(w, syn.upper_half(50, 0)) > 0.9


def _fit(name, z, steps, alpha):
    cfg = ImplicitBiasConfig()
    return fit_classification(name, z, cfg, steps, 1e-2, alpha)


def test_horst_at_alpha_zero_is_adam():
    z, _ = syn.make_heterogeneous_classification(20, 40, 3, seed=1, decades=3.0)
    adam = _fit("adam", z, 300, None)
    torch.testing.assert_close(_fit("horst", z, 300, 0.0), adam, rtol=1e-12, atol=1e-12)
    # and a small alpha stays close to Adam (the mirror adds about alpha |w| u per step)
    w = _fit("horst", z, 300, 1e-3)
    assert float((w - adam).abs().max()) <= 1e-2 * float(adam.abs().max())


def test_ham_exponent_follows_the_gradient_scale_and_horst_does_not():
    """One step from w = 1 on a gradient of coordinates g_j = s_j: HAM's log-change is lr alpha s_j, HORST's
    (Adam's first update is lr sign(g)) is alpha lr on every coordinate."""
    scales = torch.tensor([1e-2, 1.0, 1e2], dtype=torch.float64)
    cfg = ImplicitBiasConfig()
    out = {}
    for name, alpha in (("horst", 1.0), ("ham", 1e-2)):
        w = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
        opt = make_optimizer(name, w, 1e-2, cfg, regression=False, alpha=alpha)
        w.grad = scales.clone()
        opt.step()
        out[name] = w.detach()
    # HAM = Adam step (w - lr sign g, first step) then w * exp(-lr alpha g)
    torch.testing.assert_close(out["ham"], (1 - 1e-2) * torch.exp(-1e-4 * scales), rtol=1e-6, atol=0)
    horst_log = torch.log(out["horst"] / (1 - 1e-2))
    torch.testing.assert_close(horst_log, torch.full((3,), -1e-2, dtype=torch.float64), rtol=1e-5, atol=0)


def test_the_alpha_search_is_one_toolkit_round_at_equal_budgets() -> None:
    """run.tuning_plan: one round over every (tuned method, spread) arm, each trying its method's grid on the
    validation set (named by the first validation seed); HORST's and HAM's grids must be the same size."""
    from descentlab.experiments.implicit_bias.jobs import scale_arm
    from descentlab.experiments.implicit_bias.run import tuning_plan

    cfg = ImplicitBiasConfig()
    plan = tuning_plan(cfg)
    (rnd,) = plan.rounds
    assert rnd.arms == tuple(scale_arm(m, k) for k in cfg.scales.decades for m in ("horst", "ham"))
    assert plan.tune_seed == cfg.scales.validation_seeds[0] and plan.tune_seed not in plan.seeds
    assert rnd.candidates("ham@3", {}) == cfg.scales.ham_alphas
    assert rnd.candidates("horst@3", {}) == cfg.scales.horst_alphas
    cfg.scales.ham_alphas = cfg.scales.ham_alphas[:-1]
    with pytest.raises(ConfigError, match="unequal tuning budgets"):
        tuning_plan(cfg)
