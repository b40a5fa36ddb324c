"""The machine's ceilings that replayed kernels are compared with, measured on the same GPU in the
same process: a device-to-device copy (bytes/s, read + write counted) and a large bf16 GEMM
(FLOP/s, cuBLAS through ctypes: cuda-python has no BLAS, and the GEMMs of an inference engine are
cuBLAS's). A kernel's floor is the time its traffic or its arithmetic needs at these rates; its
ratio to the floor says how far it is from the machine, not from a datasheet.

Not measured: an L2-resident copy rate, the FP8 tensor rate, anything about launch latency (the
replay's graph timing shows that).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from dataclasses import dataclass
from pathlib import Path

from vocab.errors import MineError

CUDA_R_16BF = 14
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1


class NoBlas(MineError, OSError):
    """No cuBLAS library could be loaded: the GEMM ceiling is not measured."""


@dataclass
class Ceilings:
    copy_bytes_s: float
    gemm_flop_s: float | None      # None: not measured (the note says why)
    gemm_n: int
    note: str = ""

    def floor_us(self, bytes_moved: int = 0, flops: int = 0) -> float:
        """The time (µs) `bytes_moved` and `flops` need at the ceilings (the larger of the two)."""
        t = bytes_moved / self.copy_bytes_s
        if flops and self.gemm_flop_s:
            t = max(t, flops / self.gemm_flop_s)
        return t * 1e6


def _cublas() -> ctypes.CDLL:
    names = [os.environ.get("MINE_CUBLAS", ""), ctypes.util.find_library("cublas") or ""]
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "lib64"
    names += [str(home / f"libcublas.so.{v}") for v in (13, 12)] + ["libcublas.so.13", "libcublas.so.12", "libcublas.so"]
    for n in names:
        if not n:
            continue
        try:
            return ctypes.CDLL(n)
        except OSError:
            continue
    raise NoBlas("no cuBLAS library found (set MINE_CUBLAS to its path): the GEMM ceiling is not measured")


def gemm_rate(gpu, n: int = 8192, reps: int = 5) -> float:
    """bf16 GEMM rate (FLOP/s) of an n x n x n product, fp32 accumulation, the best of `reps`."""
    lib = _cublas()
    handle = ctypes.c_void_p()
    if lib.cublasCreate_v2(ctypes.byref(handle)) != 0:
        raise NoBlas("cuBLAS did not start (cublasCreate failed): the GEMM ceiling is not measured")
    try:
        if lib.cublasSetStream_v2(handle, ctypes.c_void_p(int(gpu.stream))) != 0:
            raise NoBlas("cublasSetStream failed: the GEMM ceiling is not measured")
        a, b, c = gpu.alloc(n * n * 2), gpu.alloc(n * n * 2), gpu.alloc(n * n * 2)
        gpu.zero(a, n * n * 2)
        gpu.zero(b, n * n * 2)
        one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)

        def gemm() -> None:
            st = lib.cublasGemmEx(handle, 0, 0, n, n, n, ctypes.byref(one), ctypes.c_void_p(a), CUDA_R_16BF, n,
                                  ctypes.c_void_p(b), CUDA_R_16BF, n, ctypes.byref(zero), ctypes.c_void_p(c),
                                  CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
            if st != 0:
                raise NoBlas(f"cublasGemmEx failed with status {st}: the GEMM ceiling is not measured")

        gemm()
        gpu.sync()
        best = gpu.best_seconds(gemm, reps)
        return 2.0 * n ** 3 / best
    finally:
        lib.cublasDestroy_v2(handle)
        gpu.free_all()


def measure(gpu, gemm_n: int = 8192) -> Ceilings:
    """Both ceilings; a missing cuBLAS leaves the GEMM one out and says so in `note`."""
    copy = gpu.copy_bandwidth()
    try:
        return Ceilings(copy, gemm_rate(gpu, gemm_n), gemm_n)
    except NoBlas as exc:
        return Ceilings(copy, None, gemm_n, str(exc))
