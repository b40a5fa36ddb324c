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

/* A memset of n elements of elem bytes each: its range is n * elem bytes (a count so large that
 * the product overflows is no memset the driver accepts: not recorded). */
static int set_memset(mc_copy_t *c, CUdeviceptr dst, unsigned value, int elem, size_t n) {
  if ((uint64_t)n > UINT64_MAX / (uint64_t)elem) return 0;
  set_1d(c, (uint64_t)dst, 0, (uint64_t)n * (uint64_t)elem);
  c->op = MC_OP_MEMSET; c->value = value; c->elem = elem;
  return 1;
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
  case MC_K_COPY_DTOD: {
    const cuMemcpyDtoD_v2_params *p = params;
    set_1d(c, (uint64_t)p->dstDevice, (uint64_t)p->srcDevice, p->ByteCount);
    c->op = MC_OP_DTOD;
    return 1;
  }
  case MC_K_COPY_DTOD_ASYNC: {
    const cuMemcpyDtoDAsync_v2_params *p = params;
    set_1d(c, (uint64_t)p->dstDevice, (uint64_t)p->srcDevice, p->ByteCount);
    c->stream = mc_cb_stream(row, p->hStream); c->async = 1; c->op = MC_OP_DTOD;
    return 1;
  }
  case MC_K_MEMSET_D8: { const cuMemsetD8_v2_params *p = params; return set_memset(c, p->dstDevice, p->uc, 1, p->N); }
  case MC_K_MEMSET_D16: { const cuMemsetD16_v2_params *p = params; return set_memset(c, p->dstDevice, p->us, 2, p->N); }
  case MC_K_MEMSET_D32: { const cuMemsetD32_v2_params *p = params; return set_memset(c, p->dstDevice, p->ui, 4, p->N); }
  case MC_K_MEMSET_D8_ASYNC: {
    const cuMemsetD8Async_params *p = params;
    c->stream = mc_cb_stream(row, p->hStream); c->async = 1;
    return set_memset(c, p->dstDevice, p->uc, 1, p->N);
  }
  case MC_K_MEMSET_D16_ASYNC: {
    const cuMemsetD16Async_params *p = params;
    c->stream = mc_cb_stream(row, p->hStream); c->async = 1;
    return set_memset(c, p->dstDevice, p->us, 2, p->N);
  }
  case MC_K_MEMSET_D32_ASYNC: {
    const cuMemsetD32Async_params *p = params;
    c->stream = mc_cb_stream(row, p->hStream); c->async = 1;
    return set_memset(c, p->dstDevice, p->ui, 4, p->N);
  }
  default:
    return 0;
  }
}

/* ---- the record ----
 * Built straight into the thread's buffer: its length is bounded before the first byte (one
 * jb_need), so each field is a few stores, not a call that checks room and copies (through the
 * jb_* helpers the formatting was ~3,000 of a copy's ~4,000 instructions). The bytes are the same
 * the helpers write (writer.c: decimal integers, "0x" + lowercase hex without leading zeros). */
static const char hx[] = "0123456789abcdef";
#define PUT(o, s) (memcpy((o), ("" s), sizeof(s) - 1), (o) + sizeof(s) - 1)   /* literals only */
static char *put_u64(char *o, uint64_t v) {
  char t[20];
  int n = 0;
  do { t[n++] = (char)('0' + v % 10); v /= 10; } while (v);
  while (n) *o++ = t[--n];
  return o;
}
static char *put_i64(char *o, int64_t v) {
  if (v >= 0) return put_u64(o, (uint64_t)v);
  *o++ = '-';
  return put_u64(o, (uint64_t)(-(v + 1)) + 1);
}
static char *put_ptr(char *o, uint64_t v) {
  int n = v ? (67 - __builtin_clzll(v)) / 4 : 1;   /* hex digits without leading zeros */
  *o++ = '"'; *o++ = '0'; *o++ = 'x';
  for (int i = n - 1; i >= 0; i--) o[i] = hx[v & 15], v >>= 4;
  o[n] = '"';
  return o + n + 1;
}
/* two hex digits per byte value: one 2-byte store per byte (the bytes dominate a large copy's cost) */
static const char hex_pairs[513] =
    "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f"
    "303132333435363738393a3b3c3d3e3f404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f"
    "606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f808182838485868788898a8b8c8d8e8f"
    "909192939495969798999a9b9c9d9e9fa0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebf"
    "c0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedfe0e1e2e3e4e5e6e7e8e9eaebecedeeef"
    "f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff";
static char *put_hex(char *restrict o, const unsigned char *restrict s, size_t n) {
  for (size_t i = 0; i < n; i++) memcpy(o + 2 * i, hex_pairs + 2 * s[i], 2);
  return o + 2 * n;
}
#define COPY_FIXED 560   /* every key and the largest value of each, the api name and bytes aside */

void mc_copy_json(jb_t *b, const char *api, const mc_copy_t *c, const mc_copy_stamp_t *st, const void *bytes) {
  size_t napi = strlen(api);   /* a C identifier (tables.h): nothing to escape */
  if (jb_need(b, COPY_FIXED + napi + (bytes ? 2 * (size_t)c->size + 10 : 0))) return;
  char *o = b->p + b->n;
  o = PUT(o, "\"seq_before\":"); o = put_u64(o, st->seq_before);
  o = PUT(o, ",\"t_ns\":"); o = put_u64(o, st->t_ns);
  o = PUT(o, ",\"tid\":"); o = put_i64(o, st->tid);
  o = PUT(o, ",\"dev\":"); o = put_i64(o, st->dev);
  o = PUT(o, ",\"api\":\""); memcpy(o, api, napi); o += napi;
  o = PUT(o, "\",\"stream\":"); o = put_ptr(o, (uint64_t)(uintptr_t)c->stream);
  o = PUT(o, ",\"async\":"); *o++ = c->async ? '1' : '0';
  o = PUT(o, ",\"dst\":"); o = put_ptr(o, c->dst);
  o = PUT(o, ",\"src\":"); o = put_ptr(o, c->src);
  o = PUT(o, ",\"size\":"); o = put_u64(o, c->size);
  if (c->op == MC_OP_DTOD) o = PUT(o, ",\"op\":\"dtod\"");
  else if (c->op == MC_OP_MEMSET) {
    o = PUT(o, ",\"op\":\"memset\",\"value\":"); o = put_u64(o, c->value);
    o = PUT(o, ",\"elem\":"); o = put_u64(o, (uint64_t)c->elem);
  } else o = PUT(o, ",\"op\":\"htod\"");
  o = PUT(o, ",\"result\":"); o = put_i64(o, st->result);
  o = PUT(o, ",\"graph\":");
  if (c->is_node) {   /* as a kernel node's launch record: the graph, or the exec for the Exec* call */
    o = PUT(o, "{\"graph\":"); o = put_ptr(o, (uint64_t)(uintptr_t)(c->exec ? (void *)c->exec : (void *)c->graph));
    o = PUT(o, ",\"capture_id\":0},\"node\":"); o = put_ptr(o, (uint64_t)(uintptr_t)c->node);
  } else if (c->in_graph) {
    o = PUT(o, "{\"graph\":"); o = put_ptr(o, (uint64_t)(uintptr_t)c->cap_graph);
    o = PUT(o, ",\"capture_id\":"); o = put_u64(o, c->capid); *o++ = '}';
  } else {
    o = PUT(o, "null");
  }
  if (bytes) {
    o = PUT(o, ",\"hex\":\"");
    o = put_hex(o, bytes, (size_t)c->size);
    *o++ = '"';
  }
  b->n = (size_t)(o - b->p);
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
  if (c->async && mc_stream_capture(c->stream, &c->cap_graph, &c->capid)) c->in_graph = 1;
}

void mc_on_copy(mc_tl_t *t, const mc_cb_t *row, const CUpti_CallbackData *d) {
  mc_copy_t c;
  if (!mc_knobs.copy_log || !mc_copy_parse(row, d->functionParams, &c)) return; /* no copies.jsonl open */
  int result = (int)mc_cb_result(d);
  if (c.is_node && result != CUDA_SUCCESS) return;   /* as kernel nodes: a failed definition defines nothing */
  int src_mt = -1;
  if (c.check) {   /* the generic calls: host or device -> device, as the driver sees the two addresses */
    src_mt = mem_type(c.src);
    if (src_mt < 0 || !is_device(mem_type(c.dst))) return;
    if (is_device(src_mt) && !c.is_node) c.op = MC_OP_DTOD;
    else if (!is_host(src_mt)) return;
  }
  capture_of(&c);
  const void *bytes = NULL;
  if (c.op == MC_OP_HTOD && result == CUDA_SUCCESS && mc_knobs.copy_bytes && c.size <= mc_knobs.copy_bytes) {
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
