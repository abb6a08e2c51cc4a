"""Step time of HORST against torch.optim.AdamW on a GPT-2-shaped parameter set (default ~124 M, fp32).

All variants step the same parameters with the same fixed gradients, in one process, interleaved round by
round (so machine noise hits every variant alike); each time is the median over rounds, and the ratios are
against ``AdamW(fused=True)`` measured in the same process. Per thread count (CPU) it prints the alpha sweep
{1, 10, 30} (and alpha = 10 without the NaN guard, which AdamW lacks; where the kernel runs its AVX-512 loop,
also alpha = 10 with the portable C loop it replaces), which loop the kernel runs, the achieved GB/s (28
bytes per parameter: p, g, m, v read, p, m, v written) and the machine's own copy bandwidth on the same bytes
(``dst.copy_(src)`` of 14 bytes per parameter: 14 read + 14 written), then the recompile count of the
compiled path over a cosine schedule (``torch._dynamo`` counters). Run::

    .venv/bin/python benchmarks/horst_step.py [--params 124e6] [--threads 2,1] [--rounds 7] [--json out.json]

Targets: CPU, the fused kernel <= 1.15x fused AdamW at every alpha; CUDA (the compiled path) <= 1.10x fused
AdamW at 124 M, >= 70 % of the copy bandwidth at 1 B.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import platform
import statistics
import time
from collections.abc import Callable

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from descentlab.optim._horst_kernel import load_kernel
from descentlab.optim.functional import Bucket, HorstHyper
from descentlab.optim.horst import HORST

BYTES_PER_PARAM = 28  # fp32: read p, g, m, v; write p, m, v
ALPHAS = (1.0, 10.0, 30.0)


def gpt2_shapes(n_params: float) -> list[torch.Size]:
    """GPT-2 (12 blocks, vocab 50257) shapes with the width whose count is nearest ``n_params`` (768: 124 M)."""
    # count ~ 144 d^2 + 51299 d (blocks, embeddings, norms); solve for d, round to a multiple of 12 heads
    d = (-51299 + math.sqrt(51299**2 + 4 * 144 * n_params)) / (2 * 144)
    d = max(12, 12 * round(d / 12))
    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config(n_embd=d, n_layer=12, n_head=12))
    return [p.shape for p in model.parameters()]


def make_params(shapes: list[torch.Size], device: str) -> list[torch.nn.Parameter]:
    gen = torch.Generator(device="cpu").manual_seed(0)
    params = []
    for shape in shapes:
        p = torch.nn.Parameter((torch.randn(shape, generator=gen) * 0.02).to(device))
        p.grad = (torch.randn(shape, generator=gen) * 1e-3).to(device)
        params.append(p)
    return params


class Variant:
    """An optimizer plus the group settings it is stepped with (variants of one class share one state)."""

    def __init__(
        self, opt: torch.optim.Optimizer | None, fn: Callable[[], None] | None = None, **settings
    ) -> None:
        self.opt, self.fn, self.settings = opt, fn, settings

    def step(self) -> None:
        if self.fn is not None:
            self.fn()
            return
        for group in self.opt.param_groups:
            group.update(self.settings)
        self.opt.step()


def variants(params: list[torch.nn.Parameter], device: str, copy: Callable[[], None], foreach: bool) -> dict:
    adamw = torch.optim.AdamW(params, lr=1e-3)
    horst = HORST(params, lr=1e-3)
    fast = "fused" if device == "cpu" else "compiled"
    out = {"AdamW(fused=True)": Variant(adamw, fused=True, foreach=False)}
    for alpha in ALPHAS:
        out[f"HORST alpha={alpha:g} ({fast})"] = Variant(horst, alpha=alpha, impl=fast, nan_guard=True)
    # AdamW has no guard: this row shows what HORST's (the default) costs
    out[f"HORST alpha=10 ({fast}, no guard)"] = Variant(horst, alpha=10.0, impl=fast, nan_guard=False)
    portable = load_kernel(portable=True) if device == "cpu" else None
    if portable is not None and load_kernel().simd_width:  # the loop the AVX-512 one replaces
        state = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
        bucket = Bucket([p.detach() for p in params], [p.grad for p in params], *state, [10] * len(params))
        hyper = HorstHyper(
            lr=1e-3,
            beta1=0.9,
            beta2=0.999,
            eps=1e-8,
            weight_decay=0.01,
            alpha=10.0,
            beta=0.0,
            exp_clamp=5.0,
            nan_guard=True,
        )  # HORST's defaults, at alpha = 10
        step = functools.partial(portable.horst_step_, bucket, hyper, mirror=True, check=False)
        out["HORST alpha=10 (portable C loop)"] = Variant(None, step)
    if foreach:
        out["AdamW(foreach=True)"] = Variant(adamw, fused=False, foreach=True)
        out["HORST alpha=1 (foreach)"] = Variant(horst, alpha=1.0, impl="foreach")
    out["copy of the same bytes"] = Variant(None, copy)
    return out


def bench(device: str, params: list[torch.nn.Parameter], rounds: int, foreach: bool) -> list[dict]:
    n = sum(p.numel() for p in params)
    src = torch.ones(BYTES_PER_PARAM * n // 8, dtype=torch.float32, device=device)  # 14 bytes / param
    dst = torch.empty_like(src)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    opts = variants(params, device, functools.partial(dst.copy_, src), foreach)
    for v in opts.values():  # warm-up: state, kernel build, compilation, caches
        for _ in range(2):
            v.step()
    times: dict[str, list[float]] = {name: [] for name in opts}
    for _ in range(rounds):
        for name, v in opts.items():
            sync()
            start = time.perf_counter()
            v.step()
            sync()
            times[name].append(time.perf_counter() - start)
    base = times["AdamW(fused=True)"]
    copy_gbs = BYTES_PER_PARAM * n / statistics.median(times["copy of the same bytes"]) / 1e9
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        gbs = BYTES_PER_PARAM * n / med / 1e9
        rows.append({
            "variant": name, "median_ms": 1e3 * med, "min_ms": 1e3 * min(ts),
            "vs_fused_adamw": med / statistics.median(base),
            "median_round_ratio": statistics.median([t / b for t, b in zip(ts, base, strict=True)]),
            "GB/s": gbs, "of_copy_bw": gbs / copy_gbs,
        })  # fmt: skip
    del src, dst
    return rows


def recompiles(device: str, params: list[torch.nn.Parameter], steps: int) -> dict:
    """Step the compiled path over a cosine schedule (lr, and alpha with it); count dynamo graphs and frames."""
    from torch._dynamo.utils import counters

    opt = HORST(params, lr=1e-3, alpha=10.0, impl="compiled")
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps, eta_min=1e-5)
    opt.step()
    sched.step()
    after_first = counters["stats"]["unique_graphs"]
    for k in range(steps - 1):
        for group in opt.param_groups:
            group["alpha"] = 10.0 + k
        opt.step()
        sched.step()
    return {
        "steps": steps, "graphs_after_first_step": after_first,
        "recompiles_over_schedule": counters["stats"]["unique_graphs"] - after_first,
        "lr_range": [1e-5, 1e-3],
    }  # fmt: skip


def print_rows(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print(
        f"{'variant':34s} {'median ms':>10s} {'min ms':>8s} {'vs fused':>9s} {'per-round':>10s} {'GB/s':>7s} {'of copy':>8s}"
    )
    for r in rows:
        print(
            f"{r['variant']:34s} {r['median_ms']:10.1f} {r['min_ms']:8.1f} {r['vs_fused_adamw']:8.2f}x "
            f"{r['median_round_ratio']:9.2f}x {r['GB/s']:7.1f} {100 * r['of_copy_bw']:7.0f}%"
        )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--params", type=float, default=124e6, help="parameter count (GPT-2 widths; 124e6 = small)"
    )
    parser.add_argument("--threads", type=str, default="2,1", help="CPU thread counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--recompile-steps", type=int, default=20, help="cosine-schedule steps (0: skip)")
    parser.add_argument("--with-foreach", action="store_true", help="also time foreach AdamW and HORST")
    parser.add_argument("--json", type=str, default=None, help="also write the results here")
    args = parser.parse_args()
    shapes = gpt2_shapes(args.params)
    results: dict = {
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "runs": [],
    }
    params = make_params(shapes, "cpu")
    n = sum(p.numel() for p in params)
    kernel = load_kernel()
    kernel_loop = "none (foreach)" if kernel is None else "AVX-512" if kernel.simd_width else "portable C"
    print(f"HORST fused kernel: {kernel_loop} loop")
    results["kernel_loop"] = kernel_loop
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        rows = bench("cpu", params, args.rounds, args.with_foreach)
        results["runs"].append({"device": "cpu", "threads": threads, "n_params": n, "rows": rows})
        print_rows(f"cpu: {n / 1e6:.1f} M fp32 params in {len(shapes)} tensors, {threads} thread(s), "
                   f"median of {args.rounds} rounds, torch {torch.__version__}", rows)  # fmt: skip
    del params
    if args.recompile_steps:  # CPU: a few tensors only (Inductor's C++ compile of all of GPT-2 takes minutes)
        small = make_params([torch.Size([256, 64]), torch.Size([64]), torch.Size([128, 128])], "cpu")
        results["recompiles_cpu"] = recompiles("cpu", small, args.recompile_steps)
        print(f"\ncpu compiled path (Inductor C++), 3 tensors: {results['recompiles_cpu']}")
    if torch.cuda.is_available():
        params = make_params(shapes, "cuda")
        rows = bench("cuda", params, args.rounds, args.with_foreach)
        results["runs"].append(
            {"device": "cuda", "n_params": n, "rows": rows, "gpu": torch.cuda.get_device_name()}
        )
        print_rows(f"cuda ({torch.cuda.get_device_name()}): {n / 1e6:.1f} M fp32 params", rows)
        if args.recompile_steps:
            results["recompiles_cuda"] = recompiles("cuda", params, args.recompile_steps)
            print(f"\ncuda compiled path, {len(params)} tensors: {results['recompiles_cuda']}")
    else:
        print("\nno CUDA device here: GPU timings not measured")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
