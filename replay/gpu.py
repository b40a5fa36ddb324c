"""The GPU side of a replay: one CUDA context through cuda-python's driver bindings.

Why the driver API and nothing above it: a captured launch is a cubin, an entry, a grid, a block,
dynamic shared memory, launch attributes and raw parameter bytes -- exactly what `cuModuleLoadData`
and `cuLaunchKernelEx` take. No framework, no compiler, no knowledge of the kernel's language.

Every driver result goes through `_ok`, which raises `CudaError` naming the call and the driver's
error name. A launch that faults leaves the process unable to use the GPU again (CUDA's sticky
errors: on the H200 even a primary-context reset then fails with the same illegal address), so
replays run in worker processes (`replay.run.run_isolated`) and a fault ends only its worker.
"""

from __future__ import annotations

import ctypes
import struct

import numpy as np

from vocab.errors import MineError

L2_FLUSH_BYTES = 256 << 20     # written between timed launches: more than the H200's 60 MB L2


class CudaError(MineError, RuntimeError):
    """A driver call failed: `call`, `name` (CUDA_ERROR_...), and whether the context is lost."""

    def __init__(self, call: str, name: str, sticky: bool):
        super().__init__(f"{call} failed: {name}")
        self.call, self.name, self.sticky = call, name, sticky


class NoGpu(MineError, OSError):
    """No CUDA driver or device here; one sentence."""


# errors after which the context cannot be used again (the launch faulted on the device)
STICKY = {"CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_ILLEGAL_INSTRUCTION", "CUDA_ERROR_MISALIGNED_ADDRESS",
          "CUDA_ERROR_INVALID_ADDRESS_SPACE", "CUDA_ERROR_INVALID_PC", "CUDA_ERROR_LAUNCH_FAILED",
          "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_ASSERT", "CUDA_ERROR_LAUNCH_TIMEOUT",
          "CUDA_ERROR_UNKNOWN"}


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver   # cuda-python before the bindings split
        except ImportError as exc:
            raise NoGpu("mine replay needs cuda-python (pip install 'mine[gpu]') and an NVIDIA driver") from exc
    return driver


class Gpu:
    """One device's primary context, its loaded modules and its allocations."""

    def __init__(self, device: int = 0):
        self.cu = _driver()
        self.device = device
        self._open()

    # ------------------------------------------------------------------ driver plumbing
    def _ok(self, call: str, res):
        err, *rest = res if isinstance(res, tuple) else (res,)
        if int(err) != 0:
            _, name = self.cu.cuGetErrorName(err)
            name = name.decode() if isinstance(name, bytes) else str(err)
            raise CudaError(call, name, name in STICKY)
        return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)

    def _open(self) -> None:
        cu = self.cu
        try:
            self._ok("cuInit", cu.cuInit(0))
        except CudaError as exc:
            raise NoGpu(f"no usable NVIDIA GPU here ({exc.name})") from None
        self.dev = self._ok("cuDeviceGet", cu.cuDeviceGet(self.device))
        self.ctx = self._ok("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(self.dev))
        self._ok("cuCtxSetCurrent", cu.cuCtxSetCurrent(self.ctx))
        # a blocking stream: ordered after the synchronous copies and memsets on the legacy
        # stream that fill the regions (a non-blocking one raced with them: the first replays
        # on the H200 read half-filled memory and looked nondeterministic)
        self.stream = self._ok("cuStreamCreate", cu.cuStreamCreate(0))
        self.modules: dict[str, object] = {}
        self.functions: dict[tuple[str, str], object] = {}
        self.allocs: list[int] = []
        self.host_allocs: list[int] = []
        self._flush: int | None = None
        self._flags: tuple[int, int] | None = None      # (device address, bytes) of `diff`'s flags
        self._diff_fn = None
        name = self._ok("cuDeviceGetName", cu.cuDeviceGetName(128, self.dev))
        self.name = name.split(b"\0")[0].decode(errors="replace") if isinstance(name, bytes) else str(name)

    def close(self) -> None:
        """Give the primary context back (the command's parent checks the GPU, workers replay)."""
        self.free_all()
        self.cu.cuDevicePrimaryCtxRelease(self.dev)

    # ------------------------------------------------------------------ modules and memory
    def function(self, cubin_path, symbol: str, smem: int):
        key = (str(cubin_path), symbol)
        if key not in self.functions:
            if key[0] not in self.modules:
                data = open(cubin_path, "rb").read()
                self.modules[key[0]] = self._ok("cuModuleLoadData", self.cu.cuModuleLoadData(data))
            self.functions[key] = self._ok("cuModuleGetFunction",
                                           self.cu.cuModuleGetFunction(self.modules[key[0]], symbol.encode()))
        fn = self.functions[key]
        if smem > 48 << 10:
            attr = self.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            self._ok("cuFuncSetAttribute", self.cu.cuFuncSetAttribute(fn, attr, smem))
        return fn

    def alloc(self, n: int) -> int:
        p = int(self._ok("cuMemAlloc", self.cu.cuMemAlloc(max(n, 1))))
        self.allocs.append(p)
        return p

    def alloc_host(self, n: int) -> int:
        """Pinned host memory mapped into the device: its device address (the same as the host
        one under unified addressing)."""
        flags = self.cu.CU_MEMHOSTALLOC_DEVICEMAP | self.cu.CU_MEMHOSTALLOC_PORTABLE
        h = int(self._ok("cuMemHostAlloc", self.cu.cuMemHostAlloc(max(n, 1), flags)))
        self.host_allocs.append(h)
        return int(self._ok("cuMemHostGetDevicePointer", self.cu.cuMemHostGetDevicePointer(h, 0)))

    def free_all(self) -> None:
        for p in self.allocs:
            self.cu.cuMemFree(p)
        for h in self.host_allocs:
            self.cu.cuMemFreeHost(h)
        self.allocs, self.host_allocs = [], []
        self._flush = None
        self._flags = None

    def zero(self, ptr: int, n: int) -> None:
        """Zero `n` bytes at `ptr` (device or mapped host memory), finished before it returns."""
        self._ok("cuMemsetD8", self.cu.cuMemsetD8(ptr, 0, n))
        self.sync()

    def upload(self, ptr: int, host: np.ndarray) -> None:
        self._ok("cuMemcpyHtoD", self.cu.cuMemcpyHtoD(ptr, host, host.nbytes))
        self.sync()   # a pageable copy may return before its DMA lands

    def download(self, ptr: int, n: int) -> np.ndarray:
        host = np.empty(n, np.uint8)
        self._ok("cuMemcpyDtoH", self.cu.cuMemcpyDtoH(host, ptr, n))
        return host

    def copy(self, dst: int, src: int, n: int) -> None:
        """Device-to-device copy of `n` bytes on the replay's stream (ordered before its next launch)."""
        self._ok("cuMemcpyDtoDAsync", self.cu.cuMemcpyDtoDAsync(dst, src, n, self.stream))

    def diff(self, a: int, b: int, n: int, chunk: int) -> np.ndarray:
        """Indices of the `chunk`-byte chunks where the `n` bytes at device addresses `a` and `b`
        differ, compared on the device (`replay/kernels/diff.cu`); only one flag byte per chunk
        comes back. `chunk` is a power of two of at least 8 bytes; the bytes past the last whole
        8-byte word count as a changed chunk (the caller downloads them)."""
        if chunk < 8 or chunk & (chunk - 1):
            raise ValueError(f"diff chunk {chunk} is not a power of two of at least 8")
        words = n // 8
        nflags = -(-n // chunk)
        if self._flags is None or self._flags[1] < nflags:
            self._flags = (self.alloc(max(nflags, 1 << 16)), max(nflags, 1 << 16))
        flags = self._flags[0]
        cu = self.cu
        self._ok("cuMemsetD8Async", cu.cuMemsetD8Async(flags, 0, nflags, self.stream))
        if words:
            if self._diff_fn is None:
                from importlib.resources import files

                ptx = files("replay").joinpath("kernels/diff.ptx").read_bytes() + b"\0"
                mod = self._ok("cuModuleLoadData", cu.cuModuleLoadData(ptx))
                self._diff_fn = self._ok("cuModuleGetFunction", cu.cuModuleGetFunction(mod, b"mine_diff_chunks"))
            shift = (chunk // 8).bit_length() - 1
            params = [struct.pack("<Q", a), struct.pack("<Q", b), struct.pack("<Q", words), struct.pack("<I", shift),
                      struct.pack("<Q", flags)]
            blocks = int(min(-(-words // 256), 1 << 14))
            self.launch(self._diff_fn, (blocks, 1, 1), (256, 1, 1), 0, params)
        self.sync()
        got = np.flatnonzero(self.download(flags, nflags))
        if n % 8 and (not len(got) or got[-1] != (n - 1) // chunk):
            got = np.append(got, (n - 1) // chunk)
        return got

    def sync(self) -> None:
        self._ok("cuCtxSynchronize", self.cu.cuCtxSynchronize())

    def flush_l2(self) -> None:
        if self._flush is None:
            self._flush = self.alloc(L2_FLUSH_BYTES)
        self._ok("cuMemsetD8Async", self.cu.cuMemsetD8Async(self._flush, 0, L2_FLUSH_BYTES, self.stream))

    def best_seconds(self, enqueue, reps: int = 5) -> float:
        """The shortest of `reps` runs of `enqueue()` on the stream, timed with CUDA events (s)."""
        cu = self.cu
        ev0 = self._ok("cuEventCreate", cu.cuEventCreate(0))
        ev1 = self._ok("cuEventCreate", cu.cuEventCreate(0))
        best = float("inf")
        try:
            for _ in range(reps):
                self._ok("cuEventRecord", cu.cuEventRecord(ev0, self.stream))
                enqueue()
                self._ok("cuEventRecord", cu.cuEventRecord(ev1, self.stream))
                self._ok("cuEventSynchronize", cu.cuEventSynchronize(ev1))
                best = min(best, float(self._ok("cuEventElapsedTime", cu.cuEventElapsedTime(ev0, ev1))) / 1e3)
        finally:
            cu.cuEventDestroy(ev0)
            cu.cuEventDestroy(ev1)
        return best

    def copy_bandwidth(self, nbytes: int = 1 << 30, reps: int = 5) -> float:
        """Device-to-device copy rate (bytes/s, read + write counted), the memory ceiling a
        replayed kernel's traffic is compared with."""
        a, b = self.alloc(nbytes), self.alloc(nbytes)
        try:
            t = self.best_seconds(lambda: self._ok("cuMemcpyDtoDAsync",
                                                   self.cu.cuMemcpyDtoDAsync(b, a, nbytes, self.stream)), reps)
        finally:
            self.free_all()
        return 2 * nbytes / t

    # ------------------------------------------------------------------ tensor maps
    def encode_tiled(self, rec: dict, address: int) -> bytes:
        """tensormaps.jsonl's cuTensorMapEncodeTiled record, encoded again at `address`."""
        cu = self.cu
        if rec.get("api") != "cuTensorMapEncodeTiled":
            raise CudaError(rec.get("api", "?"), "not re-encoded (only tiled maps are)", False)
        rank = int(rec["rank"])
        u32, u64 = cu.cuuint32_t, cu.cuuint64_t
        tm = self._ok("cuTensorMapEncodeTiled", cu.cuTensorMapEncodeTiled(
            cu.CUtensorMapDataType(int(rec["dtype"])), u32(rank), address,
            [u64(int(x)) for x in rec["dims"]], [u64(int(x)) for x in rec["strides"]],
            [u32(int(x)) for x in rec["box"]], [u32(int(x)) for x in rec["elem_strides"]],
            cu.CUtensorMapInterleave(int(rec["interleave"])), cu.CUtensorMapSwizzle(int(rec["swizzle"])),
            cu.CUtensorMapL2promotion(int(rec["l2"])), cu.CUtensorMapFloatOOBfill(int(rec["oob"]))))
        return struct.pack("<16Q", *[int(x) for x in tm.opaque])

    # ------------------------------------------------------------------ launching
    def launch(self, fn, grid, block, smem: int, params: list[bytes], cluster=None) -> None:
        """Enqueue one launch with these parameter bytes (an array of pointers to each, as
        cuLaunchKernel takes them)."""
        cu = self.cu
        bufs = [ctypes.create_string_buffer(b, max(len(b), 1)) for b in params]
        arr = (ctypes.c_void_p * max(len(bufs), 1))(*[ctypes.addressof(b) for b in bufs])
        addr = ctypes.addressof(arr)
        if cluster is None:
            self._ok("cuLaunchKernel", cu.cuLaunchKernel(fn, *grid, *block, smem, self.stream, addr, 0))
            return
        cfg = cu.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
        cfg.sharedMemBytes, cfg.hStream = smem, self.stream
        at = cu.CUlaunchAttribute()
        at.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        at.value.clusterDim.x, at.value.clusterDim.y, at.value.clusterDim.z = cluster
        cfg.attrs, cfg.numAttrs = [at], 1
        self._ok("cuLaunchKernelEx", cu.cuLaunchKernelEx(cfg, fn, addr, 0))

    def time_launches(self, fn, grid, block, smem, params, cluster, reps: int, flush: bool = True) -> list[float]:
        """Each of `reps` launches timed alone with CUDA events (microseconds), L2 flushed before each."""
        cu = self.cu
        ev0 = self._ok("cuEventCreate", cu.cuEventCreate(0))
        ev1 = self._ok("cuEventCreate", cu.cuEventCreate(0))
        out = []
        try:
            for _ in range(reps):
                if flush:
                    self.flush_l2()
                self._ok("cuEventRecord", cu.cuEventRecord(ev0, self.stream))
                self.launch(fn, grid, block, smem, params, cluster)
                self._ok("cuEventRecord", cu.cuEventRecord(ev1, self.stream))
                self._ok("cuEventSynchronize", cu.cuEventSynchronize(ev1))
                out.append(float(self._ok("cuEventElapsedTime", cu.cuEventElapsedTime(ev0, ev1))) * 1e3)
        finally:
            cu.cuEventDestroy(ev0)
            cu.cuEventDestroy(ev1)
        return out

    def time_graph(self, fn, grid, block, smem, params, cluster, k: int = 20, reps: int = 5) -> float:
        """Microseconds per launch of `k` launches back to back in one CUDA graph, L2 warm: the
        median over `reps` graph launches, divided by `k`. Why besides `time_launches`: a launch
        timed alone is bound by the event pair and the cold L2 (3-5 us on an H200 whatever the
        kernel); inside a graph the launches run as a graph-replaying runtime (kern) runs them."""
        cu = self.cu
        mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        self._ok("cuStreamBeginCapture", cu.cuStreamBeginCapture(self.stream, mode))
        try:
            for _ in range(k):
                self.launch(fn, grid, block, smem, params, cluster)
        finally:
            graph = self._ok("cuStreamEndCapture", cu.cuStreamEndCapture(self.stream))
        exe = None
        ev0 = self._ok("cuEventCreate", cu.cuEventCreate(0))
        ev1 = self._ok("cuEventCreate", cu.cuEventCreate(0))
        try:
            exe = self._ok("cuGraphInstantiate", cu.cuGraphInstantiate(graph, 0))
            self._ok("cuGraphLaunch", cu.cuGraphLaunch(exe, self.stream))     # warm-up
            self.sync()
            out = []
            for _ in range(reps):
                self._ok("cuEventRecord", cu.cuEventRecord(ev0, self.stream))
                self._ok("cuGraphLaunch", cu.cuGraphLaunch(exe, self.stream))
                self._ok("cuEventRecord", cu.cuEventRecord(ev1, self.stream))
                self._ok("cuEventSynchronize", cu.cuEventSynchronize(ev1))
                out.append(float(self._ok("cuEventElapsedTime", cu.cuEventElapsedTime(ev0, ev1))) * 1e3 / k)
        finally:
            if exe is not None:
                cu.cuGraphExecDestroy(exe)
            cu.cuGraphDestroy(graph)
            cu.cuEventDestroy(ev0)
            cu.cuEventDestroy(ev1)
        return float(np.median(out))
