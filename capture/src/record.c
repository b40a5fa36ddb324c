/* record.c: the launch record's JSON body, and the compact form's function records.
 *
 * mc_launch_json formats one launch from a plain description of it (mc_launch_t), so the same
 * code runs under CUPTI (launch.c) and in the CPU test harness. Default form: the function's
 * identity (the layout entry's precomputed fragment), the layout source and each parameter's
 * off/size are repeated in every record (docs/dump-format.md, launches.jsonl).
 *
 * Compact form (MINE_CAPTURE_COMPACT=1): each distinct function gets a small id and one record in
 * functions.jsonl (fragment, layout, params_layout); launches carry "fn": id and params of
 * {"i","hex"} only. Ordering contract: a launch names an id only after that id's function record
 * has been written in full (write(2) returned), so a reader that sees a launch -- even in a dump
 * cut short by a kill -- finds its function. How: the id is assigned and the function record
 * written under fn_lock; only then is the id entered in the registry and published on the layout
 * entry (release store). A thread either sees the published id (acquire; the write happened
 * before) or takes fn_lock and finds the registry entry (inserted after the write) or makes it.
 * Identity: the registry is keyed on the content of the entry (handle, context, fragment, layout),
 * not on the entry pointer, so the per-launch entries layout.c builds while a slot is being filled
 * (or when its table is full) share the id of the cached one: one function, one id.
 * Fork: ids belong to the parent's functions.jsonl; the child starts a new generation (every
 * published id is stale) with an empty registry. A function record that cannot be written
 * (max bytes, no memory, write error) publishes nothing: that launch is written in the default
 * form, which a reader accepts next to compact ones. */
#include "mc.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t fn_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_uint fn_gen = 1;        /* bumped in a forked child: published ids go stale */
static const mc_entry_t **fn_tab;     /* open addressing on content hash; under fn_lock */
static uint64_t *fn_hash;
static uint32_t *fn_ids;
static size_t fn_cap, fn_count;       /* fn_count: ids given out in this generation */

static uint64_t mix(uint64_t h, const void *p, size_t n) {
  const unsigned char *s = p;
  for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
  return h;
}

static uint64_t entry_hash(const mc_entry_t *e) {
  uint64_t h = 1469598103934665603ull;
  h = mix(h, &e->handle, sizeof e->handle);
  h = mix(h, &e->ctx, sizeof e->ctx);
  h = mix(h, e->frag, e->frag_n);
  h = mix(h, e->layout_src, strlen(e->layout_src));
  h = mix(h, &e->nparams, sizeof e->nparams);
  if (e->nparams > 0) {
    h = mix(h, e->off, (size_t)e->nparams * 4);
    h = mix(h, e->size, (size_t)e->nparams * 4);
  }
  return h | 1;
}

static int entry_same(const mc_entry_t *a, const mc_entry_t *b) {
  if (a == b) return 1;
  if (a->handle != b->handle || a->ctx != b->ctx || a->frag_n != b->frag_n || a->nparams != b->nparams ||
      strcmp(a->layout_src, b->layout_src) != 0 || memcmp(a->frag, b->frag, a->frag_n) != 0)
    return 0;
  return a->nparams <= 0 || (memcmp(a->off, b->off, (size_t)a->nparams * 4) == 0 &&
                             memcmp(a->size, b->size, (size_t)a->nparams * 4) == 0);
}

/* Under fn_lock. Index of e's slot (found or empty), or -1 when the table cannot grow. */
static long fn_slot(const mc_entry_t *e, uint64_t h, int *found) {
  if ((fn_count + 1) * 2 > fn_cap) {
    size_t cap = fn_cap ? fn_cap * 2 : 1024;
    const mc_entry_t **t = mc_calloc(cap, sizeof *t);
    uint64_t *hs = t ? mc_calloc(cap, sizeof *hs) : NULL;
    uint32_t *ids = hs ? mc_calloc(cap, sizeof *ids) : NULL;
    if (!t || !hs || !ids) { free(t); free(hs); free(ids); return -1; }
    for (size_t i = 0; i < fn_cap; i++) {
      if (!fn_tab[i]) continue;
      size_t j = fn_hash[i] & (cap - 1);
      while (t[j]) j = (j + 1) & (cap - 1);
      t[j] = fn_tab[i]; hs[j] = fn_hash[i]; ids[j] = fn_ids[i];
    }
    free(fn_tab); free(fn_hash); free(fn_ids);
    fn_tab = t; fn_hash = hs; fn_ids = ids; fn_cap = cap;
  }
  size_t j = h & (fn_cap - 1);
  while (fn_tab[j]) {
    if (fn_hash[j] == h && entry_same(fn_tab[j], e)) { *found = 1; return (long)j; }
    j = (j + 1) & (fn_cap - 1);
  }
  *found = 0;
  return (long)j;
}

void mc_fn_json(jb_t *b, const mc_entry_t *e, uint64_t id) {
  jb_lit(b, "\"fn\":"); jb_u64(b, id);
  jb_lit(b, ",\"ctx\":"); jb_ptr(b, (uintptr_t)e->ctx);
  jb_raw(b, e->frag, e->frag_n);
  jb_lit(b, ",\"layout\":"); jb_str(b, e->layout_src);
  jb_lit(b, ",\"params_layout\":[");
  for (int i = 0; i < e->nparams; i++) {
    if (i) jb_lit(b, ",");
    jb_lit(b, "["); jb_u64(b, (uint64_t)i);
    jb_lit(b, ","); jb_u64(b, e->off[i]);
    jb_lit(b, ","); jb_u64(b, e->size[i]);
    jb_lit(b, "]");
  }
  jb_lit(b, "]");
}

int64_t mc_fn_id(const mc_entry_t *e) {
  mc_entry_t *m = (mc_entry_t *)e; /* only fn_tag is written, atomically */
  uint64_t gen = atomic_load_explicit(&fn_gen, memory_order_acquire);
  uint64_t tag = atomic_load_explicit(&m->fn_tag, memory_order_acquire);
  if (tag && (tag >> 32) == gen) return (int64_t)(tag & 0xffffffffu) - 1;
  uint64_t h = entry_hash(e);
  int64_t id = -1;
  MC_LOCK(&fn_lock);
  gen = atomic_load_explicit(&fn_gen, memory_order_relaxed);
  int found = 0;
  long j = fn_slot(e, h, &found);
  if (j >= 0 && found) {
    id = fn_ids[j];
  } else if (j >= 0 && fn_count < 0xfffffffeu) {
    jb_t *b = jb_thread();
    if (b) {
      mc_fn_json(b, e, fn_count);
      if (mc_write_record(MC_F_FUNCTIONS, b, 0) >= 0) { /* written before anyone can see the id */
        id = (int64_t)fn_count++;
        fn_tab[j] = e; fn_hash[j] = h; fn_ids[j] = (uint32_t)id;
        atomic_fetch_add(&mc_cnt.functions, 1);
      }
    }
  }
  if (id >= 0) atomic_store_explicit(&m->fn_tag, (gen << 32) | (uint64_t)(id + 1), memory_order_release);
  MC_UNLOCK(&fn_lock);
  return id;
}

void mc_fn_reset_after_fork(void) {
  pthread_mutex_init(&fn_lock, NULL);
  if (fn_cap) memset(fn_tab, 0, fn_cap * sizeof *fn_tab);
  fn_count = 0;
  atomic_fetch_add(&fn_gen, 1);
}

/* ---- launch attributes (tables.h MC_LAUNCH_ATTRS; vocab/binfmt.py decodes the binary form's
 * raw attributes by the same table) ---- */
#define ATTR_ID_CHECK(n, id, key, shape, member) \
  _Static_assert(CU_LAUNCH_ATTRIBUTE_##n == id, "vocab/capture_tables.py: CU_LAUNCH_ATTRIBUTE_" #n " is not " #id);
MC_LAUNCH_ATTRS(ATTR_ID_CHECK)
#undef ATTR_ID_CHECK
#define ATTR_DIM3(b, m) \
  (jb_lit(b, "["), jb_u64(b, (m).x), jb_lit(b, ","), jb_u64(b, (m).y), jb_lit(b, ","), jb_u64(b, (m).z), jb_lit(b, "]"))
#define ATTR_I32(b, m) jb_i64(b, (m))
#define ATTR_U32(b, m) jb_u64(b, (m))
#define ATTR_PDL_EVENT(b, m)                                                                  \
  (jb_lit(b, "{\"event\":"), jb_ptr(b, (uintptr_t)(m).event), jb_lit(b, ",\"flags\":"), jb_i64(b, (m).flags), \
   jb_lit(b, ",\"trigger_at_block_start\":"), jb_i64(b, (m).triggerAtBlockStart), jb_lit(b, "}"))
#define ATTR_COMPLETION_EVENT(b, m) \
  (jb_lit(b, "{\"event\":"), jb_ptr(b, (uintptr_t)(m).event), jb_lit(b, ",\"flags\":"), jb_i64(b, (m).flags), jb_lit(b, "}"))
#define ATTR_DOMAIN_MAP(b, m) \
  (jb_lit(b, "["), jb_u64(b, (m).default_), jb_lit(b, ","), jb_u64(b, (m).remote), jb_lit(b, "]"))

static void launch_attr(jb_t *b, const CUlaunchAttribute *a) {
  const CUlaunchAttributeValue *v = &a->value;
  switch (a->id) {
#define ATTR_CASE(n, id, key, shape, member) \
  case CU_LAUNCH_ATTRIBUTE_##n: jb_lit(b, "\"" key "\":"); ATTR_##shape(b, v->member); break;
    MC_LAUNCH_ATTRS(ATTR_CASE)
#undef ATTR_CASE
  default: /* a newer attribute: its id and raw value, so nothing is lost */
    jb_lit(b, "\"attr_"); jb_u64(b, a->id); jb_lit(b, "\":"); jb_hex(b, v, sizeof *v);
    break;
  }
}

static void launch_attrs(jb_t *b, const CUlaunchConfig *cfg) {
  jb_lit(b, ",\"launch_attrs\":{");
  for (unsigned i = 0; cfg && cfg->attrs && i < cfg->numAttrs && i < 64; i++) {
    if (i) jb_lit(b, ",");
    launch_attr(b, &cfg->attrs[i]);
  }
  jb_lit(b, "}");
}

const char *const mc_api_names[MC_API_COUNT] = {
#define API_NAME(i, n) [i] = #n,
    MC_LAUNCH_APIS(API_NAME)
#undef API_NAME
};

static void launch_params(jb_t *b, const mc_launch_t *L, const mc_entry_t *e, int64_t fn);

void mc_launch_json(jb_t *b, const mc_launch_t *L, const mc_entry_t *e, int64_t fn) {
  jb_lit(b, "\"t_ns\":"); jb_u64(b, L->t_ns);
  jb_lit(b, ",\"tid\":"); jb_u64(b, (uint64_t)L->tid);
  jb_lit(b, ",\"dev\":"); jb_i64(b, L->dev);
  jb_lit(b, ",\"ctx\":"); jb_ptr(b, (uintptr_t)L->ctx);
  jb_lit(b, ",\"stream\":"); jb_ptr(b, (uintptr_t)L->stream);
  const char *api = L->api >= 0 && L->api < MC_API_COUNT ? mc_api_names[L->api] : "unknown";
  jb_lit(b, ",\"api\":\""); jb_raw(b, api, strlen(api));
  jb_lit(b, "\",\"result\":"); jb_i64(b, L->result);
  jb_lit(b, ",\"graph\":");
  if (L->in_graph) {
    jb_lit(b, "{\"graph\":"); jb_ptr(b, (uintptr_t)L->graph);
    jb_lit(b, ",\"capture_id\":"); jb_u64(b, L->capid); jb_lit(b, "}");
  } else jb_lit(b, "null");
  if (fn >= 0) { jb_lit(b, ",\"fn\":"); jb_u64(b, (uint64_t)fn); }
  else jb_raw(b, e->frag, e->frag_n);
  jb_lit(b, ",\"grid\":["); jb_u64(b, L->grid[0]); jb_lit(b, ","); jb_u64(b, L->grid[1]); jb_lit(b, ",");
  jb_u64(b, L->grid[2]);
  jb_lit(b, "],\"block\":["); jb_u64(b, L->block[0]); jb_lit(b, ","); jb_u64(b, L->block[1]); jb_lit(b, ",");
  jb_u64(b, L->block[2]);
  jb_lit(b, "],\"smem\":"); jb_u64(b, L->smem);
  launch_attrs(b, L->cfg);
  launch_params(b, L, e, fn);
}

/* packing, layout (default form), params and extra_hex: the parameter bytes of a launch record */
static void launch_params(jb_t *b, const mc_launch_t *L, const mc_entry_t *e, int64_t fn) {
  /* Packed `extra`: find the buffer and its size. */
  const unsigned char *xbuf = NULL;
  size_t xsize = 0;
  int packed = 0;
  void **extra = L->extra;
  if (!L->kp && extra) {
    packed = 1;
    for (int i = 0; i < 32 && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) xbuf = extra[i + 1];
      else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1]) xsize = *(const size_t *)extra[i + 1];
    }
    if (xsize > MC_PARAM_MAX) xsize = MC_PARAM_MAX;
    if (!xbuf) xsize = 0;
  }
  if (packed) jb_lit(b, ",\"packing\":\"extra\"");
  else jb_lit(b, ",\"packing\":\"params\"");
  if (fn < 0) { jb_lit(b, ",\"layout\":\""); jb_raw(b, e->layout_src, strlen(e->layout_src)); jb_lit(b, "\""); }
  jb_lit(b, ",\"params\":[");
  if (e->nparams < 0) atomic_fetch_add(&mc_cnt.no_layout, 1);
  for (int i = 0; i < e->nparams; i++) {
    const unsigned char *src = NULL;
    size_t sz = e->size[i];
    if (packed) { if (xbuf && (size_t)e->off[i] + sz <= xsize) src = xbuf + e->off[i]; }
    else if (L->kp) src = L->kp[i];
    if (i) jb_lit(b, ",");
    jb_lit(b, "{\"i\":"); jb_u64(b, (uint64_t)i);
    if (fn < 0) {
      jb_lit(b, ",\"off\":"); jb_u64(b, e->off[i]);
      jb_lit(b, ",\"size\":"); jb_u64(b, sz);
    }
    jb_lit(b, ",\"hex\":");
    if (src) { jb_hex(b, src, sz); if (!mc_knobs.no_classify) mc_classify_words(b, src, sz); }
    else jb_lit(b, "\"\"");
    jb_lit(b, "}");
  }
  jb_lit(b, "]");
  if (packed && e->nparams < 0 && xbuf) { jb_lit(b, ",\"extra_hex\":"); jb_hex(b, xbuf, xsize); }
}

/* ---- the binary form (MINE_CAPTURE_FORMAT=bin; docs/dump-format.md "Binary launch records") ----
 * Why: what kept recording above the overhead goal was formatting (hex digits, decimal numbers)
 * and the bytes written; here a launch is a 112-byte header, its raw launch attributes and one
 * copy of its parameter buffer. Everything a JSON record derives from the function (symbol,
 * layout, off/size) is in functions.jsonl once; device pointers are classified offline from
 * allocs.jsonl; host pointees are read only for the words learnt per function (alloc.c). */
static void put32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
#define PAD8(n) (((n) + 7) & ~(size_t)7)

/* What a launch's record holds beyond its header: where the parameter bytes come from. */
typedef struct {
  const unsigned char *xbuf;  /* packed `extra` buffer, or NULL */
  size_t blob_len;            /* parameter bytes recorded */
  unsigned flags, nattrs;     /* header flags (1 graph, 2 packed, 4 no bytes); attributes kept */
} shape_t;

static int bin_shape(const mc_launch_t *L, const mc_entry_t *e, shape_t *s) {
  s->xbuf = NULL; s->blob_len = 0; s->nattrs = 0;
  s->flags = L->in_graph ? 1u : 0u;
  if (!L->kp && L->extra) {
    size_t xsize = 0;
    s->flags |= 2;
    for (int i = 0; i < 32 && L->extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
      if (L->extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) s->xbuf = L->extra[i + 1];
      else if (L->extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && L->extra[i + 1])
        xsize = *(const size_t *)L->extra[i + 1];
    }
    if (xsize > MC_PARAM_MAX) xsize = MC_PARAM_MAX;
    if (!s->xbuf) { xsize = 0; s->flags |= 4; }
    s->blob_len = xsize;
  } else if (!L->kp) {
    s->flags |= 4;
  } else {
    for (int i = 0; i < e->nparams; i++)
      if ((size_t)e->off[i] + e->size[i] > s->blob_len) s->blob_len = (size_t)e->off[i] + e->size[i];
  }
  if (e->nparams < 0) atomic_fetch_add(&mc_cnt.no_layout, 1);
  if (s->blob_len > 0xffffffffu) return -1;
  if (L->cfg && L->cfg->attrs) s->nattrs = L->cfg->numAttrs < 64 ? L->cfg->numAttrs : 64;
  return 0;
}

static size_t bin_len(const shape_t *s) {
  return MC_BIN_HEADER + (size_t)s->nattrs * sizeof(CUlaunchAttribute) + PAD8(s->blob_len);
}

/* The record without host sections, at r: every byte but the first 8 (len, magic), which commit
 * it. Returns the offset of the parameter bytes. */
static size_t bin_fill(unsigned char *r, const mc_launch_t *L, const mc_entry_t *e, uint32_t fn,
                       const shape_t *s, uint64_t seq) {
  memset(r + 8, 0, MC_BIN_HEADER - 8);
  put64(r + 8, seq);
  put64(r + 16, L->t_ns);
  put32(r + 24, (uint32_t)L->tid);
  put32(r + 28, (uint32_t)L->dev);
  put64(r + 32, (uintptr_t)L->ctx);
  put64(r + 40, (uintptr_t)L->stream);
  if (L->in_graph) { put64(r + 48, (uintptr_t)L->graph); put64(r + 56, L->capid); }
  put32(r + 64, fn);
  put32(r + 68, (uint32_t)L->result);
  for (int k = 0; k < 3; k++) { put32(r + 72 + 4 * k, L->grid[k]); put32(r + 84 + 4 * k, L->block[k]); }
  put32(r + 96, L->smem);
  r[100] = (unsigned char)L->api;
  r[101] = (unsigned char)s->flags;
  r[102] = (unsigned char)s->nattrs;
  put32(r + 104, (uint32_t)s->blob_len);
  size_t at = MC_BIN_HEADER;
  if (s->nattrs) {
    memcpy(r + at, L->cfg->attrs, s->nattrs * sizeof(CUlaunchAttribute));
    at += s->nattrs * sizeof(CUlaunchAttribute);
  }
  unsigned char *blob = r + at;
  if (s->flags & 2) {
    if (s->blob_len) memcpy(blob, s->xbuf, s->blob_len);
  } else if (s->blob_len) {
    memset(blob, 0, s->blob_len);
    for (int i = 0; i < e->nparams; i++)
      if (L->kp[i]) memcpy(blob + e->off[i], L->kp[i], e->size[i]);
  }
  memset(blob + s->blob_len, 0, PAD8(s->blob_len) - s->blob_len);
  return at;
}

static uint64_t bin_head(size_t len) { return (uint64_t)(uint32_t)len | (uint64_t)MC_BIN_MAGIC << 32; }

/* The record built in b after its shape s, host sections appended; 0 ok, -1 dropped. */
static int bin_in_buffer(jb_t *b, const mc_launch_t *L, const mc_entry_t *e, uint32_t fn, const shape_t *s) {
  size_t host_room = MC_HOST_WORDS * (16 + PAD8((size_t)mc_knobs.host_bytes));
  if (jb_need(b, bin_len(s) + host_room)) return -1;
  size_t start = b->n;
  unsigned char *r = (unsigned char *)b->p + start;
  size_t blob_at = start + bin_fill(r, L, e, fn, s, 0);
  b->n += bin_len(s);
  /* host sections are appended inside the room reserved above, so b->p does not move */
  unsigned nhost = (s->flags & 4) ? 0 : mc_host_sections(b, e, (const unsigned char *)b->p + blob_at, s->blob_len);
  r = (unsigned char *)b->p + start;
  r[103] = (unsigned char)nhost;
  uint64_t head = bin_head(b->n - start);
  memcpy(r, &head, 8);
  return b->bad ? -1 : 0;
}

int mc_launch_bin(jb_t *b, const mc_launch_t *L, const mc_entry_t *e, uint32_t fn) {
  shape_t s;
  if (bin_shape(L, e, &s) != 0) return -1;
  return bin_in_buffer(b, L, e, fn, &s);
}

/* Why in place: a record built in a buffer and copied costs the buffer's cache lines on every
 * launch; a launch whose function has no host-pointer words (every function once its first
 * MC_HOST_LEARN launches are learnt, but cuBLASLt's alpha/beta) has a length known up front,
 * so it is built straight into its reserved place in launches.bin. */
int64_t mc_record_bin(const mc_launch_t *L, const mc_entry_t *e, uint32_t fn) {
  shape_t s;  /* once: it also counts a launch without a layout */
  if (bin_shape(L, e, &s) != 0) return -1;
  int plain = atomic_load_explicit(&e->host_seen, memory_order_relaxed) >= MC_HOST_LEARN &&
              atomic_load_explicit(&e->host_n, memory_order_acquire) == 0;
  if (plain) {
    size_t len = bin_len(&s);
    mc_place_t pl;
    int r = mc_bin_place(MC_F_LAUNCHES, len, &pl);
    if (r < 0) return -1;
    if (r > 0) {
      bin_fill(pl.dst, L, e, fn, &s, (uint64_t)pl.seq);
      return mc_bin_commit(&pl, bin_head(len));
    }
  }
  jb_t *b = jb_thread();
  if (!b) return -1;
  if (bin_in_buffer(b, L, e, fn, &s) != 0) b->bad = 1;
  return mc_write_bin(MC_F_LAUNCHES, b);
}
