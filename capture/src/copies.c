/* copies.c: host-to-device copies, one copies.jsonl record each (docs/dump-format.md "Copy log").
 *
 * Why: a launch's parameters name its buffers, not what is in them. The inputs of a forward
 * (token ids, positions, slot mapping, sequence lengths, block tables, query start offsets) are
 * what the host copied into device buffers before the launches that read them; `mine replay` needs
 * those bytes to fill attention's metadata buffers realistically, and `mine compile` to name each
 * input by its provenance. Every copy records the launch seq it precedes (`seq_before`, as the
 * allocation log), its stream, destination, size, and (size <= MINE_CAPTURE_COPY_BYTES) the bytes.
 *
 * Which calls: the typed host-to-device calls (cuMemcpyHtoD*, the runtime's cudaMemcpy* arrive as
 * these), the generic cuMemcpy / cuMemcpyAsync when the driver says the source is host memory and
 * the destination device memory, and the memcpy nodes of hand-built graphs (1-D host-to-device
 * copies; their bytes are the host buffer's at definition: a replay reads it again). A copy made
 * on a stream being captured into a graph carries `graph` (it runs at each replay, not now).
 * Cost: a typed copy is parsed, stamped and appended by the writer (with the mmap writer no
 * syscall); the bytes are read only after the driver confirms the source is host memory (one
 * cuPointerGetAttributes: never a device or managed address read from the CPU, which would fault
 * or migrate pages). Bytes are read at the API's exit: for an async copy from pinned memory they
 * are what the host buffer held then, which the DMA will copy unless the host changes them first.
 * Pure parts (mc_copy_parse, mc_copy_json) are tested on CPU (tests/capture/test_copies.c). */
#include "mc.h"

#include <string.h>

/* ---- the call's parameters ---- */
static void set_1d(mc_copy_t *c, uint64_t dst, uint64_t src, uint64_t size) {
  c->dst = dst; c->src = src; c->size = size;
}

/* A memcpy node: only a 1-D host-to-device copy (one row of bytes) is a copy of this log. */
static int node_copy(mc_copy_t *c, const CUDA_MEMCPY3D *m) {
  if (!m || m->Height > 1 || m->Depth > 1 || m->srcY || m->srcZ || m->dstY || m->dstZ) return 0;
  int src_host = m->srcMemoryType == CU_MEMORYTYPE_HOST || m->srcMemoryType == CU_MEMORYTYPE_UNIFIED;
  int dst_dev = m->dstMemoryType == CU_MEMORYTYPE_DEVICE || m->dstMemoryType == CU_MEMORYTYPE_UNIFIED;
  if (!src_host || !dst_dev) return 0;
  uint64_t src = m->srcMemoryType == CU_MEMORYTYPE_HOST ? (uint64_t)(uintptr_t)m->srcHost : (uint64_t)m->srcDevice;
  set_1d(c, (uint64_t)m->dstDevice + m->dstXInBytes, src + m->srcXInBytes, m->WidthInBytes);
  c->check = m->srcMemoryType == CU_MEMORYTYPE_UNIFIED || m->dstMemoryType == CU_MEMORYTYPE_UNIFIED;
  return 1;
}

int mc_copy_parse(const mc_cb_t *row, const void *params, mc_copy_t *c) {
  memset(c, 0, sizeof *c);
  if (!params) return 0;
  c->stream = mc_cb_stream(row, NULL); /* a call without a stream: the legacy or per-thread default */
  switch (row->kind) {
  case MC_K_COPY_HTOD: {
    const cuMemcpyHtoD_v2_params *p = params;
    set_1d(c, (uint64_t)p->dstDevice, (uint64_t)(uintptr_t)p->srcHost, p->ByteCount);
    return 1;
  }
  case MC_K_COPY_HTOD_ASYNC: {
    const cuMemcpyHtoDAsync_v2_params *p = params;
    set_1d(c, (uint64_t)p->dstDevice, (uint64_t)(uintptr_t)p->srcHost, p->ByteCount);
    c->stream = mc_cb_stream(row, p->hStream); c->async = 1;
    return 1;
  }
  case MC_K_COPY_ANY: {
    const cuMemcpy_params *p = params;
    set_1d(c, (uint64_t)p->dst, (uint64_t)p->src, p->ByteCount);
    c->check = 1;
    return 1;
  }
  case MC_K_COPY_ANY_ASYNC: {
    const cuMemcpyAsync_params *p = params;
    set_1d(c, (uint64_t)p->dst, (uint64_t)p->src, p->ByteCount);
    c->stream = mc_cb_stream(row, p->hStream); c->async = 1; c->check = 1;
    return 1;
  }
  case MC_K_COPY_NODE_ADD: {
    const cuGraphAddMemcpyNode_params *p = params;
    c->is_node = 1; c->graph = p->hGraph; c->node = p->phGraphNode ? *p->phGraphNode : NULL;
    return node_copy(c, p->copyParams);
  }
  case MC_K_COPY_NODE_SET: {
    const cuGraphMemcpyNodeSetParams_params *p = params;
    c->is_node = 1; c->node = p->hNode;
    return node_copy(c, p->nodeParams);
  }
  case MC_K_COPY_NODE_EXEC_SET: {
    const cuGraphExecMemcpyNodeSetParams_params *p = params;
    c->is_node = 1; c->exec = p->hGraphExec; c->node = p->hNode;
    return node_copy(c, p->copyParams);
  }
  default:
    return 0;
  }
}

/* ---- the record ---- */
void mc_copy_json(jb_t *b, const char *api, const mc_copy_t *c, const mc_copy_stamp_t *st, const void *bytes) {
  jb_lit(b, "\"seq_before\":"); jb_u64(b, st->seq_before);
  jb_lit(b, ",\"t_ns\":"); jb_u64(b, st->t_ns);
  jb_lit(b, ",\"tid\":"); jb_i64(b, st->tid);
  jb_lit(b, ",\"dev\":"); jb_i64(b, st->dev);
  jb_lit(b, ",\"api\":"); jb_str(b, api);
  jb_lit(b, ",\"stream\":"); jb_ptr(b, (uint64_t)(uintptr_t)c->stream);
  jb_lit(b, ",\"async\":"); jb_u64(b, (uint64_t)c->async);
  jb_lit(b, ",\"dst\":"); jb_ptr(b, c->dst);
  jb_lit(b, ",\"src\":"); jb_ptr(b, c->src);
  jb_lit(b, ",\"size\":"); jb_u64(b, c->size);
  jb_lit(b, ",\"result\":"); jb_i64(b, st->result);
  jb_lit(b, ",\"graph\":");
  if (c->is_node) {   /* as a kernel node's launch record: the graph, or the exec for the Exec* call */
    jb_lit(b, "{\"graph\":"); jb_ptr(b, (uint64_t)(uintptr_t)(c->exec ? (void *)c->exec : (void *)c->graph));
    jb_lit(b, ",\"capture_id\":0}");
    jb_lit(b, ",\"node\":"); jb_ptr(b, (uint64_t)(uintptr_t)c->node);
  } else if (c->in_graph) {
    jb_lit(b, "{\"graph\":"); jb_ptr(b, (uint64_t)(uintptr_t)c->cap_graph);
    jb_lit(b, ",\"capture_id\":"); jb_u64(b, c->capid); jb_lit(b, "}");
  } else {
    jb_lit(b, "null");
  }
  if (bytes) { jb_lit(b, ",\"hex\":"); jb_hex(b, bytes, (size_t)c->size); }
}

/* ---- what the driver knows ---- */
/* v's memory type (CU_MEMORYTYPE_*; 0: not memory the driver knows, i.e. pageable host memory),
 * or -1 when the query failed (counted by the choke point). */
static int mem_type(uint64_t v) {
  unsigned int mt = 0;
  CUpointer_attribute a = CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
  void *data = &mt;
  /* the plural query answers "not a CUDA pointer" with zeros and success (as alloc.c relies on) */
  if (MC_CU(cuPointerGetAttributes, 1, &a, &data, (CUdeviceptr)v) != CUDA_SUCCESS) return -1;
  return (int)mt;
}
static int is_host(int mt) { return mt == 0 || mt == CU_MEMORYTYPE_HOST; }
static int is_device(int mt) { return mt == CU_MEMORYTYPE_DEVICE || mt == CU_MEMORYTYPE_UNIFIED; }

/* Whether c's stream is being captured into a graph (asked only while a capture is open). */
static void capture_of(mc_copy_t *c) {
  if (!c->async || atomic_load_explicit(&mc_capturing, memory_order_relaxed) <= 0) return;
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  CUgraph g = NULL;
  if (MC_CU_ANSWER(cuStreamGetCaptureInfo, c->stream, &st, &id, &g, NULL, NULL, NULL) == CUDA_SUCCESS &&
      st == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
    c->in_graph = 1; c->cap_graph = g; c->capid = (uint64_t)id;
  }
}

void mc_on_copy(mc_tl_t *t, const mc_cb_t *row, const CUpti_CallbackData *d) {
  mc_copy_t c;
  if (!mc_copy_parse(row, d->functionParams, &c)) return;
  int result = (int)mc_cb_result(d);
  if (c.is_node && result != CUDA_SUCCESS) return;   /* as kernel nodes: a failed definition defines nothing */
  int src_mt = -1;
  if (c.check) {   /* the generic calls: host -> device only, as the driver sees the two addresses */
    src_mt = mem_type(c.src);
    if (src_mt < 0 || !is_host(src_mt) || !is_device(mem_type(c.dst))) return;
  }
  capture_of(&c);
  const void *bytes = NULL;
  if (result == CUDA_SUCCESS && mc_knobs.copy_bytes && c.size <= mc_knobs.copy_bytes) {
    if (c.size == 0) {
      bytes = "";
    } else if (c.src) {
      if (src_mt < 0) src_mt = mem_type(c.src);   /* the typed calls: never read a device address */
      if (is_host(src_mt)) bytes = (const void *)(uintptr_t)c.src;
    }
  }
  mc_copy_stamp_t st = {.seq_before = (uint64_t)mc_next_seq(MC_F_LAUNCHES), .t_ns = mc_now_ns(),
                        .tid = mc_tl_tid(t), .dev = mc_tl_dev(t, d->context), .result = result};
  jb_t *b = jb_thread();
  if (!b) { atomic_fetch_add(&mc_cnt.copies_dropped, 1); return; }
  mc_copy_json(b, row->name, &c, &st, bytes);
  if (mc_write_record(MC_F_COPIES, b, 1) < 0) atomic_fetch_add(&mc_cnt.copies_dropped, 1);
  else atomic_fetch_add(&mc_cnt.copies, 1);
}
