"""HORST's foreach (DTensor / FSDP2) path: chunked, with no host read per step, against its slow twin
(``horst_reference``) and AdamW; its transient memory against AdamW-foreach; the fused=True resume with
no read-back of the step counters; the fallbacks of ``impl="auto"``; tensor hyper-parameters checked at
each step.

Memory and host reads are measured with benchmarks/horst_memory.py's instruments (a TorchDispatchMode that
adds up newly allocated storages, and one that counts what would sync on a GPU).
"""

from __future__ import annotations

import importlib.util
import io
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from descentlab.errors import ConfigError
from descentlab.optim import horst as horst_module
from descentlab.optim._horst_kernel import load_kernel
from descentlab.optim.horst import HORST, HorstFallbackWarning, horst_reference

_BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "horst_memory.py"
_spec = importlib.util.spec_from_file_location("descentlab_bench_horst_memory", _BENCH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

KERNEL = load_kernel()
SHAPES = [(96, 40), (40,), (7, 5, 3), (300, 16), (16,), (2, 2)]


@pytest.fixture
def group(tmp_path):
    """A one-rank gloo group (DTensors need one)."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of at most 1,000 elements: the (300, 16) and (96, 40) tensors are cut into flat slices."""
    monkeypatch.setattr(horst_module, "_CHUNK_MIN", 1)
    monkeypatch.setattr(horst_module, "_CHUNK_MAX", 1000)


def _dtensors(values: list[torch.Tensor]) -> list[torch.nn.Parameter]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    return [torch.nn.Parameter(distribute_tensor(v.clone(), mesh, [Shard(0)])) for v in values]


def _grads(step: int, dtype=torch.float32, nan: bool = False) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    grads = [torch.randn(s, generator=gen).to(dtype) for s in SHAPES]
    if nan:
        grads[0][3, 7] = float("nan")
        grads[3][250, 1] = float("inf")
        grads[1][5] = float("nan")
    return grads


def _initial(dtype=torch.float32) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return [(torch.randn(s, generator=gen) * 0.1).to(dtype) for s in SHAPES]


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


HP = dict(lr=3e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, alpha=20.0, beta=0.5, exp_clamp=5.0)


def _reference_run(steps: int, nan_at: int | None, dtype=torch.float32):
    params = _initial(dtype)
    ms = [torch.zeros(s) for s in SHAPES]
    vs = [torch.zeros(s) for s in SHAPES]
    reverted = 0
    for k in range(1, steps + 1):
        for i, g in enumerate(_grads(k, dtype, nan=k == nan_at)):
            new = horst_reference(
                params[i], g, ms[i], vs[i], step=k, lr=HP["lr"], beta1=0.9, beta2=0.999, eps=1e-8,
                weight_decay=0.01, alpha=20.0, beta=0.5, mirror=params[i].ndim >= 2, exp_clamp=5.0,
            )  # fmt: skip
            params[i], ms[i], vs[i] = new.param, new.exp_avg, new.exp_avg_sq
            reverted += new.reverted
    return params, ms, vs, reverted


@pytest.mark.parametrize("sharded", [True, False], ids=["dtensor", "plain"])
def test_chunked_foreach_path_equals_the_reference_bit_for_bit(group, small_chunks, sharded):
    """Slices, chunks, the mirror and no-mirror tensors and the NaN guard: the same bits as the slow twin."""
    params = _dtensors(_initial()) if sharded else [torch.nn.Parameter(v) for v in _initial()]
    opt = HORST(params, impl="auto" if sharded else "foreach", **HP)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for k in range(1, 5):
            for p, g in zip(params, _grads(k, nan=k == 2), strict=True):
                p.grad = bench.sharded_like(p, g) if sharded else g
            opt.step()
    ref, ms, vs, reverted = _reference_run(4, nan_at=2)
    assert reverted == 3 and opt.reverted_total == 3
    for p, r, m, v in zip(params, ref, ms, vs, strict=True):
        assert torch.equal(_local(p.detach()), r)
        assert torch.equal(_local(opt.state[p]["exp_avg"]), m)
        assert torch.equal(_local(opt.state[p]["exp_avg_sq"]), v)


def test_bf16_dtensors_with_stochastic_rounding_match_the_reference(group, small_chunks):
    """Slices of a bf16 tensor draw the bits of the whole tensor (the rounding key is offset per slice)."""
    params = _dtensors(_initial(torch.bfloat16))
    opt = HORST(params, stochastic_rounding=True, sr_seed=5, **HP)
    plain = [torch.nn.Parameter(v) for v in _initial(torch.bfloat16)]
    ref = HORST(plain, stochastic_rounding=True, sr_seed=5, impl="reference", **HP)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for k in range(1, 4):
            for p, q, g in zip(params, plain, _grads(k, torch.bfloat16), strict=True):
                p.grad, q.grad = bench.sharded_like(p, g), g.clone()
            opt.step()
            ref.step()
    for p, q in zip(params, plain, strict=True):
        assert torch.equal(_local(p.detach()), q.detach())


def test_alpha_beta_zero_on_dtensors_is_adamw(group):
    params = _dtensors(_initial())
    plain = [torch.nn.Parameter(v) for v in _initial()]
    opt = HORST(params, lr=1e-2, alpha=0.0, beta=0.0)
    adamw = torch.optim.AdamW(plain, lr=1e-2, foreach=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HorstFallbackWarning)
        for k in range(1, 6):
            for p, q, g in zip(params, plain, _grads(k), strict=True):
                p.grad, q.grad = bench.sharded_like(p, g), g.clone()
            opt.step()
            adamw.step()
    for p, q in zip(params, plain, strict=True):
        torch.testing.assert_close(_local(p.detach()), q.detach(), rtol=1e-6, atol=1e-7)


def test_transient_memory_is_below_adamw_foreach_and_reads_at_most_once(group):
    """At 2.3 M parameters (chunks of 1/8 of them): the step's transient bytes <= 1x the parameters and
    <= AdamW-foreach's on the same DTensors, first step included; one host read per step with the NaN
    guard's default check, none with ``nan_check_every=None`` or without the guard."""
    shapes = bench.gpt2_like_shapes(1.5e6)
    nbytes = bench.local_bytes(bench.sharded_params(shapes))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HorstFallbackWarning)
        adamw = bench.measure(lambda ps: torch.optim.AdamW(ps, foreach=True), bench.sharded_params(shapes))
        horst = bench.measure(lambda ps: HORST(ps, alpha=10.0), bench.sharded_params(shapes))

        def lazy(ps):
            opt = HORST(ps, alpha=10.0)
            opt.nan_check_every = None
            return opt

        deferred = bench.measure(lazy, bench.sharded_params(shapes))
        unguarded = bench.measure(
            lambda ps: HORST(ps, alpha=10.0, nan_guard=False), bench.sharded_params(shapes)
        )
    assert adamw["transient_bytes"] >= 0.99 * nbytes  # the baseline does allocate its sqrt(v)
    for r in (horst, deferred, unguarded):
        assert r["transient_bytes"] <= 0.7 * nbytes
        assert r["first_step_transient_bytes"] <= 0.7 * nbytes
        assert r["transient_bytes"] <= adamw["transient_bytes"]
    assert horst["reads_per_step"] == 1 and horst["first_step_reads"] == 1
    assert deferred["reads_per_step"] == 0 and deferred["first_step_reads"] == 0
    assert unguarded["reads_per_step"] == 0


def test_the_meter_counts_allocations_and_frees():
    meter = bench.MemoryMeter()
    with meter:
        a = torch.empty(1000)  # 4,000 bytes
        b = a * 2  # 4,000 more
        a.mul_(3)  # in place: nothing
        del b
    assert meter.peak == 8000 and meter.live == 4000
    del a
    assert meter.live == 0


def test_deferred_nan_counts_are_read_when_asked_and_warn_once(group):
    params = _dtensors(_initial())
    opt = HORST(params, **HP)
    opt.nan_check_every = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in range(1, 4):
            for p, g in zip(params, _grads(k, nan=True), strict=True):
                p.grad = bench.sharded_like(p, g)
            with bench.count_reads() as reads:
                opt.step()
            assert sum(reads.values()) == 0
        nan_warnings = [w for w in caught if "NaN guard" in str(w.message)]
        assert not nan_warnings  # nothing read yet
        assert opt.reverted == 3 and opt.reverted_total == 9
        assert len([w for w in caught if "NaN guard" in str(w.message)]) == 1
        assert opt.state_dict()["param_groups"][0]["nan_reverted"] == 9


def test_fused_resume_reads_no_step_counter_back(tiny_gpt2, lm_batches, lm_loss):
    """torch puts ``step`` on the parameter's device when a group has fused=True; HORST keeps it a float32
    CPU scalar and keeps its value on the host, so a resumed fused step reads nothing back."""
    if KERNEL is None:
        pytest.skip("the fused CPU kernel did not build here")
    model = tiny_gpt2()
    opt = HORST(model.parameters(), lr=1e-3, fused=True)
    for ids in lm_batches[:2]:
        opt.zero_grad()
        lm_loss(model, ids).backward()
        opt.step()
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    resumed = HORST(model.parameters(), lr=1e-3, fused=True)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    for p in model.parameters():
        step = resumed.state[p]["step"]
        assert step.device.type == "cpu" and step.dtype == torch.float32 and float(step) == 2
    for ids in lm_batches[2:5]:
        resumed.zero_grad()
        lm_loss(model, ids).backward()
        with bench.count_reads() as reads:
            resumed.step()
        assert sum(reads.values()) == 0, dict(reads)
    assert all(float(resumed.state[p]["step"]) == 5 for p in model.parameters())


def test_a_replaced_step_counter_is_read_once(tiny_gpt2, lm_batches, lm_loss):
    model = tiny_gpt2()
    opt = HORST(model.parameters(), lr=1e-3, alpha=0.0, beta=0.0)
    adamw_model = tiny_gpt2()
    adamw = torch.optim.AdamW(adamw_model.parameters(), lr=1e-3)
    for ids in lm_batches[:3]:
        for m, o in ((model, opt), (adamw_model, adamw)):
            o.zero_grad()
            lm_loss(m, ids).backward()
            o.step()
        if ids is lm_batches[0]:  # a user sets the counters by hand, as a state surgery might
            for p, q in zip(model.parameters(), adamw_model.parameters(), strict=True):
                opt.state[p]["step"] = torch.tensor(10.0)
                adamw.state[q]["step"] = torch.tensor(10.0)
    assert all(float(opt.state[p]["step"]) == 12 for p in model.parameters())
    for p, q in zip(model.parameters(), adamw_model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=2e-6)  # the bias corrections of steps 11 and 12


def _fallback_run(params, **kw) -> tuple[HORST, list[str]]:
    opt = HORST(params, lr=1e-3, **kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            for p in params:
                p.grad = torch.ones_like(p)
            opt.step()
    return opt, [str(w.message) for w in caught if issubclass(w.category, HorstFallbackWarning)]


@pytest.mark.parametrize(("dtype", "reason"), [(torch.float64, "cpu_dtype"), (torch.bfloat16, "cpu_dtype")])
def test_auto_records_cpu_dtypes_that_take_foreach_by_design(dtype, reason):
    params = [
        torch.nn.Parameter(torch.randn(4, 4, dtype=dtype)),
        torch.nn.Parameter(torch.randn(3, dtype=dtype)),
    ]
    opt, messages = _fallback_run(params)
    assert len(messages) == 1 and "float32 only" in messages[0]
    assert opt.fallbacks == {reason: 6}
    state = opt.state_dict()
    assert state["param_groups"][0]["fallback_reasons"] == {reason: 6}
    again = HORST(params, lr=1e-3)
    again.load_state_dict(state)
    assert "6 tensor-step(s)" in again.fallback_messages[reason]


def test_auto_records_a_failed_kernel_build(monkeypatch):
    monkeypatch.setattr(horst_module, "load_kernel", lambda **kw: None)
    monkeypatch.setattr(horst_module._horst_kernel, "build_error", "CalledProcessError: cc exited 1")
    params = [torch.nn.Parameter(torch.randn(4, 4))]
    opt, messages = _fallback_run(params)
    assert opt.fallbacks == {"kernel_build": 3}
    assert len(messages) == 1 and "did not build" in messages[0] and "cc exited 1" in messages[0]


def test_auto_records_cuda_without_triton(monkeypatch):
    monkeypatch.setattr(horst_module, "load_kernel", lambda **kw: None)
    monkeypatch.setattr(horst_module, "_is_cuda", lambda p: True)  # CPU tensors follow the CUDA rules
    monkeypatch.setattr(horst_module, "_can_compile", lambda device: False)
    params = [torch.nn.Parameter(torch.randn(4, 4))]
    opt, messages = _fallback_run(params)
    assert opt.fallbacks == {"no_triton": 3}
    assert len(messages) == 1 and "no Triton" in messages[0]


def test_auto_records_dtensors(group):
    params = _dtensors([torch.randn(4, 4)])
    opt, messages = _fallback_run(params)
    assert opt.fallbacks == {"tensor_subclass": 3} and len(messages) == 1 and "DTensor" in messages[0]


def test_explicit_foreach_records_nothing():
    params = [torch.nn.Parameter(torch.randn(4, 4, dtype=torch.float64))]
    opt, messages = _fallback_run(params, impl="foreach")
    assert opt.fallbacks == {} and not messages


@pytest.mark.parametrize("bad", [float("nan"), -1e-3, float("inf")])
@pytest.mark.parametrize("key", ["lr", "weight_decay", "alpha"])
def test_a_bad_tensor_hyper_parameter_set_after_construction_raises_at_step(bad, key):
    p = torch.nn.Parameter(torch.randn(4, 4))
    opt = HORST([p], lr=torch.tensor(1e-3))
    p.grad = torch.randn(4, 4)
    opt.step()
    before = p.detach().clone()
    opt.param_groups[0][key] = torch.tensor(bad)
    with pytest.raises(ConfigError, match=f"invalid {key}="):
        opt.step()
    assert torch.equal(p.detach(), before)  # nothing touched
    assert float(opt.state[p]["step"]) == 1


def test_a_float_lr_step_reads_nothing(tiny_gpt2, lm_batches, lm_loss):
    model = tiny_gpt2()
    opt = HORST(model.parameters(), lr=1e-3)
    for ids in lm_batches[:3]:
        opt.zero_grad()
        lm_loss(model, ids).backward()
        with bench.count_reads() as reads:
            opt.step()
    assert sum(reads.values()) == 0, dict(reads)
