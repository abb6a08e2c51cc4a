"""Host syncs per step, counted op by op with the shared counter (:mod:`descentlab.host_syncs`: on the CPU it
counts what would sync on a GPU) against each path's budget:

* a constrained step: PrimalDual's one finiteness read-back plus what the readout needs, never a count that
  grows with the number of layers L; logs read once, when read;
* the causal-LM readout's own reads, with its token subsample's ``randperm(...).to(device)``;
* HORST's step, on each path the CPU reaches;
* ``fit``'s per-step checks (the finiteness decision), and one read at a log step.

Where a path syncs beyond its budget, the budget test is ``xfail(strict=True)`` naming the line, and a
second test pins today's exact count so that it cannot grow unnoticed.
"""

from __future__ import annotations

import pytest
import torch

import descentlab as dl
from descentlab.errors import InfeasibleConstraintError, NumericalError
from descentlab.host_syncs import HostSyncCounter
from descentlab.logs import LazyLogs
from descentlab.optim._horst_kernel import load_kernel
from descentlab.optim.horst import HORST
from descentlab.readout import CausalLMReadout, layer_losses
from descentlab.train.loop import TrainConfig, fit
from descentlab.train.objectives import ERM, Constrained
from descentlab.train.rundir import RunDir
from tiny_models import tiny_bert, tiny_gpt2

SyncCounter = HostSyncCounter  # the name tests/constrained/test_problem.py imports from here


def test_the_counter_sees_every_kind_of_sync_and_nothing_else() -> None:
    """The counter is the measuring instrument: each kind fires on a minimal example, once, and a
    sync-free op counts nothing (on the CPU: what would sync on a GPU; module docs of host_syncs)."""
    x = torch.tensor([1.0, -2.0, 3.0])
    cases = [
        (lambda: x.sum().item(), {"item": 1}),
        (lambda: float(x[0]), {"item": 1}),
        (lambda: bool(x[0] > 0), {"item": 1}),
        (lambda: x.tolist(), {"device_to_host": 1}),
        (lambda: x.cpu()[0].item(), {"device_to_host": 1}),  # then a host scalar: no second sync
        (lambda: x.to("cpu"), {"device_to_host": 1}),
        (lambda: x.numpy(), {"device_to_host": 1}),
        (lambda: torch.zeros(3).copy_(x), {"device_to_host": 1}),
        (lambda: x[x > 0], {"bool_mask": 1}),
        (lambda: x.clone().__setitem__(x > 0, 0.0), {"bool_mask": 1}),
        (lambda: torch.nonzero(x), {"bool_mask": 1}),
        (lambda: x.masked_select(x > 0), {"bool_mask": 1}),
        (lambda: torch.unique(x), {"bool_mask": 1}),
        (lambda: torch.randperm(5, device="cpu")[:2].to(x.device), {"host_to_device": 1}),
        (lambda: torch.tensor([0, 2], device=x.device), {"host_to_device": 1}),
        (lambda: x.clone().copy_(torch.zeros(3)), {"host_to_device": 1}),
        # sync-free: device arithmetic, masks used arithmetically, dtype casts, moves that stay put,
        # pinned-style non-blocking copies, and host scalars made and read on the host
        (lambda: x * 2 + x.sum(), {}),
        (lambda: torch.where(x > 0, x, 0.0).sum(), {}),
        (lambda: x.masked_fill(x > 0, 0.0), {}),
        (lambda: x.to(torch.float64).to(x.device), {}),
        (lambda: torch.randperm(5)[:2].to(x.device, non_blocking=True), {}),
        (lambda: torch.tensor(2.0).item() + len(torch.arange(3).tolist()), {}),
        (lambda: x.index_select(0, torch.arange(2, device=x.device)), {}),
    ]
    for fn, expected in cases:
        with HostSyncCounter() as c:
            fn()
        assert dict(c.counts) == expected, (fn, dict(c.ops))


def test_the_counter_counts_only_device_memory_on_an_accelerator() -> None:
    """Given a CUDA device (as gpu_check does), CPU tensors are host memory: their reads are no syncs."""
    x = torch.tensor([1.0, -2.0, 3.0])
    with HostSyncCounter("cuda") as c:
        x.sum().item(), x.tolist(), x[x > 0], x.cpu()
    assert c.total == 0, dict(c.ops)


def _one_step(
    model: torch.nn.Module, layers: int, batch: dict, *, check_finite: bool = True, sampled: bool = False
) -> HostSyncCounter:
    constraint = dl.LayerwiseDescent(num_layers=layers, alpha=0.05, dual_lr=0.1)
    # SGD with momentum: its own step never reads the device (AdamW's per-tensor step counters would)
    opt = dl.PrimalDual(
        torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9), constraint, check_finite=check_finite
    )
    objective = Constrained(constraint)
    for _ in range(2):  # the first step traces the model's structure; count a later one
        loss, logs = objective(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
    with HostSyncCounter() as counter:
        loss, logs = objective(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert isinstance(logs, LazyLogs) and not logs.read  # nobody read the logs: no sync for them
    with HostSyncCounter() as reading:
        values = dict(logs)
    assert reading.total == 1, dict(reading.counts)  # all of them in one read-back
    # a sampled readout (the causal LM's default under grad) labels its estimates, and their standard
    # errors come back in the same one read
    g = "g_sampled" if sampled else "g"
    assert {"loss", "lagrangian", f"f/{layers}", f"{g}/{layers}", f"lambda/{layers}"} <= set(values)
    assert (f"g_se/{layers}" in values) == sampled and (f"g/{layers}" in values) != sampled
    assert values["lambda/1"] == pytest.approx(float(constraint.multipliers[0]), abs=0.2)
    counter.logs_read = values  # type: ignore[attr-defined]
    return counter


def _gpt2(layers: int) -> tuple[torch.nn.Module, dict]:
    ids = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    return tiny_gpt2(layers=layers), {"input_ids": ids, "labels": ids}


_gpt2.sampled = True  # type: ignore[attr-defined]  # the default causal-LM readout samples under grad


def _bert(layers: int) -> tuple[torch.nn.Module, dict]:
    ids = torch.randint(1, 97, (4, 10), generator=torch.Generator().manual_seed(0))
    return tiny_bert(layers=layers), {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "labels": torch.tensor([0, 1, 1, 0]),
    }


_bert.sampled = False  # type: ignore[attr-defined]


@pytest.mark.parametrize("family", [_gpt2, _bert], ids=["gpt2", "bert"])
def test_syncs_per_constrained_step_do_not_grow_with_depth(family) -> None:
    counts = {}
    for layers in (2, 6):
        model, batch = family(layers)
        counts[layers] = _one_step(model, layers, batch, sampled=family.sampled)
    few, many = counts[2], counts[6]
    assert few.total == many.total, (dict(few.counts), dict(many.counts))
    # PrimalDual's documented finiteness read-back, plus what the readout needs once per batch (the causal
    # LM's: the target count, which rows have targets, the mean's denominator): 6 at most, whatever L
    assert few.counts["item"] >= 1
    assert few.total <= 6, dict(few.ops)
    assert few.counts["device_to_host"] == 0, dict(few.ops)


def test_the_constrained_machinery_alone_syncs_once_per_step_and_not_at_all_unguarded() -> None:
    """Lagrangian, backward and PrimalDual.step on given losses: exactly the one finiteness read-back."""
    for layers in (2, 6):
        for check_finite, expected in ((True, 1), (False, 0)):
            theta = torch.nn.Parameter(torch.randn(layers + 1, generator=torch.Generator().manual_seed(1)))
            constraint = dl.LayerwiseDescent(
                num_layers=layers, alpha=0.1, dual_lr=0.1, divergence_patience=50
            )
            opt = dl.PrimalDual(torch.optim.SGD([theta], lr=1e-2), constraint, check_finite=check_finite)
            for step in range(3):
                with HostSyncCounter() as c:
                    f = theta.pow(2) + 1.0
                    constraint.lagrangian(f).backward()
                    opt.step()
                    opt.zero_grad()
                assert c.total == expected, (layers, check_finite, step, dict(c.counts))
            assert float(constraint.multipliers.max()) > 0  # the dual step did run


def test_deferred_guards_still_raise_at_the_next_read_back() -> None:
    """A diverging λ is found by the next step's read-back (before that primal step moves anything)."""
    theta = torch.nn.Parameter(torch.ones(3))
    constraint = dl.LayerwiseDescent(num_layers=2, alpha=0.5, dual_lr=10.0, max_multiplier=5.0)
    opt = dl.PrimalDual(torch.optim.SGD([theta], lr=1e-3), constraint)
    assert constraint.defer_checks

    def step() -> None:
        constraint.lagrangian(theta * torch.tensor([1.0, 2.0, 4.0])).backward()  # never descends
        opt.step()
        opt.zero_grad()

    step()  # λ = 10 · ĝ > 5 after this dual step; nothing read yet
    assert float(constraint.multipliers.max()) > 5.0
    before = theta.detach().clone()
    with pytest.raises(InfeasibleConstraintError, match="exceeds max_multiplier"):
        step()
    assert torch.equal(theta.detach(), before)


def test_deferred_guards_are_read_with_the_logs_when_the_step_does_not_check() -> None:
    theta = torch.nn.Parameter(torch.ones(3))
    constraint = dl.LayerwiseDescent(num_layers=2, alpha=0.1, dual_lr=0.1)
    opt = dl.PrimalDual(torch.optim.SGD([theta], lr=1e-3), constraint, check_finite=False)
    constraint.lagrangian(theta * torch.tensor([1.0, float("nan"), 1.0])).backward()
    opt.step()  # unguarded: the NaN ĝ reaches the dual step, which leaves λ alone and records it
    assert torch.equal(constraint.multipliers, torch.zeros(2, dtype=torch.float64))
    with pytest.raises(NumericalError, match=r"non-finite constraint violation at layer\(s\) \[1, 2\]"):
        dict(constraint.log_values())


def test_lazy_logs_read_once_and_pickle_as_floats() -> None:
    import pickle

    logs = LazyLogs({"loss": torch.tensor(2.5), "n": 3}, {"f": (torch.tensor([1.0, 2.0]), 0)})
    assert list(logs) == ["loss", "n", "f/0", "f/1"] and "f/1" in logs and not logs.read
    with HostSyncCounter() as c:
        assert logs["f/1"] == 2.0 and logs["loss"] == 2.5 and logs["n"] == 3.0
    assert c.total == 1 and logs.read
    assert pickle.loads(pickle.dumps(logs)) == {"loss": 2.5, "n": 3.0, "f/0": 1.0, "f/1": 2.0}


# -- the causal-LM readout's own reads ------------------------------------------------------------------------

_READOUT_FILES = ("descentlab/readout/", "descentlab/linear_cross_entropy.py", "descentlab/losses.py")


def _readout_syncs(layers: int, *, sampled: bool, grad: bool) -> dict[str, int]:
    """Syncs whose line is in the readout (the model's own forward, e.g. transformers' mask checks, is ERM's
    too), by kind, for one ``layer_losses`` call after a first one traced the structure."""
    model, batch = _gpt2(layers)
    readout = CausalLMReadout() if sampled else CausalLMReadout(sample_tokens=None)
    layer_losses(model, batch, readout=readout)
    with torch.set_grad_enabled(grad), HostSyncCounter(locate=True) as c:
        f = layer_losses(model, batch, readout=readout)
        if grad:
            f.sum().backward()
    assert readout.last_estimate.sampled == (sampled and grad)
    kinds: dict[str, int] = {}
    for key, n in c.where.items():
        if any(part in key for part in _READOUT_FILES):
            kind = key.split(":")[0]
            kinds[kind] = kinds.get(kind, 0) + n
    return kinds


@pytest.mark.parametrize(("sampled", "grad"), [(True, True), (False, True), (True, False)])
def test_the_readout_reads_once_per_batch(sampled: bool, grad: bool) -> None:
    """Budget: one host read per batch, the target count (``n = int(valid.sum())``, it sizes the
    subsample), sampled or not, at any depth: the rows with a target are selected by
    ``nonzero_static(size=n)`` (no boolean mask), and the subsample is drawn on the device it is used on."""
    for layers in (2, 5):
        assert _readout_syncs(layers, sampled=sampled, grad=grad) == {"item": 1}


# -- HORST's step, on each path the CPU reaches ------------------------------------------------------------------

_SHAPES = [(8, 6), (5,), (3, 3), (4,)]


def _horst_syncs(impl: str, dtype: torch.dtype, every: int | None) -> tuple[list[int], int, HORST]:
    """Syncs of 4 steps (each counted alone) after a first one, and of reading ``reverted_total``."""
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen).to(dtype)) for s in _SHAPES]
    opt = HORST(
        [{"params": params[:2], "alpha": 3.0}, {"params": params[2:], "mirror": True}], lr=1e-3, impl=impl
    )
    opt.nan_check_every = every
    per_step = []
    for step in range(5):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(dtype)
        with HostSyncCounter() as c:
            opt.step()
        if step:
            per_step.append(c.total)
    with HostSyncCounter() as read:
        assert opt.reverted_total == 0
    return per_step, read.total, opt


@pytest.mark.filterwarnings(
    "ignore::RuntimeWarning"
)  # HorstFallbackWarning: CPU bf16 takes foreach by design
@pytest.mark.parametrize(
    ("impl", "dtype"),
    [("auto", torch.float32), ("fused", torch.float32), ("auto", torch.bfloat16), ("foreach", torch.float32)],
)
def test_horst_step_syncs_today(impl: str, dtype: torch.dtype) -> None:
    """Pinned. The C kernel (auto / fused, fp32 on the CPU) counts reverts on the host: no read, ever. The
    foreach path (CPU bf16 under auto, and impl="foreach") reads the NaN guard's device counts at
    ``nan_check_every`` (1: every step) and when ``reverted_total`` is read: one device-to-host copy of
    every pending count at once, in HORST._read_counts. ``nan_check_every=None``: no read in the step at
    all. (``impl="compiled"`` is not counted here: a dispatch mode turns torch.compile off.)"""
    kernel = impl in ("auto", "fused") and dtype == torch.float32 and load_kernel() is not None
    if impl in ("auto", "fused") and dtype == torch.float32 and not kernel:
        pytest.skip("the HORST C kernel did not build here")
    reads = 0 if kernel else 1  # the kernel counts on the host; foreach reads its stacked device counts once
    steps, read, _ = _horst_syncs(impl, dtype, every=1)
    assert steps == [reads] * 4 and read == 0
    steps, read, _ = _horst_syncs(impl, dtype, every=None)
    assert steps == [0] * 4 and read == reads


def test_horst_reference_reads_each_tensor_by_design() -> None:
    """The reference twin (not a fast path) reads each tensor's revert count as it steps it."""
    steps, read, _ = _horst_syncs("reference", torch.float32, every=1)
    assert steps == [len(_SHAPES)] * 4 and read == 0


def test_horst_foreach_reads_once_per_step() -> None:
    """Budget (docs/horst.md): one host read per step with the NaN guard, one per reverted_total read."""
    steps, read, _ = _horst_syncs("foreach", torch.float32, every=1)
    assert steps == [1] * 4 and read == 0
    steps, read, _ = _horst_syncs("foreach", torch.float32, every=None)
    assert steps == [0] * 4 and read == 1


# -- fit: the finiteness decision, and a log step ------------------------------------------------------------------


def _fit_syncs(tmp_path, *, log_every: int, grad_clip: float | None) -> list[dict[str, int]]:
    """The syncs of each of 6 steps of ``fit`` (counted between its per-step callbacks), by kind@file."""
    gen = torch.Generator().manual_seed(0)
    data = [{"x": torch.randn(4, generator=gen), "y": torch.tensor(i % 2)} for i in range(16)]

    def loss(model: torch.nn.Module, batch: dict) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"])

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    cfg = TrainConfig(max_steps=6, batch_size=4, log_every=log_every, progress=False, grad_clip=grad_clip)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    counter = HostSyncCounter(locate=True)
    per_step: list[dict[str, int]] = []

    def after_step(step: int, model: torch.nn.Module, logs: object) -> None:
        where: dict[str, int] = {}
        for key, n in counter.where.items():
            kind, place = key.split(":")[0], key.rsplit("/", 1)[-1].split(":")[0]
            where[f"{kind}@{place}"] = where.get(f"{kind}@{place}", 0) + n
        per_step.append(where)
        counter.reset()

    with counter:
        fit(model, data, objective=ERM(loss), optimizer=opt, cfg=cfg, callbacks=[after_step],
            run=RunDir(tmp_path))  # fmt: skip
    return per_step


@pytest.mark.parametrize("grad_clip", [None, 1.0])
def test_fit_reads_once_per_step_and_once_more_at_a_log_step(tmp_path, grad_clip: float | None) -> None:
    """Budget: the step's finiteness decision is its one read (``bool(step_ok)``: the loss's flag and the
    batch's own, read together), and a log step adds the logs' one read; clipping adds none; the batch's
    copy to the device is non-blocking (not counted)."""
    steps = _fit_syncs(tmp_path, log_every=3, grad_clip=grad_clip)
    one = {"item@loop.py": 1}
    assert steps == [one, one, {**one, "device_to_host@logs.py": 1}] * 2
