"""Step time of HORST against torch.optim.AdamW on a GPT-2-small-shaped parameter set (~124 M, fp32).

All optimizers step the same parameters with the same fixed gradients, in one process, interleaved round by
round (so machine noise hits every variant alike); each variant's time is the median over rounds, and the
ratios are against ``AdamW(fused=True)``. Run::

    .venv/bin/python benchmarks/horst_step.py [--rounds 7] [--json out.json] [--with-foreach-horst]

Target: HORST (fused kernel) <= 1.15x fused AdamW on CPU. On a CUDA machine the same table is printed for
the GPU (HORST there runs its foreach path: no Triton kernel is written yet).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from descentlab.optim.horst import HORST


def gpt2_small_shapes(layers: int = 12) -> list[torch.Size]:
    """Parameter shapes of GPT-2 small (tied LM head counted once), read off the transformers model on meta."""
    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config(n_layer=layers))
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
    """One timed configuration: an optimizer plus the group settings it is stepped with.

    Variants of the same optimizer class share one optimizer (and its state), so the benchmark holds two
    sets of moments (AdamW's, HORST's) instead of one per row: 124 M fp32 parameters cost 1 GB per set, and
    the machine is shared.
    """

    def __init__(self, opt: torch.optim.Optimizer, **settings: object) -> None:
        self.opt, self.settings = opt, settings

    def step(self) -> None:
        for group in self.opt.param_groups:
            group.update(self.settings)
        self.opt.step()


def variants(params: list[torch.nn.Parameter], device: str, foreach_horst: bool) -> dict[str, Variant]:
    adamw = torch.optim.AdamW(params, lr=1e-3)
    horst = HORST(params, lr=1e-3)
    out = {
        "AdamW(fused=True)": Variant(adamw, fused=True, foreach=False),
        "AdamW(foreach=True)": Variant(adamw, fused=False, foreach=True),
    }
    if device == "cpu":
        out["HORST alpha=1 (fused kernel)"] = Variant(horst, alpha=1.0, impl="fused")
        # alpha * lr = 3e-2 > 1e-2: most exponents take the true-exp path
        out["HORST alpha=30 (fused kernel, exp path)"] = Variant(horst, alpha=30.0, impl="fused")
    if device != "cpu" or foreach_horst:
        out["HORST alpha=1 (foreach)"] = Variant(horst, alpha=1.0, impl="foreach")
    return out


def time_step(variant: Variant, sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    variant.step()
    sync()
    return time.perf_counter() - start


def bench(device: str, rounds: int, foreach_horst: bool, layers: int) -> dict:
    shapes = gpt2_small_shapes(layers)
    params = make_params(shapes, device)
    n_params = sum(p.numel() for p in params)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    opts = variants(params, device, foreach_horst)
    for opt in opts.values():  # warm-up: state allocation, kernel build / load, caches
        for _ in range(2):
            time_step(opt, sync)
    times: dict[str, list[float]] = {name: [] for name in opts}
    for _ in range(rounds):
        for name, opt in opts.items():
            times[name].append(time_step(opt, sync))
    base = statistics.median(times["AdamW(fused=True)"])
    rows = []
    for name, ts in times.items():
        per_round = [t / b for t, b in zip(ts, times["AdamW(fused=True)"], strict=True)]
        rows.append(
            {
                "variant": name,
                "median_ms": 1e3 * statistics.median(ts),
                "min_ms": 1e3 * min(ts),
                "ratio_vs_fused_adamw": statistics.median(ts) / base,
                "median_round_ratio": statistics.median(per_round),
            }
        )
    fe = statistics.median(times["AdamW(foreach=True)"])
    for row in rows:
        row["ratio_vs_foreach_adamw"] = row["median_ms"] / (1e3 * fe)
    return {"device": device, "n_params": n_params, "rounds": rounds, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", type=str, default=None, help="also write the results here")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--layers", type=int, default=12, help="GPT-2 blocks (12 = GPT-2 small, ~4 GB RSS)")
    parser.add_argument(
        "--with-foreach-horst", action="store_true", help="time HORST's foreach path on CPU too"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
    results = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "runs": [bench(d, args.rounds, args.with_foreach_horst, args.layers) for d in devices],
    }
    for run in results["runs"]:
        print(f"\n{run['device']}: {run['n_params'] / 1e6:.1f} M fp32 params, median of {run['rounds']} rounds, "
              f"torch {results['torch']}, {results['threads']} threads")  # fmt: skip
        print(
            f"{'variant':42s} {'median ms':>10s} {'min ms':>8s} {'vs fused':>9s} {'per-round':>10s} {'vs foreach':>11s}"
        )
        for r in run["rows"]:
            print(
                f"{r['variant']:42s} {r['median_ms']:10.1f} {r['min_ms']:8.1f} {r['ratio_vs_fused_adamw']:8.2f}x "
                f"{r['median_round_ratio']:9.2f}x {r['ratio_vs_foreach_adamw']:10.2f}x"
            )
    if not torch.cuda.is_available():
        print("\nno CUDA device here: GPU timings not measured")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
