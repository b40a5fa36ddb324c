/* alloc.c: is this 8-byte word a pointer, and into what?
 *
 * A word passes a cheap plausibility filter (a canonical user-space address) before any call.
 * Device: one cuPointerGetAttributes call gives memory type, allocation range and the driver's
 * process-unique BUFFER_ID (a reused address gets a new id). Hits are kept in a small per-thread
 * cache that every free API (cuMemFree*, cuMemRelease, cuMemUnmap) invalidates through a global
 * epoch, so the launch path takes no lock. Words the driver said are not device memory are kept in a
 * second per-thread cache (keyed by the value) that every allocation or mapping API (cuMemAlloc*,
 * cuMemMap, cuIpcOpenMemHandle, cuMemPoolImportPointer, ...; dispatch.c) invalidates through a
 * second epoch: an integer that looks like an address costs one driver call per allocation epoch,
 * not one per launch. Both epochs are bumped at the API's exit, before the caller can hold the new
 * pointer, and each entry keeps the epoch read before its query, so a race only loses an entry.
 * Host: the pointee is copied with process_vm_readv on our own pid, which returns EFAULT instead
 * of faulting on unmapped memory; a word that was unreadable is not re-tried for 10 ms (below).
 * Not checked: whether a word that lands in an allocation really is a pointer (an integer can
 * alias one); analysis decides that across launches. */
#include "mc.h"

#include <pthread.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#define PLAUSIBLE(v) ((v) >= 0x10000ull && (v) < 0x800000000000ull)
#define CACHE_N 16

typedef struct { uint64_t base, size, id; unsigned epoch; } cache_ent_t;
static __thread cache_ent_t tl_cache[CACHE_N];
static __thread unsigned tl_next;
#define NEG_N 256
static __thread struct { uint64_t v; unsigned epoch; } tl_neg[NEG_N];
/* Words that process_vm_readv could not read (not mapped in this process). Host mappings made
 * outside CUDA are invisible to us, so an entry holds for HOST_NEG_NS only (and until the next
 * CUDA allocation or host registration): a word is re-tried at most every HOST_NEG_NS, not at
 * every launch. Torch's launch parameters repeat the same non-pointer words (IntDivider magics,
 * uninitialised padding) in every forward, and each try is one syscall. */
#define HOST_NEG_N 256
#define HOST_NEG_NS 10000000ull
static __thread struct { uint64_t v, t_ns; unsigned epoch; } tl_host_neg[HOST_NEG_N];

static inline unsigned word_slot(uint64_t v, unsigned n) {
  return (unsigned)((v * 0x9E3779B97F4A7C15ull) >> 40) % n;
}

int mc_device_alloc(uint64_t v, mc_alloc_t *out) {
  if (!PLAUSIBLE(v)) return 0;
  unsigned ep = atomic_load_explicit(&mc_free_epoch, memory_order_acquire) + 1; /* 0 = empty */
  for (int i = 0; i < CACHE_N; i++) {
    cache_ent_t *c = &tl_cache[i];
    if (c->epoch == ep && v - c->base < c->size) {
      out->base = c->base; out->size = c->size; out->id = c->id;
      return 1;
    }
  }
  unsigned aep = atomic_load_explicit(&mc_alloc_epoch, memory_order_acquire) + 1;
  unsigned slot = word_slot(v, NEG_N);
  if (tl_neg[slot].epoch == aep && tl_neg[slot].v == v) return 0;
  unsigned int mtype = 0;
  CUdeviceptr start = 0;
  size_t size = 0;
  unsigned long long id = 0;
  CUpointer_attribute attrs[4] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                  CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_BUFFER_ID};
  void *data[4] = {&mtype, &start, &size, &id};
  /* Unlike the singular query, this one answers "not a CUDA pointer" with zeros and success. */
  if (MC_CU(cuPointerGetAttributes, 4, attrs, data, (CUdeviceptr)v) != CUDA_SUCCESS) return 0;
  if ((mtype != CU_MEMORYTYPE_DEVICE && mtype != CU_MEMORYTYPE_UNIFIED) || size == 0) {
    tl_neg[slot].v = v; tl_neg[slot].epoch = aep;
    return 0;
  }
  cache_ent_t *c = &tl_cache[tl_next++ % CACHE_N];
  c->base = start; c->size = size; c->id = id; c->epoch = ep;
  out->base = start; out->size = size; out->id = id;
  return 1;
}

int mc_host_read(uint64_t v, void *dst, unsigned n) {
  if (!PLAUSIBLE(v) || n == 0) return 0;
  struct iovec local = {dst, n}, remote = {(void *)(uintptr_t)v, n};
  ssize_t r = process_vm_readv(mc_pid, &local, 1, &remote, 1, 0);
  if (r > 0) return (int)r;
  /* A read that crosses into an unmapped page fails whole: retry up to the page end. */
  size_t to_page = 4096 - (v & 4095);
  if (to_page >= n) return 0;
  local.iov_len = remote.iov_len = to_page;
  r = process_vm_readv(mc_pid, &local, 1, &remote, 1, 0);
  return r > 0 ? (int)r : 0;
}

/* The pointee of host word v into buf (MINE_CAPTURE_HOST_BYTES at most): bytes read, or 0 when v
 * is not readable; unreadable words are not re-tried for HOST_NEG_NS. */
static int host_try(uint64_t v, unsigned char buf[4096], uint64_t *now) {
  unsigned want = mc_knobs.host_bytes < 4096 ? mc_knobs.host_bytes : 4096;
  unsigned hs = word_slot(v, HOST_NEG_N);
  unsigned aep = atomic_load_explicit(&mc_alloc_epoch, memory_order_acquire) + 1;
  if (tl_host_neg[hs].v == v && tl_host_neg[hs].epoch == aep) {
    if (*now == 0) *now = mc_now_ns();
    if (*now - tl_host_neg[hs].t_ns < HOST_NEG_NS) return 0;
  }
  int got = mc_host_read(v, buf, want);
  if (got <= 0) {
    if (*now == 0) *now = mc_now_ns();
    tl_host_neg[hs].v = v; tl_host_neg[hs].t_ns = *now; tl_host_neg[hs].epoch = aep;
    return 0;
  }
  return got;
}

void mc_classify_words(jb_t *b, const unsigned char *p, size_t size) {
  int nptr = 0, nhost = 0, ntmap = 0;
  size_t words = size / 8;
  /* Device pointers first; remember which words were plausible but not device. */
  unsigned char maybe_host[512];
  size_t nmaybe = 0;
  for (size_t w = 0; w < words; w++) {
    uint64_t v;
    memcpy(&v, p + 8 * w, 8);
    if (!PLAUSIBLE(v)) continue;
    mc_alloc_t a;
    if (mc_device_alloc(v, &a)) {
      if (nptr++) jb_lit(b, ",{\"at\":"); else jb_lit(b, ",\"ptrs\":[{\"at\":");
      jb_u64(b, 8 * w);
      jb_lit(b, ",\"base\":"); jb_ptr(b, a.base);
      jb_lit(b, ",\"size\":"); jb_u64(b, a.size);
      jb_lit(b, ",\"id\":"); jb_u64(b, a.id);
      jb_lit(b, ",\"off\":"); jb_u64(b, v - a.base);
      jb_lit(b, "}");
    } else if (nmaybe < sizeof maybe_host) {
      maybe_host[nmaybe++] = (unsigned char)(w < 255 ? w : 255);
    }
  }
  if (nptr) jb_lit(b, "]");
  uint64_t now = 0;
  for (size_t k = 0; k < nmaybe && maybe_host[k] < 255; k++) {
    size_t w = maybe_host[k];
    uint64_t v;
    memcpy(&v, p + 8 * w, 8);
    unsigned char buf[4096];
    int got = host_try(v, buf, &now);
    if (got <= 0) continue;
    if (nhost++) jb_lit(b, ",{\"at\":"); else jb_lit(b, ",\"host\":[{\"at\":");
    jb_u64(b, 8 * w);
    jb_lit(b, ",\"addr\":"); jb_ptr(b, v);
    jb_lit(b, ",\"hex\":"); jb_hex(b, buf, (size_t)got);
    jb_lit(b, "}");
  }
  if (nhost) jb_lit(b, "]");
  if (size >= 128) {
    for (size_t at = 0; at + 128 <= size; at += 64) {
      int64_t s = mc_tmap_find(p + at);
      if (s < 0) continue;
      if (ntmap++) jb_lit(b, ",{\"at\":"); else jb_lit(b, ",\"tmap\":[{\"at\":");
      jb_u64(b, at);
      jb_lit(b, ",\"encode\":"); jb_u64(b, (uint64_t)s);
      jb_lit(b, "}");
    }
    if (ntmap) jb_lit(b, "]");
  }
}

/* ---- host pointees in the binary form (docs/dump-format.md "Binary launch records") ----
 * Why learnt per function: without per-launch device classification every plausible word would
 * cost a process_vm_readv; a function's host-pointer words (cuBLASLt's alpha/beta) are the same
 * parameter words launch after launch. The first MC_HOST_LEARN launches of a function check every
 * plausible word that is not device memory; words that held a readable host pointer are kept (at
 * most MC_HOST_WORDS, under learn_lock: rare) and are the only words read afterwards. */
static pthread_mutex_t learn_lock = PTHREAD_MUTEX_INITIALIZER;

static void learn_word(const mc_entry_t *ce, uint32_t at) {
  mc_entry_t *e = (mc_entry_t *)ce; /* only host_at/host_n are written, under learn_lock */
  MC_LOCK(&learn_lock);
  unsigned n = atomic_load_explicit(&e->host_n, memory_order_relaxed), k = 0;
  while (k < n && e->host_at[k] != at) k++;
  if (k == n && n < MC_HOST_WORDS) {
    e->host_at[n] = at;
    atomic_store_explicit(&e->host_n, n + 1, memory_order_release);
  }
  MC_UNLOCK(&learn_lock);
}

static int host_section(jb_t *b, uint32_t at, uint64_t v, uint64_t *now) {
  unsigned char buf[4096];
  int got = host_try(v, buf, now);
  if (got <= 0) return 0;
  size_t pad = ((size_t)got + 7) & ~(size_t)7;
  if (jb_need(b, 16 + pad)) return 0;
  unsigned char *o = (unsigned char *)b->p + b->n;
  uint32_t n = (uint32_t)got;
  memcpy(o, &at, 4); memcpy(o + 4, &n, 4); memcpy(o + 8, &v, 8);
  memcpy(o + 16, buf, (size_t)got);
  memset(o + 16 + got, 0, pad - (size_t)got);
  b->n += 16 + pad;
  return 1;
}

unsigned mc_host_sections(jb_t *b, const mc_entry_t *ce, const unsigned char *blob, size_t n) {
  mc_entry_t *e = (mc_entry_t *)ce;
  unsigned made = 0;
  uint64_t now = 0;
  if (atomic_load_explicit(&e->host_seen, memory_order_relaxed) < MC_HOST_LEARN) {
    atomic_fetch_add_explicit(&e->host_seen, 1, memory_order_relaxed);
    for (size_t at = 0; at + 8 <= n && made < MC_HOST_WORDS; at += 8) {
      uint64_t v;
      memcpy(&v, blob + at, 8);
      mc_alloc_t a;
      if (!PLAUSIBLE(v) || mc_device_alloc(v, &a)) continue;
      if (host_section(b, (uint32_t)at, v, &now)) { made++; learn_word(e, (uint32_t)at); }
    }
    return made;
  }
  unsigned k = atomic_load_explicit(&e->host_n, memory_order_acquire);
  for (unsigned i = 0; i < k; i++) {
    uint32_t at = e->host_at[i];
    uint64_t v;
    if ((size_t)at + 8 > n) continue;
    memcpy(&v, blob + at, 8);
    if (PLAUSIBLE(v)) made += (unsigned)host_section(b, at, v, &now);
  }
  return made;
}

/* ---- the allocation log (MINE_CAPTURE_ALLOC_LOG=1; docs/dump-format.md "allocs.jsonl") ----
 * Every allocation, free and mapping API the library hears of becomes one allocs.jsonl record,
 * so mining can classify parameter words offline (mining/allocs.py) and a capture can run with
 * MINE_CAPTURE_CLASSIFY=0 (no driver call per launch). Each event carries `seq_before`, the
 * launches.jsonl seq the next recorded launch gets, and `order`, a process-wide ticket: a launch
 * with seq s sees the events with seq_before <= s, applied in (seq_before, order) order.
 * Allocations and mappings are stamped at the API's exit (the address exists from then on);
 * frees and unmaps at its entry, before the driver can hand the address to another thread, so a
 * reuse of the address is always ordered after the free that made it possible. The record is
 * written at exit either way, with the API's CUresult (a failed call is logged, readers skip it).
 * Device allocations and mappings ask the driver once (cuPointerGetAttributes, as the per-launch
 * classification does) for the BUFFER_ID, and for the size when the API does not give one. */
#define EV(ev, b, sz, h, dv)                                                                 \
  do {                                                                                       \
    e->event = ev; e->base = (b); e->size = (sz); e->handle = (h);                           \
    e->has = 0u | ((b) != NO ? MC_AE_BASE : 0) | ((sz) != NO ? MC_AE_SIZE : 0) |            \
             ((h) != NO ? MC_AE_HANDLE : 0);                                                 \
    e->device = dv;                                                                          \
    if (e->base == NO) e->base = 0;                                                          \
    if (e->size == NO) e->size = 0;                                                          \
    if (e->handle == NO) e->handle = 0;                                                      \
  } while (0)
#define NO UINT64_MAX                                 /* "the API does not give this" */
#define OUTP(pp) ((pp) ? (uint64_t)*(pp) : NO)        /* an out-pointer, read at exit */
#define OUTV(pp) ((pp) ? (uint64_t)(uintptr_t)*(pp) : NO)

/* The logged rows of the callback table (tables.h): the API's name and whether it is stamped at
 * its entry; NULL when the log does not take the call. */
static const char *logged(CUpti_CallbackId cbid, int *at_entry) {
  switch (cbid) {
#define LOGGED_ROW(n, kind, enable, api, v1, ptsz, logged_, at_entry_) \
  case CUPTI_DRIVER_TRACE_CBID_##n: *at_entry = at_entry_; return logged_ ? #n : NULL;
    MC_CALLBACKS(LOGGED_ROW)
#undef LOGGED_ROW
  default: return NULL;
  }
}

/* The event the call's parameters describe (what each API gives: base, size, handle). */
static int ev_fields(CUpti_CallbackId cbid, const void *params, mc_alloc_ev_t *e) {
  switch (cbid) {
  case CUPTI_DRIVER_TRACE_CBID_cuMemAlloc: {
    const cuMemAlloc_params *p = params;
    EV("alloc", OUTP(p->dptr), p->bytesize, NO, 1); return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2: {
    const cuMemAlloc_v2_params *p = params;
    EV("alloc", OUTP(p->dptr), p->bytesize, NO, 1); return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuMemAllocPitch: {
    const cuMemAllocPitch_params *p = params;
    EV("alloc", OUTP(p->dptr), p->pPitch ? (uint64_t)*p->pPitch * p->Height : NO, NO, 1);
    return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuMemAllocPitch_v2: {
    const cuMemAllocPitch_v2_params *p = params;
    EV("alloc", OUTP(p->dptr), p->pPitch ? (uint64_t)*p->pPitch * p->Height : NO, NO, 1);
    return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync: case CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync_ptsz: {
    const cuMemAllocAsync_params *p = params; /* the _ptsz struct has the same fields */
    EV("alloc", OUTP(p->dptr), p->bytesize, NO, 1);
    return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync:
  case CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync_ptsz: {
    const cuMemAllocFromPoolAsync_params *p = params;
    EV("alloc", OUTP(p->dptr), p->bytesize, (uint64_t)(uintptr_t)p->pool, 1);
    return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuMemAllocManaged: {
    const cuMemAllocManaged_params *p = params;
    EV("alloc", OUTP(p->dptr), p->bytesize, NO, 1); return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuMemFree: {
    const cuMemFree_params *p = params;
    EV("free", (uint64_t)p->dptr, NO, NO, 0); return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2: {
    const cuMemFree_v2_params *p = params;
    EV("free", (uint64_t)p->dptr, NO, NO, 0); return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync: case CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync_ptsz: {
    const cuMemFreeAsync_params *p = params;
    EV("free", (uint64_t)p->dptr, NO, NO, 0);
    return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuMemCreate: {
    const cuMemCreate_params *p = params;
    EV("create", NO, p->size, OUTP(p->handle), 0); return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuMemRelease: {
    const cuMemRelease_params *p = params;
    EV("release", NO, NO, (uint64_t)p->handle, 0); return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuMemAddressReserve: {
    const cuMemAddressReserve_params *p = params;
    EV("reserve", OUTP(p->ptr), p->size, NO, 0); return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuMemAddressFree: {
    const cuMemAddressFree_params *p = params;
    EV("unreserve", (uint64_t)p->ptr, p->size, NO, 0); return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuMemMap: {
    const cuMemMap_params *p = params;
    EV("map", (uint64_t)p->ptr, p->size, (uint64_t)p->handle, 1); return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuMemUnmap: {
    const cuMemUnmap_params *p = params;
    EV("unmap", (uint64_t)p->ptr, p->size, NO, 0); return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuMemSetAccess: {
    const cuMemSetAccess_params *p = params;
    EV("access", (uint64_t)p->ptr, p->size, NO, 0); return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuIpcOpenMemHandle: case CUPTI_DRIVER_TRACE_CBID_cuIpcOpenMemHandle_v2: {
    const cuIpcOpenMemHandle_v2_params *p = params;
    EV("ipc_open", OUTP(p->pdptr), NO, NO, 1);
    return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuIpcCloseMemHandle: {
    const cuIpcCloseMemHandle_params *p = params;
    EV("ipc_close", (uint64_t)p->dptr, NO, NO, 0); return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuMemPoolImportPointer: {
    const cuMemPoolImportPointer_params *p = params;
    EV("import", OUTP(p->ptr_out), NO, (uint64_t)(uintptr_t)p->pool, 1); return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuExternalMemoryGetMappedBuffer: {
    const cuExternalMemoryGetMappedBuffer_params *p = params;
    EV("ext_map", OUTP(p->devPtr), p->bufferDesc ? p->bufferDesc->size : NO, (uint64_t)(uintptr_t)p->extMem, 1);
    return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuGraphicsResourceGetMappedPointer: {
    const cuGraphicsResourceGetMappedPointer_params *p = params;
    EV("gfx_map", OUTP(p->pDevPtr), OUTP(p->pSize), (uint64_t)(uintptr_t)p->resource, 1);
    return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuGraphicsResourceGetMappedPointer_v2: {
    const cuGraphicsResourceGetMappedPointer_v2_params *p = params;
    EV("gfx_map", OUTP(p->pDevPtr), OUTP(p->pSize), (uint64_t)(uintptr_t)p->resource, 1);
    return 1;
  }
  /* Pinned host memory: logged for completeness; it is host memory (mining leaves it alone). */
  case CUPTI_DRIVER_TRACE_CBID_cuMemHostAlloc: case CUPTI_DRIVER_TRACE_CBID_cuMemHostAlloc_v2: {
    const cuMemHostAlloc_params *p = params; /* no _v2 struct in the header: same signature */
    EV("host_alloc", OUTV(p->pp), p->bytesize, NO, 0);
    return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost: {
    const cuMemAllocHost_params *p = params;
    EV("host_alloc", OUTV(p->pp), p->bytesize, NO, 0); return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost_v2: {
    const cuMemAllocHost_v2_params *p = params;
    EV("host_alloc", OUTV(p->pp), p->bytesize, NO, 0); return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuMemHostRegister: case CUPTI_DRIVER_TRACE_CBID_cuMemHostRegister_v2: {
    const cuMemHostRegister_v2_params *p = params;
    EV("host_register", (uint64_t)(uintptr_t)p->p, p->bytesize, NO, 0);
    return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuMemFreeHost: {
    const cuMemFreeHost_params *p = params;
    EV("host_free", (uint64_t)(uintptr_t)p->p, NO, NO, 0); return 1;
  }
  case CUPTI_DRIVER_TRACE_CBID_cuMemHostUnregister: {
    const cuMemHostUnregister_params *p = params;
    EV("host_unregister", (uint64_t)(uintptr_t)p->p, NO, NO, 0); return 1;
  }
  default:
    return 0;
  }
}

int mc_alloc_ev_parse(CUpti_CallbackId cbid, const void *params, mc_alloc_ev_t *e) {
  memset(e, 0, sizeof *e);
  int entry = 0;
  const char *api = logged(cbid, &entry);
  if (!params || !api || !ev_fields(cbid, params, e)) return 0;
  e->api = api;
  e->at_entry = entry;
  return 1;
}
#undef EV
#undef NO
#undef OUTP
#undef OUTV

void mc_alloc_ev_json(jb_t *b, const mc_alloc_ev_t *e, const mc_alloc_stamp_t *st) {
  jb_lit(b, "\"seq_before\":"); jb_u64(b, st->seq_before);
  jb_lit(b, ",\"order\":"); jb_u64(b, st->order);
  jb_lit(b, ",\"t_ns\":"); jb_u64(b, st->t_ns);
  jb_lit(b, ",\"tid\":"); jb_i64(b, st->tid);
  jb_lit(b, ",\"dev\":"); jb_i64(b, st->dev);
  jb_lit(b, ",\"event\":"); jb_str(b, e->event);
  jb_lit(b, ",\"api\":"); jb_str(b, e->api);
  jb_lit(b, ",\"base\":"); if (e->has & MC_AE_BASE) jb_ptr(b, e->base); else jb_lit(b, "null");
  jb_lit(b, ",\"size\":"); if (e->has & MC_AE_SIZE) jb_u64(b, e->size); else jb_lit(b, "null");
  if (e->has & MC_AE_HANDLE) { jb_lit(b, ",\"handle\":"); jb_ptr(b, e->handle); }
  jb_lit(b, ",\"id\":"); if (st->id >= 0) jb_i64(b, st->id); else jb_lit(b, "null");
  jb_lit(b, ",\"result\":"); jb_i64(b, st->result);
}

/* A free's stamp, taken at entry and used at exit (the same thread, matched by CUPTI's
 * correlation id; these APIs do not nest). */
static atomic_ullong alloc_order;
static __thread struct { uint32_t corr; int valid; uint64_t order, seq; } tl_pend;

void mc_alloc_log_entry(CUpti_CallbackId cbid, uint32_t correlation_id) {
  int entry = 0;
  if (!mc_knobs.alloc_log || !logged(cbid, &entry) || !entry) return;
  tl_pend.order = atomic_fetch_add(&alloc_order, 1);
  tl_pend.seq = (uint64_t)mc_next_seq(MC_F_LAUNCHES);
  tl_pend.corr = correlation_id;
  tl_pend.valid = 1;
}

void mc_alloc_log_exit(CUpti_CallbackId cbid, uint32_t correlation_id, const void *params, CUcontext ctx,
                       int result) {
  mc_alloc_ev_t e;
  if (!mc_knobs.alloc_log || !mc_alloc_ev_parse(cbid, params, &e)) return; /* no allocs.jsonl open */
  mc_alloc_stamp_t st = {0};
  if (e.at_entry && tl_pend.valid && tl_pend.corr == correlation_id) {
    st.order = tl_pend.order; st.seq_before = tl_pend.seq;
  } else {
    st.order = atomic_fetch_add(&alloc_order, 1);
    st.seq_before = (uint64_t)mc_next_seq(MC_F_LAUNCHES);
  }
  tl_pend.valid = 0;
  st.result = result;
  st.id = -1;
  if (result == CUDA_SUCCESS && e.device && (e.has & MC_AE_BASE) && e.base) {
    unsigned int mtype = 0;
    CUdeviceptr start = 0;
    size_t size = 0;
    unsigned long long id = 0;
    CUpointer_attribute attrs[4] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                    CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_BUFFER_ID};
    void *data[4] = {&mtype, &start, &size, &id};
    if (MC_CU(cuPointerGetAttributes, 4, attrs, data, (CUdeviceptr)e.base) == CUDA_SUCCESS &&
        (mtype == CU_MEMORYTYPE_DEVICE || mtype == CU_MEMORYTYPE_UNIFIED) && size) {
      if (id) st.id = (int64_t)id;
      if (!(e.has & MC_AE_SIZE) && start <= e.base && e.base - start < size) {
        e.size = size - (e.base - start);
        e.has |= MC_AE_SIZE;
      }
    }
  }
  st.t_ns = mc_now_ns();
  st.tid = mc_tid();
  st.dev = ctx ? mc_ctx_device(ctx) : -1;
  jb_t *b = jb_thread();
  if (!b) { atomic_fetch_add(&mc_cnt.alloc_dropped, 1); return; }
  mc_alloc_ev_json(b, &e, &st);
  if (mc_write_record(MC_F_ALLOCS, b, 0) < 0) atomic_fetch_add(&mc_cnt.alloc_dropped, 1);
  else atomic_fetch_add(&mc_cnt.alloc_events, 1);
}
