"""A fused single-pass CPU kernel for the HORST step: plain C + OpenMP, built once with the system compiler.

Why a kernel: the update has the memory traffic of AdamW (read p, g, m, v; write p, m, v), but a foreach
implementation makes ~15 passes over memory and pays one ``exp`` per element, which dominates on CPU. The
kernel does everything in one vectorised pass over cache-sized blocks, with its own exponential
(``horst_expf_impl``): range reduction x = k ln2 + r, |r| <= ln2 / 2, then 2^k * p(r), p a degree-6
near-minimax polynomial, all in fma's and integer bit operations that vectorise inside the loop. It is
within 1.04 ulp of the correctly rounded exp over the whole float32 range (0.99 ulp for |x| <= 80; overflow
to inf, gradual underflow to denormals and 0 included; tests/optim/test_horst_kernel.py bounds it at 1.05),
and it costs the same for every exponent, so alpha = 30 costs what alpha = 1 does. (The previous kernel
used a cubic for |x| < 1e-2 and a second pass with libm's ``expf`` elsewhere: 1.3x fused AdamW at alpha = 1,
4x at alpha = 30.)

The source, ``horst_kernel.c``, has two implementations of the same arithmetic, operation for operation: a
portable loop that the compiler vectorises, and, where the compiler targets AVX-512, hand-written 16-lane
intrinsics whose NaN guard costs a rarely taken branch instead of copies of the old values
(:attr:`HorstKernel.simd_width` says which runs). ``load_kernel(portable=True)`` builds the portable one
anyway: it is the reference twin, and the tests check that both give the same bits.

The AdamW half rounds like ``torch.optim.AdamW(fused=True)`` (``lerp`` as an fma, ``addcmul`` as
``fma(value * g, g, v)``, correctly rounded ``sqrt``), so with alpha = beta = 0 it reproduces it bit for bit
(exp(0) is exactly 1; the default, non-fused AdamW differs by an ulp here and there: its CPU ``sqrt`` is
not correctly rounded).

Plain C (no torch headers) compiles in about a second; the shared library is cached under
``$TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``), keyed by the source, flags and CPU flags,
and called through ``ctypes``. If it cannot be built (no C compiler, ``DESCENTLAB_HORST_KERNEL=0``),
:func:`load_kernel` returns ``None`` and HORST uses its pure-torch foreach path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

import torch
from torch import Tensor

from descentlab.optim.functional import Bucket, HorstHyper

logger = logging.getLogger(__name__)


# The C source ships beside this module (package data); it holds the portable loop and the AVX-512 one.
_C_SOURCE = (resources.files("descentlab.optim") / "horst_kernel.c").read_text()

# No fp contraction: the AdamW half must round like torch's fused AdamW, built with -ffp-contract=off (and
# the exp's rint trick needs the add and the subtract rounded separately). -fno-math-errno lets sqrtf
# vectorise (errno is never read). The OpenMP runtime resolves to the libgomp.so.1 torch already loaded, so
# both share one thread pool. The second entry drops -march=native for toolchains that reject it.
_BASE_FLAGS = ["-O3", "-fopenmp", "-ffp-contract=off", "-fno-math-errno"]
_FLAG_SETS: tuple[tuple[list[str], list[str]], ...] = (
    ([*_BASE_FLAGS, "-march=native"], []),
    (_BASE_FLAGS, []),
)


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def _cache_dir() -> Path:
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions"
    return Path(root) / "descentlab_horst"


def _build(source: str, flags: list[str], libs: list[str]) -> Path:
    key = hashlib.sha256("\n".join([source, *flags, *libs, _cpu_flags()]).encode()).hexdigest()[:16]
    target = _cache_dir() / f"horst_{key}.so"
    if target.exists():
        return target
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc/gcc) on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src, out = Path(tmp) / "horst.c", Path(tmp) / "horst.so"
        src.write_text(source)
        cmd = [compiler, *flags, "-std=c99", "-shared", "-fPIC", str(src), "-o", str(out), *libs, "-lm"]
        subprocess.run(cmd, check=True, capture_output=True, timeout=300)
        os.replace(out, target)  # atomic: concurrent builders each write a complete file
    return target


class HorstKernel:
    """The loaded shared library, with a typed Python entry point."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lib = ctypes.CDLL(str(path))
        fn = self._lib.horst_step
        fn.restype = ctypes.c_int64
        ptr, dbl = ctypes.c_void_p, ctypes.c_double
        fn.argtypes = [ctypes.c_int64, ptr, ptr, ptr, ptr, ptr, ptr, ptr]
        fn.argtypes += [dbl] * 5 + [ctypes.c_int, dbl, dbl, dbl, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        self._fn = fn
        exp = self._lib.horst_expf_array
        exp.restype = None
        exp.argtypes = [ptr, ptr, ctypes.c_int64, ctypes.c_int]
        self._exp = exp
        self._lib.horst_simd_width.restype = ctypes.c_int
        self.simd_width: int = self._lib.horst_simd_width()
        """16 where the AVX-512 intrinsics run, 0 for the portable loop."""

    def expf(self, x: Tensor, *, bounded: bool = False) -> Tensor:
        """The kernel's own exponential (the one inside the step), elementwise on a float32 CPU tensor.

        Exposed so that its error against the correctly rounded exp can be tested. ``bounded=True`` is the
        variant the step uses when the exponent clamp is at most 80; it requires |x| <= 80.
        """
        if x.dtype != torch.float32 or x.device.type != "cpu":
            raise TypeError("expf expects a float32 CPU tensor")
        x = x.contiguous()
        out = torch.empty_like(x)
        if bounded and x.numel() and not bool(x.abs().max() <= 80):
            raise ValueError("expf(bounded=True) requires |x| <= 80")
        self._exp(x.data_ptr(), out.data_ptr(), x.numel(), int(bounded))
        return out

    def horst_step_(
        self, bucket: Bucket, hp: HorstHyper, *, mirror: bool, check: bool = True, maximize: bool = False
    ) -> int:
        """In-place fused step of contiguous float32 CPU tensors at steps ``steps`` (one per tensor).

        ``maximize`` steps with -g (the kernel multiplies each gradient element by -1, an exact negation, in
        its one pass; by 1 otherwise, which changes no bit).

        ``check=False`` skips the per-tensor dtype / layout / size checks, for callers that made them (HORST
        does, when it picks the path); a wrong tensor then corrupts memory instead of raising.

        Returns:
            The number of elements the NaN guard reverted.
        """
        params, grads, exp_avgs, exp_avg_sqs, _ = bucket
        n = len(params)
        for lst in (grads, exp_avgs, exp_avg_sqs) if check else ():
            for p, t in zip(params, lst, strict=True):
                if t.dtype != torch.float32 or not t.is_contiguous() or t.device.type != "cpu":
                    raise TypeError("horst_step_ expects contiguous float32 CPU tensors")
                if t.numel() != p.numel():
                    raise ValueError("horst_step_: a gradient or moment does not match its parameter's size")
        if n == 0:
            return 0

        def ptrs(ts: list[Tensor]) -> ctypes.Array:
            return (ctypes.c_void_p * n)(*[t.data_ptr() for t in ts])

        step_sizes, bc2_sqrts = hp.bias_corrections(bucket.steps)
        lr, beta1, beta2, eps, weight_decay, alpha, beta, exp_clamp, nan_guard = hp
        exp_clamp = -1.0 if exp_clamp is None else float(exp_clamp)  # the C side reads <= 0 as "no clamp"
        numel = (ctypes.c_int64 * n)(*[p.numel() for p in params])
        reverted = self._fn(
            n, ptrs(params), ptrs(grads), ptrs(exp_avgs), ptrs(exp_avg_sqs), numel,
            (ctypes.c_double * n)(*step_sizes), (ctypes.c_double * n)(*bc2_sqrts),
            lr, beta1, beta2, eps, weight_decay, int(mirror), alpha, beta, exp_clamp, int(nan_guard),
            int(maximize), torch.get_num_threads(),
        )  # fmt: skip
        if reverted < 0:
            raise MemoryError("horst_step_: out of memory")
        return int(reverted)


#: Why the last :func:`load_kernel` returned None ("" when it built, or was never asked): HORST puts it in
#: its "kernel_build" fallback warning, so a failed build is recorded, not only logged.
build_error = ""


@functools.lru_cache(maxsize=2)
def load_kernel(*, portable: bool = False) -> HorstKernel | None:
    """Build (first call on a machine, about a second) or load the fused kernel.

    Args:
        portable: build the portable C loop even where the AVX-512 intrinsics would run (the reference
            twin of the fast path; HORST itself always uses the default).

    Returns:
        The kernel, or ``None`` if it cannot be built here (then HORST uses its foreach path).
    """
    global build_error
    if os.environ.get("DESCENTLAB_HORST_KERNEL", "1") == "0":
        build_error = "DESCENTLAB_HORST_KERNEL=0"
        return None
    extra = ["-DHORST_PORTABLE"] if portable else []
    for flags, libs in _FLAG_SETS:
        try:
            return HorstKernel(_build(_C_SOURCE, [*flags, *extra], libs))
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", b"") or b""
            logger.warning("HORST kernel build with %s failed: %s %s", flags, exc, detail.decode()[-500:])
            build_error = f"{type(exc).__name__}: {exc}"[:300]
    logger.warning("HORST fused CPU kernel unavailable; using the pure-torch foreach path")
    return None


if __name__ == "__main__":
    kernel = load_kernel()
    if kernel is None:
        print("HORST kernel: unavailable (foreach fallback)")
    else:
        print(f"HORST kernel: {kernel.path} ({'AVX-512' if kernel.simd_width else 'portable'} loop)")
