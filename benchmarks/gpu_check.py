"""One prepared GPU check (issues 31, 46): correctness of the CUDA paths and the figures docs/horst.md and
docs/constrained.md leave "unmeasured". Writes one JSON, after every section (a run cut short keeps what it
did).

Route (a lent GPU machine, offline, with its own CUDA torch): ``make gpu-check``. It installs descentlab
into the machine's python with ``pip install --no-deps --no-build-isolation -e .`` (nothing downloaded, no
CPU torch pulled in) and runs this script with that python. By hand::

    python -m pip install --no-deps --no-build-isolation -e .   # or a venv made with --system-site-packages
    python benchmarks/gpu_check.py --out gpu_check.json

The script imports only torch, transformers, accelerate, safetensors, numpy and descentlab (no omegaconf,
datasets, av, rdata or gguf: ``descentlab.constrained`` imports its omegaconf config lazily). It runs in
<= 9 minutes on one H100/H200 (``--budget-s``: what would run past it is skipped and says so).

Sections, in this order (each records its own error instead of stopping the run):

* ``timing.constrained`` first, each case under its own time budget (at least two interleaved rounds):
  the constrained step (default readout, PrimalDual over fused AdamW) against two ERM baselines on the same
  model and AdamW state, in the same process: ``erm_fused``, the fair one, whose loss is the same fused
  kernel as the readout's (:func:`descentlab.linear_cross_entropy`, no ``[N, V]`` logits), and ``erm_hf``,
  the Hugging Face loss (its fp32 logits: 8.4 GB at 1B, 8 x 2048 tokens). Cases: a Llama-3.2-1B-shaped
  model from config in pure bf16; the same with fp32 weights under bf16 autocast (as ``fit`` runs with
  ``mixed_precision="bf16"``); an 8B-width 4-layer slice with activation checkpointing. Per variant: median
  step time, peak and the constrained first step's peak (``torch.cuda.max_memory_allocated``; the
  allocator's cache is never emptied before a timed step), and host syncs per step counted by
  :class:`descentlab.host_syncs.HostSyncCounter` (``.item()`` / ``float`` / ``bool``, boolean-mask
  indexing and ``nonzero``, device-to-host and blocking host-to-device copies). Ratios: ``time_ratio``
  (against ``erm_fused``) and ``time_ratio_vs_hf_loss``, likewise for peaks.
* ``correctness.adamw``: HORST with alpha = beta = 0 against ``torch.optim.AdamW(fused=True)``.
* ``correctness.lambda``: lambda of PrimalDual(AdamW, LayerwiseDescent) on a small Llama from config,
  CPU against the device, after 5 steps on the same batches.
* ``correctness.acdc``: AC/DC's magnitude masks (global, layer, 2:4) CPU against the device.
* ``correctness.horst``: every HORST path on the device (auto, compiled, fused, fused=True, foreach,
  reference) against the CPU ``impl="reference"`` (``horst_reference``) in fp32, bf16 and bf16 with stochastic
  rounding (the same ``sr_seed``), 6 steps with an inf injected into one gradient at step 3 (the NaN guard
  must revert exactly the same elements).
* ``timing.horst`` last (it compiles): HORST against fused AdamW on GPT-2-124M and Llama-3.2-1B parameter
  shapes: ms per step, ratio, achieved GB/s against a device copy's, compile time (first step minus a steady
  one), CUDA kernels per step (torch.profiler), recompiles over an lr schedule, and the optimizer's fallbacks.

``--tiny`` runs every section on the CPU with tiny shapes in seconds (the device is then "cpu" in the JSON,
GPU figures, peaks and kernel counts, read "unmeasured", and syncs are those a GPU run would make); the test
``tests/test_gpu_check.py`` runs it so in CI.

Usage: python benchmarks/gpu_check.py [--out gpu_check.json] [--tiny] [--budget-s 510]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

import descentlab
from descentlab.constrained.descent import LayerwiseDescent
from descentlab.constrained.primal_dual import PrimalDual
from descentlab.host_syncs import HostSyncCounter
from descentlab.linear_cross_entropy import linear_cross_entropy
from descentlab.optim import _horst_compiled
from descentlab.optim._horst_kernel import load_kernel
from descentlab.optim.horst import HORST
from descentlab.readout import CausalLMReadout, layer_losses
from descentlab.sparsity.masks import compute_masks, select_prunable

START = time.perf_counter()


class Ctx:
    def __init__(self, device: torch.device, tiny: bool, budget_s: float) -> None:
        self.device = device
        self.tiny = tiny
        self.budget_s = budget_s

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - START)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)


# -- helpers ------------------------------------------------------------------------------------------------


UNMEASURED = "unmeasured"  # a GPU figure on a run without a GPU (--tiny)


def peak_mib(ctx: Ctx) -> float | str:
    return torch.cuda.max_memory_allocated(ctx.device) / 2**20 if ctx.cuda else UNMEASURED


def reset_peak(ctx: Ctx) -> None:
    """Start a new peak window. No ``empty_cache()``: timed steps run on the allocator's warm cache, as in
    training (emptying it before a step would time cudaMalloc calls a training step never makes)."""
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats(ctx.device)


def release(ctx: Ctx) -> None:
    """Between cases only (never before a timed step): hand the last case's cached blocks back."""
    import gc

    gc.collect()
    if ctx.cuda:
        torch.cuda.empty_cache()


def timed(ctx: Ctx, fn: Callable[[], Any]) -> float:
    ctx.sync()
    t0 = time.perf_counter()
    fn()
    ctx.sync()
    return time.perf_counter() - t0


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


# -- correctness --------------------------------------------------------------------------------------------


def _horst_params(dtype: torch.dtype, tiny: bool) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = [(37, 29), (300,), (16, 16)] if tiny else [(1024, 768), (3072,), (257, 129), (64, 64)]
    return [(torch.randn(s, generator=g) * 0.1).to(dtype) for s in shapes]


def _run_horst(params: list[torch.Tensor], device: torch.device, steps: int, **kw: Any) -> dict[str, Any]:
    ps = [torch.nn.Parameter(p.clone().to(device)) for p in params]
    opt = HORST(
        [{"params": ps[:2], "alpha": 30.0, "beta": 0.5}, {"params": ps[2:], "mirror": True, "alpha": 2e3}],
        lr=1e-3,
        weight_decay=0.01,
        **kw,
    )
    gen = torch.Generator().manual_seed(1)
    reverted = []
    for step in range(steps):
        for q in ps:
            grad = torch.randn(q.shape, generator=gen).to(q.dtype)
            if step == 2:
                grad.view(-1)[0] = math.inf  # the NaN guard must revert exactly this element
            q.grad = grad.to(device)
        opt.step()
        reverted.append(opt.reverted)
    return {"params": [q.detach().cpu() for q in ps], "reverted": reverted, "opt": opt}


def check_horst(ctx: Ctx) -> dict[str, Any]:
    out: dict[str, Any] = {}
    variants: dict[str, dict[str, Any]] = {
        "auto": {"impl": "auto"},
        "compiled": {"impl": "compiled"},
        "fused": {"impl": "fused"},
        "fused=True": {"fused": True},
        "foreach": {"impl": "foreach"},
        "reference": {"impl": "reference"},
    }
    # bf16 with stochastic rounding: its random bits hash (seed, tensor, step, element), so every path and
    # device draws the same ones and must agree with the CPU reference up to fp32 rounding of the update
    sr = {"stochastic_rounding": True, "sr_seed": 1234}
    cases = [(torch.float32, {}), (torch.bfloat16, {}), (torch.bfloat16, sr)]
    for dtype, extra in cases:
        fresh_dynamo()
        params = _horst_params(dtype, ctx.tiny)
        ref = _run_horst(params, torch.device("cpu"), 6, impl="reference", **extra)
        tol = 2e-5 if dtype == torch.float32 else 2e-2  # bf16: a rounding of the stored weight may differ
        for name, kw in variants.items():
            key = f"{name}/{str(dtype).removeprefix('torch.')}" + ("+sr" if extra else "")
            try:
                got = _run_horst(params, ctx.device, 6, **kw, **extra)
            except Exception as exc:  # e.g. fused=True refused for bf16 CPU tensors: recorded, not a failure
                out[key] = {"status": "unavailable", "error": f"{type(exc).__name__}: {exc}"[:400]}
                continue
            errs = [rel_err(a, b) for a, b in zip(got["params"], ref["params"], strict=True)]
            finite = all(bool(torch.isfinite(q).all()) for q in got["params"])
            ok = finite and max(errs) <= tol and got["reverted"] == ref["reverted"]
            out[key] = {
                "status": "pass" if ok else "FAIL",
                "max_rel_err": max(errs),
                "tol": tol,
                "reverted": got["reverted"],
                "reverted_reference": ref["reverted"],
                "fallbacks": dict(got["opt"].fallbacks),
                "fused_fallbacks": got["opt"].fused_fallbacks,
            }
    return out


def check_adamw(ctx: Ctx) -> dict[str, Any]:
    params = _horst_params(torch.float32, ctx.tiny)
    a = [torch.nn.Parameter(p.clone().to(ctx.device)) for p in params]
    b = [torch.nn.Parameter(p.clone().to(ctx.device)) for p in params]
    horst = HORST(a, lr=1e-3, weight_decay=0.01, alpha=0.0, beta=0.0)
    adamw = torch.optim.AdamW(b, lr=1e-3, weight_decay=0.01, fused=True)
    gen = torch.Generator().manual_seed(2)
    for _ in range(30):
        for p, q in zip(a, b, strict=True):
            g = torch.randn(p.shape, generator=gen).to(ctx.device)
            p.grad, q.grad = g.clone(), g.clone()
        horst.step()
        adamw.step()
    err = max(rel_err(p, q) for p, q in zip(a, b, strict=True))
    return {"status": "pass" if err <= 1e-5 else "FAIL", "max_rel_err": err, "tol": 1e-5, "steps": 30}


def _llama(ctx: Ctx, device: torch.device, *, layers: int, hidden: int, inter: int, heads: int, kv: int,
           vocab: int, tie: bool, dtype: torch.dtype, seed: int = 0):  # fmt: skip
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=4096,
        tie_word_embeddings=tie,
        rope_theta=500000.0,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(old)
    return model.train()


def _small_llama(ctx: Ctx, device: torch.device):
    return _llama(ctx, device, layers=3, hidden=64, inter=128, heads=4, kv=2, vocab=256, tie=False,
                  dtype=torch.float32)  # fmt: skip


def check_lambda(ctx: Ctx) -> dict[str, Any]:
    lams = {}
    exact = CausalLMReadout(sample_tokens=None)
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(3))
    cpu_model = _small_llama(ctx, torch.device("cpu"))
    state = {k: v.clone() for k, v in cpu_model.state_dict().items()}
    for device in (torch.device("cpu"), ctx.device):
        model = _small_llama(ctx, device)
        model.load_state_dict(state)
        batch = {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device)}
        constraint = LayerwiseDescent(model.config.num_hidden_layers, alpha=0.05, dual_lr=0.5)
        opt = PrimalDual(torch.optim.AdamW(model.parameters(), lr=1e-3), constraint)
        for _ in range(5):  # the exact readout: the default's token subsample would differ between the two
            constraint.lagrangian(layer_losses(model, batch, readout=exact)).backward()
            opt.step()
            opt.zero_grad()
        lams[device.type] = constraint.multipliers.detach().double().cpu()
    diff = float((lams["cpu"] - lams[ctx.device.type]).abs().max())
    ok = diff <= 1e-4 * max(1.0, float(lams["cpu"].abs().max()))
    return {"status": "pass" if ok else "FAIL", "max_abs_diff": diff, "lambda_cpu": lams["cpu"].tolist()}


def check_acdc(ctx: Ctx) -> dict[str, Any]:
    cpu_model = _small_llama(ctx, torch.device("cpu"))
    dev_model = _small_llama(ctx, ctx.device)
    dev_model.load_state_dict(cpu_model.state_dict())
    out: dict[str, Any] = {}
    for scope, sparsity in (("global", 0.9), ("layer", 0.5), ("nm", 0.5)):
        a = compute_masks(select_prunable(cpu_model), sparsity, scope)
        b = compute_masks(select_prunable(dev_model), sparsity, scope)
        differ = sum(int((a[k].cpu() != b[k].cpu()).sum()) for k in a)
        out[scope] = {"status": "pass" if differ == 0 and a.keys() == b.keys() else "FAIL",
                      "elements_differing": differ, "tensors": len(a)}  # fmt: skip
    return out


# -- timing -------------------------------------------------------------------------------------------------


def fused_erm_loss(model, batch: dict[str, torch.Tensor], targets: torch.Tensor, rows: torch.Tensor):
    """ERM's loss through the readout's own fused kernel (:func:`descentlab.linear_cross_entropy`): the
    backbone's last hidden state against the LM head's weight, the mean CE over every next-token target,
    chunk by chunk, so no ``[N, V]`` logits (the HF loss's fp32 logits are 8.4 GB at 1B, 8 x 2048 tokens)."""
    out = model.get_decoder()(**batch, use_cache=False)
    return linear_cross_entropy(
        out.last_hidden_state, model.get_output_embeddings().weight, targets, rows=rows
    )


def _variants(
    ctx: Ctx, model, batch, autocast: torch.dtype | None
) -> tuple[dict[str, Callable[[], None]], torch.optim.Optimizer]:
    """One training step of each: ERM with the fused loss (the fair baseline), the constrained step (default
    readout, PrimalDual over AdamW), ERM with the HF loss (its fp32 logits; the baseline users compare to)."""
    ids = batch["input_ids"]
    targets = ids[:, 1:].reshape(-1)
    rows = torch.arange(ids.numel(), device=ids.device).view(ids.shape)[:, :-1].reshape(-1)
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=ctx.cuda or None)
    constraint = LayerwiseDescent(model.config.num_hidden_layers, alpha=0.05, dual_lr=0.01)
    pd = PrimalDual(adamw, constraint)

    def amp():
        return torch.autocast(ctx.device.type, dtype=autocast) if autocast is not None else nullcontext()

    def step(loss_fn: Callable[[], torch.Tensor], opt: torch.optim.Optimizer) -> Callable[[], None]:
        def run() -> None:
            with amp():
                loss = loss_fn()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return run

    steps = {
        "erm_fused": step(lambda: fused_erm_loss(model, batch, targets, rows), adamw),
        "constrained": step(lambda: constraint.lagrangian(layer_losses(model, batch)), pd),
        "erm_hf": step(lambda: model(**batch, labels=ids).loss, adamw),
    }
    return steps, adamw


def time_constrained(ctx: Ctx, name: str, model, tokens: tuple[int, int], repeats: int, budget_s: float,
                     autocast: torch.dtype | None) -> dict[str, Any]:  # fmt: skip
    """Median step time, peak and host syncs of each variant, interleaved, within ``budget_s`` (at least two
    rounds); the ratios of the constrained step to each ERM baseline."""
    t_case = time.perf_counter()
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, tokens, generator=torch.Generator().manual_seed(0)).to(ctx.device)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    steps, adamw = _variants(ctx, model, batch, autocast)
    weights = {str(p.dtype).removeprefix("torch.") for p in model.parameters()}
    res: dict[str, Any] = {
        "model": name,
        "tokens": list(tokens),
        "params": sum(p.numel() for p in model.parameters()),
        "weights": sorted(weights),
        "autocast": str(autocast).removeprefix("torch.") if autocast is not None else None,
        "case_budget_s": budget_s,
    }
    failed: dict[str, str] = {}

    def attempt(key: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except torch.cuda.OutOfMemoryError as exc:  # e.g. the HF loss's fp32 logits: recorded, case goes on
            failed[key] = f"oom: {str(exc)[:300]}"
            model.zero_grad(set_to_none=True)  # drop the half-made gradients before the next variant
            release(ctx)  # after a failure only, never before a timed step that follows a success
            return None

    # the first ERM step creates the AdamW state, so that the constrained first step (the structure is traced
    # in it) allocates what every later one does
    res["erm_fused_first_step_s"] = attempt("erm_fused", lambda: timed(ctx, steps["erm_fused"]))
    reset_peak(ctx)
    res["constrained_first_step_s"] = attempt("constrained", lambda: timed(ctx, steps["constrained"]))
    res["constrained_first_step_peak_mib"] = peak_mib(ctx)
    res["erm_hf_first_step_s"] = attempt("erm_hf", lambda: timed(ctx, steps["erm_hf"]))
    live = [k for k in steps if k not in failed]
    times: dict[str, list[float]] = {k: [] for k in live}
    peaks: dict[str, float] = {}
    for r in range(repeats):
        if r >= 2 and time.perf_counter() - t_case > budget_s:
            break
        for key in [k for k in live if k not in failed]:
            reset_peak(ctx)
            t = attempt(key, lambda key=key: timed(ctx, steps[key]))
            if t is not None:
                times[key].append(t)
                if ctx.cuda:
                    peaks[key] = max(peaks.get(key, 0.0), float(peak_mib(ctx)))
    res["rounds"] = max((len(t) for t in times.values()), default=0)
    for key in steps:
        if key in failed or not times.get(key):
            res[f"{key}_status"] = failed.get(key, "skipped: case budget")
            continue
        res[f"{key}_step_s"] = statistics.median(times[key])
        res[f"{key}_peak_mib"] = peaks[key] if ctx.cuda else UNMEASURED
        counter = HostSyncCounter(ctx.device)
        if counter.emulated:  # unfused AdamW keeps its step counters on the host on a GPU run too
            counter.host(*(st["step"] for st in adamw.state.values() if "step" in st))
        with counter:
            steps[key]()
        res[f"{key}_host_syncs"] = counter.total
        res[f"{key}_host_sync_ops"] = dict(counter.ops)
    for base, suffix in (("erm_fused", ""), ("erm_hf", "_vs_hf_loss")):
        if "constrained_step_s" in res and f"{base}_step_s" in res:
            res[f"time_ratio{suffix}"] = res["constrained_step_s"] / res[f"{base}_step_s"]
            if ctx.cuda:
                res[f"peak_ratio{suffix}"] = res["constrained_peak_mib"] / res[f"{base}_peak_mib"]
                res[f"first_step_peak_ratio{suffix}"] = (
                    res["constrained_first_step_peak_mib"] / res[f"{base}_peak_mib"]
                )
            else:
                res[f"peak_ratio{suffix}"] = UNMEASURED
    if failed:
        res["status"] = "partial: " + ", ".join(sorted(failed))
    res["case_s"] = time.perf_counter() - t_case
    return res


def constrained_cases(tiny: bool) -> dict[str, dict[str, Any]]:
    """name -> the model's shape, weights' dtype, autocast dtype, tokens, repeats and time budget (s)."""
    if tiny:
        small = dict(layers=2, hidden=64, inter=128, heads=4, kv=2, vocab=512, tie=True)
        wide = dict(layers=2, hidden=96, inter=192, heads=4, kv=2, vocab=512, tie=False)
        run = {"tokens": (2, 32), "repeats": 2, "budget_s": 60.0}
    else:
        small = dict(layers=16, hidden=2048, inter=8192, heads=32, kv=8, vocab=128256, tie=True)
        wide = dict(layers=4, hidden=4096, inter=14336, heads=32, kv=8, vocab=128256, tie=False)
        run = {"tokens": (8, 2048), "repeats": 5, "budget_s": 100.0}
    return {
        # pure bf16 weights: what a bf16 checkpoint trained without autocast runs
        "llama_1b_shape": {"shape": small, "dtype": torch.bfloat16, "autocast": None, **run},
        # fp32 weights under bf16 autocast, as `fit` runs with mixed_precision="bf16": the head matmuls of
        # ERM run in bf16; the readout's must too
        "llama_1b_shape_fp32_autocast": {"shape": small, "dtype": torch.float32, "autocast": torch.bfloat16,
                                         **run},
        "llama_8b_width_4_layers": {"shape": wide, "dtype": torch.bfloat16, "autocast": None, "checkpointing": True,
                                    **run, "budget_s": run["budget_s"] * 1.2},
    }  # fmt: skip


def timing_constrained(ctx: Ctx) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, case in constrained_cases(ctx.tiny).items():
        if ctx.left() < min(60.0, case["budget_s"]):
            out[name] = {"status": "skipped: time budget"}
            continue
        budget = min(case["budget_s"], ctx.left() - 20.0)
        model = None
        try:
            model = _llama(ctx, ctx.device, dtype=case["dtype"], **case["shape"])
            if case.get("checkpointing"):
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            out[name] = time_constrained(
                ctx, name, model, case["tokens"], case["repeats"], budget, case["autocast"]
            )
            out[name]["checkpointing"] = bool(case.get("checkpointing"))
        except torch.cuda.OutOfMemoryError as exc:
            out[name] = {"status": "oom", "error": str(exc)[:400]}
        except Exception as exc:
            out[name] = {
                "status": "error",
                "error": traceback.format_exc()[-2000:],
                "type": type(exc).__name__,
            }
        finally:
            model = None
            release(ctx)
        print(f"gpu_check: timing.constrained.{name}: {_summary(out[name])}", flush=True)
    return out


def _summary(row: dict[str, Any]) -> str:
    if "time_ratio" not in row:
        return str(row.get("status", "?"))
    parts = [f"{row['time_ratio']:.2f}x time vs ERM (fused loss)"]
    if "time_ratio_vs_hf_loss" in row:
        parts.append(f"{row['time_ratio_vs_hf_loss']:.2f}x vs ERM (HF loss)")
    parts.append(f"syncs/step {row.get('constrained_host_syncs')} (ERM {row.get('erm_fused_host_syncs')})")
    return ", ".join(parts)


def _shapes_124m() -> list[tuple[int, ...]]:
    d, v = 768, 50257
    layer = [
        (d,),
        (d,),
        (d, 3 * d),
        (3 * d,),
        (d, d),
        (d,),
        (d,),
        (d,),
        (d, 4 * d),
        (4 * d,),
        (4 * d, d),
        (d,),
    ]
    return [(v, d), (1024, d)] + layer * 12 + [(d,), (d,)]


def _shapes_1b() -> list[tuple[int, ...]]:
    d, kv, inter = 2048, 512, 8192
    layer = [(d, d), (kv, d), (kv, d), (d, d), (inter, d), (inter, d), (d, inter), (d,), (d,)]
    return [(128256, d)] + layer * 16 + [(d,)]


def _copy_gbps(ctx: Ctx, nbytes: int, repeats: int) -> float:
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=ctx.device).uniform_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    t = min(timed(ctx, lambda: dst.copy_(src)) for _ in range(repeats))
    return 2 * src.numel() * 4 / t / 1e9


def _kernels_per_step(ctx: Ctx, step: Callable[[], None]) -> int | str:
    if not ctx.cuda:
        return UNMEASURED
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        ctx.sync()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def fresh_dynamo() -> None:
    """Forget every compiled HORST graph: they share one code object, and its recompile_limit (8) would
    otherwise be reached across this script's sections (HORST would warn and fall back to foreach)."""
    torch._dynamo.reset()
    _horst_compiled.compiled_step.cache_clear()


def time_horst(ctx: Ctx, shapes: list[tuple[int, ...]], dtype: torch.dtype, repeats: int) -> dict[str, Any]:
    from torch._dynamo.utils import counters

    fresh_dynamo()
    numel = sum(math.prod(s) for s in shapes)
    res: dict[str, Any] = {
        "tensors": len(shapes),
        "params": numel,
        "dtype": str(dtype).removeprefix("torch."),
    }
    gen = torch.Generator(device=ctx.device).manual_seed(0)

    def make():
        ps = [
            torch.nn.Parameter(torch.randn(s, device=ctx.device, generator=gen, dtype=dtype) * 0.02)
            for s in shapes
        ]
        for p in ps:
            p.grad = torch.randn(p.shape, device=ctx.device, generator=gen, dtype=dtype) * 1e-3
        return ps

    ps = make()
    adamw = torch.optim.AdamW(ps, lr=1e-4, fused=True)
    adamw.step()
    t_adamw = statistics.median(timed(ctx, adamw.step) for _ in range(repeats))
    res["adamw_fused_ms"] = t_adamw * 1e3
    res["adamw_kernels_per_step"] = _kernels_per_step(ctx, adamw.step)
    del adamw, ps
    reset_peak(ctx)
    ps = make()
    horst = HORST(ps, lr=1e-4, alpha=1.0)
    graphs0 = counters["stats"]["unique_graphs"]
    res["horst_first_step_s"] = timed(ctx, horst.step)
    res["horst_graphs_compiled"] = counters["stats"]["unique_graphs"] - graphs0
    times = []
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(horst, T_max=repeats, eta_min=1e-6)
    graphs1 = counters["stats"]["unique_graphs"]
    for _ in range(repeats):
        times.append(timed(ctx, horst.step))
        sched.step()
    res["horst_recompiles_over_lr_schedule"] = counters["stats"]["unique_graphs"] - graphs1
    t_horst = statistics.median(times)
    res["horst_ms"] = t_horst * 1e3
    res["compile_s"] = res["horst_first_step_s"] - t_horst
    res["ratio_to_fused_adamw"] = t_horst / t_adamw
    res["horst_kernels_per_step"] = _kernels_per_step(ctx, horst.step)
    res["horst_fallbacks"] = dict(horst.fallbacks)
    kernel = load_kernel()
    res["horst_paths"] = sorted({horst._path(g["impl"], kernel, p, *(horst.state[p][k] for k in ("exp_avg", "exp_avg_sq")),
                                             p.grad)[0] for g in horst.param_groups for p in g["params"]})  # fmt: skip
    # read p, g, m, v and write p, m, v; m and v are float32 whatever the parameters' dtype
    moved = numel * (3 * (torch.finfo(dtype).bits // 8) + 4 * 4)
    res["horst_gbps"] = moved / t_horst / 1e9
    res["copy_gbps"] = _copy_gbps(ctx, min(moved, 2 * 2**30), max(3, repeats // 2))
    res["fraction_of_copy_bandwidth"] = res["horst_gbps"] / res["copy_gbps"]
    del horst, ps
    reset_peak(ctx)
    return res


def timing_horst(ctx: Ctx) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if ctx.tiny:
        cases = {"124m_fp32": ([(64, 48), (48,), (32, 32)], torch.float32),
                 "1b_fp32": ([(96, 64), (64,)], torch.float32),
                 "1b_bf16": ([(96, 64), (64,)], torch.bfloat16)}  # fmt: skip
        repeats = 3
    else:
        cases = {"124m_fp32": (_shapes_124m(), torch.float32), "1b_fp32": (_shapes_1b(), torch.float32),
                 "1b_bf16": (_shapes_1b(), torch.bfloat16)}  # fmt: skip
        repeats = 20
    for name, (shapes, dtype) in cases.items():
        if ctx.left() < 45:
            out[name] = {"status": "skipped: time budget"}
            continue
        try:
            out[name] = time_horst(ctx, shapes, dtype, repeats)
        except Exception as exc:
            out[name] = {
                "status": "error",
                "error": traceback.format_exc()[-2000:],
                "type": type(exc).__name__,
            }
    return out


# -- main ---------------------------------------------------------------------------------------------------


def _installed(dist: str) -> bool:
    """Whether ``dist`` is installed (make gpu-check: False when it ran from src/ on PYTHONPATH)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(dist)
    except PackageNotFoundError:
        return False
    return True


def _passed(node: Any) -> bool:
    if isinstance(node, dict):
        if node.get("status") == "FAIL" or node.get("status") == "error":
            return False
        return all(_passed(v) for v in node.values())
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_check.json")
    parser.add_argument("--tiny", action="store_true", help="every section on the CPU, tiny shapes, seconds")
    parser.add_argument(
        "--budget-s", type=float, default=510.0, help="skip sections that would run past this"
    )
    args = parser.parse_args(argv)
    if args.tiny:
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda", 0)
    else:
        print("gpu_check: no CUDA device; run with --tiny for the CPU smoke run", file=sys.stderr)
        return 2
    ctx = Ctx(device, args.tiny, args.budget_s)
    import transformers

    result: dict[str, Any] = {
        "meta": {
            "device": device.type,
            "device_name": torch.cuda.get_device_name(device) if ctx.cuda else platform.processor() or "cpu",
            "tiny": args.tiny,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "cuda": torch.version.cuda,
            "can_compile": _horst_compiled.can_compile(device),
            "descentlab_from": str(Path(descentlab.__file__).parent),
            "descentlab_installed": _installed("descentlab"),
            "python": platform.python_version(),
        },
        "correctness": {},
        "timing": {},
    }
    # the constrained figures first, each case under its own budget; HORST's compiles (its correctness
    # variants and its timing) last, so they cannot eat the budget the constrained figures need
    sections: list[tuple[str, str, Callable[[Ctx], dict[str, Any]]]] = [
        ("timing", "constrained", timing_constrained),
        ("correctness", "adamw", check_adamw),
        ("correctness", "lambda", check_lambda),
        ("correctness", "acdc", check_acdc),
        ("correctness", "horst", check_horst),
        ("timing", "horst", timing_horst),
    ]
    for kind, name, fn in sections:
        t0 = time.perf_counter()
        if ctx.left() < 20:
            result[kind][name] = {"status": "skipped: time budget"}
            continue
        try:
            result[kind][name] = fn(ctx)
        except Exception as exc:
            result[kind][name] = {
                "status": "error",
                "type": type(exc).__name__,
                "error": traceback.format_exc()[-2000:],
            }
        result[kind][name]["_seconds"] = time.perf_counter() - t0
        print(f"gpu_check: {kind}.{name} done in {time.perf_counter() - t0:.1f} s", flush=True)
        with open(args.out, "w") as fh:  # written after every section: a run cut short keeps what it did
            json.dump(result, fh, indent=1, default=str)
    result["correctness_passed"] = _passed(result["correctness"])
    result["timing_ok"] = _passed(result["timing"])
    result["meta"]["seconds"] = time.perf_counter() - START
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1, default=str)
    print(
        f"gpu_check: wrote {args.out}; correctness {'passed' if result['correctness_passed'] else 'FAILED'}"
    )
    return 0 if result["correctness_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
