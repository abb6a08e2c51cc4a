"""regime-map: the trend contrasts against least squares, and a tiny sweep of sparse-lm end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from descentlab.errors import AssetMissingError, ConfigError
from descentlab.experiments.regime_map.claims import prediction_weights, trend_weights
from descentlab.report.claims import NOT_IN_RUN
from descentlab.study.cells import CellStore

# sparse-lm at a size that trains in seconds (tests/experiments/test_sparse_lm.py's tiny settings)
TINY_LM = [
    "methods=[adamw,horst]",
    "smollm2=false",
    "threads=1",
    "workers=1",
    "corpus_max_chars=60000",
    "bpe_vocab=320",
    "model.n_layer=2",
    "model.n_positions=32",
    "train.max_steps=12",
    "train.batch_size=8",
    "train.progress=false",
    "eval_blocks=8",
    "test_blocks=10",
    "eval_batch_size=4",
]
SIZES = {"d32": "model.n_embd=8 model.n_head=2", "d64": "model.n_embd=16 model.n_head=2",
         "d128": "model.n_embd=32 model.n_head=2"}  # fmt: skip


def test_the_trend_contrast_is_the_least_squares_slope_and_line() -> None:
    rng = np.random.default_rng(0)
    x = np.array([5.07, 5.52, 6.03, 6.4])
    for _ in range(5):
        y = rng.normal(size=4)
        slope, intercept = np.polyfit(x, y, 1)
        assert trend_weights(x) @ y == pytest.approx(slope, abs=1e-12)
        assert prediction_weights(x, 8.1) @ y == pytest.approx(intercept + slope * 8.1, abs=1e-12)
    with pytest.raises(ValueError, match="two distinct"):
        trend_weights([1.0, 1.0, 1.0])


def test_bad_configs_fail_before_anything_runs(tmp_path: Path) -> None:
    from descentlab.experiments import run_experiment

    for overrides, message in [
        (["seeds=[300,1000]"], "tuning seed"),
        (["primary_sparsity=0.8"], "primary_sparsity"),
        (["parts=[horst,video]"], "parts"),
        (["constrained_depths=[2,2,4]"], "3 depths"),
        (["constrained_depths=[1,2,4]"], "no constrained layer"),
    ]:
        with pytest.raises(ConfigError, match=message):
            run_experiment("regime-map", overrides=overrides, out=tmp_path)
    assert not any(tmp_path.iterdir())


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    from descentlab.experiments import run_experiment

    root = tmp_path_factory.mktemp("regime")
    config = root / "tiny.yaml"
    config.write_text(
        json.dumps(
            {
                "parts": ["horst"],
                "seeds": [0, 1],
                "horst_preset": "quick",
                "horst_base": TINY_LM,
                "horst_sizes": SIZES,
                "sparsities": [0.5, 0.9],
            }
        )
    )
    try:
        path = run_experiment("regime-map", config_file=config, out=root / "runs")
    except AssetMissingError as exc:
        pytest.skip(f"no offline LM corpus: {exc}")
    return path, json.loads((path / "results.json").read_text())


def test_the_map_judges_its_primary_from_the_sweep_points_cells(sweep) -> None:
    path, res = sweep
    store = CellStore.load(path)
    points = sorted((path / "points").iterdir())
    assert [p.name for p in points] == ["horst-d128", "horst-d32", "horst-d64"]
    params = store.design.extra["params"]
    assert params["d32"] < params["d64"] < params["d128"]
    # the slope row is the mean of the per-seed least-squares slopes of the point runs' own cells
    x = np.log10([params[s] for s in ("d32", "d64", "d128")])
    per_seed = []
    for s in ("d32", "d64", "d128"):
        (point,) = (path / "points" / f"horst-{s}").iterdir()
        own = CellStore.load(point)
        per_seed.append((own.get("nll", "horst", 0.9) - own.get("nll", "adamw", 0.9)).mean(axis=1))
    slopes = [np.polyfit(x, np.array(per_seed)[:, k], 1)[0] for k in range(2)]
    (primary,) = [c for c in res["claims"] if c["name"] == "horst-trend"]
    assert primary["role"] == "primary" and primary["verdict"] != NOT_IN_RUN
    assert primary["seeds"] == 2 and primary["estimate"] == pytest.approx(np.mean(slopes), abs=1e-9)
    # no depth sweep and no level beyond 90 %: those rows wait for another run
    assert {c["name"] for c in res["claims"] if c["verdict"] == NOT_IN_RUN} == {
        "constrained-trend",
        "constrained-erm",
        "horst-adamw-beyond",
    }
    titles = [t["title"] for t in res["tables"]]
    assert any("prediction" in t for t in titles) and len(res["tables"][0]["rows"]) == 3
    assert (path / "figures" / "regime-map.png").stat().st_size > 10_000


def test_a_resumed_map_reads_finished_points_back_and_refuses_a_changed_one(sweep) -> None:
    from descentlab.experiments import run_experiment

    path, res = sweep
    jobs_before = sorted(p.name for p in (path / "points").rglob("jobs/*"))
    again = run_experiment("regime-map", resume=path, out=path.parent)
    assert again == path
    assert sorted(p.name for p in (path / "points").rglob("jobs/*")) == jobs_before
    assert json.loads((path / "results.json").read_text())["claims"] == res["claims"]
    # a point that stopped half-way is resumed only when it is the point the config asks for
    (point,) = (path / "points" / "horst-d64").iterdir()
    (point / "status.json").write_text(json.dumps({"state": "interrupted"}))
    saved = json.loads((point / "config.json").read_text())
    (point / "config.json").write_text(json.dumps({**saved, "overrides": ["model.n_embd=24"]}))
    with pytest.raises(ConfigError, match="move it away"):
        run_experiment("regime-map", resume=path, out=path.parent)
    (point / "config.json").write_text(json.dumps(saved))


def test_a_finished_point_is_read_back_only_when_it_is_the_point_the_config_asks_for(tmp_path: Path) -> None:
    from descentlab.experiments.regime_map.jobs import run_point

    point = tmp_path / "horst-d32" / "sparse-lm-20260101-000000"
    point.mkdir(parents=True)
    (point / "config.yaml").write_text("{}\n")
    (point / "status.json").write_text(json.dumps({"state": "done"}))
    (point / "config.json").write_text(json.dumps({"preset": "quick", "overrides": ["model.n_embd=24"]}))
    with pytest.raises(ConfigError, match="move it away"):
        run_point(tmp_path, "horst-d32", "sparse-lm", "quick", ["model.n_embd=32"])
    # the same point is read back, not run again: this one saved no cells, which is all that is wrong with it
    (point / "config.json").write_text(json.dumps({"preset": "quick", "overrides": ["model.n_embd=32"]}))
    with pytest.raises(ConfigError, match="saved no cell store"):
        run_point(tmp_path, "horst-d32", "sparse-lm", "quick", ["model.n_embd=32"])
    assert sorted(p.name for p in point.iterdir()) == ["config.json", "config.yaml", "status.json"]


def test_the_parameter_count_is_read_from_the_point_s_job_results(tmp_path: Path) -> None:
    from descentlab.experiments.regime_map.jobs import trained_params

    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "adamw-lr0.004-seed0.json").write_text(json.dumps({"params": 118_464, "tag": "a"}))
    (jobs / "horst-lr0.004-seed0.json").write_text(json.dumps({"params": 118_464, "tag": "h"}))
    (jobs / "horst-lr0.1-seed1000.json").write_text(
        json.dumps({"diverged": "nan", "tag": "d"})
    )  # records none
    assert trained_params(tmp_path) == 118_464
    (jobs / "adamw-lr0.004-seed1.json").write_text(json.dumps({"params": 335_232}))
    with pytest.raises(ConfigError, match="not one"):
        trained_params(tmp_path)
