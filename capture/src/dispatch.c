/* dispatch.c: the CUPTI callback: which handler each callback id goes to, and enabling them.
 *
 * Every driver-API callback the library listens to is one row of tables.h MC_CALLBACKS
 * (generated from vocab/capture_tables.py): its kind (the handler, and the shape of its
 * parameter struct), when it is enabled, its launch records' api byte. The dispatch looks the row
 * up (a switch the compiler makes a jump table) and hands it to the family's handler; no other
 * list of callback ids exists in the library.
 * Launches are read at API EXIT: with lazy loading the function only exists after the call, and
 * the caller's kernelParams / extra buffer are still live. Our own driver calls inside a callback
 * are not re-entered (thread flag). Not recorded: legacy cuLaunch/cuLaunchGrid and
 * cuLaunchCooperativeKernelMultiDevice (gone in CUDA 13). */
#include "mc.h"

#include <stddef.h>

/* ---- the rows ---- */
enum {
#define KIND_FAMILY(kind, family) MC_KF_##kind = MC_FAM_##family,
  MC_CB_KINDS(KIND_FAMILY)
#undef KIND_FAMILY
};
enum {
#define ROW_INDEX(n, ...) MC_ROW_##n,
  MC_CALLBACKS(ROW_INDEX)
#undef ROW_INDEX
};
const mc_cb_t mc_cbs[MC_CB_COUNT] = {
#define ROW(n, kind_, enable_, api_, v1_, ptsz_, logged_, at_entry_)                                    \
  [MC_ROW_##n] = {.cbid = CUPTI_DRIVER_TRACE_CBID_##n, .name = #n, .kind = MC_K_##kind_,               \
                  .family = MC_KF_##kind_, .enable = MC_EN_##enable_, .api = api_, .v1 = v1_, .ptsz = ptsz_, \
                  .logged = logged_, .at_entry = at_entry_},
    MC_CALLBACKS(ROW)
#undef ROW
};

const mc_cb_t *mc_cb_of(CUpti_CallbackId cbid) {
  switch (cbid) {
#define ROW_CASE(n, ...) case CUPTI_DRIVER_TRACE_CBID_##n: return &mc_cbs[MC_ROW_##n];
    MC_CALLBACKS(ROW_CASE)
#undef ROW_CASE
  default: return NULL;
  }
}

/* The table's claims about parameter structs, checked against the CUDA headers: every call of a
 * kind has the fields its handler reads where the kind's representative struct has them.
 * Hazard: cuda.h defines some API names as macros (cuGraphAddNode is cuGraphAddNode_v2), so a
 * name is pasted into its struct's name before it is passed on, never passed bare. */
#define SAME_AT(t, s, rep, field) \
  _Static_assert(offsetof(t, field) == offsetof(rep##_params, field), s ": " #field " is not where " #rep " has it");
#define CHECK_LAUNCH(t, s) SAME_AT(t, s, cuLaunchKernel, kernelParams) SAME_AT(t, s, cuLaunchKernel, extra) \
  SAME_AT(t, s, cuLaunchKernel, hStream) SAME_AT(t, s, cuLaunchKernel, sharedMemBytes)
#define CHECK_LAUNCH_COOP(t, s) SAME_AT(t, s, cuLaunchCooperativeKernel, kernelParams) \
  SAME_AT(t, s, cuLaunchCooperativeKernel, hStream)
#define CHECK_LAUNCH_EX(t, s) SAME_AT(t, s, cuLaunchKernelEx, config) SAME_AT(t, s, cuLaunchKernelEx, extra)
#define CHECK_NODE_ADD(t, s) SAME_AT(t, s, cuGraphAddKernelNode, nodeParams) SAME_AT(t, s, cuGraphAddKernelNode, hGraph)
#define CHECK_NODE_ADD_ANY(t, s) SAME_AT(t, s, cuGraphAddNode, nodeParams)
#define CHECK_NODE_ADD_ANY_V2(t, s) SAME_AT(t, s, cuGraphAddNode_v2, nodeParams)
#define CHECK_NODE_SET(t, s) SAME_AT(t, s, cuGraphKernelNodeSetParams, nodeParams)
#define CHECK_NODE_EXEC_SET(t, s) SAME_AT(t, s, cuGraphExecKernelNodeSetParams, nodeParams)
#define CHECK_NODE_SET_ANY(t, s) SAME_AT(t, s, cuGraphNodeSetParams, nodeParams)
#define CHECK_NODE_EXEC_SET_ANY(t, s) SAME_AT(t, s, cuGraphExecNodeSetParams, nodeParams)
#define CHECK_CAPTURE_BEGIN(t, s) _Static_assert(offsetof(t, hStream) == 0, s ": hStream is not first");
#define CHECK_CAPTURE_END(t, s) SAME_AT(t, s, cuStreamEndCapture, phGraph) SAME_AT(t, s, cuStreamEndCapture, hStream)
#define CHECK_INSTANTIATE(t, s) SAME_AT(t, s, cuGraphInstantiateWithFlags, phGraphExec) \
  SAME_AT(t, s, cuGraphInstantiateWithFlags, hGraph)
#define CHECK_GRAPH_LAUNCH(t, s) SAME_AT(t, s, cuGraphLaunch, hStream) /* the exec first (hGraph, hGraphExec) */ \
  _Static_assert(sizeof(t) == sizeof(cuGraphLaunch_params), s ": not cuGraphLaunch's shape");
#define CHECK_NONE(t, s)
#define CHECK_MODULE CHECK_NONE       /* the out-pointer first: module and pMod by name */
#define CHECK_FREE CHECK_NONE         /* alloc.c reads each call's own struct */
#define CHECK_ALLOC CHECK_NONE
#define CHECK_ALLOC_LOG CHECK_NONE
#define CHECK_TMAP_TILED CHECK_NONE   /* tmap.c reads each call's own struct */
#define CHECK_TMAP_IM2COL CHECK_NONE
#define CHECK_TMAP_IM2COL_WIDE CHECK_NONE
#define CHECK_COPY_HTOD(t, s) SAME_AT(t, s, cuMemcpyHtoD_v2, dstDevice) SAME_AT(t, s, cuMemcpyHtoD_v2, srcHost) \
  SAME_AT(t, s, cuMemcpyHtoD_v2, ByteCount)
#define CHECK_COPY_HTOD_ASYNC(t, s) SAME_AT(t, s, cuMemcpyHtoDAsync_v2, dstDevice) \
  SAME_AT(t, s, cuMemcpyHtoDAsync_v2, srcHost) SAME_AT(t, s, cuMemcpyHtoDAsync_v2, ByteCount) \
  SAME_AT(t, s, cuMemcpyHtoDAsync_v2, hStream)
#define CHECK_COPY_ANY(t, s) SAME_AT(t, s, cuMemcpy, dst) SAME_AT(t, s, cuMemcpy, src) SAME_AT(t, s, cuMemcpy, ByteCount)
#define CHECK_COPY_ANY_ASYNC(t, s) SAME_AT(t, s, cuMemcpyAsync, dst) SAME_AT(t, s, cuMemcpyAsync, src) \
  SAME_AT(t, s, cuMemcpyAsync, ByteCount) SAME_AT(t, s, cuMemcpyAsync, hStream)
#define CHECK_COPY_DTOD(t, s) SAME_AT(t, s, cuMemcpyDtoD_v2, dstDevice) SAME_AT(t, s, cuMemcpyDtoD_v2, srcDevice) \
  SAME_AT(t, s, cuMemcpyDtoD_v2, ByteCount)
#define CHECK_COPY_DTOD_ASYNC(t, s) SAME_AT(t, s, cuMemcpyDtoDAsync_v2, dstDevice) \
  SAME_AT(t, s, cuMemcpyDtoDAsync_v2, srcDevice) SAME_AT(t, s, cuMemcpyDtoDAsync_v2, ByteCount) \
  SAME_AT(t, s, cuMemcpyDtoDAsync_v2, hStream)
#define CHECK_MEMSET(t, s, rep, v) SAME_AT(t, s, rep, dstDevice) SAME_AT(t, s, rep, v) SAME_AT(t, s, rep, N)
#define CHECK_MEMSET_D8(t, s) CHECK_MEMSET(t, s, cuMemsetD8_v2, uc)
#define CHECK_MEMSET_D16(t, s) CHECK_MEMSET(t, s, cuMemsetD16_v2, us)
#define CHECK_MEMSET_D32(t, s) CHECK_MEMSET(t, s, cuMemsetD32_v2, ui)
#define CHECK_MEMSET_D8_ASYNC(t, s) CHECK_MEMSET(t, s, cuMemsetD8Async, uc) SAME_AT(t, s, cuMemsetD8Async, hStream)
#define CHECK_MEMSET_D16_ASYNC(t, s) CHECK_MEMSET(t, s, cuMemsetD16Async, us) SAME_AT(t, s, cuMemsetD16Async, hStream)
#define CHECK_MEMSET_D32_ASYNC(t, s) CHECK_MEMSET(t, s, cuMemsetD32Async, ui) SAME_AT(t, s, cuMemsetD32Async, hStream)
#define CHECK_COPY_NODE_ADD CHECK_NONE /* one call each: copies.c reads its own struct */
#define CHECK_COPY_NODE_SET CHECK_NONE
#define CHECK_COPY_NODE_EXEC_SET CHECK_NONE
#define CHECK_EXEC_DESTROY CHECK_NONE
#define CHECK_GRAPH_DESTROY CHECK_NONE
#define CHECK_ROW(n, kind, ...) CHECK_##kind(n##_params, #n)
MC_CALLBACKS(CHECK_ROW)
#define CHECK_API(i, n) _Static_assert(mc_cbs_api_##n == i, #n);
enum {
#define API_OF_ROW(n, kind, enable, api, ...) mc_cbs_api_##n = api,
  MC_CALLBACKS(API_OF_ROW)
#undef API_OF_ROW
};
MC_LAUNCH_APIS(CHECK_API)

/* ---- the handlers of the small families ---- */
static void on_resource(CUpti_CallbackId cbid, const CUpti_ResourceData *r) {
  if (cbid == CUPTI_CBID_RESOURCE_MODULE_LOADED || cbid == CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING) {
    const CUpti_ModuleResourceData *m = r->resourceDescriptor;
    if (!m) return;
    if (cbid == CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING) mc_module_unloading(r->context, m->moduleId);
    else if (m->pCubin && m->cubinSize) mc_module_loaded(r->context, m->moduleId, m->pCubin, m->cubinSize);
  } else if (cbid == CUPTI_CBID_RESOURCE_CONTEXT_CREATED) {
    mc_ctx_device(r->context);
    mc_meta_write(0);
  }
}

static void on_module_call(const CUpti_CallbackData *d) {
  CUmodule *pm = *(CUmodule *const *)d->functionParams; /* the out-pointer comes first */
  if (mc_cb_result(d) == CUDA_SUCCESS && pm) mc_module_note_hmod(*pm);
}

static void alloc_log_exit(CUpti_CallbackId cbid, const CUpti_CallbackData *d) {
  if (mc_knobs.alloc_log)
    mc_alloc_log_exit(cbid, d->correlationId, d->functionParams, d->context, (int)mc_cb_result(d));
  if (mc_knobs.snapshot) mc_snapshot_alloc_event(cbid, d->functionParams, 0, (int)mc_cb_result(d));
}

static void launch_timed(mc_tl_t *t, const mc_cb_t *row, const CUpti_CallbackData *d) {
  if (mc_knobs.alternate) { /* diagnostic: odd blocks of launches pass unrecorded */
    static atomic_ullong seen;
    if ((atomic_fetch_add_explicit(&seen, 1, memory_order_relaxed) / mc_knobs.alternate) & 1) return;
  }
  if (!mc_knobs.selftime) { mc_on_launch(t, row, d); return; }
  uint64_t t0 = mc_now_ns();
  mc_on_launch(t, row, d);
  atomic_fetch_add_explicit(&mc_cnt.self_ns, mc_now_ns() - t0, memory_order_relaxed);
  atomic_fetch_add_explicit(&mc_cnt.self_launches, 1, memory_order_relaxed);
}

static void on_exit_site(mc_tl_t *t, const mc_cb_t *row, const CUpti_CallbackData *d) {
  switch (row->family) {
  case MC_FAM_LAUNCH:
    launch_timed(t, row, d);
    if (mc_knobs.snapshot) mc_snapshot_at_launch(row, d);   /* snapshot.c: when one is due */
    return;
  case MC_FAM_KERNEL_NODE: mc_on_kernel_node(t, row, d); return;
  case MC_FAM_MODULE: on_module_call(d); return;
  case MC_FAM_FREE:
    atomic_fetch_add_explicit(&mc_free_epoch, 1, memory_order_release);
    alloc_log_exit(row->cbid, d);
    return;
  case MC_FAM_ALLOC:
    atomic_fetch_add_explicit(&mc_alloc_epoch, 1, memory_order_release);
    alloc_log_exit(row->cbid, d);
    return;
  case MC_FAM_ALLOC_LOG: alloc_log_exit(row->cbid, d); return;
  case MC_FAM_TENSORMAP: mc_on_tensormap(row, d); return;
  case MC_FAM_GRAPH: mc_on_graph(row, d); return;
  case MC_FAM_COPY: mc_on_copy(t, row, d); return;
  }
}

void CUPTIAPI mc_callback(void *ud, CUpti_CallbackDomain dom, CUpti_CallbackId cbid, const void *cbdata) {
  (void)ud;
  if (atomic_load_explicit(&mc_off, memory_order_relaxed)) return;
  if (dom == CUPTI_CB_DOMAIN_RESOURCE) {
    if (mc_tl_get()) on_resource(cbid, cbdata); /* NULL: no thread block, capture is off */
    return;
  }
  if (dom != CUPTI_CB_DOMAIN_DRIVER_API || mc_knobs.noop) return;
  const CUpti_CallbackData *d = cbdata;
  mc_tl_t *t = mc_tl_get();
  if (!t || t->in_cb) return;
  const mc_cb_t *row = mc_cb_of(cbid);
  if (!row) return;
  if (d->callbackSite != CUPTI_API_EXIT) {
    if (mc_knobs.alloc_log && row->at_entry) mc_alloc_log_entry(cbid, d->correlationId); /* frees: at entry */
    if (mc_knobs.snapshot && row->at_entry) {   /* snapshot.c's table drops a freed allocation now */
      t->in_cb = 1;
      mc_snapshot_alloc_event(cbid, d->functionParams, 1, CUDA_SUCCESS);
      t->in_cb = 0;
    }
    return;
  }
  t->in_cb = 1;
  on_exit_site(t, row, d);
  t->nloaded = 0;   /* layout.c: modules loaded during this call are forgotten at its end */
  t->in_cb = 0;
}

/* ---- enabling ---- */
static int wanted(const mc_cb_t *row) {
  switch (row->enable) {
  case MC_EN_ALWAYS: return 1;
  case MC_EN_LAUNCHES: return !mc_knobs.modules_only;
  case MC_EN_COPY_LOG: return !mc_knobs.modules_only && mc_knobs.copy_log;
  default: return !mc_knobs.modules_only && mc_knobs.alloc_log;
  }
}

int mc_enable_callbacks(CUpti_SubscriberHandle sub) {
  static const CUpti_CallbackId res[] = {
#define RES_ID(n) CUPTI_CBID_RESOURCE_##n,
      MC_RESOURCE_CALLBACKS(RES_ID)
#undef RES_ID
  };
  for (size_t i = 0; i < sizeof res / sizeof *res; i++)
    if (MC_CUPTI_FATAL(cuptiEnableCallback, 1, sub, CUPTI_CB_DOMAIN_RESOURCE, res[i]) != CUPTI_SUCCESS) return -1;
  for (size_t i = 0; i < MC_CB_COUNT; i++)
    if (wanted(&mc_cbs[i]) &&
        MC_CUPTI_FATAL(cuptiEnableCallback, 1, sub, CUPTI_CB_DOMAIN_DRIVER_API, mc_cbs[i].cbid) != CUPTI_SUCCESS)
      return -1;
  return 0;
}

void mc_callbacks_reset_after_fork(void) {
  mc_tmap_reset_after_fork();
  mc_graphs_reset_after_fork(); /* (the thread block's in_cb: ident.c) */
}
