"""benchmarks/gpu_check.py smoke-run on the CPU (--tiny), as CI runs it, with the packages the GPU image lacks
made unimportable, so the script's imports stay within torch, transformers, accelerate, safetensors, numpy and
descentlab; and the ``make gpu-check`` route it documents."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RUN = """
import importlib.abc, runpy, sys
BLOCKED = {"omegaconf", "datasets", "av", "rdata", "gguf"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is not on the GPU image")
sys.meta_path.insert(0, Block())
sys.argv = ["gpu_check.py", "--tiny", "--out", sys.argv[1]]
runpy.run_path(%r, run_name="__main__")
"""


def test_gpu_check_tiny_runs_every_section_and_passes(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    script = str(ROOT / "benchmarks" / "gpu_check.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", RUN % script, str(out)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["meta"]["device"] == "cpu" and result["meta"]["tiny"] is True
    assert set(result["correctness"]) == {"horst", "adamw", "lambda", "acdc"}
    assert set(result["timing"]) == {"horst", "constrained"}
    assert result["correctness_passed"] is True and result["timing_ok"] is True
    horst = result["correctness"]["horst"]
    for impl in ("auto", "foreach", "reference"):
        for dtype in ("float32", "bfloat16"):
            check = horst[f"{impl}/{dtype}"]
            assert check["status"] == "pass", check
            assert sum(check["reverted"]) > 0  # the injected inf was reverted, as by the reference
    assert result["correctness"]["adamw"]["status"] == "pass"
    assert result["correctness"]["lambda"]["status"] == "pass"
    assert all(result["correctness"]["acdc"][s]["status"] == "pass" for s in ("global", "layer", "nm"))
    # the constrained figures come first, HORST's compiles last
    done = [
        line.split()[1] for line in proc.stdout.splitlines() if line.endswith(" s") and " done in " in line
    ]
    assert done[0] == "timing.constrained" and done[-2:] == ["correctness.horst", "timing.horst"], done
    cases = result["timing"]["constrained"]
    assert set(cases) - {"_seconds"} == {
        "llama_1b_shape",
        "llama_1b_shape_fp32_autocast",
        "llama_8b_width_4_layers",
    }
    assert cases["llama_1b_shape"]["weights"] == ["bfloat16"] and cases["llama_1b_shape"]["autocast"] is None
    mixed = cases["llama_1b_shape_fp32_autocast"]
    assert mixed["weights"] == ["float32"] and mixed["autocast"] == "bfloat16"
    for name in ("llama_1b_shape", "llama_1b_shape_fp32_autocast", "llama_8b_width_4_layers"):
        row = cases[name]
        assert "status" not in row, row  # every variant ran
        for key in ("erm_fused_step_s", "erm_hf_step_s", "constrained_step_s", "time_ratio",
                    "time_ratio_vs_hf_loss", "constrained_first_step_s", "case_budget_s"):  # fmt: skip
            assert isinstance(row[key], float), (name, key)
        assert row["time_ratio"] == row["constrained_step_s"] / row["erm_fused_step_s"]
        assert row["time_ratio_vs_hf_loss"] == row["constrained_step_s"] / row["erm_hf_step_s"]
        # no GPU here: its figures say so instead of a number
        for key in (
            "constrained_peak_mib",
            "erm_fused_peak_mib",
            "peak_ratio",
            "constrained_first_step_peak_mib",
        ):
            assert row[key] == "unmeasured", (name, key)
        # syncs as a GPU run would make them (shared counter): the fused-loss ERM step adds none to the
        # model's own, and the constrained step at least PrimalDual's one finiteness read-back
        syncs = {k: row[f"{k}_host_syncs"] for k in ("erm_fused", "constrained", "erm_hf")}
        assert all(isinstance(n, int) for n in syncs.values()), syncs
        assert syncs["constrained"] >= syncs["erm_fused"] + 1, syncs
        assert row["erm_fused_host_sync_ops"].keys() <= {"item: aten._local_scalar_dense.default"}, row
    for name in ("124m_fp32", "1b_fp32", "1b_bf16"):
        row = result["timing"]["horst"][name]
        for key in ("adamw_fused_ms", "horst_ms", "ratio_to_fused_adamw", "horst_gbps", "copy_gbps",
                    "compile_s", "horst_recompiles_over_lr_schedule", "horst_kernels_per_step"):  # fmt: skip
            assert key in row, (name, key)
        assert row["horst_kernels_per_step"] == "unmeasured"
        # on this CPU, bf16 takes HORST's foreach path by design, and every such step is now recorded
        allowed = {"cpu_dtype"} if name.endswith("bf16") else set()
        assert set(row["horst_fallbacks"]) <= allowed, (name, row["horst_fallbacks"])


def test_make_gpu_check_installs_without_dependencies_and_runs_the_check() -> None:
    """The offline route: the machine's own python and torch, descentlab installed with --no-deps and nothing
    else (no index, no build isolation that would fetch setuptools), then the full check (`make -n` prints the
    recipe without running it)."""
    proc = subprocess.run(
        ["make", "-n", "gpu-check", "GPU_PYTHON=/opt/gpu/bin/python"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    recipe = proc.stdout
    install = recipe.split("pip install", 1)[1].split(";", 1)[0]
    assert "/opt/gpu/bin/python -m pip install" in recipe
    assert install.split() == ["-q", "--no-deps", "--no-build-isolation", "-e", "."], install
    runs = recipe.count("/opt/gpu/bin/python benchmarks/gpu_check.py --out gpu_check.json")
    assert runs == 2 and "--tiny" not in recipe  # installed, or (said so) from src/ on PYTHONPATH
