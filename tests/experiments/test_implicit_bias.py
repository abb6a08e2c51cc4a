"""Implicit-bias claims of METHODS.md 2.2, against exact references (pinv, scipy linprog); float64, one seed."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from descentlab.data import synthetic as syn
from descentlab.errors import ConfigError
from descentlab.experiments.implicit_bias import claims as ib_claims
from descentlab.experiments.implicit_bias import config as ibc
from descentlab.experiments.implicit_bias import jobs as ibj
from descentlab.optim.compose import HyperbolicMirror, LpMirrorAfter
from descentlab.report.claims import EXPLORATORY_WORDS, NOT_IN_RUN, PENDING, VERDICTS


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 60-dim vectors: threads only add overhead
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def regression():
    x, y = syn.make_regression(20, 60, 4, seed=0)
    return x, y, syn.regression_references(x, y)


@pytest.fixture(scope="module")
def classification():
    z = syn.make_classification(40, 100, 3, seed=0)
    return z, syn.optimal_margins(z)


def _fit_regression(name: str, x, y, steps: int) -> torch.Tensor:
    cfg = ibc.ImplicitBiasConfig()
    lr = ibj.regression_lr(name, x)
    w, _ = ibj.train(
        torch.zeros(x.shape[1], dtype=torch.float64),
        lambda v: syn.regression_grad(v, x, y),
        lambda p: ibj.make_optimizer(name, p, lr, cfg, regression=True),
        steps,
        [],
    )
    return w


def test_references_are_exact(regression, classification):
    x, y, ref = regression
    torch.testing.assert_close(x @ ref["w_l2"], y, rtol=0, atol=1e-10)
    # weak duality checks of the LPs: the planted solution is an interpolant, so min L1/Linf cannot exceed it
    planted = torch.linalg.lstsq(x[:, :4], y).solution
    assert ref["l1"] <= float(planted.abs().sum()) + 1e-9
    assert ref["linf"] <= ref["l2"] <= ref["l1"]
    z, margins = classification
    teacher = torch.zeros(100, dtype=torch.float64)
    teacher[:3] = 1.0
    assert margins["l1"] >= syn.normalized_margin(teacher, z, 1) - 1e-12
    assert margins["linf"] >= syn.normalized_margin(teacher, z, math.inf) - 1e-12


def test_gd_reaches_the_pseudo_inverse(regression):
    x, y, ref = regression
    w = _fit_regression("gd", x, y, 600)
    assert float((w - ref["w_l2"]).abs().max()) <= 1e-8


def test_sign_descent_is_near_min_linf(regression):
    x, y, ref = regression
    w = _fit_regression("sign", x, y, 2000)
    assert float((x @ w - y).abs().max()) <= 1e-6
    assert float(w.abs().max()) <= 1.25 * ref["linf"]


def test_coordinate_descent_is_near_min_l1(regression):
    x, y, ref = regression
    w = _fit_regression("coordinate", x, y, 4000)
    assert float((x @ w - y).abs().max()) <= 1e-3
    assert float(w.abs().sum()) <= 1.15 * ref["l1"]


def test_hyperbolic_mirror_descent_is_near_min_l1(regression):
    x, y, ref = regression
    w = _fit_regression("hyperbolic_md", x, y, 8000)
    assert float((x @ w - y).abs().max()) <= 1e-2
    assert float(w.abs().sum()) <= 1.25 * ref["l1"]
    assert float(w.abs().sum()) < float(ref["w_l2"].abs().sum())  # and clearly not the L2 solution


def test_horst_l1_margin_beats_adam(classification):
    z, margins = classification
    cfg = ibc.ImplicitBiasConfig()
    out = {}
    for name in ("adam", "horst"):
        w, _ = ibj.train(
            torch.zeros(z.shape[1], dtype=torch.float64),
            lambda v: syn.classification_grad(v, z),
            lambda p, name=name: ibj.make_optimizer(name, p, 1e-2, cfg, regression=False),
            5000,
            [],
        )
        out[name] = (syn.normalized_margin(w, z, 1) / margins["l1"], syn.count_nonzeros(w, 1e-3))
    (adam_margin, adam_nnz), (horst_margin, horst_nnz) = out["adam"], out["horst"]
    assert horst_margin >= 0.9
    assert horst_margin >= 1.8 * adam_margin
    assert horst_nnz < adam_nnz


TINY = [
    "seeds=[0,1]",
    "methods=[gd,adam,horst,ham,sign+mirror_before]",
    "regression.n=8",
    "regression.d=20",
    "regression.support=2",
    "regression.steps=60",
    "classification.n=10",
    "classification.d=20",
    "classification.support=2",
    "classification.steps=60",
    "curve_points=4",
    "scales.n=10",
    "scales.d=20",
    "scales.support=2",
    "scales.steps=60",
    "scales.decades=[0,3]",
    "scales.methods=[adam,horst,ham]",
    "scales.horst_alphas=[0.3,1]",
    "scales.ham_alphas=[0.03,0.1]",
    "scales.validation_seeds=[100]",
    "theorem.steps=60",
    "theorem.points=5",
]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from descentlab.experiments import run_experiment

    path = run_experiment("implicit-bias", overrides=TINY, out=tmp_path_factory.mktemp("runs"))
    return path, json.loads((path / "results.json").read_text())


def test_run_writes_tables_and_figure_data(tiny_run):
    from descentlab.io import load_arrays

    path, res = tiny_run
    main = ["gd", "adam", "horst", "ham", "sign+mirror_before"]
    theorem = [f"{m} (theorem)" for m in ibc.THEOREM_METHODS]
    assert ibc.THEOREM_METHODS == (
        "ngd+mirror_after", "lp3+mirror_after", "lp4+mirror_after", "lp8+mirror_after", "sign+mirror_after",
    )  # fmt: skip
    assert list(res["methods"]) == [*main, *theorem, "adam (scales)", "horst (scales)", "ham (scales)"]
    horst = res["methods"]["horst"]
    assert horst["curves"]["cls_margin"]["x"] == ibj.log_grid(60, 4)
    assert len(horst["curves"]["cls_margin"]["std"]) == 4  # two seeds: a real spread
    assert [t["title"].split(":")[0] for t in res["tables"]] == [
        "Regression (from w = 0)", "Separable classification", "Heterogeneous column scales",
        "Validation seeds",
    ]  # fmt: skip
    assert len(res["tables"][0]["rows"]) == 5
    # the scale study: alpha chosen from its grid per spread, per-seed values
    chosen = res["scales"]["chosen_alpha"]
    assert (
        set(chosen) == {"0", "3"} and chosen["3"]["horst"] in (0.3, 1.0) and chosen["3"]["ham"] in (0.03, 0.1)
    )
    assert len(res["scales"]["per_seed"]["3"]["ham"]["l1_margin_ratio"]) == 2
    assert res["methods"]["horst (scales)"]["curves"]["scales_l1_margin"]["x"] == [0.0, 3.0]
    # the claims engine's rows, judged from the cell store (arrays/cells.npz): every declared claim, two seeds
    store = ib_claims.claim_arrays(path)
    assert not (path / "arrays" / "claims.npz").exists() and store.design.seeds == (0, 1)
    assert store.design.conditions == ("0", "3") and store.design.extra["theorem"]["steps"] == ibj.log_grid(
        60, 5
    )
    claims = {(c["name"], c["at"]): c for c in res["claims"]}
    assert {k[0] for k in claims} == {s.name for s in ib_claims.CLAIMS}
    assert [c["name"] for c in res["claims"] if c["role"] == "primary"] == ["theorem-lp4-mirror"]
    primary = claims["theorem-lp4-mirror", "end of the decaying-step run"]
    assert primary["role"] == "primary" and primary["seeds"] == 2
    assert primary["estimate"] == pytest.approx(store.get("theorem_ratio", "lp4+mirror_after")[:, -1].mean())
    assert primary["estimate"] == pytest.approx(
        res["methods"]["lp4+mirror_after (theorem)"]["metrics"]["l1_margin_ratio"]
    )
    for m in ibc.THEOREM_METHODS:
        assert store.get("theorem_ratio", m).shape == (2, len(ibj.log_grid(60, 5)))
    for name in ("theorem-sign-mirror", "theorem-sign-mirror-rising"):  # p = inf: outside the theorem's scope
        row = next(c for c in res["claims"] if c["name"] == name)
        assert row["role"] == "exploratory" and row["verdict"] in EXPLORATORY_WORDS.values()
    c = claims["horst-vs-ham-spread", "3 decades"]
    per_seed = res["scales"]["per_seed"]["3"]
    assert c["estimate"] == pytest.approx(
        sum(per_seed["horst"]["l1_margin_ratio"]) / 2 - sum(per_seed["ham"]["l1_margin_ratio"]) / 2
    )
    assert claims["horst-l1-vs-adam", ""]["b_mean"] == pytest.approx(
        res["methods"]["adam"]["metrics"]["cls_l1_margin_ratio"]
    )
    # every row is judged from this run's arrays (a tiny run may read "degenerate" where seeds agree exactly)
    assert all(c["verdict"] in VERDICTS and c["verdict"] not in (PENDING, NOT_IN_RUN) for c in res["claims"])
    # the figure data is the first seed's: the final classification weights reproduce its margin
    z = syn.make_classification(10, 20, 2, seed=0)
    final = load_arrays(path / "arrays" / "final-weights.npz")
    margins = load_arrays(path / "arrays" / "margins.npz")
    assert list(final) == main and margins["steps"][-1] == 60
    w = torch.from_numpy(final["horst"])
    assert margins["horst"][-1] == pytest.approx(
        syn.normalized_margin(w, z, 1) / syn.optimal_margins(z)["l1"]
    )
    traj = load_arrays(path / "arrays" / "trajectories.npz")
    assert traj["gd"].shape == (len(traj["steps"]), 20)
    for name in ("theorem-margins", "regression-trajectories", "classification-margins",
                 "classification-weights", "scales-margins", "scales-weights"):  # fmt: skip
        assert (path / "figures" / f"{name}.png").stat().st_size > 0
        assert f"figures/{name}.png" in (path / "report.md").read_text()
    with pytest.raises(ConfigError):
        ibc.ImplicitBiasConfig(methods=["lion"])
    with pytest.raises(ConfigError, match="disjoint"):
        ibc.ImplicitBiasConfig(seeds=[0, 100])


def test_report_rebuilds_the_same_figures_and_report(tiny_run, tmp_path):
    from descentlab.cli import main

    path = tmp_path / "run"
    shutil.copytree(tiny_run[0], path)

    def files(folder):
        return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}

    figures, report = files(path / "figures"), (path / "report.md").read_bytes()
    shutil.rmtree(path / "figures")
    (path / "report.md").unlink()
    assert main(["report", str(path)]) == 0
    assert files(path / "figures") == figures
    assert (path / "report.md").read_bytes() == report


def test_horst_and_ham_are_the_optimizers_of_the_config_layer():
    """HORST / HAM over the raw vector: mirror step on it, no weight decay, the configured strengths."""
    from descentlab.optim.ham import HAM
    from descentlab.optim.horst import HORST

    cfg = ibc.ImplicitBiasConfig(horst_alpha=2.0, ham_alpha=3.0)
    w = torch.nn.Parameter(torch.zeros(5, dtype=torch.float64))
    horst = ibj.make_optimizer("horst", w, 1e-2, cfg, regression=False)
    ham = ibj.make_optimizer("ham", w, 1e-2, cfg, regression=False)
    assert isinstance(horst, HORST) and isinstance(ham, HAM)
    (group,) = horst.param_groups
    assert (group["mirror"], group["alpha"], group["weight_decay"], group["lr"]) == (True, 2.0, 0.0, 1e-2)
    (group,) = ham.param_groups
    assert (group["mirror"], group["alpha"], group["beta"], group["weight_decay"]) == (True, 3.0, 0.0, 0.0)


def test_registry_and_presets_resolve():
    from descentlab import experiments
    from descentlab.config import resolve_config

    exp = experiments.get("implicit-bias")
    assert exp.config_cls is ibc.ImplicitBiasConfig
    for preset in ("quick", "full"):
        cfg = resolve_config(exp.config_cls, preset=preset, presets=exp.presets, overrides=[])
        assert cfg.regression.steps == ibc.PRESETS[preset]["regression.steps"]
        assert not set(cfg.seeds) & set(cfg.scales.validation_seeds)
        assert tuple(cfg.theorem.methods) == ibc.THEOREM_METHODS  # every p, p = 4 the primary
    full = resolve_config(exp.config_cls, preset="full", presets=exp.presets, overrides=[])
    assert (full.theorem.steps, full.theorem.points) == (100_000, 60)
    # the sizing pilot: the full run's theorem objects on seeds neither evaluation nor validation seeds
    pilot = resolve_config(exp.config_cls, preset="pilot", presets=exp.presets, overrides=[])
    assert pilot.theorem == full.theorem and pilot.methods == [] and pilot.scales.methods == []
    assert not set(pilot.seeds) & (set(full.seeds) | set(full.scales.validation_seeds) | {200, 201, 202, 203})


def _theorem_path(make, z: torch.Tensor, steps: int = 300) -> torch.Tensor:
    """The iterates of the optimizer ``make(w)`` on ``z`` at Theorem 4.7's decaying step lr 0.3 / sqrt(k)."""
    _, snaps = ibj.train(
        torch.zeros(z.shape[1], dtype=torch.float64),
        lambda v: syn.classification_grad(v, z),
        make,
        steps,
        list(range(1, steps + 1)),
        lr_at=lambda k: 0.3 / math.sqrt(k),
    )
    return torch.stack([snaps[k] for k in sorted(snaps)])


def test_lp_mirror_after_is_the_composition_of_ngd_and_sign_at_its_ends(classification):
    """LpMirrorAfter at p = 2 walks ngd+mirror_after's path and at p = inf sign+mirror_after's: the same M∘S
    composition (composed_step, same mirror) with the L_p operator in the steepest slot."""
    z, _ = classification
    cfg = ibc.ImplicitBiasConfig()
    after = HyperbolicMirror(alpha=1.0, exp_clamp=5.0)
    for p, twin in ((2.0, "ngd+mirror_after"), (math.inf, "sign+mirror_after")):
        got = _theorem_path(lambda w, p=p: LpMirrorAfter([w], lr=0.3, p=p, mirror=after), z)
        expected = _theorem_path(
            lambda w, twin=twin: ibj.make_optimizer(twin, w, 0.3, cfg, regression=False, alpha=1.0), z
        )
        assert float((expected[-1] - expected[0]).abs().max()) > 0.1  # the paths do move
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    # the study's objects: p read from the name, the mirror step on the whole vector, no weight decay
    w = torch.nn.Parameter(torch.zeros(5, dtype=torch.float64))
    opt = ibj.make_optimizer(
        "lp4+mirror_after", w, 0.1, ibc.ImplicitBiasConfig(horst_alpha=2.0), regression=False
    )
    assert isinstance(opt, LpMirrorAfter) and opt.param_groups[0]["p"] == 4.0
    assert opt.mirror == HyperbolicMirror(alpha=2.0, exp_clamp=5.0)
    assert not opt.param_groups[0]["dual_scaled"]  # classification: the step of L_p length lr, as sign
    regression = ibj.make_optimizer("lp4+mirror_after", w, 0.1, ibc.ImplicitBiasConfig(), regression=True)
    assert regression.param_groups[0]["dual_scaled"]  # regression: scaled by ||g||_q, as sign -> linf
    # one step by hand: u = lr d_4(g), then w <- (w - u) exp(clamp(-alpha sign(w - u) u))
    w0 = torch.tensor([0.5, -0.2, 0.0, 1.0, -1.0], dtype=torch.float64)
    g = torch.tensor([1.0, -2.0, 0.5, 0.0, 3.0], dtype=torch.float64)
    w.data.copy_(w0)
    w.grad = g.clone()
    opt.step()
    q = 4.0 / 3.0
    d = torch.sign(g) * g.abs() ** (q - 1) / (g.abs() ** q).sum() ** ((q - 1) / q)
    half = w0 - 0.1 * d
    torch.testing.assert_close(
        w.detach(), half * torch.exp(-2.0 * torch.sign(half) * 0.1 * d), rtol=1e-14, atol=0
    )
