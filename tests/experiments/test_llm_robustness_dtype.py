"""llm-robustness's ``model.dtype`` key: validated, and the dtype the worker loads the model in."""

from __future__ import annotations

import pytest
import torch

from descentlab.config import resolve_config
from descentlab.errors import ConfigError
from descentlab.experiments.llm_robustness import config as exp
from descentlab.experiments.llm_robustness import jobs
from tiny_models import tiny_llama


def test_dtype_is_float32_by_default_bfloat16_on_request_and_nothing_else() -> None:
    assert resolve_config(exp.LlmRobustnessConfig).model.torch_dtype == torch.float32
    bf16 = resolve_config(exp.LlmRobustnessConfig, overrides=["model.dtype=bfloat16"])
    assert bf16.model.torch_dtype == torch.bfloat16
    for bad in ("float16", "bf16", "fp32"):
        with pytest.raises(ConfigError, match=r"model\.dtype"):
            resolve_config(exp.LlmRobustnessConfig, overrides=[f"model.dtype={bad}"])


def test_the_worker_loads_the_model_in_the_configured_dtype(monkeypatch) -> None:
    loads: list[tuple[str, torch.dtype]] = []

    def fake_load(name: str, dtype: torch.dtype | None = None, **kwargs: object):
        loads.append((name, dtype))
        return tiny_llama(layers=1, hidden=16, heads=2, kv_heads=1).to(dtype), object()

    monkeypatch.setattr(jobs, "load_causal_lm", fake_load)
    monkeypatch.setattr(jobs, "_WORKER", {})
    bf16 = resolve_config(exp.LlmRobustnessConfig, overrides=["model.dtype=bfloat16"])
    model, _ = jobs.model_for(bf16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    jobs.model_for(bf16)  # loaded once per process ...
    assert loads == [("smollm2", torch.bfloat16)]
    model, _ = jobs.model_for(resolve_config(exp.LlmRobustnessConfig))  # ... and again for another dtype
    assert loads[-1] == ("smollm2", torch.float32) and len(loads) == 2
    assert {p.dtype for p in model.parameters()} == {torch.float32}
