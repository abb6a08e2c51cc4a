"""benchmarks/gpu_check.py smoke-run on the CPU (--tiny), with the packages the GPU image lacks made
unimportable, so the script's imports stay within torch, transformers, accelerate, safetensors, numpy and
descentlab."""

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
    for name in ("llama_1b_shape", "llama_8b_width_4_layers"):
        row = result["timing"]["constrained"][name]
        for key in ("erm_step_s", "constrained_step_s", "time_ratio", "constrained_first_step_s",
                    "erm_host_syncs", "constrained_host_syncs", "constrained_peak_mib"):  # fmt: skip
            assert key in row, (name, key)
    for name in ("124m_fp32", "1b_fp32", "1b_bf16"):
        row = result["timing"]["horst"][name]
        for key in ("adamw_fused_ms", "horst_ms", "ratio_to_fused_adamw", "horst_gbps", "copy_gbps",
                    "compile_s", "horst_recompiles_over_lr_schedule", "horst_kernels_per_step"):  # fmt: skip
            assert key in row, (name, key)
        # on this CPU, bf16 takes HORST's foreach path by design, and every such step is now recorded
        allowed = {"cpu_dtype"} if name.endswith("bf16") else set()
        assert set(row["horst_fallbacks"]) <= allowed, (name, row["horst_fallbacks"])
