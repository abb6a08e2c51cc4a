"""Every block of docs/write-a-study.md runs as written, in order, in one namespace, and does what the page
says: the design record is written, the tuning seed trains no reported run, the claims reach their cells
(or read not-in-run for an arm the design lacks), and the least-squares arm matches its closed form."""

from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "write-a-study.md"
FENCE = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def test_the_page_runs_end_to_end_and_says_what_it_prints(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    blocks = FENCE.findall(DOC.read_text())
    assert len(blocks) == 6
    module = types.ModuleType(
        "write_a_study"
    )  # a real module: dataclasses look their class up in sys.modules
    monkeypatch.setitem(sys.modules, module.__name__, module)
    ns = module.__dict__
    for i, block in enumerate(blocks):
        exec(compile(block, f"{DOC.name}[block {i + 1}]", "exec"), ns)
    printed = capsys.readouterr().out
    for line in printed.splitlines():  # the page quotes the printed rows verbatim
        assert line in DOC.read_text(), line

    run_dir, cfg, store = tmp_path / "ridge-run", ns["cfg"], ns["store"]
    record = json.loads((run_dir / "arrays" / "design.json").read_text())
    assert record["arms"] == ["ols", "ridge"] and record["conditions"] == ["0.5", "2"]
    assert record["seeds"] == cfg.seeds and record["examples"] == cfg.n_test
    assert record["extra"]["lam"] == {"ols": 0.0, "ridge": 100.0}
    # tuning: every candidate on the tuning seed only, the pick on every evaluation seed
    cached = sorted(p.stem for p in (run_dir / "jobs").glob("*.json"))
    tuning = [t for t in cached if t.endswith(f"seed{cfg.tune_seed}")]
    assert tuning == sorted(f"ridge-lam{lam:g}-seed{cfg.tune_seed}" for lam in cfg.ridge_grid)
    assert not any(str(cfg.tune_seed) in t for t in cached if t not in tuning)
    assert len(cached) == len(cfg.ridge_grid) + 2 * len(cfg.seeds)

    rows = {r.name: r for r in ns["rows"]}
    assert rows["ridge-at-threshold"].verdict == "reproduced" and rows["ridge-at-threshold"].role == "primary"
    assert rows["ridge-low-noise"].verdict == "reproduced"
    assert rows["ridge-lasso"].verdict == "not in this run" and "no lasso arm" in rows["ridge-lasso"].reason
    a, b = store.get("sq_error", "ridge", 2.0), store.get("sq_error", "ols", 2.0)
    assert rows["ridge-at-threshold"].estimate == pytest.approx(float((a - b).mean()), rel=1e-12)

    # the least-squares arm against its closed form: E[test error] = σ²(1 + d / (n − d − 1))
    for sigma in cfg.noise:
        expected = sigma**2 * (1 + cfg.dim / (cfg.n_train - cfg.dim - 1))
        assert store.get("sq_error", "ols", sigma).mean() == pytest.approx(expected, rel=0.1)
    assert ns["table"]["rows"][0][0] == "ols" and all(" ± " in c for c in ns["table"]["rows"][0][1:])
    assert ns["figures"] == [
        {
            "path": "figures/error-vs-noise.png",
            "caption": "Test squared error against label noise; band = ± sd over seeds",
        }
    ]
    assert (run_dir / "figures" / "error-vs-noise.png").is_file()
    # the numbers the page quotes are the table's
    for row in ns["table"]["rows"]:
        for cell in row[1:]:
            assert cell in DOC.read_text()
    assert np.isclose(float(ns["table"]["rows"][1][2].split(" ± ")[0]), a.mean(-1).mean(), atol=5e-4)
