"""Every script in examples/ runs in its --tiny mode: offline, a few steps, seconds (issue 33, item 17)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

# script -> a line its tiny run must print
EXPECTED = {
    "plain_loop.py": "lambda [",
    "hf_trainer.py": "'sparsity/global': 0.5",
    "accelerate_loop.py": "global ",
    "horst_acdc_cnn.py": "at 90.0% zeros",
    "fairness_constraint.py": "quadratic_penalty ",
}


def test_every_example_is_listed_here() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(EXPECTED)


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_runs_tiny_and_offline(script: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }
    args = [sys.executable, str(EXAMPLES / script), "--tiny"]
    if script in ("hf_trainer.py", "accelerate_loop.py"):
        args += ["--out", str(tmp_path / "out")]
    proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert EXPECTED[script] in proc.stdout, proc.stdout[-3000:]
    assert "Traceback" not in proc.stderr


def test_license_and_citation() -> None:
    license_text = (ROOT / "LICENSE").read_text()
    assert license_text.startswith("MIT License") and "descentlab developers" in license_text
    assert 'license = "MIT"' in (ROOT / "pyproject.toml").read_text()
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software" and cff["license"] == "MIT"
    refs = {r["title"]: r for r in cff["references"]}
    horst = refs["HORST: Composing Optimizer Geometries for Sparse Transformer Training"]
    assert "2605.21104" in horst["url"]
    (paper1,) = [r for t, r in refs.items() if "Unrolled Transformers" in t]
    assert "2601.17257" in paper1["url"] and paper1["volume"] == 306
    assert [a["family-names"] for a in paper1["authors"]] == ["Porras-Valenzuela", "Hadou", "Ribeiro"]
