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
#define CACHE_N MC_TL_CACHE_N /* the caches are the thread block's (mc.h mc_tl_t) */
#define NEG_N MC_TL_NEG_N
/* Words that process_vm_readv could not read (not mapped in this process). Host mappings made
 * outside CUDA are invisible to us, so an entry holds for HOST_NEG_NS only (and until the next
 * CUDA allocation or host registration): a word is re-tried at most every HOST_NEG_NS, not at
 * every launch. Torch's launch parameters repeat the same non-pointer words (IntDivider magics,
 * uninitialised padding) in every forward, and each try is one syscall. */
#define HOST_NEG_N MC_TL_HOST_NEG_N
#define HOST_NEG_NS 10000000ull

static inline unsigned word_slot(uint64_t v, unsigned n) {
  return (unsigned)((v * 0x9E3779B97F4A7C15ull) >> 40) % n;
}

/* The driver's answer for v: 1 device (or unified) memory, its range and BUFFER_ID in out; 0 not
 * device memory; -1 the query failed (counted by the choke point). */
static int ask_driver(uint64_t v, mc_alloc_t *out) {
  unsigned int mtype = 0;
  CUdeviceptr start = 0;
  size_t size = 0;
  unsigned long long id = 0;
  CUpointer_attribute attrs[4] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                  CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_BUFFER_ID};
  void *data[4] = {&mtype, &start, &size, &id};
  /* Unlike the singular query, this one answers "not a CUDA pointer" with zeros and success. */
  if (MC_CU(cuPointerGetAttributes, 4, attrs, data, (CUdeviceptr)v) != CUDA_SUCCESS) return -1;
  if ((mtype != CU_MEMORYTYPE_DEVICE && mtype != CU_MEMORYTYPE_UNIFIED) || size == 0) return 0;
  *out = (mc_alloc_t){.base = start, .size = size, .id = id};
  return 1;
}

int mc_device_alloc(uint64_t v, mc_alloc_t *out) {
  if (!PLAUSIBLE(v)) return 0;
  mc_tl_t *t = mc_tl_cur;
  if (!t) return ask_driver(v, out) == 1; /* no thread block: no cache */
  unsigned ep = atomic_load_explicit(&mc_free_epoch, memory_order_acquire) + 1; /* 0 = empty */
  for (int i = 0; i < CACHE_N; i++) {
    __typeof__(&t->cache[0]) c = &t->cache[i];
    if (c->epoch == ep && v - c->base < c->size) {
      out->base = c->base; out->size = c->size; out->id = c->id;
      return 1;
    }
  }
  unsigned aep = atomic_load_explicit(&mc_alloc_epoch, memory_order_acquire) + 1;
  unsigned slot = word_slot(v, NEG_N);
  if (t->neg[slot].epoch == aep && t->neg[slot].v == v) return 0;
  mc_alloc_t a;
  int r = ask_driver(v, &a);
  if (r < 0) return 0;
  if (r == 0) {
    t->neg[slot].v = v; t->neg[slot].epoch = aep;
    return 0;
  }
  __typeof__(&t->cache[0]) c = &t->cache[t->next++ % CACHE_N];
  c->base = a.base; c->size = a.size; c->id = a.id; c->epoch = ep;
  *out = a;
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
  mc_tl_t *t = mc_tl_cur;
  if (!t) return mc_host_read(v, buf, want); /* no thread block: no cache */
  __typeof__(&t->host_neg[0]) hn = &t->host_neg[word_slot(v, HOST_NEG_N)];
  unsigned aep = atomic_load_explicit(&mc_alloc_epoch, memory_order_acquire) + 1;
  if (hn->v == v && hn->epoch == aep) {
    if (*now == 0) *now = mc_now_ns();
    if (*now - hn->t_ns < HOST_NEG_NS) return 0;
  }
  int got = mc_host_read(v, buf, want);
  if (got <= 0) {
    if (*now == 0) *now = mc_now_ns();
    hn->v = v; hn->t_ns = *now; hn->epoch = aep;
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

/* ---- the allocation log (MINE_CAPTURE_ALLOC_LOG=1; docs/dump-format.md "Allocation log") ----
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
#define NO UINT64_MAX                                  /* "the API does not give this" */
/* How a field is read (vocab/capture_tables.py READS); out-pointers are valid at API exit only. */
#define READ_IN(p, f) ((uint64_t)(p)->f)
#define READ_PTR(p, f) ((uint64_t)(uintptr_t)(p)->f)
#define READ_OUT(p, f) ((p)->f ? (uint64_t)*(p)->f : NO)
#define READ_OUTV(p, f) ((p)->f ? (uint64_t)(uintptr_t)*(p)->f : NO)
#define READ_PITCH(p, f) ((p)->pPitch ? (uint64_t)*(p)->pPitch * (p)->Height : NO)
#define READ_DESC(p, f) ((p)->bufferDesc ? (uint64_t)(p)->bufferDesc->size : NO)
#define READ_NONE(p, f) NO

static void ev_set(mc_alloc_ev_t *e, const char *event, uint64_t base, uint64_t size, uint64_t handle, int device) {
  e->event = event;
  e->has = (base != NO ? MC_AE_BASE : 0u) | (size != NO ? MC_AE_SIZE : 0u) | (handle != NO ? MC_AE_HANDLE : 0u);
  e->base = base != NO ? base : 0;
  e->size = size != NO ? size : 0;
  e->handle = handle != NO ? handle : 0;
  e->device = device;
}

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

/* The event the call's parameters describe: one case per logged row of tables.h MC_ALLOC_LOG,
 * each reading its own *_params struct (pasted, never passed on: cuda.h defines some API names
 * as macros). */
static int ev_fields(CUpti_CallbackId cbid, const void *params, mc_alloc_ev_t *e) {
  switch (cbid) {
#define LOG_CASE(n, st, event, bm, bf, sm, sf, hm, hf, device)                                       \
  case CUPTI_DRIVER_TRACE_CBID_##n: {                                                                \
    const st##_params *p = params;                                                                   \
    ev_set(e, event, READ_##bm(p, bf), READ_##sm(p, sf), READ_##hm(p, hf), device);                  \
    return 1;                                                                                        \
  }
    MC_ALLOC_LOG(LOG_CASE)
#undef LOG_CASE
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
#undef NO

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

void mc_alloc_log_entry(CUpti_CallbackId cbid, uint32_t correlation_id) {
  int entry = 0;
  mc_tl_t *t = mc_tl_cur;   /* the thread block's pend */
  if (!mc_knobs.alloc_log || !t || !logged(cbid, &entry) || !entry) return;
  t->pend.order = atomic_fetch_add(&alloc_order, 1);
  t->pend.seq = (uint64_t)mc_next_seq(MC_F_LAUNCHES);
  t->pend.corr = correlation_id;
  t->pend.valid = 1;
}

void mc_alloc_log_exit(CUpti_CallbackId cbid, uint32_t correlation_id, const void *params, CUcontext ctx,
                       int result) {
  mc_alloc_ev_t e;
  if (!mc_knobs.alloc_log || !mc_alloc_ev_parse(cbid, params, &e)) return; /* no allocs.jsonl open */
  mc_alloc_stamp_t st = {0};
  mc_tl_t *t = mc_tl_cur;
  if (e.at_entry && t && t->pend.valid && t->pend.corr == correlation_id) {
    st.order = t->pend.order; st.seq_before = t->pend.seq;
  } else {
    st.order = atomic_fetch_add(&alloc_order, 1);
    st.seq_before = (uint64_t)mc_next_seq(MC_F_LAUNCHES);
  }
  if (t) t->pend.valid = 0;
  st.result = result;
  st.id = -1;
  mc_alloc_t a;
  if (result == CUDA_SUCCESS && e.device && (e.has & MC_AE_BASE) && e.base && ask_driver(e.base, &a) == 1) {
    if (a.id) st.id = (int64_t)a.id;
    if (!(e.has & MC_AE_SIZE) && a.base <= e.base && e.base - a.base < a.size) {
      e.size = a.size - (e.base - a.base);
      e.has |= MC_AE_SIZE;
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
