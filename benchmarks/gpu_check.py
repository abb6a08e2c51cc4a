"""One prepared GPU check (issue 31): correctness of the CUDA paths and the figures docs/horst.md and
docs/constrained.md leave "unmeasured". Writes one JSON.

Runs in <= 9 minutes on one H200 (a time budget, ``--budget-s``, skips what would run past it and says so),
offline, importing only torch, transformers, accelerate, safetensors, numpy and descentlab (no omegaconf,
datasets, av, rdata or gguf: ``descentlab.constrained`` imports its omegaconf config lazily).

Sections (each records its own error instead of stopping the run):

* ``correctness.horst``: every HORST path on the device (auto, compiled, fused, fused=True, foreach,
  reference) against the CPU ``impl="reference"`` (``horst_reference``) in fp32, bf16 and bf16 with stochastic
  rounding (the same ``sr_seed``), 6 steps with an inf injected into one gradient at step 3 (the NaN guard
  must revert exactly the same elements).
* ``correctness.adamw``: HORST with alpha = beta = 0 against ``torch.optim.AdamW(fused=True)``.
* ``correctness.lambda``: lambda of PrimalDual(AdamW, LayerwiseDescent) on a small Llama from config,
  CPU against the device, after 5 steps on the same batches.
* ``correctness.acdc``: AC/DC's magnitude masks (global, layer, 2:4) CPU against the device.
* ``timing.constrained``: constrained (default readout) against ERM on a Llama-3.2-1B-shaped model from
  config (bf16, 8 x 2048) and on an 8B-width 4-layer slice with activation checkpointing: median step time,
  peak, first-step peak (``torch.cuda.max_memory_allocated``) and host syncs per step (a TorchDispatchMode
  counter of the ops that read device memory back: ``_local_scalar_dense``, ``nonzero``, device-to-host
  copies, ...).
* ``timing.horst``: HORST against fused AdamW on GPT-2-124M and Llama-3.2-1B parameter shapes: ms per step,
  ratio, achieved GB/s against a device copy's, compile time (first step minus a steady one), CUDA kernels
  per step (torch.profiler), recompiles over an lr schedule, and the optimizer's fallbacks.

``--tiny`` runs every section on the CPU with tiny shapes in seconds (the device is then "cpu" in the
JSON); the test ``tests/test_gpu_check.py`` runs it so.

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
from collections import Counter
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from descentlab.constrained.descent import LayerwiseDescent
from descentlab.constrained.primal_dual import PrimalDual
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


class SyncCounter(TorchDispatchMode):
    """Counts the aten ops that make the host wait for the device (reads of device memory)."""

    SYNCING: ClassVar[set[str]] = {
        "aten._local_scalar_dense.default",
        "aten.nonzero.default",
        "aten.is_nonzero.default",
        "aten.masked_select.default",
        "aten.unique_consecutive.default",
        "aten._unique2.default",
        "aten.equal.default",
    }

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        out = func(*args, **kwargs)
        if name in self.SYNCING:
            if any(isinstance(a, torch.Tensor) and a.device.type == self.device.type for a in args):
                self.ops[name] += 1  # (a CPU scalar's .item() on a CUDA run is no sync)
        elif name in ("aten._to_copy.default", "aten.copy_.default") and self.device.type != "cpu":
            src = args[0] if name == "aten._to_copy.default" else args[1]
            dst = out if name == "aten._to_copy.default" else args[0]
            if (
                isinstance(src, torch.Tensor)
                and isinstance(dst, torch.Tensor)
                and src.device.type == self.device.type
                and dst.device.type == "cpu"
            ):
                self.ops["device_to_host_copy"] += 1
        return out

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def peak_mib(ctx: Ctx) -> float | None:
    return torch.cuda.max_memory_allocated(ctx.device) / 2**20 if ctx.cuda else None


def reset_peak(ctx: Ctx) -> None:
    if ctx.cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(ctx.device)


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


def _steps(ctx: Ctx, model, batch, labels):
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=ctx.cuda or None)
    constraint = LayerwiseDescent(model.config.num_hidden_layers, alpha=0.05, dual_lr=0.01)
    pd = PrimalDual(adamw, constraint)

    def erm():
        model(**batch, labels=labels).loss.backward()
        adamw.step()
        adamw.zero_grad(set_to_none=True)

    def constrained():
        constraint.lagrangian(layer_losses(model, batch)).backward()
        pd.step()
        pd.zero_grad(set_to_none=True)

    return erm, constrained


def time_constrained(ctx: Ctx, name: str, model, tokens: tuple[int, int], repeats: int) -> dict[str, Any]:
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, tokens, generator=torch.Generator().manual_seed(0)).to(ctx.device)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    erm, constrained = _steps(ctx, model, batch, ids)
    res: dict[str, Any] = {
        "model": name,
        "tokens": list(tokens),
        "params": sum(p.numel() for p in model.parameters()),
    }
    res["erm_first_step_s"] = timed(ctx, erm)  # creates the AdamW state
    reset_peak(ctx)
    res["constrained_first_step_s"] = timed(ctx, constrained)  # the structure is traced here
    res["constrained_first_step_peak_mib"] = peak_mib(ctx)
    times: dict[str, list[float]] = {"erm": [], "constrained": []}
    peaks: dict[str, float | None] = {}
    for _ in range(repeats):
        for key, fn in (("erm", erm), ("constrained", constrained)):
            reset_peak(ctx)
            times[key].append(timed(ctx, fn))
            peaks[key] = max(peaks.get(key) or 0.0, peak_mib(ctx) or 0.0) if ctx.cuda else None
    for key in times:
        res[f"{key}_step_s"] = statistics.median(times[key])
        res[f"{key}_peak_mib"] = peaks[key]
        counter = SyncCounter(ctx.device)
        with counter:
            (erm if key == "erm" else constrained)()
        res[f"{key}_host_syncs"] = counter.total
        res[f"{key}_host_sync_ops"] = dict(counter.ops)
    res["time_ratio"] = res["constrained_step_s"] / res["erm_step_s"]
    if ctx.cuda:
        res["peak_ratio"] = res["constrained_peak_mib"] / res["erm_peak_mib"]
        res["first_step_peak_ratio"] = res["constrained_first_step_peak_mib"] / res["erm_peak_mib"]
    return res


def timing_constrained(ctx: Ctx) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if ctx.tiny:
        shapes = {
            "llama_1b_shape": dict(layers=2, hidden=64, inter=128, heads=4, kv=2, vocab=512, tie=True),
            "llama_8b_width_4_layers": dict(
                layers=2, hidden=96, inter=192, heads=4, kv=2, vocab=512, tie=False
            ),
        }
        tokens, repeats = (2, 32), 2
    else:
        shapes = {
            "llama_1b_shape": dict(layers=16, hidden=2048, inter=8192, heads=32, kv=8, vocab=128256, tie=True),
            "llama_8b_width_4_layers": dict(layers=4, hidden=4096, inter=14336, heads=32, kv=8, vocab=128256,
                                            tie=False),
        }  # fmt: skip
        tokens, repeats = (8, 2048), 5
    for name, shape in shapes.items():
        if ctx.left() < 60:
            out[name] = {"status": "skipped: time budget"}
            continue
        try:
            model = _llama(ctx, ctx.device, dtype=torch.bfloat16, **shape)
            if name.startswith("llama_8b"):
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            out[name] = time_constrained(ctx, name, model, tokens, repeats)
            out[name]["checkpointing"] = name.startswith("llama_8b")
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
            reset_peak(ctx)
    return out


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


def _kernels_per_step(ctx: Ctx, step: Callable[[], None]) -> int | None:
    if not ctx.cuda:
        return None
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
            "python": platform.python_version(),
        },
        "correctness": {},
        "timing": {},
    }
    sections: list[tuple[str, str, Callable[[Ctx], dict[str, Any]]]] = [
        ("correctness", "horst", check_horst),
        ("correctness", "adamw", check_adamw),
        ("correctness", "lambda", check_lambda),
        ("correctness", "acdc", check_acdc),
        ("timing", "horst", timing_horst),
        ("timing", "constrained", timing_constrained),
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
