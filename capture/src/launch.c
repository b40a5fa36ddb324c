/* launch.c: the record of a launch API call, and of a kernel node of an explicitly built graph.
 *
 * A launch is described as an mc_launch_t (record.c formats it, in the JSON or the binary form),
 * after the filters (include/exclude, skip, max launches) and, for a launch inside a stream
 * capture, the capture it belongs to. Failed launches are recorded with their CUresult. */
#include "mc.h"

#include <string.h>

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

/* 1 when the skip and max-launches knobs let this launch through (counted when not). */
static int passes_limits(void) {
  if (mc_knobs.skip && atomic_fetch_add(&mc_cnt.eligible, 1) < mc_knobs.skip) {
    atomic_fetch_add(&mc_cnt.dropped[MC_DROP_SKIP], 1);
    return 0;
  }
  if (mc_knobs.max_launches &&
      atomic_load_explicit(&mc_cnt.launches_recorded, memory_order_relaxed) >= mc_knobs.max_launches) {
    atomic_fetch_add(&mc_cnt.dropped[MC_DROP_MAX_LAUNCHES], 1);
    return 0;
  }
  return 1;
}

/* Whether L's stream is being captured into a graph (asked only while a capture is open). */
static void capture_of(mc_launch_t *L) {
  if (mc_stream_capture(L->stream, &L->graph, &L->capid)) L->in_graph = 1;
}

/* Filters, then one launch record (JSON or binary) for L, whose kernel is `handle` (a CUfunction
 * or CUkernel). Fills in time, thread and device, and (ask_graph) whether L's stream is being
 * captured into a graph: asked only for a launch that will be recorded. Returns the seq, or -1. */
static int64_t record_launch(mc_tl_t *t, mc_launch_t *L, void *handle,
                             const char *cupti_symbol, int ask_graph) {
  int64_t fn = -1;
  const mc_entry_t *e = function_of(t, handle, L->ctx, cupti_symbol, &fn);
  if (!e || !passes_limits()) return -1;
  if (ask_graph) capture_of(L);
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

/* ---- launch APIs ---- */
#define DIMS_OF(src, gx, gy, gz, bx, by, bz, out)                                 \
  do {                                                                           \
    (out)->grid[0] = (src)->gx; (out)->grid[1] = (src)->gy; (out)->grid[2] = (src)->gz; \
    (out)->block[0] = (src)->bx; (out)->block[1] = (src)->by; (out)->block[2] = (src)->bz; \
    (out)->smem = (src)->sharedMemBytes;                                         \
  } while (0)

/* L's dimensions, stream and parameter pointers from the call's parameters; 0 when unusable. */
static int launch_of(const mc_cb_t *row, const void *params, mc_launch_t *L, CUfunction *f) {
  switch (row->kind) {
  case MC_K_LAUNCH: {
    const cuLaunchKernel_params *p = params;
    DIMS_OF(p, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, L);
    *f = p->f; L->stream = p->hStream; L->kp = p->kernelParams; L->extra = p->extra;
    return 1;
  }
  case MC_K_LAUNCH_COOP: {
    const cuLaunchCooperativeKernel_params *p = params;
    DIMS_OF(p, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, L);
    *f = p->f; L->stream = p->hStream; L->kp = p->kernelParams;
    return 1;
  }
  case MC_K_LAUNCH_EX: {
    const cuLaunchKernelEx_params *p = params;
    const CUlaunchConfig *cfg = p->config;
    if (!cfg) return 0;
    DIMS_OF(cfg, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, L);
    *f = p->f; L->stream = cfg->hStream; L->cfg = cfg; L->kp = p->kernelParams; L->extra = p->extra;
    return 1;
  }
  default:
    return 0;
  }
}

int mc_launch_stream(const mc_cb_t *row, const void *params, CUstream *s) {
  mc_launch_t L = {0};
  CUfunction f = NULL;
  if (!params || !launch_of(row, params, &L, &f)) return 0;
  *s = mc_cb_stream(row, L.stream);
  return 1;
}

void mc_on_launch(mc_tl_t *t, const mc_cb_t *row, const CUpti_CallbackData *d) {
  mc_launch_t L = {.ctx = d->context, .api = row->api, .result = (int)mc_cb_result(d)};
  CUfunction f = NULL;
  if (!d->functionParams || !launch_of(row, d->functionParams, &L, &f)) return;
  atomic_fetch_add_explicit(&mc_cnt.launches, 1, memory_order_relaxed);
  L.stream = mc_cb_stream(row, L.stream);
  int64_t seq = record_launch(t, &L, (void *)f, d->symbolName, 1);
  if (seq >= 0 && L.in_graph) mc_capture_note_launch(L.capid, seq);
}

/* ---- kernel nodes of explicitly built graphs (cuGraphAddKernelNode, cuGraphAddNode, and the
 * calls that change a node's or an instantiated node's parameters) ----
 * Such a kernel runs at every cuGraphLaunch of an exec made from the graph and never passes
 * through a launch API, so its ABI is recorded when the node is defined: one launch record
 * (api = the graph call, graph = {graph or exec, capture_id 0}, stream 0x0) and one graphs.jsonl
 * `kernel_node` event {graph, exec, node, seq} naming that record. The parameter structs of all
 * versions begin with the same fields (func .. extra); v2 and later add kern and ctx. */
typedef struct { const void *np; CUgraph graph; CUgraphExec exec; CUgraphNode node; } node_call_t;

static const void *kernel_of(const CUgraphNodeParams *gp) {
  return gp && gp->type == CU_GRAPH_NODE_TYPE_KERNEL ? &gp->kernel : NULL;
}

/* The kernel-node parameters a call defines (n->np NULL: not a kernel node). */
static void node_call_of(const mc_cb_t *row, const void *params, node_call_t *n) {
  switch (row->kind) {
  case MC_K_NODE_ADD: {
    const cuGraphAddKernelNode_params *p = params;  /* v1 and v2: the same fields */
    *n = (node_call_t){.np = p->nodeParams, .graph = p->hGraph, .node = p->phGraphNode ? *p->phGraphNode : NULL};
    return;
  }
  case MC_K_NODE_ADD_ANY: {
    const cuGraphAddNode_params *p = params;
    *n = (node_call_t){.np = kernel_of(p->nodeParams), .graph = p->hGraph,
                       .node = p->phGraphNode ? *p->phGraphNode : NULL};
    return;
  }
  case MC_K_NODE_ADD_ANY_V2: {
    const cuGraphAddNode_v2_params *p = params;
    *n = (node_call_t){.np = kernel_of(p->nodeParams), .graph = p->hGraph,
                       .node = p->phGraphNode ? *p->phGraphNode : NULL};
    return;
  }
  case MC_K_NODE_SET: {
    const cuGraphKernelNodeSetParams_params *p = params;
    *n = (node_call_t){.np = p->nodeParams, .node = p->hNode};
    return;
  }
  case MC_K_NODE_EXEC_SET: {
    const cuGraphExecKernelNodeSetParams_params *p = params;
    *n = (node_call_t){.np = p->nodeParams, .node = p->hNode, .exec = p->hGraphExec};
    return;
  }
  case MC_K_NODE_SET_ANY: {
    const cuGraphNodeSetParams_params *p = params;
    *n = (node_call_t){.np = kernel_of(p->nodeParams), .node = p->hNode};
    return;
  }
  case MC_K_NODE_EXEC_SET_ANY: {
    const cuGraphExecNodeSetParams_params *p = params;
    *n = (node_call_t){.np = kernel_of(p->nodeParams), .node = p->hNode, .exec = p->hGraphExec};
    return;
  }
  default:
    *n = (node_call_t){0};
  }
}

void mc_on_kernel_node(mc_tl_t *t, const mc_cb_t *row, const CUpti_CallbackData *d) {
  if (mc_cb_result(d) != CUDA_SUCCESS || !d->functionParams) return;
  node_call_t n;
  node_call_of(row, d->functionParams, &n);
  if (!n.np) return;
  const CUDA_KERNEL_NODE_PARAMS_v1 *k1 = n.np;   /* the common prefix */
  void *handle = (void *)k1->func;
  CUcontext ctx = d->context;
  if (!row->v1 && !handle) {
    const CUDA_KERNEL_NODE_PARAMS_v2 *k2 = n.np;
    handle = (void *)k2->kern;
    if (k2->ctx) ctx = k2->ctx;
  }
  if (!handle) return;
  atomic_fetch_add_explicit(&mc_cnt.launches, 1, memory_order_relaxed);
  mc_launch_t L = {.ctx = ctx, .api = row->api, .in_graph = 1,
                   .graph = n.exec ? (CUgraph)(void *)n.exec : n.graph,
                   .grid = {k1->gridDimX, k1->gridDimY, k1->gridDimZ},
                   .block = {k1->blockDimX, k1->blockDimY, k1->blockDimZ},
                   .smem = k1->sharedMemBytes, .kp = k1->kernelParams, .extra = k1->extra};
  int64_t seq = record_launch(t, &L, handle, NULL, 0);
  if (seq >= 0) mc_graph_line_kernel_node(row->name, n.graph, n.exec, n.node, seq);
}
