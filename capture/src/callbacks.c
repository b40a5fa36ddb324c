/* callbacks.c: the CUPTI callback, launch records, graph lifecycle and tensor maps.
 *
 * Launches are read at API EXIT: with lazy loading the function only exists after the call,
 * and the caller's kernelParams / extra buffer are still live. Failed launches are recorded with
 * their CUresult. Our own driver calls inside a callback are not re-entered (thread flag).
 * Kernel nodes of explicitly built graphs are recorded when defined (on_kernel_node).
 * Not recorded: legacy cuLaunch/cuLaunchGrid and cuLaunchCooperativeKernelMultiDevice (gone in
 * CUDA 13). */
#include "mc.h"

#include <pthread.h>
#include <string.h>
#include <time.h>

/* Allocation and mapping APIs: a value that was not device memory may be now (alloc.c). */
#define ALLOC_IDS(X) X(cuMemAlloc) X(cuMemAlloc_v2) X(cuMemAllocPitch) X(cuMemAllocPitch_v2) X(cuMemAllocAsync) X(cuMemAllocAsync_ptsz) X(cuMemAllocFromPoolAsync) X(cuMemAllocFromPoolAsync_ptsz) X(cuMemAllocManaged) X(cuMemMap) X(cuMemSetAccess) X(cuIpcOpenMemHandle) X(cuIpcOpenMemHandle_v2) X(cuMemPoolImportPointer) X(cuExternalMemoryGetMappedBuffer) X(cuGraphicsResourceGetMappedPointer) X(cuGraphicsResourceGetMappedPointer_v2) X(cuMemHostAlloc) X(cuMemHostAlloc_v2) X(cuMemAllocHost) X(cuMemAllocHost_v2) X(cuMemHostRegister) X(cuMemHostRegister_v2)
#define CBID_CASE(n) case CUPTI_DRIVER_TRACE_CBID_##n:
#define CBID_LIST(n) CUPTI_DRIVER_TRACE_CBID_##n,

/* ---- tensor maps: a seqlock-guarded ring the launch path reads without a lock ----
 * Found through a hash index (TMAP_SETS sets of TMAP_WAYS ring slots, keyed by a hash of the 128
 * bytes): a launch looks at every 64-byte-aligned 128-byte window of its parameters, and cuBLASLt
 * encodes maps at every GEMM call, so a scan of the whole ring at each window grew with the run.
 * An index entry may name a slot that was overwritten since: the bytes are compared under the
 * slot's seqlock, so a stale entry only misses. */
#define TMAP_RING 4096
#define TMAP_SETS 2048
#define TMAP_WAYS 4
typedef struct { atomic_uint ver; uint64_t hash; int64_t seq; unsigned char bytes[128]; } tmap_t;
static tmap_t tmaps[TMAP_RING];
static atomic_uint ntmaps;
static atomic_uint tmap_index[TMAP_SETS][TMAP_WAYS]; /* ring slot + 1; 0 empty */
static unsigned char tmap_way[TMAP_SETS];             /* next way to replace, under tmap_lock */
static pthread_mutex_t tmap_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t tmap_hash(const unsigned char *p) {
  uint64_t h = 0x243f6a8885a308d3ull;
  for (int i = 0; i < 16; i++) {
    uint64_t w;
    memcpy(&w, p + 8 * i, 8);
    h = (h ^ w) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
  }
  return h | 1; /* never 0 */
}

int64_t mc_tmap_find(const unsigned char *p) {
  if (atomic_load_explicit(&ntmaps, memory_order_acquire) == 0) return -1;
  uint64_t h = tmap_hash(p);
  unsigned set = (unsigned)(h >> 32) % TMAP_SETS;
  for (int w = 0; w < TMAP_WAYS; w++) {
    unsigned i = atomic_load_explicit(&tmap_index[set][w], memory_order_acquire);
    if (i == 0 || i > TMAP_RING) continue;
    tmap_t *t = &tmaps[i - 1];
    unsigned v = atomic_load_explicit(&t->ver, memory_order_acquire);
    if (v == 0 || (v & 1)) continue;
    if (t->hash != h || memcmp(t->bytes, p, 128) != 0) continue;
    int64_t s = t->seq;
    if (atomic_load_explicit(&t->ver, memory_order_acquire) == v) return s;
  }
  return -1;
}

static void tmap_remember(const void *map, int64_t seq) {
  uint64_t h = tmap_hash(map);
  unsigned set = (unsigned)(h >> 32) % TMAP_SETS;
  MC_LOCK(&tmap_lock);
  unsigned i = atomic_load(&ntmaps) % TMAP_RING;
  tmap_t *t = &tmaps[i];
  unsigned v = atomic_load(&t->ver); /* even between writes; odd while being written */
  atomic_store_explicit(&t->ver, v + 1, memory_order_release);
  memcpy(t->bytes, map, 128);
  t->hash = h;
  t->seq = seq;
  atomic_store_explicit(&t->ver, v + 2, memory_order_release);
  atomic_store_explicit(&tmap_index[set][tmap_way[set]++ % TMAP_WAYS], i + 1, memory_order_release);
  atomic_fetch_add(&ntmaps, 1);
  MC_UNLOCK(&tmap_lock);
}

static void jb_u64_array(jb_t *b, const void *p, int n, int is64) {
  jb_lit(b, "[");
  for (int i = 0; i < n && p; i++) {
    if (i) jb_lit(b, ",");
    jb_u64(b, is64 ? ((const uint64_t *)p)[i] : ((const uint32_t *)p)[i]);
  }
  jb_lit(b, "]");
}

static void on_tensormap(CUpti_CallbackId cbid, const CUpti_CallbackData *d) {
  if (d->functionReturnValue && *(const CUresult *)d->functionReturnValue != CUDA_SUCCESS) return;
  const char *api; const void *map; int dtype; unsigned rank; void *global;
  const cuuint64_t *dims, *strides; const cuuint32_t *box = NULL, *es;
  int inter, swz, l2, oob;
  if (cbid == CUPTI_DRIVER_TRACE_CBID_cuTensorMapEncodeTiled) {
    const cuTensorMapEncodeTiled_params *p = d->functionParams;
    api = "cuTensorMapEncodeTiled"; map = p->tensorMap; dtype = p->tensorDataType; rank = p->tensorRank;
    global = p->globalAddress; dims = p->globalDim; strides = p->globalStrides; box = p->boxDim;
    es = p->elementStrides; inter = p->interleave; swz = p->swizzle; l2 = p->l2Promotion; oob = p->oobFill;
  } else if (cbid == CUPTI_DRIVER_TRACE_CBID_cuTensorMapEncodeIm2col) {
    const cuTensorMapEncodeIm2col_params *p = d->functionParams;
    api = "cuTensorMapEncodeIm2col"; map = p->tensorMap; dtype = p->tensorDataType; rank = p->tensorRank;
    global = p->globalAddress; dims = p->globalDim; strides = p->globalStrides;
    es = p->elementStrides; inter = p->interleave; swz = p->swizzle; l2 = p->l2Promotion; oob = p->oobFill;
  } else {
    const cuTensorMapEncodeIm2colWide_params *p = d->functionParams;
    api = "cuTensorMapEncodeIm2colWide"; map = p->tensorMap; dtype = p->tensorDataType; rank = p->tensorRank;
    global = p->globalAddress; dims = p->globalDim; strides = p->globalStrides;
    es = p->elementStrides; inter = p->interleave; swz = p->swizzle; l2 = p->l2Promotion; oob = p->oobFill;
  }
  if (!map || rank == 0 || rank > 5) return;
  jb_t *b = jb_thread();
  if (!b) return;
  jb_lit(b, "\"t_ns\":"); jb_u64(b, mc_now_ns());
  jb_lit(b, ",\"tid\":"); jb_u64(b, (uint64_t)mc_tid());
  jb_lit(b, ",\"api\":"); jb_str(b, api);
  jb_lit(b, ",\"map\":"); jb_ptr(b, (uintptr_t)map);
  jb_lit(b, ",\"hex\":"); jb_hex(b, map, 128);
  jb_lit(b, ",\"dtype\":"); jb_i64(b, dtype);
  jb_lit(b, ",\"rank\":"); jb_u64(b, rank);
  jb_lit(b, ",\"global\":"); jb_ptr(b, (uintptr_t)global);
  jb_lit(b, ",\"dims\":"); jb_u64_array(b, dims, (int)rank, 1);
  jb_lit(b, ",\"strides\":"); jb_u64_array(b, strides, (int)rank - 1, 1);
  jb_lit(b, ",\"box\":"); jb_u64_array(b, box, box ? (int)rank : 0, 0);
  jb_lit(b, ",\"elem_strides\":"); jb_u64_array(b, es, (int)rank, 0);
  jb_lit(b, ",\"interleave\":"); jb_i64(b, inter);
  jb_lit(b, ",\"swizzle\":"); jb_i64(b, swz);
  jb_lit(b, ",\"l2\":"); jb_i64(b, l2);
  jb_lit(b, ",\"oob\":"); jb_i64(b, oob);
  mc_alloc_t a;
  jb_lit(b, ",\"ptr\":");
  if (mc_device_alloc((uintptr_t)global, &a)) {
    jb_lit(b, "{\"base\":"); jb_ptr(b, a.base);
    jb_lit(b, ",\"size\":"); jb_u64(b, a.size);
    jb_lit(b, ",\"id\":"); jb_u64(b, a.id);
    jb_lit(b, ",\"off\":"); jb_u64(b, (uintptr_t)global - a.base);
    jb_lit(b, "}");
  } else jb_lit(b, "null");
  int64_t seq = mc_write_record(MC_F_TENSORMAPS, b, 1);
  if (seq >= 0) tmap_remember(map, seq);
}

/* ---- stream captures in flight ---- */
#define NCAP 256
typedef struct { CUstream stream; uint64_t id; int64_t first, last; int active; } capture_t;
static capture_t caps[NCAP];
static pthread_mutex_t cap_lock = PTHREAD_MUTEX_INITIALIZER;

static void capture_note_launch(uint64_t id, int64_t seq) {
  MC_LOCK(&cap_lock);
  for (int i = 0; i < NCAP; i++)
    if (caps[i].active && caps[i].id == id) {
      if (caps[i].first < 0) caps[i].first = seq;
      caps[i].last = seq;
    }
  MC_UNLOCK(&cap_lock);
}

enum { G_STREAM = 1, G_GRAPH = 2, G_EXEC = 4, G_CAPID = 8, G_SEQS = 16, G_NODES = 32 };
static void graph_line(const char *ev, int has, CUstream s, CUgraph g, CUgraphExec x, uint64_t capid,
                       int64_t first, int64_t last, size_t nodes) {
  jb_t *b = jb_thread();
  if (!b) return;
  jb_lit(b, "\"event\":"); jb_str(b, ev);
  jb_lit(b, ",\"t_ns\":"); jb_u64(b, mc_now_ns());
  jb_lit(b, ",\"tid\":"); jb_u64(b, (uint64_t)mc_tid());
  if (has & G_STREAM) { jb_lit(b, ",\"stream\":"); jb_ptr(b, (uintptr_t)s); }
  if (has & G_GRAPH) { jb_lit(b, ",\"graph\":"); jb_ptr(b, (uintptr_t)g); }
  if (has & G_EXEC) { jb_lit(b, ",\"exec\":"); jb_ptr(b, (uintptr_t)x); }
  if (has & G_CAPID) { jb_lit(b, ",\"capture_id\":"); jb_u64(b, capid); }
  if (has & G_SEQS) {
    jb_lit(b, ",\"seq_first\":"); if (first >= 0) jb_i64(b, first); else jb_lit(b, "null");
    jb_lit(b, ",\"seq_last\":"); if (last >= 0) jb_i64(b, last); else jb_lit(b, "null");
  }
  if (has & G_NODES) { jb_lit(b, ",\"nodes\":"); jb_u64(b, nodes); }
  mc_write_record(MC_F_GRAPHS, b, 0);
}

static int is_ptsz(CUpti_CallbackId c) {
  return c == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz || c == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz ||
         c == CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz ||
         c == CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_ptsz ||
         c == CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2_ptsz ||
         c == CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph_ptsz ||
         c == CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture_ptsz || c == CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz;
}

static CUstream norm_stream(CUpti_CallbackId cbid, CUstream s) {
  return (s == NULL && is_ptsz(cbid)) ? CU_STREAM_PER_THREAD : s;
}

static void on_graph(CUpti_CallbackId cbid, const CUpti_CallbackData *d) {
  CUresult rc = d->functionReturnValue ? *(const CUresult *)d->functionReturnValue : CUDA_SUCCESS;
  switch (cbid) {
  case CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture:
  case CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_ptsz:
  case CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2:
  case CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2_ptsz:
  case CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph:
  case CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph_ptsz: {
    if (rc != CUDA_SUCCESS) return;
    CUstream s = norm_stream(cbid, *(CUstream const *)d->functionParams); /* hStream comes first */
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t id = 0;
    CUgraph g = NULL;
    if (MC_CU(cuStreamGetCaptureInfo, s, &st, &id, &g, NULL, NULL, NULL) != CUDA_SUCCESS) return;
    MC_LOCK(&cap_lock);
    for (int i = 0; i < NCAP; i++)
      if (!caps[i].active) { caps[i] = (capture_t){s, id, -1, -1, 1}; break; }
    MC_UNLOCK(&cap_lock);
    atomic_fetch_add(&mc_capturing, 1);
    graph_line("capture_begin", G_STREAM | G_GRAPH | G_CAPID, s, g, NULL, id, -1, -1, 0);
    return;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture:
  case CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture_ptsz: {
    const cuStreamEndCapture_params *p = d->functionParams;
    CUstream s = norm_stream(cbid, p->hStream);
    CUgraph g = (rc == CUDA_SUCCESS && p->phGraph) ? *p->phGraph : NULL;
    capture_t c = {0};
    int found = 0;
    MC_LOCK(&cap_lock);
    for (int i = 0; i < NCAP; i++)
      if (caps[i].active && caps[i].stream == s) { c = caps[i]; caps[i].active = 0; found = 1; break; }
    MC_UNLOCK(&cap_lock);
    if (!found) return;
    atomic_fetch_sub(&mc_capturing, 1);
    size_t nodes = 0;
    int has = G_STREAM | G_GRAPH | G_CAPID | G_SEQS;
    if (g && MC_CU(cuGraphGetNodes, g, NULL, &nodes) == CUDA_SUCCESS) has |= G_NODES;
    graph_line("capture_end", has, s, g, NULL, c.id, c.first, c.last, nodes);
    return;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiate:
  case CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiate_v2:
  case CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithFlags:
  case CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithParams:
  case CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithParams_ptsz: {
    if (rc != CUDA_SUCCESS) return;
    const cuGraphInstantiateWithFlags_params *p = d->functionParams; /* same first two fields */
    graph_line("instantiate", G_GRAPH | G_EXEC, NULL, p->hGraph, p->phGraphExec ? *p->phGraphExec : NULL,
               0, -1, -1, 0);
    return;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch:
  case CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz: {
    const cuGraphLaunch_params *p = d->functionParams;
    graph_line("launch", G_STREAM | G_EXEC, norm_stream(cbid, p->hStream), NULL, p->hGraph, 0, -1, -1, 0);
    return;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuGraphExecDestroy:
    graph_line("exec_destroy", G_EXEC, NULL, NULL, ((const cuGraphExecDestroy_params *)d->functionParams)->hGraphExec,
               0, -1, -1, 0);
    return;
  case CUPTI_DRIVER_TRACE_CBID_cuGraphDestroy:
    graph_line("graph_destroy", G_GRAPH, NULL, ((const cuGraphDestroy_params *)d->functionParams)->hGraph, NULL,
               0, -1, -1, 0);
    return;
  }
}

/* ---- launches (the record body: record.c) ---- */
/* The binary form's api byte (docs/dump-format.md "Binary launch records"). */
static int api_id(CUpti_CallbackId cbid) {
  switch (cbid) {
  case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel: return 0;
  case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz: return 1;
  case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx: return 2;
  case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz: return 3;
  case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel: return 4;
  case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz: return 5;
  case CUPTI_DRIVER_TRACE_CBID_cuGraphAddKernelNode: return 6;
  case CUPTI_DRIVER_TRACE_CBID_cuGraphAddKernelNode_v2: return 7;
  case CUPTI_DRIVER_TRACE_CBID_cuGraphAddNode: return 8;
  case CUPTI_DRIVER_TRACE_CBID_cuGraphAddNode_v2: return 9;
  case CUPTI_DRIVER_TRACE_CBID_cuGraphKernelNodeSetParams: return 10;
  case CUPTI_DRIVER_TRACE_CBID_cuGraphKernelNodeSetParams_v2: return 11;
  case CUPTI_DRIVER_TRACE_CBID_cuGraphExecKernelNodeSetParams: return 12;
  case CUPTI_DRIVER_TRACE_CBID_cuGraphExecKernelNodeSetParams_v2: return 13;
  case CUPTI_DRIVER_TRACE_CBID_cuGraphNodeSetParams: return 14;
  case CUPTI_DRIVER_TRACE_CBID_cuGraphExecNodeSetParams: return 15;
  default: return 255;
  }
}

/* e and its compact id (-1: default form) for a launch of `handle`, or NULL when the launch is not
 * recorded (filtered out, or no memory). Why the thread's last function first: the launch path
 * then reads one cache line of this thread's instead of the layout table, its slot and the
 * function's id; a launch loop, a decode step's many launches of one kernel, hit it. Kept only
 * when CUPTI names the symbol (a handle reused by another kernel is another symbol pointer, as
 * the layout table checks). */
static const mc_entry_t *function_of(mc_tl_t *t, void *handle, CUcontext ctx, const char *cupti_symbol,
                                     int64_t *fn) {
  if (cupti_symbol && t->handle == handle && t->ctx == ctx && t->symkey == cupti_symbol) {
    *fn = t->fn;
    return t->e;
  }
  const mc_entry_t *e = mc_layout_get(handle, ctx, cupti_symbol);
  if (!e) return NULL;
  if (!e->record) { atomic_fetch_add(&mc_cnt.dropped[MC_DROP_FILTERED], 1); return NULL; }
  /* compact: the function's record is written (once) before this launch's is built */
  *fn = mc_knobs.compact ? mc_fn_id(e) : -1;
  if (cupti_symbol && (*fn >= 0 || !mc_knobs.compact)) {
    t->handle = handle; t->ctx = ctx; t->symkey = cupti_symbol; t->e = e; t->fn = *fn;
  }
  return e;
}

/* Filters, then one launch record (JSON or binary) for L, whose kernel is `handle` (a CUfunction
 * or CUkernel). Fills in time, thread and device, and (ask_graph) whether L's stream is being
 * captured into a graph: asked only for a launch that will be recorded. Returns the seq, or -1. */
/* noipa: told that t is always &mc_tl, the compiler would look that TLS address up again at every
 * use of t (a __tls_get_addr call each) */
__attribute__((noipa)) static int64_t record_launch(mc_tl_t *t, mc_launch_t *L, void *handle, const char *cupti_symbol, int ask_graph) {
  int64_t fn = -1;
  const mc_entry_t *e = function_of(t, handle, L->ctx, cupti_symbol, &fn);
  if (!e) return -1;
  if (mc_knobs.skip && atomic_fetch_add(&mc_cnt.eligible, 1) < mc_knobs.skip) {
    atomic_fetch_add(&mc_cnt.dropped[MC_DROP_SKIP], 1);
    return -1;
  }
  if (mc_knobs.max_launches &&
      atomic_load_explicit(&mc_cnt.launches_recorded, memory_order_relaxed) >= mc_knobs.max_launches) {
    atomic_fetch_add(&mc_cnt.dropped[MC_DROP_MAX_LAUNCHES], 1);
    return -1;
  }
  if (ask_graph && atomic_load_explicit(&mc_capturing, memory_order_relaxed) > 0) {
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t capid = 0;
    CUgraph graph = NULL;
    if (MC_CU_ANSWER(cuStreamGetCaptureInfo, L->stream, &st, &capid, &graph, NULL, NULL, NULL) == CUDA_SUCCESS &&
        st == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
      L->in_graph = 1; L->graph = graph; L->capid = (uint64_t)capid;
    }
  }
  L->t_ns = mc_now_ns();
  L->tid = mc_tl_tid(t);
  L->dev = mc_tl_dev(t, L->ctx);
  if (mc_knobs.bin && fn < 0) { /* no function record, so no binary form: dropped, counted */
    atomic_fetch_add(&mc_cnt.dropped[mc_knobs.max_bytes ? MC_DROP_MAX_BYTES : MC_DROP_NO_MEMORY], 1);
    return -1;
  }
  int64_t seq;
  if (mc_knobs.bin) {
    seq = mc_record_bin(L, e, (uint32_t)fn);
  } else {
    jb_t *b = jb_thread();
    if (!b) return -1;
    mc_launch_json(b, L, e, fn);
    seq = mc_write_record(MC_F_LAUNCHES, b, 1);
  }
  if (seq >= 0) atomic_fetch_add_explicit(&mc_cnt.launches_recorded, 1, memory_order_relaxed);
  return seq;
}

/* ---- kernel nodes of explicitly built graphs (cuGraphAddKernelNode, cuGraphAddNode, and the
 * calls that change a node's or an instantiated node's parameters) ----
 * Such a kernel runs at every cuGraphLaunch of an exec made from the graph and never passes
 * through a launch API, so its ABI is recorded when the node is defined: one launch record
 * (api = the graph call, graph = {graph or exec, capture_id 0}, stream 0x0) and one graphs.jsonl
 * `kernel_node` event {graph, exec, node, seq} naming that record. The parameter structs of all
 * versions begin with the same fields (func .. extra); v2 and later add kern and ctx. */
typedef struct { CUfunction func; unsigned g[3], b[3], smem; void **kp, **extra; CUkernel kern; CUcontext ctx; } node_kp_t;

static void on_kernel_node(mc_tl_t *t, CUpti_CallbackId cbid, const CUpti_CallbackData *d) {
  CUresult rc = d->functionReturnValue ? *(const CUresult *)d->functionReturnValue : CUDA_SUCCESS;
  if (rc != CUDA_SUCCESS || !d->functionParams) return;
  const void *np = NULL;     /* the kernel-node parameter struct */
  int v2 = 1;
  CUgraph graph = NULL;
  CUgraphExec exec = NULL;
  CUgraphNode node = NULL;
  switch (cbid) {
  case CUPTI_DRIVER_TRACE_CBID_cuGraphAddKernelNode: {
    const cuGraphAddKernelNode_params *p = d->functionParams;
    np = p->nodeParams; v2 = 0; graph = p->hGraph;
    node = p->phGraphNode ? *p->phGraphNode : NULL;
    break;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuGraphAddKernelNode_v2: {
    const cuGraphAddKernelNode_v2_params *p = d->functionParams;
    np = p->nodeParams; graph = p->hGraph;
    node = p->phGraphNode ? *p->phGraphNode : NULL;
    break;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuGraphAddNode: case CUPTI_DRIVER_TRACE_CBID_cuGraphAddNode_v2: {
    const CUgraphNodeParams *gp;
    if (cbid == CUPTI_DRIVER_TRACE_CBID_cuGraphAddNode) {
      const cuGraphAddNode_params *p = d->functionParams;
      gp = p->nodeParams; graph = p->hGraph; node = p->phGraphNode ? *p->phGraphNode : NULL;
    } else {
      const cuGraphAddNode_v2_params *p = d->functionParams;
      gp = p->nodeParams; graph = p->hGraph; node = p->phGraphNode ? *p->phGraphNode : NULL;
    }
    if (!gp || gp->type != CU_GRAPH_NODE_TYPE_KERNEL) return;
    np = &gp->kernel;
    break;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuGraphKernelNodeSetParams: {
    const cuGraphKernelNodeSetParams_params *p = d->functionParams;
    np = p->nodeParams; v2 = 0; node = p->hNode;
    break;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuGraphKernelNodeSetParams_v2: {
    const cuGraphKernelNodeSetParams_v2_params *p = d->functionParams;
    np = p->nodeParams; node = p->hNode;
    break;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuGraphExecKernelNodeSetParams: {
    const cuGraphExecKernelNodeSetParams_params *p = d->functionParams;
    np = p->nodeParams; v2 = 0; node = p->hNode; exec = p->hGraphExec;
    break;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuGraphExecKernelNodeSetParams_v2: {
    const cuGraphExecKernelNodeSetParams_v2_params *p = d->functionParams;
    np = p->nodeParams; node = p->hNode; exec = p->hGraphExec;
    break;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuGraphNodeSetParams: case CUPTI_DRIVER_TRACE_CBID_cuGraphExecNodeSetParams: {
    const CUgraphNodeParams *gp;
    if (cbid == CUPTI_DRIVER_TRACE_CBID_cuGraphNodeSetParams) {
      const cuGraphNodeSetParams_params *p = d->functionParams;
      gp = p->nodeParams; node = p->hNode;
    } else {
      const cuGraphExecNodeSetParams_params *p = d->functionParams;
      gp = p->nodeParams; node = p->hNode; exec = p->hGraphExec;
    }
    if (!gp || gp->type != CU_GRAPH_NODE_TYPE_KERNEL) return;
    np = &gp->kernel;
    break;
  }
  default:
    return;
  }
  if (!np) return;
  const CUDA_KERNEL_NODE_PARAMS_v1 *k1 = np;   /* the common prefix */
  void *handle = (void *)k1->func;
  CUcontext ctx = d->context;
  if (v2) {
    const CUDA_KERNEL_NODE_PARAMS_v2 *k2 = np;
    if (!handle) { handle = (void *)k2->kern; if (k2->ctx) ctx = k2->ctx; }
  }
  if (!handle) return;
  atomic_fetch_add_explicit(&mc_cnt.launches, 1, memory_order_relaxed);
  mc_launch_t L = {0, 0, 0, ctx, NULL, api_id(cbid), 0, 1, exec ? (CUgraph)(void *)exec : graph, 0,
                   {k1->gridDimX, k1->gridDimY, k1->gridDimZ}, {k1->blockDimX, k1->blockDimY, k1->blockDimZ},
                   k1->sharedMemBytes, NULL, k1->kernelParams, k1->extra};
  int64_t seq = record_launch(t, &L, handle, NULL, 0);
  if (seq < 0) return;
  jb_t *b = jb_thread();
  if (!b) return;
  jb_lit(b, "\"event\":\"kernel_node\",\"t_ns\":"); jb_u64(b, mc_now_ns());
  jb_lit(b, ",\"tid\":"); jb_u64(b, (uint64_t)mc_tid());
  jb_lit(b, ",\"api\":"); jb_str(b, mc_api_names[L.api]);
  if (graph) { jb_lit(b, ",\"graph\":"); jb_ptr(b, (uintptr_t)graph); }
  if (exec) { jb_lit(b, ",\"exec\":"); jb_ptr(b, (uintptr_t)exec); }
  jb_lit(b, ",\"node\":"); jb_ptr(b, (uintptr_t)node);
  jb_lit(b, ",\"seq\":"); jb_i64(b, seq);
  mc_write_record(MC_F_GRAPHS, b, 0);
}


static void on_launch(mc_tl_t *t, CUpti_CallbackId cbid, const CUpti_CallbackData *d) {
  CUfunction f;
  unsigned g[3], bl[3], smem;
  CUstream stream;
  void **kp, **extra = NULL;
  const CUlaunchConfig *cfg = NULL;
  switch (cbid) {
  case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
  case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz: {
    const cuLaunchKernel_params *p = d->functionParams;
    f = p->f; g[0] = p->gridDimX; g[1] = p->gridDimY; g[2] = p->gridDimZ;
    bl[0] = p->blockDimX; bl[1] = p->blockDimY; bl[2] = p->blockDimZ; smem = p->sharedMemBytes;
    stream = p->hStream; kp = p->kernelParams; extra = p->extra;
    break;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel:
  case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz: {
    const cuLaunchCooperativeKernel_params *p = d->functionParams;
    f = p->f; g[0] = p->gridDimX; g[1] = p->gridDimY; g[2] = p->gridDimZ;
    bl[0] = p->blockDimX; bl[1] = p->blockDimY; bl[2] = p->blockDimZ; smem = p->sharedMemBytes;
    stream = p->hStream; kp = p->kernelParams;
    break;
  }
  default: {
    const cuLaunchKernelEx_params *p = d->functionParams;
    cfg = p->config;
    if (!cfg) return;
    f = p->f; g[0] = cfg->gridDimX; g[1] = cfg->gridDimY; g[2] = cfg->gridDimZ;
    bl[0] = cfg->blockDimX; bl[1] = cfg->blockDimY; bl[2] = cfg->blockDimZ; smem = cfg->sharedMemBytes;
    stream = cfg->hStream; kp = p->kernelParams; extra = p->extra;
    break;
  }
  }
  atomic_fetch_add_explicit(&mc_cnt.launches, 1, memory_order_relaxed);
  CUresult result = d->functionReturnValue ? *(const CUresult *)d->functionReturnValue : CUDA_SUCCESS;
  mc_launch_t L = {0, 0, 0, d->context, norm_stream(cbid, stream), api_id(cbid), (int)result, 0, NULL, 0,
                   {g[0], g[1], g[2]}, {bl[0], bl[1], bl[2]}, smem, cfg, kp, extra};
  int64_t seq = record_launch(t, &L, (void *)f, d->symbolName, 1);
  if (seq >= 0 && L.in_graph) capture_note_launch(L.capid, seq);
}

static void alloc_log_exit(CUpti_CallbackId cbid, const CUpti_CallbackData *d) {
  int result = d->functionReturnValue ? (int)*(const CUresult *)d->functionReturnValue : 0;
  mc_alloc_log_exit(cbid, d->correlationId, d->functionParams, d->context, result);
}

void CUPTIAPI mc_callback(void *ud, CUpti_CallbackDomain dom, CUpti_CallbackId cbid, const void *cbdata) {
  (void)ud;
  if (atomic_load_explicit(&mc_off, memory_order_relaxed)) return;
  if (dom == CUPTI_CB_DOMAIN_RESOURCE) {
    const CUpti_ResourceData *r = cbdata;
    if (cbid == CUPTI_CBID_RESOURCE_MODULE_LOADED || cbid == CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING) {
      const CUpti_ModuleResourceData *m = r->resourceDescriptor;
      if (!m) return;
      if (cbid == CUPTI_CBID_RESOURCE_MODULE_LOADED) {
        if (m->pCubin && m->cubinSize) mc_module_loaded(r->context, m->moduleId, m->pCubin, m->cubinSize);
      } else mc_module_unloading(r->context, m->moduleId);
    } else if (cbid == CUPTI_CBID_RESOURCE_CONTEXT_CREATED) {
      mc_ctx_device(r->context);
      mc_meta_write(0);
    }
    return;
  }
  if (dom != CUPTI_CB_DOMAIN_DRIVER_API || mc_knobs.noop) return;
  const CUpti_CallbackData *d = cbdata;
  mc_tl_t *t = &mc_tl;
  if (t->in_cb) return;
  if (d->callbackSite != CUPTI_API_EXIT) {
    if (mc_knobs.alloc_log) mc_alloc_log_entry(cbid, d->correlationId); /* frees: stamped at entry */
    return;
  }
  t->in_cb = 1;
  switch (cbid) {
  case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel: case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz:
  case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx: case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz:
  case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel:
  case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz:
    if (mc_knobs.alternate) { /* diagnostic: odd blocks of launches pass unrecorded */
      static atomic_ullong seen;
      if ((atomic_fetch_add_explicit(&seen, 1, memory_order_relaxed) / mc_knobs.alternate) & 1) break;
    }
    if (mc_knobs.selftime) {
      uint64_t t0 = mc_now_ns();
      on_launch(t, cbid, d);
      atomic_fetch_add_explicit(&mc_cnt.self_ns, mc_now_ns() - t0, memory_order_relaxed);
      atomic_fetch_add_explicit(&mc_cnt.self_launches, 1, memory_order_relaxed);
    } else on_launch(t, cbid, d);
    break;
  case CUPTI_DRIVER_TRACE_CBID_cuGraphAddKernelNode: case CUPTI_DRIVER_TRACE_CBID_cuGraphAddKernelNode_v2:
  case CUPTI_DRIVER_TRACE_CBID_cuGraphAddNode: case CUPTI_DRIVER_TRACE_CBID_cuGraphAddNode_v2:
  case CUPTI_DRIVER_TRACE_CBID_cuGraphKernelNodeSetParams: case CUPTI_DRIVER_TRACE_CBID_cuGraphKernelNodeSetParams_v2:
  case CUPTI_DRIVER_TRACE_CBID_cuGraphExecKernelNodeSetParams:
  case CUPTI_DRIVER_TRACE_CBID_cuGraphExecKernelNodeSetParams_v2:
  case CUPTI_DRIVER_TRACE_CBID_cuGraphNodeSetParams: case CUPTI_DRIVER_TRACE_CBID_cuGraphExecNodeSetParams:
    on_kernel_node(t, cbid, d);
    break;
  case CUPTI_DRIVER_TRACE_CBID_cuModuleLoad: case CUPTI_DRIVER_TRACE_CBID_cuModuleLoadData:
  case CUPTI_DRIVER_TRACE_CBID_cuModuleLoadDataEx: case CUPTI_DRIVER_TRACE_CBID_cuModuleLoadFatBinary:
  case CUPTI_DRIVER_TRACE_CBID_cuLibraryGetModule: {
    CUmodule *pm = *(CUmodule *const *)d->functionParams; /* the out-pointer comes first */
    if (d->functionReturnValue && *(const CUresult *)d->functionReturnValue == CUDA_SUCCESS && pm)
      mc_module_note_hmod(*pm);
    break;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuMemFree: case CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2:
  case CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync: case CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync_ptsz:
  case CUPTI_DRIVER_TRACE_CBID_cuMemRelease: case CUPTI_DRIVER_TRACE_CBID_cuMemUnmap:
  /* the next four are enabled only with the allocation log (mc_alloc_log_cbids) */
  case CUPTI_DRIVER_TRACE_CBID_cuIpcCloseMemHandle: case CUPTI_DRIVER_TRACE_CBID_cuMemAddressFree:
  case CUPTI_DRIVER_TRACE_CBID_cuMemFreeHost: case CUPTI_DRIVER_TRACE_CBID_cuMemHostUnregister:
    atomic_fetch_add_explicit(&mc_free_epoch, 1, memory_order_release);
    if (mc_knobs.alloc_log) alloc_log_exit(cbid, d);
    break;
  ALLOC_IDS(CBID_CASE)
    atomic_fetch_add_explicit(&mc_alloc_epoch, 1, memory_order_release);
    if (mc_knobs.alloc_log) alloc_log_exit(cbid, d);
    break;
  case CUPTI_DRIVER_TRACE_CBID_cuMemCreate: case CUPTI_DRIVER_TRACE_CBID_cuMemAddressReserve:
    if (mc_knobs.alloc_log) alloc_log_exit(cbid, d); /* enabled only with the allocation log */
    break;
  case CUPTI_DRIVER_TRACE_CBID_cuTensorMapEncodeTiled: case CUPTI_DRIVER_TRACE_CBID_cuTensorMapEncodeIm2col:
  case CUPTI_DRIVER_TRACE_CBID_cuTensorMapEncodeIm2colWide:
    on_tensormap(cbid, d);
    break;
  default:
    on_graph(cbid, d);
    break;
  }
  t->nloaded = 0;   /* layout.c: modules loaded during this call are forgotten at its end */
  t->in_cb = 0;
}

static const CUpti_CallbackId launch_ids[] = {
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel, CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemFree, CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync, CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemRelease, CUPTI_DRIVER_TRACE_CBID_cuMemUnmap,
    ALLOC_IDS(CBID_LIST)
    CUPTI_DRIVER_TRACE_CBID_cuTensorMapEncodeTiled, CUPTI_DRIVER_TRACE_CBID_cuTensorMapEncodeIm2col,
    CUPTI_DRIVER_TRACE_CBID_cuTensorMapEncodeIm2colWide,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture, CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2, CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph, CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture, CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiate, CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiate_v2,
    CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithFlags, CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithParams,
    CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithParams_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch, CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuGraphExecDestroy, CUPTI_DRIVER_TRACE_CBID_cuGraphDestroy,
    CUPTI_DRIVER_TRACE_CBID_cuGraphAddKernelNode, CUPTI_DRIVER_TRACE_CBID_cuGraphAddKernelNode_v2,
    CUPTI_DRIVER_TRACE_CBID_cuGraphAddNode, CUPTI_DRIVER_TRACE_CBID_cuGraphAddNode_v2,
    CUPTI_DRIVER_TRACE_CBID_cuGraphKernelNodeSetParams, CUPTI_DRIVER_TRACE_CBID_cuGraphKernelNodeSetParams_v2,
    CUPTI_DRIVER_TRACE_CBID_cuGraphExecKernelNodeSetParams, CUPTI_DRIVER_TRACE_CBID_cuGraphExecKernelNodeSetParams_v2,
    CUPTI_DRIVER_TRACE_CBID_cuGraphNodeSetParams, CUPTI_DRIVER_TRACE_CBID_cuGraphExecNodeSetParams,
};
static const CUpti_CallbackId module_ids[] = {
    CUPTI_DRIVER_TRACE_CBID_cuModuleLoad, CUPTI_DRIVER_TRACE_CBID_cuModuleLoadData,
    CUPTI_DRIVER_TRACE_CBID_cuModuleLoadDataEx, CUPTI_DRIVER_TRACE_CBID_cuModuleLoadFatBinary,
    CUPTI_DRIVER_TRACE_CBID_cuLibraryGetModule,
};

int mc_enable_callbacks(CUpti_SubscriberHandle sub) {
  static const CUpti_CallbackId res[] = {CUPTI_CBID_RESOURCE_MODULE_LOADED, CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING,
                                         CUPTI_CBID_RESOURCE_CONTEXT_CREATED};
  for (size_t i = 0; i < sizeof res / sizeof *res; i++)
    if (MC_CUPTI_FATAL(cuptiEnableCallback, 1, sub, CUPTI_CB_DOMAIN_RESOURCE, res[i]) != CUPTI_SUCCESS) return -1;
  for (size_t i = 0; i < sizeof module_ids / sizeof *module_ids; i++)
    if (MC_CUPTI_FATAL(cuptiEnableCallback, 1, sub, CUPTI_CB_DOMAIN_DRIVER_API, module_ids[i]) != CUPTI_SUCCESS)
      return -1;
  if (mc_knobs.modules_only) return 0;
  for (size_t i = 0; i < sizeof launch_ids / sizeof *launch_ids; i++)
    if (MC_CUPTI_FATAL(cuptiEnableCallback, 1, sub, CUPTI_CB_DOMAIN_DRIVER_API, launch_ids[i]) != CUPTI_SUCCESS)
      return -1;
  if (!mc_knobs.alloc_log) return 0;
  size_t n;
  const CUpti_CallbackId *ids = mc_alloc_log_cbids(&n); /* a superset of the alloc/free ids above */
  for (size_t i = 0; i < n; i++)
    if (MC_CUPTI_FATAL(cuptiEnableCallback, 1, sub, CUPTI_CB_DOMAIN_DRIVER_API, ids[i]) != CUPTI_SUCCESS)
      return -1;
  return 0;
}

/* ---- MINE_CAPTURE_TOGGLE_MS (diagnostic): launch callbacks switched off and on every T ms ----
 * Why: launch cost moves by more than the capture's cost between two processes on one machine
 * (docs/benchmarks.md), so benchmarks/bench_launch.cu times blocks of launches inside one process
 * and bench_capture.py sorts them into "callbacks on" and "off" by the switch times kept here.
 * A thread of its own (all signals blocked, never calls CUDA) flips the six launch callback ids;
 * the times go to meta.json ("toggles": [[t_ns, on], ...]) at exit. */
#define NTOGGLE 4096
static uint64_t toggle_t[NTOGGLE];
static unsigned char toggle_on[NTOGGLE];
static atomic_uint ntoggle;

static void *toggle_main(void *arg) {
  CUpti_SubscriberHandle sub = arg;
  int on = 1;
  const struct timespec period = {(time_t)(mc_knobs.toggle_ms / 1000), (long)(mc_knobs.toggle_ms % 1000) * 1000000L};
  for (unsigned i = 0; i < NTOGGLE; i++) {
    struct timespec left = period;
    while (nanosleep(&left, &left) != 0) {}
    on = !on;
    for (size_t k = 0; k < 6; k++) /* launch_ids[0..5]: the launch APIs */
      if (MC_CUPTI(cuptiEnableCallback, (uint32_t)on, sub, CUPTI_CB_DOMAIN_DRIVER_API, launch_ids[k]) !=
          CUPTI_SUCCESS)
        return NULL;
    toggle_t[i] = mc_now_ns();
    toggle_on[i] = (unsigned char)on;
    atomic_store_explicit(&ntoggle, i + 1, memory_order_release);
  }
  return NULL;
}

void mc_toggle_start(CUpti_SubscriberHandle sub) {
  if (!mc_knobs.toggle_ms || mc_knobs.modules_only) return;
  mc_thread_start(toggle_main, sub);   /* a failure is counted by the choke point under its call */
}

void mc_toggles_json(jb_t *b) {
  unsigned n = atomic_load_explicit(&ntoggle, memory_order_acquire);
  if (!n) return;
  jb_lit(b, ",\"toggles\":[");
  for (unsigned i = 0; i < n; i++) {
    if (i) jb_lit(b, ",");
    jb_lit(b, "["); jb_u64(b, toggle_t[i]); jb_lit(b, ","); jb_u64(b, toggle_on[i]); jb_lit(b, "]");
  }
  jb_lit(b, "]");
}

void mc_callbacks_reset_after_fork(void) {
  pthread_mutex_init(&tmap_lock, NULL);
  pthread_mutex_init(&cap_lock, NULL);
  mc_tl.in_cb = 0;
}
