/* tmap.c: tensor maps: each cuTensorMapEncode* call's record, and the ring the launch path
 * searches for a parameter window equal to a recorded map.
 *
 * The ring is seqlock-guarded and read without a lock. It is found through a hash index
 * (TMAP_SETS sets of TMAP_WAYS ring slots, keyed by a hash of the 128 bytes): a launch looks at
 * every 64-byte-aligned 128-byte window of its parameters, and cuBLASLt encodes maps at every
 * GEMM call, so a scan of the whole ring at each window grew with the run. An index entry may
 * name a slot that was overwritten since: the bytes are compared under the slot's seqlock, so a
 * stale entry only misses. */
#include "mc.h"

#include <pthread.h>
#include <string.h>

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

/* ---- the encode record ---- */
typedef struct {
  const void *map; int dtype; unsigned rank; void *global;
  const cuuint64_t *dims, *strides; const cuuint32_t *box, *es; /* box: tiled only */
  int inter, swz, l2, oob;
} encode_t;

/* The three encode calls' parameters share their names; im2col ones have no box. */
#define ENCODE_FIELDS(p, out, with_box)                                                        \
  (out) = (encode_t){.map = (p)->tensorMap, .dtype = (p)->tensorDataType, .rank = (p)->tensorRank, \
                     .global = (p)->globalAddress, .dims = (p)->globalDim, .strides = (p)->globalStrides, \
                     .box = with_box, .es = (p)->elementStrides, .inter = (p)->interleave,       \
                     .swz = (p)->swizzle, .l2 = (p)->l2Promotion, .oob = (p)->oobFill}

static void encode_of(const mc_cb_t *row, const void *params, encode_t *e) {
  if (row->kind == MC_K_TMAP_TILED) {
    const cuTensorMapEncodeTiled_params *p = params;
    ENCODE_FIELDS(p, *e, p->boxDim);
  } else if (row->kind == MC_K_TMAP_IM2COL) {
    const cuTensorMapEncodeIm2col_params *p = params;
    ENCODE_FIELDS(p, *e, NULL);
  } else {
    const cuTensorMapEncodeIm2colWide_params *p = params;
    ENCODE_FIELDS(p, *e, NULL);
  }
}

static void jb_u64_array(jb_t *b, const void *p, int n, int is64) {
  jb_lit(b, "[");
  for (int i = 0; i < n && p; i++) {
    if (i) jb_lit(b, ",");
    jb_u64(b, is64 ? ((const uint64_t *)p)[i] : ((const uint32_t *)p)[i]);
  }
  jb_lit(b, "]");
}

static void encode_json(jb_t *b, const char *api, const encode_t *e) {
  jb_lit(b, "\"t_ns\":"); jb_u64(b, mc_now_ns());
  jb_lit(b, ",\"tid\":"); jb_u64(b, (uint64_t)mc_tid());
  jb_lit(b, ",\"api\":"); jb_str(b, api);
  jb_lit(b, ",\"map\":"); jb_ptr(b, (uintptr_t)e->map);
  jb_lit(b, ",\"hex\":"); jb_hex(b, e->map, 128);
  jb_lit(b, ",\"dtype\":"); jb_i64(b, e->dtype);
  jb_lit(b, ",\"rank\":"); jb_u64(b, e->rank);
  jb_lit(b, ",\"global\":"); jb_ptr(b, (uintptr_t)e->global);
  jb_lit(b, ",\"dims\":"); jb_u64_array(b, e->dims, (int)e->rank, 1);
  jb_lit(b, ",\"strides\":"); jb_u64_array(b, e->strides, (int)e->rank - 1, 1);
  jb_lit(b, ",\"box\":"); jb_u64_array(b, e->box, e->box ? (int)e->rank : 0, 0);
  jb_lit(b, ",\"elem_strides\":"); jb_u64_array(b, e->es, (int)e->rank, 0);
  jb_lit(b, ",\"interleave\":"); jb_i64(b, e->inter);
  jb_lit(b, ",\"swizzle\":"); jb_i64(b, e->swz);
  jb_lit(b, ",\"l2\":"); jb_i64(b, e->l2);
  jb_lit(b, ",\"oob\":"); jb_i64(b, e->oob);
  mc_alloc_t a;
  jb_lit(b, ",\"ptr\":");
  if (mc_device_alloc((uintptr_t)e->global, &a)) {
    jb_lit(b, "{\"base\":"); jb_ptr(b, a.base);
    jb_lit(b, ",\"size\":"); jb_u64(b, a.size);
    jb_lit(b, ",\"id\":"); jb_u64(b, a.id);
    jb_lit(b, ",\"off\":"); jb_u64(b, (uintptr_t)e->global - a.base);
    jb_lit(b, "}");
  } else jb_lit(b, "null");
}

void mc_on_tensormap(const mc_cb_t *row, const CUpti_CallbackData *d) {
  if (mc_cb_result(d) != CUDA_SUCCESS || !d->functionParams) return;
  encode_t e;
  encode_of(row, d->functionParams, &e);
  if (!e.map || e.rank == 0 || e.rank > 5) return;
  jb_t *b = jb_thread();
  if (!b) return;
  encode_json(b, row->name, &e);
  int64_t seq = mc_write_record(MC_F_TENSORMAPS, b, 1);
  if (seq >= 0) tmap_remember(e.map, seq);
}

void mc_tmap_reset_after_fork(void) {
  pthread_mutex_init(&tmap_lock, NULL);
}
