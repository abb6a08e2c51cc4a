"""Host syncs of one constrained step, counted op by op: a constant (PrimalDual's one finiteness read-back plus
what the readout needs), never a count that grows with the number of layers L; logs read once, when read.

On CPU nothing really waits, so the counter counts the operations that *would* sync on a GPU: at the
dispatcher, ``_local_scalar_dense`` (``.item()``, ``float(t)``, ``bool(t)``), ``nonzero``, ``masked_select``,
indexing with a boolean mask, and copies of a non-CPU tensor to the CPU; at the torch-function level,
``tolist()`` and ``numpy()`` (on a CPU tensor they never reach the dispatcher).
"""

from __future__ import annotations

import collections

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import descentlab as dl
from descentlab.errors import InfeasibleConstraintError, NumericalError
from descentlab.logs import LazyLogs
from descentlab.train.objectives import Constrained
from tiny_models import tiny_bert, tiny_gpt2

_SYNC_OPS = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.masked_select.default"}


class _DispatchSyncs(TorchDispatchMode):
    def __init__(self, counts: collections.Counter) -> None:
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        if name in _SYNC_OPS:
            self.counts[name] += 1
        elif name.startswith("aten.index.Tensor") or name.startswith("aten.index_put"):
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ()):
                self.counts[f"{name}[bool mask]"] += 1
        elif name.startswith("aten._to_copy") or name.startswith("aten.copy_"):
            source = args[0] if name.startswith("aten._to_copy") else args[1]
            target = kwargs.get("device") if name.startswith("aten._to_copy") else args[0].device
            off_host = isinstance(source, torch.Tensor) and source.device.type != "cpu"
            if off_host and target is not None and torch.device(target).type == "cpu":
                self.counts["device->host copy"] += 1
        return func(*args, **kwargs)


class _FunctionSyncs(TorchFunctionMode):
    def __init__(self, counts: collections.Counter) -> None:
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("tolist", "numpy"):
            self.counts[func.__name__] += 1
        return func(*args, **(kwargs or {}))


class SyncCounter:
    """``with SyncCounter() as c: ...`` then ``c.total`` and ``c.counts`` (op -> count)."""

    def __init__(self) -> None:
        self.counts: collections.Counter = collections.Counter()
        self._modes = (_FunctionSyncs(self.counts), _DispatchSyncs(self.counts))

    def __enter__(self) -> SyncCounter:
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def test_the_counter_sees_every_kind_of_sync() -> None:
    """The counter is the measuring instrument: it must count what it claims to count."""
    x = torch.tensor([1.0, -2.0, 3.0])
    cases = [
        (lambda: float(x[0]), 1),
        (lambda: bool(x[0] > 0), 1),
        (lambda: x.tolist(), 1),
        (lambda: x[x > 0], 1),
        (lambda: torch.nonzero(x), 1),
        (lambda: x.masked_select(x > 0), 1),
        (lambda: x * 2 + x.sum(), 0),
        (lambda: torch.where(x > 0, x, 0.0).sum(), 0),
    ]
    for fn, expected in cases:
        with SyncCounter() as c:
            fn()
        assert c.total == expected, (fn, dict(c.counts))


def _one_step(
    model: torch.nn.Module, layers: int, batch: dict, *, check_finite: bool = True, sampled: bool = False
) -> SyncCounter:
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
    with SyncCounter() as counter:
        loss, logs = objective(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert isinstance(logs, LazyLogs) and not logs.read  # nobody read the logs: no sync for them
    with SyncCounter() as reading:
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
    assert few.counts["aten._local_scalar_dense.default"] >= 1
    assert few.total <= 6, dict(few.counts)
    assert few.counts["tolist"] == 0 and few.counts["aten.nonzero.default"] == 0, dict(few.counts)


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
                with SyncCounter() as c:
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
    with SyncCounter() as c:
        assert logs["f/1"] == 2.0 and logs["loss"] == 2.5 and logs["n"] == 3.0
    assert c.total == 1 and logs.read
    assert pickle.loads(pickle.dumps(logs)) == {"loss": 2.5, "n": 3.0, "f/0": 1.0, "f/1": 2.0}
