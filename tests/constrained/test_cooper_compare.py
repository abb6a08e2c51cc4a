"""descentlab and Cooper 1.0.1 on the three problems of ``benchmarks/cooper_compare.py`` (the builders are
imported from there, so the benchmark's figures and these assertions are about the same runs).

Tolerances (also in docs/from-cooper.md):

* (a) QP, float64: the two libraries' iterates (θ, λ, μ) agree to 1e-12 at every one of 3000 steps, and
  both end within 1e-7 of cvxpy's (θ*, λ*, μ*).
* (b) fairness, float64: the iterates (weights, 6 multipliers) agree to 1e-12 at every one of 180 steps, with
  projected ascent (Cooper: SGD with maximize) and with Adam as the dual optimizer. The constrained model's
  strict demographic-parity gap max_z |r_z - r| on the whole data is <= ε + 0.02 = 0.07 (the last iterate of a
  mini-batch primal-dual run oscillates around ε), the unconstrained one's >= 0.3.
* (c) layer-wise descent on a 4-layer BERT, float32 model, float64 multipliers: weights and λ agree to 1e-6
  (absolute) at every one of 24 steps, λ well off 0.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("cooper")

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "cooper_compare.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("cooper_compare", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["cooper_compare"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def test_qp_iterates_match_cooper_and_end_at_cvxpys_kkt_point(bench) -> None:
    qp = bench.make_qp()
    mine = bench.trajectory(bench.qp_ours(qp), 3000)
    theirs = bench.trajectory(bench.qp_cooper(qp), 3000)
    torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-12)
    optimum = bench.qp_optimum(qp)
    assert float(optimum[5:8].max()) > 0.5 and float(optimum[5:8].min()) < 1e-9  # active and slack rows
    torch.testing.assert_close(mine[-1], optimum, rtol=0, atol=1e-7)


@pytest.mark.parametrize("adam_dual", [False, True], ids=["projected-ascent", "adam"])
def test_fairness_iterates_match_cooper(bench, adam_dual) -> None:
    data = bench.make_fairness()
    steps = len(data.batches)
    ours = bench.fairness_ours(data, adam_dual=adam_dual)
    mine = bench.trajectory(ours, steps)
    theirs = bench.trajectory(bench.fairness_cooper(data, adam_dual=adam_dual), steps)
    torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-12)
    lam = mine[:, -2 * bench.GROUPS :]
    assert float(lam.max()) > 0.1, "the parity constraints must bind"
    if not adam_dual:
        assert bench.strict_parity_gap(ours.model, data) <= bench.EPSILON + 0.02


def test_fairness_constraints_close_the_parity_gap_and_the_dual_reads_the_strict_rates(bench) -> None:
    data = bench.make_fairness()
    steps = len(data.batches)
    assert bench.strict_parity_gap(bench.train_unconstrained(data, steps), data) >= 0.3
    # the dual step reads the strict rates: one step from λ = 0 moves λ by η · max(0, strict gap)
    model = bench.fairness_model()
    with torch.no_grad():
        model.weight.copy_(torch.linspace(-1, 1, model.weight.numel()).reshape_as(model.weight))
    idx = data.batches[0]
    _, proxy, strict = bench.fairness_state(model, data, idx)
    assert float((proxy.detach() - strict).abs().max()) > 1e-2  # proxy and strict twin differ on this batch
    runner = bench.fairness_ours(data)
    runner.model.load_state_dict(model.state_dict())
    runner.step()
    expected = (bench.FAIR_DUAL_LR * strict).clamp_min(0)
    torch.testing.assert_close(runner.snapshot()[-2 * bench.GROUPS :], expected, rtol=0, atol=1e-15)


def test_layerwise_descent_on_a_transformer_matches_cooper(bench) -> None:
    batches = bench.descent_batches()
    mine = bench.trajectory(bench.descent_ours(batches), 24)
    theirs = bench.trajectory(bench.descent_cooper(batches), 24)
    torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-6)
    assert float(mine[-1, -bench.DESCENT_LAYERS :].max()) > 0.1


def test_the_benchmark_times_both_libraries_in_one_process(bench) -> None:
    for name, build in bench.BUILDERS.items():
        ours, theirs = build()
        t_ours, t_cooper = bench.step_times(ours, theirs, repeats=3, warmup=1)
        assert math.isfinite(t_ours / t_cooper) and t_ours > 0 and t_cooper > 0, name
