"""Transient memory, host reads and step time of HORST's DTensor (FSDP2) path, against AdamW-foreach on the
same DTensor parameters, in the same process.

FSDP2 hands the optimizer DTensors, which HORST steps with its foreach path (the fused CPU kernel and the
compiled step take plain tensors only). This script shards a GPT-2-shaped parameter set (default 16 M
float32 parameters, 64 MiB) with ``distribute_tensor(..., [Shard(0)])`` over the ranks of a gloo group and
measures, per optimizer:

- ``state``: the bytes the first step allocates and keeps (the moments), per rank;
- ``transient``: the peak of the bytes allocated during a step and freed by its end, above what was
  allocated before it (first step included: its peak is reported separately), per rank;
- host reads per step (``.item()`` / ``float(t)`` / ``bool(t)``, boolean-mask indexing / ``nonzero``,
  device-to-host and blocking host-to-device copies, counted op by op by the shared
  :class:`descentlab.host_syncs.HostSyncCounter` as on a GPU they would sync);
- step time (median over rounds, interleaved), as a ratio to AdamW-foreach.

Memory is counted by a ``TorchDispatchMode`` that adds the size of every newly allocated output storage and
subtracts it when the storage is freed (tracemalloc does not see torch's allocations, and the CPU allocator
keeps no statistics). Ratios are against the local shard's parameter bytes and against AdamW-foreach
(``torch.optim.AdamW(foreach=True)``, the fair baseline: the same multi-tensor machinery). Run::

    .venv/bin/python benchmarks/horst_memory.py [--params 16e6] [--rounds 5] [--json out.json]
    .venv/bin/python -m torch.distributed.run --standalone --nproc_per_node=2 benchmarks/horst_memory.py

``--unchunked`` adds HORST with one chunk per bucket (the pre-#46 footprint of the same code path: all its
buffers at once). Target (issue 46): HORST's transient <= 1x the parameters, <= 1 host read per step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
import weakref
from collections.abc import Callable
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from descentlab.host_syncs import HostSyncCounter
from descentlab.optim import horst as horst_module
from descentlab.optim.horst import HORST


def _storage_of(t: torch.Tensor) -> torch.UntypedStorage | None:
    local = getattr(t, "_local_tensor", None)  # a DTensor's shard
    t = local if isinstance(local, torch.Tensor) else t
    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.device.type == "meta":
        return None
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None


class MemoryMeter(TorchDispatchMode):
    """Bytes of the storages allocated under it and still alive: ``live``, and ``peak`` since ``reset()``.

    An output is counted when its storage is new (not an input's, not one already counted), and uncounted
    when its tensor object is collected. Views of counted buffers that outlive their base would be missed;
    the optimizers measured here keep none.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._tracked: dict[int, int] = {}

    def reset(self) -> None:
        self.peak = self.live

    def _free(self, key: int) -> None:
        self.live -= self._tracked.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {
            s.data_ptr()
            for a in torch.utils._pytree.tree_leaves((args, kwargs))
            if isinstance(a, torch.Tensor) and (s := _storage_of(a)) is not None
        }
        for t in torch.utils._pytree.tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            s = _storage_of(t)
            if s is None or s.nbytes() == 0:
                continue
            key = s.data_ptr()
            if key in inputs or key in self._tracked:
                continue
            self._tracked[key] = s.nbytes()
            self.live += s.nbytes()
            self.peak = max(self.peak, self.live)
            weakref.finalize(t, self._free, key)
        return out


def host_step_counters(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's ``step`` counters that a GPU run keeps on the host (torch's unless ``capturable`` or
    ``fused``; HORST's always): reading them is no sync."""
    return [
        st
        for group in opt.param_groups
        if not (group.get("capturable") or group.get("fused") is True)
        for p in group["params"]
        if isinstance(st := opt.state.get(p, {}).get("step"), torch.Tensor) and type(st) is torch.Tensor
    ]


@contextmanager
def count_reads(opt: torch.optim.Optimizer | None = None):
    """``with count_reads(opt) as counts: ...``: host reads by kind (:class:`descentlab.host_syncs.HostSyncCounter`
    on the CPU: what would sync on a GPU; ``opt``'s host-side step counters declared as such)."""
    counter = HostSyncCounter().host(*(host_step_counters(opt) if opt is not None else ()))
    with counter:
        yield counter.counts


def gpt2_like_shapes(n_params: float) -> list[tuple[int, ...]]:
    """A GPT-2-like layout (an embedding, 12 blocks of 4 matrices with biases and norms) near n_params."""
    d = max(64, 64 * round(math.sqrt(n_params / (12 * 12 + 64)) / 64))
    vocab = 64 * d
    shapes: list[tuple[int, ...]] = [(vocab, d)]
    for _ in range(12):
        shapes += [(3 * d, d), (3 * d,), (d, d), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,), (d,), (d,)]
    return shapes


def sharded_params(shapes, seed: int = 0) -> list[torch.nn.Parameter]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    gen = torch.Generator().manual_seed(seed)
    params = []
    for shape in shapes:
        p = torch.nn.Parameter(distribute_tensor(torch.randn(shape, generator=gen) * 0.02, mesh, [Shard(0)]))
        p.grad = distribute_tensor(torch.randn(shape, generator=gen) * 1e-3, mesh, [Shard(0)])
        params.append(p)
    return params


def sharded_like(p: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``t`` (a whole tensor) laid out like the DTensor ``p`` (e.g. its gradient)."""
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(t, p.device_mesh, p.placements)


def local_bytes(params) -> int:
    return sum(p.to_local().numel() * p.element_size() for p in params)


@contextmanager
def unchunked():
    """HORST's foreach path with one chunk per bucket: all its buffers at once (the pre-#46 footprint)."""
    saved = horst_module._CHUNK_MAX, horst_module._CHUNK_SHARE
    horst_module._CHUNK_MAX, horst_module._CHUNK_SHARE = 1 << 62, 1
    try:
        yield
    finally:
        horst_module._CHUNK_MAX, horst_module._CHUNK_SHARE = saved


def measure(make: Callable, params, steps: int = 3, context=None) -> dict:
    """First-step and later-step memory and host reads of ``make(params)``'s steps."""
    meter = MemoryMeter()
    result: dict = {}
    with context() if context else contextlib_null():
        opt = make(params)
        for k in range(steps):
            before = meter.live
            with meter:
                meter.reset()
                with count_reads(opt) as reads:
                    opt.step()
            kept = meter.live - before
            transient = meter.peak - meter.live
            if k == 0:
                result["state_bytes"] = kept
                result["first_step_peak_bytes"] = meter.peak - before
                result["first_step_transient_bytes"] = transient
                result["first_step_reads"] = sum(reads.values())
            else:
                result["transient_bytes"] = max(result.get("transient_bytes", 0), transient)
                result["reads_per_step"] = max(result.get("reads_per_step", 0), sum(reads.values()))
                result["read_ops"] = dict(reads)
    return result


@contextmanager
def contextlib_null():
    yield


def time_steps(
    variants: dict[str, tuple[Callable, Callable | None]], params, rounds: int
) -> dict[str, float]:
    opts = {}
    for name, (make, context) in variants.items():
        with context() if context else contextlib_null():
            opts[name] = make(params)
            opts[name].step()
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (_, context) in variants.items():
            with context() if context else contextlib_null():
                start = time.perf_counter()
                opts[name].step()
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=16e6)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--unchunked", action="store_true")
    parser.add_argument("--json", type=str, default=None)
    args = parser.parse_args()

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    else:
        store = tempfile.mktemp(prefix="horst_memory_")
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()
    shapes = gpt2_like_shapes(args.params)
    hp = dict(lr=1e-3, weight_decay=0.01)
    variants: dict[str, tuple[Callable, Callable | None]] = {
        "adamw_foreach": (lambda ps: torch.optim.AdamW(ps, foreach=True, **hp), None),
        "horst": (lambda ps: HORST(ps, alpha=10.0, **hp), None),
        "horst_no_guard": (lambda ps: HORST(ps, alpha=10.0, nan_guard=False, **hp), None),
    }
    if args.unchunked:
        variants["horst_unchunked"] = (lambda ps: HORST(ps, alpha=10.0, **hp), unchunked)
    import warnings

    warnings.simplefilter("ignore", RuntimeWarning)  # HorstFallbackWarning: DTensor takes foreach by design
    results: dict[str, dict] = {}
    for name, (make, context) in variants.items():
        params = sharded_params(shapes)
        results[name] = measure(make, params, context=context)
        del params
    params = sharded_params(shapes)
    nbytes = local_bytes(params)
    times = time_steps(variants, params, args.rounds)
    base = results["adamw_foreach"]
    report = {
        "world": world,
        "params": sum(math.prod(s) for s in shapes),
        "local_param_bytes": nbytes,
        "threads": torch.get_num_threads(),
        "results": results,
        "time_s": times,
    }
    if rank == 0:
        mib = 2**20
        print(
            f"{report['params'] / 1e6:.1f} M float32 parameters, {world} rank(s), {nbytes / mib:.1f} MiB per rank"
        )
        print(
            f"{'variant':<18}{'transient':>12}{'x params':>10}{'x AdamW':>9}{'1st step':>10}{'reads':>7}{'time x':>8}"
        )
        for name, r in results.items():
            rel = r["transient_bytes"] / base["transient_bytes"] if base["transient_bytes"] else float("nan")
            print(
                f"{name:<18}{r['transient_bytes'] / mib:>9.1f} MiB{r['transient_bytes'] / nbytes:>10.2f}"
                f"{rel:>9.2f}{r['first_step_transient_bytes'] / nbytes:>10.2f}{r['reads_per_step']:>7}"
                f"{times[name] / times['adamw_foreach']:>8.2f}"
            )
        print("transient: peak bytes allocated and freed within a step (later steps; '1st step' the first,")
        print(
            "as a multiple of the parameters); reads: host reads per step; time: median step vs AdamW-foreach"
        )
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(report, fh, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
