/* layout.c: per-handle parameter layouts, the module table, and the launch -> module link.
 *
 * Layout cache: a fixed open-addressing table keyed by (handle, context). Slots are claimed with
 * a CAS and published with a release store; readers never take a lock and the table is never
 * reallocated, so a reader can never see freed memory. An entry whose handle was reused by a
 * different kernel (different symbol) is rebuilt and swapped in; the old one is leaked on
 * purpose (a reader may still hold it). When the table is full, entries are built per launch.
 *
 * Link (see docs/dump-format.md, "How the launch -> module link is made"): CUPTI's
 * MODULE_LOADED gives a module id and its cubin but no CUmodule. We parse each cubin's ELF
 * symbol table at load to know its entries. For a launch, the handle's CUmodule (cuFuncGetModule)
 * is looked up in a CUmodule -> id map; otherwise the candidates are the live modules of that
 * context whose entries hold the symbol, narrowed by: loaded during this thread's current API
 * call, then not already mapped to another CUmodule. A unique answer is learnt into the map.
 * Same-content duplicates (one sha256) resolve to the newest. Otherwise `module` is null.
 * The module table is guarded by one mutex that the launch path takes only on a cache miss. */
#include "mc.h"

#include <dlfcn.h>
#include <elf.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS (1u << 16)
typedef struct {
  _Atomic(uintptr_t) handle;
  _Atomic(uintptr_t) ctx;
  _Atomic(mc_entry_t *) entry; /* NULL while being filled */
} slot_t;
static slot_t *table; /* calloc'd once at first use, never freed */
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

typedef struct {
  uint32_t id;
  CUcontext ctx;
  CUmodule hmod;   /* learnt; NULL until known */
  int alive;
  uint64_t order;
  char sha[65];
  size_t size;
  uint32_t nent;
  uint64_t *ent_hash;
} module_t;
static module_t *mods;
static size_t nmods, capmods;
static uint64_t mod_order;
static pthread_mutex_t mod_lock = PTHREAD_MUTEX_INITIALIZER;

static void table_init(void) { table = mc_calloc(SLOTS, sizeof(slot_t)); }

static uint64_t fnv1a(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static uint32_t slot_hash(uintptr_t h, uintptr_t c) {
  uint64_t x = (uint64_t)h * 0x9E3779B97F4A7C15ull ^ (uint64_t)c * 0xC2B2AE3D27D4EB4Full;
  return (uint32_t)(x >> 40) & (SLOTS - 1);
}

/* ---- cubin ELF: entry names ---- */
static uint32_t cubin_entries(const unsigned char *p, size_t n, char ***names_out) {
  *names_out = NULL;
  if (n < sizeof(Elf64_Ehdr) || memcmp(p, ELFMAG, SELFMAG) != 0 || p[EI_CLASS] != ELFCLASS64) return 0;
  const Elf64_Ehdr *eh = (const Elf64_Ehdr *)p;
  if (eh->e_shoff == 0 || eh->e_shentsize != sizeof(Elf64_Shdr) ||
      eh->e_shoff + (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr) > n) return 0;
  const Elf64_Shdr *sh = (const Elf64_Shdr *)(p + eh->e_shoff);
  for (int pass = 0; pass < 2; pass++) {
    uint32_t count = 0, cap = 0;
    char **names = NULL;
    for (unsigned i = 0; i < eh->e_shnum; i++) {
      if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_entsize != sizeof(Elf64_Sym)) continue;
      if (sh[i].sh_offset + sh[i].sh_size > n || sh[i].sh_link >= eh->e_shnum) continue;
      const Elf64_Shdr *st = &sh[sh[i].sh_link];
      if (st->sh_offset + st->sh_size > n) continue;
      const char *strs = (const char *)p + st->sh_offset;
      const Elf64_Sym *sym = (const Elf64_Sym *)(p + sh[i].sh_offset);
      size_t ns = sh[i].sh_size / sizeof(Elf64_Sym);
      for (size_t k = 0; k < ns; k++) {
        if (ELF64_ST_TYPE(sym[k].st_info) != STT_FUNC || sym[k].st_name >= st->sh_size) continue;
        /* pass 0: entries marked by the CUDA ELF "entry" bit in st_other; pass 1: globals */
        if (pass == 0 && !(sym[k].st_other & 0x10)) continue;
        if (pass == 1 && ELF64_ST_BIND(sym[k].st_info) != STB_GLOBAL) continue;
        const char *nm = strs + sym[k].st_name;
        if (!memchr(nm, 0, st->sh_size - sym[k].st_name) || !*nm) continue;
        if (count == cap) {
          char **t = mc_realloc(names, (cap ? cap * 2 : 16) * sizeof *names);
          if (!t) goto out_of_memory;
          names = t;
          cap = cap ? cap * 2 : 16;
        }
        if (!(names[count] = mc_strdup(nm))) goto out_of_memory;
        count++;
      }
    }
    if (count || pass == 1) { *names_out = names; return count; }
    free(names);
    continue;
  out_of_memory: /* capture is off (the choke point said so); nothing is kept */
    while (count) free(names[--count]);
    free(names);
    return 0;
  }
  return 0;
}

void mc_module_loaded(CUcontext ctx, uint32_t id, const void *cubin, size_t size) {
  char sha[65], rel[100];
  mc_sha256_hex(cubin, size, sha);
  char **names = NULL;
  uint32_t nent = cubin_entries(cubin, size, &names);
  uint64_t *hashes = nent ? mc_malloc(nent * sizeof *hashes) : NULL;
  if (nent && !hashes) { /* capture is off: nothing of this module is kept */
    for (uint32_t i = 0; i < nent; i++) free(names[i]);
    free(names);
    return;
  }
  for (uint32_t i = 0; i < nent; i++) hashes[i] = fnv1a(names[i]);
  int dev = mc_ctx_device(ctx);

  MC_LOCK(&mod_lock);
  if (nmods == capmods) { /* only slow paths read this array, all under mod_lock */
    size_t cap = capmods ? capmods * 2 : 256;
    module_t *t = mc_realloc(mods, cap * sizeof *mods);
    if (t) { mods = t; capmods = cap; }
  }
  if (nmods == capmods) { /* capture is off; the module is not kept */
    MC_UNLOCK(&mod_lock);
    free(hashes);
    for (uint32_t i = 0; i < nent; i++) free(names[i]);
    free(names);
    return;
  }
  if (nmods < capmods) {
    module_t *m = &mods[nmods++];
    memset(m, 0, sizeof *m);
    m->id = id; m->ctx = ctx; m->alive = 1; m->order = ++mod_order; m->size = size;
    memcpy(m->sha, sha, 65);
    m->nent = hashes ? nent : 0; m->ent_hash = hashes;
  }
  MC_UNLOCK(&mod_lock);
  mc_tl_t *t = mc_tl_cur;   /* (made by the callback that brought this load) */
  if (t && t->nloaded < MC_TL_LOADED) t->loaded[t->nloaded++] = id;

  atomic_fetch_add(&mc_cnt.modules, 1);
  snprintf(rel, sizeof rel, "cubins/%s.cubin", sha);
  if (mc_write_file_once(rel, cubin, size) == 1) atomic_fetch_add(&mc_cnt.cubin_bytes, size);

  jb_t *b = jb_thread();
  if (b) {
    jb_lit(b, "\"event\":\"load\",\"module\":"); jb_u64(b, id);
    jb_lit(b, ",\"ctx\":"); jb_ptr(b, (uintptr_t)ctx);
    jb_lit(b, ",\"dev\":"); jb_i64(b, dev);
    jb_lit(b, ",\"t_ns\":"); jb_u64(b, mc_now_ns());
    jb_lit(b, ",\"sha256\":\""); jb_raw(b, sha, 64);
    jb_lit(b, "\",\"size\":"); jb_u64(b, size);
    jb_lit(b, ",\"entries\":[");
    for (uint32_t i = 0; i < nent; i++) { if (i) jb_lit(b, ","); jb_str(b, names[i]); }
    jb_lit(b, "]");
    mc_write_record(MC_F_MODULES, b, 0);
  }
  for (uint32_t i = 0; i < nent; i++) free(names[i]);
  free(names);
}

void mc_module_unloading(CUcontext ctx, uint32_t id) {
  char sha[65] = "";
  size_t size = 0;
  MC_LOCK(&mod_lock);
  for (size_t i = 0; i < nmods; i++)
    if (mods[i].alive && mods[i].id == id && mods[i].ctx == ctx) {
      mods[i].alive = 0; memcpy(sha, mods[i].sha, 65); size = mods[i].size;
    }
  MC_UNLOCK(&mod_lock);
  jb_t *b = jb_thread();
  if (!b) return;
  jb_lit(b, "\"event\":\"unload\",\"module\":"); jb_u64(b, id);
  jb_lit(b, ",\"ctx\":"); jb_ptr(b, (uintptr_t)ctx);
  jb_lit(b, ",\"dev\":"); jb_i64(b, mc_ctx_device(ctx));
  jb_lit(b, ",\"t_ns\":"); jb_u64(b, mc_now_ns());
  jb_lit(b, ",\"sha256\":"); if (sha[0]) jb_str(b, sha); else jb_lit(b, "null");
  jb_lit(b, ",\"size\":"); jb_u64(b, size);
  mc_write_record(MC_F_MODULES, b, 0);
}

void mc_module_note_hmod(CUmodule hmod) {
  mc_tl_t *t = mc_tl_cur;
  if (!hmod || !t || t->nloaded != 1) return;
  MC_LOCK(&mod_lock);
  for (size_t i = nmods; i-- > 0;)
    if (mods[i].alive && mods[i].id == t->loaded[0]) { mods[i].hmod = hmod; break; }
  MC_UNLOCK(&mod_lock);
}

/* Returns the index of the linked module in mods[] or -1; called with mod_lock held. */
static long link_module(CUcontext ctx, CUmodule hmod, const char *symbol) {
  if (hmod)
    for (size_t i = nmods; i-- > 0;)
      if (mods[i].alive && mods[i].hmod == hmod) return (long)i;
  uint64_t h = fnv1a(symbol);
  long cand[64];
  int nc = 0;
  for (size_t i = 0; i < nmods && nc < 64; i++) {
    if (!mods[i].alive || mods[i].ctx != ctx) continue;
    for (uint32_t k = 0; k < mods[i].nent; k++)
      if (mods[i].ent_hash[k] == h) { cand[nc++] = (long)i; break; }
  }
  if (nc == 0) return -1;
  long pick = -1;
  if (nc == 1) pick = cand[0];
  mc_tl_t *tl = mc_tl_cur;
  if (pick < 0 && tl) { /* loaded during this API call on this thread */
    int hits = 0;
    for (int c = 0; c < nc; c++)
      for (int t = 0; t < tl->nloaded; t++)
        if (mods[cand[c]].id == tl->loaded[t]) { hits++; pick = cand[c]; }
    if (hits != 1) pick = -1;
  }
  if (pick < 0 && hmod) { /* not yet claimed by another CUmodule */
    int free_n = 0;
    for (int c = 0; c < nc; c++)
      if (!mods[cand[c]].hmod) { free_n++; pick = cand[c]; }
    if (free_n != 1) pick = -1;
  }
  if (pick < 0) { /* all candidates the same content: the newest */
    int same = 1;
    for (int c = 1; c < nc; c++) same &= strcmp(mods[cand[c]].sha, mods[cand[0]].sha) == 0;
    if (same) pick = cand[nc - 1];
  }
  if (pick >= 0 && hmod && !mods[pick].hmod) mods[pick].hmod = hmod;
  return pick;
}

typedef char *(*demangle_fn)(const char *, char *, size_t *, int *);

static void build_frag(mc_entry_t *e, const char *name, long modid, const char *sha,
                       const int attr[7]) {
  jb_t b = {0};
  jb_lit(&b, ",\"handle\":");
  jb_raw(&b, e->is_kernel == 1 ? "\"kernel\"" : e->is_kernel == 0 ? "\"function\"" : "\"unknown\"",
         e->is_kernel == 1 ? 8 : e->is_kernel == 0 ? 10 : 9);
  jb_lit(&b, ",\"func\":"); jb_ptr(&b, (uintptr_t)e->func);
  jb_lit(&b, ",\"module\":"); if (modid >= 0) jb_u64(&b, (uint64_t)modid); else jb_lit(&b, "null");
  jb_lit(&b, ",\"sha256\":"); if (sha) jb_str(&b, sha); else jb_lit(&b, "null");
  jb_lit(&b, ",\"symbol\":"); jb_str(&b, e->symbol);
  jb_lit(&b, ",\"name\":"); jb_str(&b, name);
  static const char *const an[7] = {"regs", "static_smem", "local", "const", "max_threads", "ptx", "binary"};
  jb_lit(&b, ",\"attrs\":{");
  int first = 1;
  for (int i = 0; i < 7; i++) {
    if (attr[i] < 0) continue;
    if (!first) jb_lit(&b, ",");
    first = 0;
    jb_str(&b, an[i]); jb_lit(&b, ":"); jb_u64(&b, (uint64_t)attr[i]);
  }
  jb_lit(&b, "}");
  if (b.bad) { free(b.p); b.p = NULL; b.n = 0; } /* capture is off (the choke point) */
  e->frag = b.p; e->frag_n = b.n;
}

static mc_entry_t *build_entry(void *handle, CUcontext ctx, const char *cupti_symbol) {
  mc_entry_t *e = mc_calloc(1, sizeof *e);
  if (!e) return NULL;
  e->handle = handle; e->ctx = ctx; e->symbol_key = cupti_symbol; e->nparams = -1;
  e->layout_src = "none"; e->is_kernel = -1;
  const char *nm = NULL;
  if (MC_CU_ANSWER(cuFuncGetName, &nm, (CUfunction)handle) == CUDA_SUCCESS) {
    e->is_kernel = 0; e->func = (CUfunction)handle;
  } else if (MC_CU(cuKernelGetFunction, &e->func, (CUkernel)handle) == CUDA_SUCCESS) {
    e->is_kernel = 1;
    if (MC_CU_ANSWER(cuKernelGetName, &nm, (CUkernel)handle) != CUDA_SUCCESS) nm = NULL;
  }
  e->symbol = mc_strdup(cupti_symbol && *cupti_symbol ? cupti_symbol : nm ? nm : "");
  if (!e->symbol) { free(e); return NULL; }

  /* Layout: the call that fits the handle kind first, then the other. An out-of-range index
   * answers CUDA_ERROR_INVALID_VALUE, which ends the list (index 0: no parameters). */
  for (int pass = 0; pass < 2 && e->nparams < 0 && e->is_kernel >= 0; pass++) {
    int use_kernel = (pass == 0) == (e->is_kernel == 1);
    if (use_kernel && e->is_kernel != 1) continue;
    uint32_t cap = 16, n = 0;
    uint32_t *off = mc_malloc(cap * 4), *sz = off ? mc_malloc(cap * 4) : NULL;
    CUresult r = CUDA_SUCCESS;
    int oom = !sz;
    while (!oom) {
      size_t o = 0, s = 0;
      r = use_kernel ? MC_CU_ANSWER(cuKernelGetParamInfo, (CUkernel)handle, n, &o, &s)
                     : MC_CU_ANSWER(cuFuncGetParamInfo, e->func, n, &o, &s);
      if (r != CUDA_SUCCESS) break;
      if (n == cap) {
        uint32_t *o2 = mc_realloc(off, cap * 8);
        if (o2) off = o2;
        uint32_t *s2 = o2 ? mc_realloc(sz, cap * 8) : NULL;
        if (s2) sz = s2;
        if (!o2 || !s2) { oom = 1; break; }
        cap *= 2;
      }
      off[n] = (uint32_t)o; sz[n] = (uint32_t)s; n++;
      if (n > 8192) break;
    }
    int found = !oom && (r == CUDA_ERROR_INVALID_VALUE || n > 0);
    uint32_t *both = found ? mc_malloc(((size_t)n + 1) * 8) : NULL; /* off and size in one block:
                                                                      fewer lines per launch */
    if (both) { memcpy(both, off, (size_t)n * 4); memcpy(both + n, sz, (size_t)n * 4); }
    free(off); free(sz);
    if (oom || (found && !both)) break;   /* capture is off (the choke point): no layout */
    if (!found) continue;
    e->nparams = (int)n; e->off = both; e->size = both + n;
    e->layout_src = use_kernel ? "kernel" : "function";
  }

  int attr[7] = {-1, -1, -1, -1, -1, -1, -1};
  static const CUfunction_attribute ak[7] = {
      CU_FUNC_ATTRIBUTE_NUM_REGS, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
      CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
      CU_FUNC_ATTRIBUTE_PTX_VERSION, CU_FUNC_ATTRIBUTE_BINARY_VERSION};
  if (e->func)
    for (int i = 0; i < 7; i++) {
      int v = 0;
      if (MC_CU(cuFuncGetAttribute, &v, ak[i], e->func) == CUDA_SUCCESS) attr[i] = v;
    }

  CUmodule hmod = NULL;
  if (e->func && MC_CU(cuFuncGetModule, &hmod, e->func) != CUDA_SUCCESS) hmod = NULL;
  long modid = -1;
  char sha[65] = "";
  MC_LOCK(&mod_lock);
  long mi = link_module(ctx, hmod, e->symbol);
  if (mi >= 0) { modid = mods[mi].id; memcpy(sha, mods[mi].sha, 65); }
  MC_UNLOCK(&mod_lock);

  e->record = 1;
  if (mc_knobs.has_include && regexec(&mc_knobs.include_re, e->symbol, 0, NULL, 0) != 0) e->record = 0;
  if (mc_knobs.has_exclude && regexec(&mc_knobs.exclude_re, e->symbol, 0, NULL, 0) == 0) e->record = 0;

  static demangle_fn dm;
  if (!dm) dm = (demangle_fn)dlsym(RTLD_DEFAULT, "__cxa_demangle");
  char *dem = NULL;
  int st = -1;
  if (dm && e->symbol[0] == '_' && e->symbol[1] == 'Z') dem = dm(e->symbol, NULL, NULL, &st);
  build_frag(e, dem && st == 0 ? dem : e->symbol, modid, sha[0] ? sha : NULL, attr);
  free(dem);
  if (!e->frag) { /* out of memory: capture is off, the entry is not kept */
    free(e->off); free(e->symbol); free(e);
    return NULL;
  }
  return e;
}

const mc_entry_t *mc_layout_get(void *handle, CUcontext ctx, const char *cupti_symbol) {
  MC_C(pthread_once, 1, pthread_once(&table_once, table_init));
  if (!table) return build_entry(handle, ctx, cupti_symbol);
  uintptr_t h = (uintptr_t)handle, c = (uintptr_t)ctx;
  uint32_t i = slot_hash(h, c);
  for (uint32_t probe = 0; probe < 64; probe++, i = (i + 1) & (SLOTS - 1)) {
    slot_t *s = &table[i];
    uintptr_t sh = atomic_load_explicit(&s->handle, memory_order_acquire);
    if (sh == 0) {
      uintptr_t zero = 0;
      if (!atomic_compare_exchange_strong(&s->handle, &zero, h)) {
        if (zero != h) continue; /* another handle took it */
      } else {
        atomic_store_explicit(&s->ctx, c, memory_order_release);
        mc_entry_t *e = build_entry(handle, ctx, cupti_symbol);
        atomic_store_explicit(&s->entry, e, memory_order_release);
        return e;
      }
    }
    if (atomic_load_explicit(&s->handle, memory_order_acquire) != h) continue;
    if (atomic_load_explicit(&s->ctx, memory_order_acquire) != c) {
      if (atomic_load_explicit(&s->ctx, memory_order_acquire) == 0)
        return build_entry(handle, ctx, cupti_symbol); /* being filled right now */
      continue;
    }
    mc_entry_t *e = atomic_load_explicit(&s->entry, memory_order_acquire);
    if (!e) return build_entry(handle, ctx, cupti_symbol); /* being filled right now */
    if (e->symbol_key == cupti_symbol || !cupti_symbol || strcmp(e->symbol, cupti_symbol) == 0)
      return e;
    mc_entry_t *fresh = build_entry(handle, ctx, cupti_symbol); /* handle reused */
    if (fresh) atomic_store_explicit(&s->entry, fresh, memory_order_release);
    return fresh;
  }
  return build_entry(handle, ctx, cupti_symbol); /* leaks per launch; only when 64 probes fail */
}

void mc_layout_reset_after_fork(void) {
  pthread_mutex_init(&mod_lock, NULL); /* (the thread block's loaded ids: ident.c) */
}
