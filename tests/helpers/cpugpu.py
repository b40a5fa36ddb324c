"""A CPU model of `replay.gpu.Gpu` for measurement tests: allocations are numpy arrays addressed
like device memory, and the launched 'kernel' is a Python function over that memory. Why: the
forward replay's measurement (which bytes it uploads, compares and downloads, and what it concludes)
must be checked on machines without a GPU, against kernels whose reads and writes are known.

`with_diff`: the model also offers `copy` and `diff` (the device-side compare); without them the
replay downloads regions whole and compares on the host. Both must measure the same.
"""

from __future__ import annotations

import numpy as np

from replay.gpu import CudaError


class CpuGpu:
    def __init__(self, kernel, with_diff: bool = True):
        self.kernel = kernel               # kernel(mem: CpuGpu, params: list[bytes], grid, block)
        self.mem: dict[int, np.ndarray] = {}
        self.next = 1 << 40
        self.uploaded = self.downloaded = 0
        self.uploads: dict[int, int] = {}  # base -> upload calls
        self.launches = 0
        self.dead = False
        if not with_diff:
            self.diff = None               # replay.runs.Live then compares on the host

    # memory ------------------------------------------------------------------------------
    def alloc(self, n):
        p = self.next
        self.next += (n + (1 << 20)) // (1 << 16) * (1 << 16) + (1 << 16)
        self.mem[p] = np.zeros(max(n, 1), np.uint8)
        return p

    alloc_host = alloc

    def free_all(self):
        self.mem = {}

    def _at(self, p: int, n: int) -> np.ndarray:
        for b, a in self.mem.items():
            if b <= p and p + n <= b + len(a):
                return a[p - b:p - b + n]
        raise CudaError("cpu access", "CUDA_ERROR_ILLEGAL_ADDRESS", True)

    def upload(self, p, h):
        self.uploaded += h.nbytes
        base = max(b for b in self.mem if b <= p)
        self.uploads[base] = self.uploads.get(base, 0) + 1
        self._at(p, h.nbytes)[:] = h

    def download(self, p, n):
        self.downloaded += n
        return self._at(p, n).copy()

    def zero(self, p, n):
        self._at(p, n)[:] = 0

    def copy(self, dst, src, n):
        self._at(dst, n)[:] = self._at(src, n)

    def diff(self, a, b, n, chunk):
        from replay.runs import host_chunks
        return host_chunks(self._at(b, n), self._at(a, n), chunk)

    def sync(self):
        pass

    def function(self, *a):
        return None

    def encode_tiled(self, rec, address):
        return bytes(128)

    def launch(self, fn, grid, block, smem, params, cluster=None):
        if self.dead:
            raise CudaError("cuLaunchKernel", "CUDA_ERROR_ILLEGAL_ADDRESS", True)
        self.launches += 1
        try:
            self.kernel(self, params, grid, block)
        except CudaError:
            self.dead = True
            raise

    # what kernels use ----------------------------------------------------------------------
    def ptr(self, params, k) -> int:
        return int.from_bytes(params[k][:8], "little")

    def read(self, p, n) -> np.ndarray:
        return self._at(p, n)

    def write(self, p, data) -> None:
        self._at(p, len(data))[:] = data
