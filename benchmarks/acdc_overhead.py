"""AC/DC per-step overhead against one training step of the sparse-vit model (target: <= 5 %).

Measures, on the sparse-vit ``full`` model and batch (ViT 3x64, patch 7, batch 64, AdamW):

* ``step``      one training step: forward, backward, ``optimizer.step()``, ``zero_grad``;
* ``per-step``  what AC/DC adds to every compressed step: ``mask_grads_()`` before the step and the
                re-zeroing in ``step()`` after it (timed alone, on real gradients, so that machine noise
                in the much longer training step does not swamp it);
* ``end-to-end`` a compressed training step with the controller minus one without (interleaved, medians);
* ``prune``     the global top-k at the start of a compressed phase, also amortised over a phase.

Run: ``python benchmarks/acdc_overhead.py [--repeats 30] [--threads 1]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from descentlab.models.vit import ViTSpec, build_vit
from descentlab.sparsity import ACDC, ACDCSchedule


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument(
        "--phase-steps", type=int, default=94, help="steps per AC/DC phase (full preset: 0.5 epoch)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model = build_vit(ViTSpec(hidden_size=args.hidden, num_layers=args.layers), seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    never_ending = ACDCSchedule(total=10**9, warmup=0, phase=10**9, last_decompressed=0, final=0)
    acdc = ACDC(model, opt, sparsity=0.9, schedule=never_ending)  # compressed from step 0
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, 1, 28, 28, generator=gen)
    y = torch.randint(10, (args.batch,), generator=gen)

    def train_step(controller: ACDC | None) -> float:
        start = time.perf_counter()
        model(pixel_values=x, labels=y).loss.backward()
        if controller is not None:
            controller.before_optimizer_step()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if controller is not None:
            controller.step()
        return time.perf_counter() - start

    def acdc_ops() -> float:
        model(pixel_values=x, labels=y).loss.backward()
        start = time.perf_counter()
        acdc.mask_grads_()
        acdc._zero_pruned_()  # the work of step() inside a compressed phase
        elapsed = time.perf_counter() - start
        opt.zero_grad(set_to_none=True)
        return elapsed

    for _ in range(5):
        train_step(acdc)
    plain, with_acdc, ops = [], [], []
    for _ in range(args.repeats):
        plain.append(train_step(None))
        with_acdc.append(train_step(acdc))
        ops.append(acdc_ops())
    prune = []
    for _ in range(5):
        start = time.perf_counter()
        acdc._compress()
        prune.append(time.perf_counter() - start)

    t_step, t_acdc, t_ops = (statistics.median(v) for v in (plain, with_acdc, ops))
    t_prune = statistics.median(prune)
    n = sum(t.param.numel() for t in acdc.tensors)
    print(
        f"model: ViT {args.layers}x{args.hidden}, batch {args.batch}, {n:,} prunable weights, "
        f"{args.threads} thread(s), {args.repeats} repeats (medians)"
    )
    print(f"training step (AdamW)             {1e3 * t_step:8.2f} ms")
    print(f"AC/DC per-step work (mask+rezero) {1e3 * t_ops:8.3f} ms   ratio {t_ops / t_step:.4f}")
    print(
        f"end-to-end compressed step        {1e3 * t_acdc:8.2f} ms   ratio {t_acdc / t_step - 1:+.4f} (noisy)"
    )
    print(
        f"global top-k prune at phase start {1e3 * t_prune:8.3f} ms   amortised over {args.phase_steps} steps: "
        f"ratio {t_prune / args.phase_steps / t_step:.4f}"
    )
    total = (t_ops + t_prune / args.phase_steps) / t_step
    verdict = "PASS" if total <= 0.05 else "FAIL"
    print(f"AC/DC overhead per step: {100 * total:.2f} % of a training step (target <= 5 %): {verdict}")


if __name__ == "__main__":
    main()
