/* alloc.c: is this 8-byte word a pointer, and into what?
 *
 * A word passes a cheap plausibility filter (a canonical user-space address) before any call.
 * Device: one cuPointerGetAttributes call gives memory type, allocation range and the driver's
 * process-unique BUFFER_ID (a reused address gets a new id). Hits are kept in a small per-thread
 * cache that every free API (cuMemFree*, cuMemRelease, cuMemUnmap) invalidates through a global
 * epoch, so the launch path takes no lock. Words the driver said are not device memory are kept in a
 * second per-thread cache (keyed by the value) that every allocation or mapping API (cuMemAlloc*,
 * cuMemMap, cuIpcOpenMemHandle, cuMemPoolImportPointer, ...; callbacks.c) invalidates through a
 * second epoch: an integer that looks like an address costs one driver call per allocation epoch,
 * not one per launch. Both epochs are bumped at the API's exit, before the caller can hold the new
 * pointer, and each entry keeps the epoch read before its query, so a race only loses an entry.
 * Host: the pointee is copied with process_vm_readv on our own pid, which returns EFAULT instead
 * of faulting on unmapped memory; a word that was unreadable is not re-tried for 10 ms (below).
 * Not checked: whether a word that lands in an allocation really is a pointer (an integer can
 * alias one); analysis decides that across launches. */
#include "mc.h"

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
    unsigned want = mc_knobs.host_bytes < sizeof buf ? mc_knobs.host_bytes : sizeof buf;
    unsigned hs = word_slot(v, HOST_NEG_N);
    unsigned aep = atomic_load_explicit(&mc_alloc_epoch, memory_order_acquire) + 1;
    if (tl_host_neg[hs].v == v && tl_host_neg[hs].epoch == aep) {
      if (now == 0) now = mc_now_ns();
      if (now - tl_host_neg[hs].t_ns < HOST_NEG_NS) continue;
    }
    int got = mc_host_read(v, buf, want);
    if (got <= 0) {
      if (now == 0) now = mc_now_ns();
      tl_host_neg[hs].v = v; tl_host_neg[hs].t_ns = now; tl_host_neg[hs].epoch = aep;
      continue;
    }
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
