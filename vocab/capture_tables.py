"""The capture's tables: the driver calls it listens to, the launch APIs' record codes, the launch
attributes it decodes, the drop reasons it counts and meta.json's top-level keys (one place).

Why: the C library (capture/src/), the binary reader (vocab/binfmt.py), the loader
(mining/load.py) and docs/dump-format.md each need these lists; kept apart they drifted (the
toggler depended on the order of a C array, launch attributes were decoded by bare numbers in
Python). Here each is stated once. `python -m vocab.capture_tables` writes the C header
capture/src/tables.h from them (X-macro lists the C code expands: the dispatch's rows, the
enabling, the toggler, the allocation log's parameter reading, the api names, the attribute
decoding, the drop names); tests/capture/test_tables.py checks that the committed header is what
this module renders and that every name is a CUPTI callback id, and the C build checks every
attribute id and every kind's parameter-struct layout against the CUDA headers (`_Static_assert`s
in capture/src/dispatch.c and record.c), so an entry that disagrees with CUDA does not compile.
vocab/binfmt.py and mining/load.py read the Python side. Standard library only.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

# ------------------------------------------------------------------ driver-API callbacks
# What the dispatch does with a callback id (capture/src/dispatch.c), grouped by family:
#   launch      a kernel launch: one launch record (launch.c)
#   kernel_node a kernel node of an explicitly built graph: a launch record + a graphs.jsonl event
#   module      cuModuleLoad* / cuLibraryGetModule: links the CUmodule to the module just loaded
#   free        a free or unmap: the pointer caches' free epoch moves; logged with the allocation log
#   alloc       an allocation or mapping: the "not device memory" epoch moves; logged likewise
#   alloc_log   only logged (the allocation log), no epoch
#   tensormap   a cuTensorMapEncode*: one tensormaps.jsonl record (tmap.c)
#   graph       stream capture and graph lifecycle: one graphs.jsonl event (graphs.c)
#   copy        a host-to-device or device-to-device copy, a memset, or a memcpy node of a hand-built
#               graph: one copies.jsonl record (copies.c; the generic cuMemcpy* only when the driver
#               says host -> device or device -> device)
# Kinds name the parameter struct shape within a family (the C code reads one representative
# struct per kind; the header asserts that every call of the kind has that struct's layout).
KIND_FAMILY = {
    "LAUNCH": "launch", "LAUNCH_COOP": "launch", "LAUNCH_EX": "launch",
    "NODE_ADD": "kernel_node", "NODE_ADD_ANY": "kernel_node", "NODE_ADD_ANY_V2": "kernel_node",
    "NODE_SET": "kernel_node", "NODE_EXEC_SET": "kernel_node", "NODE_SET_ANY": "kernel_node",
    "NODE_EXEC_SET_ANY": "kernel_node",
    "MODULE": "module", "FREE": "free", "ALLOC": "alloc", "ALLOC_LOG": "alloc_log",
    "TMAP_TILED": "tensormap", "TMAP_IM2COL": "tensormap", "TMAP_IM2COL_WIDE": "tensormap",
    "CAPTURE_BEGIN": "graph", "CAPTURE_END": "graph", "INSTANTIATE": "graph", "GRAPH_LAUNCH": "graph",
    "EXEC_DESTROY": "graph", "GRAPH_DESTROY": "graph",
    "COPY_HTOD": "copy", "COPY_HTOD_ASYNC": "copy", "COPY_ANY": "copy", "COPY_ANY_ASYNC": "copy",
    "COPY_NODE_ADD": "copy", "COPY_NODE_SET": "copy", "COPY_NODE_EXEC_SET": "copy",
    "COPY_DTOD": "copy", "COPY_DTOD_ASYNC": "copy",
    "MEMSET_D8": "copy", "MEMSET_D8_ASYNC": "copy", "MEMSET_D16": "copy", "MEMSET_D16_ASYNC": "copy",
    "MEMSET_D32": "copy", "MEMSET_D32_ASYNC": "copy",
}
# When a callback is enabled: always (module links are made even with MODULES_ONLY), with launch
# capture (not MODULES_ONLY), only with the allocation log, or only with the copy log
# (MINE_CAPTURE_COPY_LOG, on by default; not with MODULES_ONLY).
ENABLES = ("ALWAYS", "LAUNCHES", "ALLOC_LOG", "COPY_LOG")


# How an allocation-log event's base, size and handle are read from the call's `*_params`:
#   in:F (the value of field F), ptr:F (a pointer-typed field F, as a number), out:F (F points to
#   the value, read at the API's exit), outv:F (F points to a pointer), pitch (pPitch x Height),
#   desc (bufferDesc->size), none (the API does not give it).
READS = ("in", "ptr", "out", "outv", "pitch", "desc", "none")


@dataclass(frozen=True)
class Log:
    """What an allocation, free or mapping call becomes in allocs.jsonl (capture/src/alloc.c)."""
    event: str           # allocs.jsonl "event"
    base: str = "none"
    size: str = "none"
    handle: str = "none"
    device: bool = False # base..base+size becomes device memory (the driver is asked for its id)
    struct: str = ""     # the CUPTI *_params struct when the call has none of its own


@dataclass(frozen=True)
class Callback:
    name: str            # the API, as CUPTI_DRIVER_TRACE_CBID_<name> and in records' "api"
    kind: str            # a key of KIND_FAMILY
    enable: str = "LAUNCHES"
    v1: bool = False     # kernel nodes: the parameters are CUDA_KERNEL_NODE_PARAMS_v1 (no kern/ctx)
    log: Log | None = None  # the allocation log's reading of the call (free, alloc, alloc_log families)

    @property
    def family(self) -> str:
        return KIND_FAMILY[self.kind]

    @property
    def ptsz(self) -> bool:
        """A NULL stream means the per-thread default stream (a _ptds call has no stream argument:
        it runs on the per-thread default stream)."""
        return self.name.endswith(("_ptsz", "_ptds"))

    @property
    def logged(self) -> bool:
        """Written to allocs.jsonl when the allocation log is on (capture/src/alloc.c)."""
        return self.log is not None

    @property
    def at_entry(self) -> bool:
        """Allocation log: ordered at the API's entry (a free, before the address can be reused)."""
        return self.family == "free"


def _cbs(kind: str, *names: str, **kw) -> tuple[Callback, ...]:
    return tuple(Callback(n, kind, **kw) for n in names)


def _logged(kind: str, enable: str, groups) -> tuple[Callback, ...]:
    """Rows of the allocation log: (name or names, Log) groups, in order."""
    out = []
    for names, log in groups:
        for n in (names,) if isinstance(names, str) else names:
            out.append(Callback(n, kind, enable=enable, log=log))
    return tuple(out)


# Launch records: the APIs in the order of their binary `api` byte (docs/dump-format.md).
LAUNCH_APIS: tuple[Callback, ...] = (
    *_cbs("LAUNCH", "cuLaunchKernel", "cuLaunchKernel_ptsz"),
    *_cbs("LAUNCH_EX", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"),
    *_cbs("LAUNCH_COOP", "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz"),
    Callback("cuGraphAddKernelNode", "NODE_ADD", v1=True), Callback("cuGraphAddKernelNode_v2", "NODE_ADD"),
    Callback("cuGraphAddNode", "NODE_ADD_ANY"), Callback("cuGraphAddNode_v2", "NODE_ADD_ANY_V2"),
    Callback("cuGraphKernelNodeSetParams", "NODE_SET", v1=True), Callback("cuGraphKernelNodeSetParams_v2", "NODE_SET"),
    Callback("cuGraphExecKernelNodeSetParams", "NODE_EXEC_SET", v1=True),
    Callback("cuGraphExecKernelNodeSetParams_v2", "NODE_EXEC_SET"),
    Callback("cuGraphNodeSetParams", "NODE_SET_ANY"), Callback("cuGraphExecNodeSetParams", "NODE_EXEC_SET_ANY"),
)
API_NAMES: tuple[str, ...] = tuple(c.name for c in LAUNCH_APIS)  # index = the binary api byte

CALLBACKS: tuple[Callback, ...] = (
    *LAUNCH_APIS,
    *_cbs("MODULE", "cuModuleLoad", "cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary",
          "cuLibraryGetModule", enable="ALWAYS"),
    *_logged("FREE", "LAUNCHES", (
        (("cuMemFree", "cuMemFree_v2", "cuMemFreeAsync", "cuMemFreeAsync_ptsz"), Log("free", base="in:dptr")),
        ("cuMemRelease", Log("release", handle="in:handle")),
        ("cuMemUnmap", Log("unmap", base="in:ptr", size="in:size")),
    )),
    *_logged("FREE", "ALLOC_LOG", (
        ("cuIpcCloseMemHandle", Log("ipc_close", base="in:dptr")),
        ("cuMemAddressFree", Log("unreserve", base="in:ptr", size="in:size")),
        ("cuMemFreeHost", Log("host_free", base="ptr:p")),
        ("cuMemHostUnregister", Log("host_unregister", base="ptr:p")),
    )),
    *_logged("ALLOC", "LAUNCHES", (
        (("cuMemAlloc", "cuMemAlloc_v2", "cuMemAllocAsync", "cuMemAllocAsync_ptsz", "cuMemAllocManaged"),
         Log("alloc", base="out:dptr", size="in:bytesize", device=True)),
        (("cuMemAllocPitch", "cuMemAllocPitch_v2"), Log("alloc", base="out:dptr", size="pitch", device=True)),
        (("cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz"),
         Log("alloc", base="out:dptr", size="in:bytesize", handle="ptr:pool", device=True)),
        ("cuMemMap", Log("map", base="in:ptr", size="in:size", handle="in:handle", device=True)),
        ("cuMemSetAccess", Log("access", base="in:ptr", size="in:size")),
        (("cuIpcOpenMemHandle", "cuIpcOpenMemHandle_v2"), Log("ipc_open", base="out:pdptr", device=True)),
        ("cuMemPoolImportPointer", Log("import", base="out:ptr_out", handle="ptr:pool", device=True)),
        ("cuExternalMemoryGetMappedBuffer",
         Log("ext_map", base="out:devPtr", size="desc", handle="ptr:extMem", device=True)),
        (("cuGraphicsResourceGetMappedPointer", "cuGraphicsResourceGetMappedPointer_v2"),
         Log("gfx_map", base="out:pDevPtr", size="out:pSize", handle="ptr:resource", device=True)),
        # pinned host memory: logged for completeness; it is host memory (mining leaves it alone)
        ("cuMemHostAlloc", Log("host_alloc", base="outv:pp", size="in:bytesize")),
        ("cuMemHostAlloc_v2", Log("host_alloc", base="outv:pp", size="in:bytesize", struct="cuMemHostAlloc")),
        (("cuMemAllocHost", "cuMemAllocHost_v2"), Log("host_alloc", base="outv:pp", size="in:bytesize")),
        (("cuMemHostRegister", "cuMemHostRegister_v2"), Log("host_register", base="ptr:p", size="in:bytesize")),
    )),
    *_logged("ALLOC_LOG", "ALLOC_LOG", (
        ("cuMemCreate", Log("create", size="in:size", handle="out:handle")),
        ("cuMemAddressReserve", Log("reserve", base="out:ptr", size="in:size")),
        # VMM memory shared between processes (a tensor-parallel peer's buffers): the handle an
        # import returns is the one its cuMemMap names, so mining tells peer memory apart
        ("cuMemImportFromShareableHandle", Log("vmm_import", handle="out:handle")),
        ("cuMemExportToShareableHandle", Log("vmm_export", handle="in:handle")),
    )),
    Callback("cuTensorMapEncodeTiled", "TMAP_TILED"), Callback("cuTensorMapEncodeIm2col", "TMAP_IM2COL"),
    Callback("cuTensorMapEncodeIm2colWide", "TMAP_IM2COL_WIDE"),
    *_cbs("CAPTURE_BEGIN", "cuStreamBeginCapture", "cuStreamBeginCapture_ptsz", "cuStreamBeginCapture_v2",
          "cuStreamBeginCapture_v2_ptsz", "cuStreamBeginCaptureToGraph", "cuStreamBeginCaptureToGraph_ptsz"),
    *_cbs("CAPTURE_END", "cuStreamEndCapture", "cuStreamEndCapture_ptsz"),
    *_cbs("INSTANTIATE", "cuGraphInstantiate", "cuGraphInstantiate_v2", "cuGraphInstantiateWithFlags",
          "cuGraphInstantiateWithParams", "cuGraphInstantiateWithParams_ptsz"),
    *_cbs("GRAPH_LAUNCH", "cuGraphLaunch", "cuGraphLaunch_ptsz"),
    Callback("cuGraphExecDestroy", "EXEC_DESTROY"), Callback("cuGraphDestroy", "GRAPH_DESTROY"),
    # host-to-device copies (copies.jsonl); the runtime's cudaMemcpy* arrive as these
    *_cbs("COPY_HTOD", "cuMemcpyHtoD_v2", "cuMemcpyHtoD_v2_ptds", enable="COPY_LOG"),
    *_cbs("COPY_HTOD_ASYNC", "cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync_v2_ptsz", enable="COPY_LOG"),
    *_cbs("COPY_ANY", "cuMemcpy", "cuMemcpy_ptds", enable="COPY_LOG"),
    *_cbs("COPY_ANY_ASYNC", "cuMemcpyAsync", "cuMemcpyAsync_ptsz", enable="COPY_LOG"),
    Callback("cuGraphAddMemcpyNode", "COPY_NODE_ADD", enable="COPY_LOG"),
    Callback("cuGraphMemcpyNodeSetParams", "COPY_NODE_SET", enable="COPY_LOG"),
    Callback("cuGraphExecMemcpyNodeSetParams", "COPY_NODE_EXEC_SET", enable="COPY_LOG"),
    # device-to-device copies and memsets (copies.jsonl `op`): inside a forward they move or clear
    # activations (a CUDA graph's copy of its output into a static buffer), which a program must see
    *_cbs("COPY_DTOD", "cuMemcpyDtoD_v2", "cuMemcpyDtoD_v2_ptds", enable="COPY_LOG"),
    *_cbs("COPY_DTOD_ASYNC", "cuMemcpyDtoDAsync_v2", "cuMemcpyDtoDAsync_v2_ptsz", enable="COPY_LOG"),
    *_cbs("MEMSET_D8", "cuMemsetD8_v2", "cuMemsetD8_v2_ptds", enable="COPY_LOG"),
    *_cbs("MEMSET_D8_ASYNC", "cuMemsetD8Async", "cuMemsetD8Async_ptsz", enable="COPY_LOG"),
    *_cbs("MEMSET_D16", "cuMemsetD16_v2", "cuMemsetD16_v2_ptds", enable="COPY_LOG"),
    *_cbs("MEMSET_D16_ASYNC", "cuMemsetD16Async", "cuMemsetD16Async_ptsz", enable="COPY_LOG"),
    *_cbs("MEMSET_D32", "cuMemsetD32_v2", "cuMemsetD32_v2_ptds", enable="COPY_LOG"),
    *_cbs("MEMSET_D32_ASYNC", "cuMemsetD32Async", "cuMemsetD32Async_ptsz", enable="COPY_LOG"),
)
# copies.jsonl `op`: what a copy record is (records without it are host-to-device: older dumps)
COPY_OPS = ("htod", "dtod", "memset")
BY_NAME = {c.name: c for c in CALLBACKS}
# Resource-domain callbacks (CUPTI_CBID_RESOURCE_<name>): always enabled.
RESOURCE_CALLBACKS = ("MODULE_LOADED", "MODULE_UNLOAD_STARTING", "CONTEXT_CREATED")
# graphs.jsonl events (capture/src/graphs.c, launch.c)
GRAPH_EVENTS = ("capture_begin", "capture_end", "instantiate", "launch", "exec_destroy", "graph_destroy",
                "kernel_node")

# ------------------------------------------------------------------ launch attributes
# CUlaunchAttribute ids the capture decodes into launch records' `launch_attrs` (others are kept
# as "attr_<id>": the 64-byte value in hex). shape: how the value union is read:
#   dim3 [x, y, z] u32 | i32 | u32 | pdl_event {event, flags, trigger_at_block_start}
#   completion_event {event, flags} | domain_map [default, remote] (two u8)


@dataclass(frozen=True)
class LaunchAttr:
    cu_name: str         # CU_LAUNCH_ATTRIBUTE_<cu_name>
    id: int              # its value in cuda.h (checked at compile time)
    key: str             # the key in launch_attrs
    shape: str
    member: str          # the CUlaunchAttributeValue member (C side)


LAUNCH_ATTRS: tuple[LaunchAttr, ...] = (
    LaunchAttr("COOPERATIVE", 2, "cooperative", "i32", "cooperative"),
    LaunchAttr("CLUSTER_DIMENSION", 4, "cluster", "dim3", "clusterDim"),
    LaunchAttr("CLUSTER_SCHEDULING_POLICY_PREFERENCE", 5, "cluster_scheduling", "i32",
               "clusterSchedulingPolicyPreference"),
    LaunchAttr("PROGRAMMATIC_STREAM_SERIALIZATION", 6, "pdl", "i32", "programmaticStreamSerializationAllowed"),
    LaunchAttr("PROGRAMMATIC_EVENT", 7, "pdl_event", "pdl_event", "programmaticEvent"),
    LaunchAttr("PRIORITY", 8, "priority", "i32", "priority"),
    LaunchAttr("MEM_SYNC_DOMAIN_MAP", 9, "mem_sync_domain_map", "domain_map", "memSyncDomainMap"),
    LaunchAttr("MEM_SYNC_DOMAIN", 10, "mem_sync_domain", "i32", "memSyncDomain"),
    LaunchAttr("PREFERRED_CLUSTER_DIMENSION", 11, "preferred_cluster", "dim3", "clusterDim"),
    LaunchAttr("LAUNCH_COMPLETION_EVENT", 12, "completion_event", "completion_event", "launchCompletionEvent"),
    LaunchAttr("PREFERRED_SHARED_MEMORY_CARVEOUT", 14, "smem_carveout", "u32", "sharedMemCarveout"),
)
ATTR_BY_ID = {a.id: a for a in LAUNCH_ATTRS}
ATTR_SHAPES = ("dim3", "i32", "u32", "pdl_event", "completion_event", "domain_map")

# ------------------------------------------------------------------ counters and meta.json
# meta.json counters.dropped: why a launch that passed through the callback was not recorded.
DROP_REASONS = ("filtered", "skip", "max_launches", "max_bytes", "off", "no_memory")
# meta.json's top-level keys (the loader refuses any other: another format, not damage).
META_KEYS = ("format_version", "pid", "ppid", "argv", "env", "start_ns", "start_unix_ns", "driver_version",
             "cupti_version", "devices", "options", "counters", "toggles", "end_ns", "disabled")

# ------------------------------------------------------------------ the C header
HEADER = Path(__file__).resolve().parent.parent / "capture" / "src" / "tables.h"


def _xmacro(name: str, rows: list[str], doc: str) -> list[str]:
    out = [f"/* {doc} */", f"#define {name}(X) \\"]
    out += [f"  {r} \\" for r in rows]
    out.append("  /* end */")
    return out + [""]


def _read(spec: str) -> str:
    mode, _, field = spec.partition(":")
    assert mode in READS, spec
    return f"{mode.upper()}, {field or '_'}"


def _log_row(c: Callback) -> str:
    log = c.log
    return (f"X({c.name}, {log.struct or c.name}, \"{log.event}\", {_read(log.base)}, {_read(log.size)}, "
            f"{_read(log.handle)}, {int(log.device)})")


def render_header() -> str:
    """capture/src/tables.h, as this module states it."""
    kinds = list(KIND_FAMILY)
    fams = list(dict.fromkeys(KIND_FAMILY.values()))
    lines = ["/* tables.h: GENERATED by `python -m vocab.capture_tables` from vocab/capture_tables.py; do not edit.",
             " * The driver calls the capture listens to, the launch APIs' record codes, the launch attributes it",
             " * decodes and the drop reasons it counts (docs/dump-format.md). */",
             "#ifndef MC_TABLES_H", "#define MC_TABLES_H", ""]
    lines += _xmacro("MC_CALLBACKS", [
        f"X({c.name}, {c.kind}, {c.enable}, {API_NAMES.index(c.name) if c.name in API_NAMES else -1}, "
        f"{int(c.v1)}, {int(c.ptsz)}, {int(c.logged)}, {int(c.at_entry)})" for c in CALLBACKS],
        "X(name, kind, enable, api byte or -1, v1 node params, ptsz, allocation-logged, stamped at entry)")
    lines += _xmacro("MC_ALLOC_LOG", [_log_row(c) for c in CALLBACKS if c.log],
                     "X(name, params struct, event, base read, field, size read, field, handle read, field, device)")
    lines += _xmacro("MC_CB_KINDS", [f"X({k}, {KIND_FAMILY[k].upper()})" for k in kinds], "X(kind, family)")
    lines += _xmacro("MC_CB_FAMILIES", [f"X({f.upper()})" for f in fams], "X(family)")
    lines += _xmacro("MC_LAUNCH_APIS", [f"X({i}, {n})" for i, n in enumerate(API_NAMES)],
                     "X(api byte, name): launch records' api, in byte order")
    lines += _xmacro("MC_RESOURCE_CALLBACKS", [f"X({r})" for r in RESOURCE_CALLBACKS], "X(name): always enabled")
    lines += _xmacro("MC_LAUNCH_ATTRS", [f"X({a.cu_name}, {a.id}, \"{a.key}\", {a.shape.upper()}, {a.member})"
                                         for a in LAUNCH_ATTRS], "X(CU_LAUNCH_ATTRIBUTE_ name, id, key, shape, member)")
    lines += _xmacro("MC_DROPS", [f"X({r.upper()}, \"{r}\")" for r in DROP_REASONS], "X(enum tail, name)")
    lines += [f"#define MC_API_COUNT {len(API_NAMES)}", f"#define MC_CB_COUNT {len(CALLBACKS)}",
              f"#define MC_LAUNCH_ATTR_COUNT {len(LAUNCH_ATTRS)}", "",
              "#endif", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    text = render_header()
    if argv == ["--check"]:
        if HEADER.read_text() != text:
            print(f"vocab.capture_tables: {HEADER.name} is out of date; run python -m vocab.capture_tables",
                  file=sys.stderr)
            return 1
        return 0
    if argv:
        print("usage: python -m vocab.capture_tables [--check]", file=sys.stderr)
        return 2
    HEADER.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
