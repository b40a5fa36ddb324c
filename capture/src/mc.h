/* mc.h: shared declarations of the mine capture injection library.
 *
 * Contract: loaded by the CUDA driver through CUDA_INJECTION64_PATH; writes the dump described in
 * docs/dump-format.md. The library never links libcuda: every driver entry point is resolved at
 * run time through cuGetProcAddress, so the .so builds and loads on machines without a driver.
 * It never aborts the host: a failed CUDA/CUPTI call is counted under its name; calls whose
 * failure means the capture cannot continue turn capture off with one line on stderr.
 * Files: init.c (knobs, start, fork, exit), ident.c (time, thread id, context -> device),
 * dispatch.c (the CUPTI callback: which handler a callback id goes to, enabling them), launch.c
 * (launch and kernel-node records), graphs.c (stream captures, graph lifecycle), tmap.c (tensor
 * maps), toggle.c (MINE_CAPTURE_TOGGLE_MS), layout.c (per-handle layout cache, module table,
 * launch->module link), alloc.c (pointer classification, the allocation log), record.c (launch
 * record JSON and binary bodies, compact function records), writer.c (JSON building, the mmap and
 * write(2) record writers, sha256), copies.c (host-to-device copies, copies.jsonl), snapshot.c (MINE_CAPTURE_SNAPSHOT_*: device
 * memory copied out once). tables.h: the per-API tables, generated from
 * vocab/capture_tables.py (the one place they are stated; Python reads the same module). */
#ifndef MC_H
#define MC_H

#define _GNU_SOURCE
#include <cuda.h>
#include <cupti.h>
#include <regex.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "tables.h"

/* Driver entry points we call, resolved by name at run time with the ABI of the CUDA version we
 * compile against. Hazard: for some names the driver hands out a newer ABI than the header's
 * unsuffixed prototype (cuCtxGetDevice at 13.0 is cuCtxGetDevice_v2(dev, ctx)); such entries are
 * listed with their suffix, which init.c strips from the name it asks for. */
#define MC_DRIVER_FUNCS(X)                                                                  \
  X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName)              \
  X(cuDeviceGetAttribute) X(cuDeviceGetUuid) X(cuDeviceTotalMem) X(cuCtxGetDevice_v2)         \
  X(cuCtxGetCurrent) X(cuFuncGetName) X(cuFuncGetParamInfo) X(cuFuncGetAttribute)           \
  X(cuFuncGetModule) X(cuKernelGetFunction) X(cuKernelGetName) X(cuKernelGetParamInfo)      \
  X(cuPointerGetAttributes) X(cuStreamGetCaptureInfo) X(cuGraphGetNodes) X(cuGraphNodeGetType) \
  X(cuCtxSynchronize_v2) X(cuMemcpyDtoH_v2)

#define MC_CUPTI_FUNCS(X) X(cuptiSubscribe) X(cuptiEnableDomain) X(cuptiEnableCallback) \
  X(cuptiGetVersion) X(write) X(open) X(mkdir) X(mmap) X(fallocate) X(ftruncate) X(pwrite)    \
  X(malloc) X(pthread_create) X(pthread_attr) X(pthread_sigmask) X(pthread_mutex_lock)         \
  X(pthread_mutex_unlock) X(pthread_once) X(pthread_atfork) X(atexit) X(clock_gettime)       \
  X(close) X(munmap) X(rename) X(pthread_key_create) X(pthread_setspecific) X(unlink)

typedef struct {
#define MC_DECL(fn) __typeof__(&fn) fn;
  MC_DRIVER_FUNCS(MC_DECL)
#undef MC_DECL
} mc_driver_t;
extern mc_driver_t mc_drv;

enum {
#define MC_ENUM(fn) MC_FN_##fn,
  MC_DRIVER_FUNCS(MC_ENUM) MC_CUPTI_FUNCS(MC_ENUM)
#undef MC_ENUM
  MC_FN_COUNT
};
extern const char *const mc_fn_names[MC_FN_COUNT];

/* The choke point: every foreign call goes through one of these.
 * MC_CU: failure is unexpected: counted under the call's name, logged once, capture stays on.
 * MC_CU_ANSWER: failure is an answer (probing past the last parameter): not counted.
 * MC_CU_FATAL / MC_CUPTI_FATAL: failure means capture cannot work: counted, capture off. */
void mc_note_error(int fn, int code, int fatal);
#define MC_CU(fn, ...) ({ CUresult _r = mc_drv.fn ? mc_drv.fn(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND; \
  if (_r != CUDA_SUCCESS) { mc_note_error(MC_FN_##fn, (int)_r, 0); } _r; })
#define MC_CU_ANSWER(fn, ...) (mc_drv.fn ? mc_drv.fn(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND)
#define MC_CU_FATAL(fn, ...) ({ CUresult _r = mc_drv.fn ? mc_drv.fn(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND; \
  if (_r != CUDA_SUCCESS) { mc_note_error(MC_FN_##fn, (int)_r, 1); } _r; })
#define MC_CUPTI_FATAL(fn, ...) ({ CUptiResult _r = fn(__VA_ARGS__); \
  if (_r != CUPTI_SUCCESS) { mc_note_error(MC_FN_##fn, (int)_r, 1); } _r; })
#define MC_CUPTI(fn, ...) ({ CUptiResult _r = fn(__VA_ARGS__); \
  if (_r != CUPTI_SUCCESS) { mc_note_error(MC_FN_##fn, (int)_r, 0); } _r; })
/* libc and pthread calls that answer 0 or an error number (pthread_*; the errno of -1 callers):
 * counted under `name` with that number; fatal ones turn capture off. */
#define MC_C(name, fatal, call) ({ int _r = (call); \
  if (_r != 0) { mc_note_error(MC_FN_##name, _r, (fatal)); } _r; })
/* The library's locks: a lock that cannot be taken (a corrupted or destroyed mutex) turns capture
 * off; the caller goes on as if it held it, as it would have without the check. */
#define MC_LOCK(m) ((void)MC_C(pthread_mutex_lock, 1, pthread_mutex_lock(m)))
#define MC_UNLOCK(m) ((void)MC_C(pthread_mutex_unlock, 1, pthread_mutex_unlock(m)))

/* The allocation choke point (writer.c): every heap allocation of the library goes through these.
 * A failure is counted under "malloc" and turns capture off with one line on stderr (the host's
 * memory is the host's; a capture that cannot allocate stops instead of recording holes); the
 * caller gets NULL and gives up its work. mc_realloc leaves p untouched (the caller's to free)
 * when it fails. All of them call mc_sys_realloc (libc's realloc; tests/helpers/harness_dispatch.c swaps
 * in one that fails the Nth allocation), and what they return is freed with free(). */
void *mc_malloc(size_t n);
void *mc_calloc(size_t k, size_t n);
void *mc_realloc(void *p, size_t n);
char *mc_strdup(const char *s);
extern void *(*mc_sys_realloc)(void *, size_t);

/* Knobs (capture/knobs.py lists the same variables with the same defaults). The fields the launch
 * path reads come first, so they share the struct's first cache line. */
typedef struct {
  int noop;                  /* MINE_CAPTURE_NOOP=1: the driver-API callback returns at once
                                (diagnostic: CUPTI's own cost per launch, nothing recorded) */
  int selftime;              /* MINE_CAPTURE_SELFTIME=1: time spent recording each launch (on_launch)
                                summed in counters.self_ns / self_launches (diagnostic) */
  int bin;                   /* MINE_CAPTURE_FORMAT=bin: launches.bin records (record.c); implies
                                compact, alloc_log and no_classify */
  int compact;               /* MINE_CAPTURE_COMPACT=1: each function once in functions.jsonl,
                                launches carry "fn" (record.c) */
  int snapshot;              /* MINE_CAPTURE_SNAPSHOT_AT or _SIGNAL set: a snapshot is armed (snapshot.c);
                                implies alloc_log */
  int alloc_log;             /* MINE_CAPTURE_ALLOC_LOG=1: allocation/free/mapping events to
                                allocs.jsonl (alloc.c), for offline pointer classification */
  int no_classify;           /* MINE_CAPTURE_CLASSIFY=0: no "ptrs"/"host"/"tmap" keys (diagnostic:
                                times the writer without pointer classification) */
  int no_prefault;           /* MINE_CAPTURE_PREFAULT=0: mmap writer without the helper thread or
                                madvise; pages fault in on first touch (diagnostic) */
  unsigned host_bytes;
  int copy_log;              /* MINE_CAPTURE_COPY_LOG=1 (default): host-to-device copies to copies.jsonl */
  unsigned copy_bytes;       /* MINE_CAPTURE_COPY_BYTES: a copy of at most this many bytes carries them */
  uint64_t max_launches, max_bytes, skip;
  uint64_t toggle_ms;        /* MINE_CAPTURE_TOGGLE_MS=T: launch callbacks switched off and on every T
                                ms by a thread of ours (diagnostic, toggle.c) */
  uint64_t alternate;        /* MINE_CAPTURE_ALTERNATE=N: launches in alternate blocks of N are not
                                recorded (callback returns at once): recording's cost measured inside
                                one process (diagnostic, benchmarks/bench_launch.cu) */
  uint64_t snapshot_at;      /* MINE_CAPTURE_SNAPSHOT_AT=N: after N launch records (0: off) */
  uint64_t snapshot_bytes;   /* MINE_CAPTURE_SNAPSHOT_BYTES: the most bytes a snapshot copies */
  int snapshot_signal;       /* MINE_CAPTURE_SNAPSHOT_SIGNAL=1: SIGUSR2 triggers it */
  int writer_write;          /* MINE_CAPTURE_WRITER=write: one write(2) per record everywhere */
  int modules_only;
  int has_include, has_exclude;
  char dir[4096];
  char include[1024], exclude[1024];
  regex_t include_re, exclude_re;
} mc_knobs_t;
extern mc_knobs_t mc_knobs;

/* Global state. */
extern atomic_int mc_off;            /* 1: capture turned itself off */
extern atomic_uint mc_free_epoch;    /* bumped on every free: invalidates pointer caches */
extern atomic_uint mc_alloc_epoch;   /* bumped on every allocation/mapping: invalidates "not device" */
extern atomic_int mc_capturing;      /* streams being captured into graphs right now */
extern int mc_pid;
enum {
#define MC_DROP_ENUM(tail, name) MC_DROP_##tail,
  MC_DROPS(MC_DROP_ENUM)
#undef MC_DROP_ENUM
  MC_DROP_COUNT
};
extern const char *const mc_drop_names[MC_DROP_COUNT];
typedef struct {
  atomic_ullong launches, launches_recorded, eligible, modules, cubin_bytes, no_layout;
  atomic_ullong alloc_events, alloc_dropped; /* allocs.jsonl records written / not written */
  atomic_ullong functions;                   /* functions.jsonl records written (compact) */
  atomic_ullong copies, copies_dropped;      /* copies.jsonl records written / not written */
  atomic_ullong self_ns, self_launches;      /* MINE_CAPTURE_SELFTIME=1 */
  atomic_ullong dropped[MC_DROP_COUNT];
  atomic_ullong errors[MC_FN_COUNT];
} mc_counters_t;
extern mc_counters_t mc_cnt;

void mc_disable(const char *fmt, ...);
uint64_t mc_now_ns(void);
int mc_tid(void);
int mc_ctx_device(CUcontext ctx);
void mc_ident_reset_after_fork(void);

/* What the library keeps per thread: one block, allocated through the choke point at the thread's
 * first need of it (mc_tl_get) and freed by a thread-exit destructor (writer.c). Hazard: the library
 * is dlopened (CUDA_INJECTION64_PATH), so a __thread variable of the default model is dynamic TLS,
 * allocated by glibc at each thread's first touch, and glibc ends the whole host when that
 * allocation fails ("cannot allocate memory for thread-local data: ABORT"); a large initial-exec
 * block instead takes glibc's static TLS surplus and makes dlopen fail in a process that used it
 * up (seen in CPython). So the library's only thread-local is mc_tl_cur, one 8-byte initial-exec
 * pointer (the surplus keeps room for such), and a failed allocation is the choke point's: capture
 * off, one line, the host runs on. The launch path's fields come first, in one cache line. */
struct mc_entry;
#define MC_TL_LOADED 16
#define MC_TL_CACHE_N 16
#define MC_TL_NEG_N 256
#define MC_TL_HOST_NEG_N 256
typedef struct { char *p; size_t n, cap; int bad; } jb_t; /* writer.c; bad: an allocation failed, the record is dropped */
typedef struct mc_tl {
  int in_cb;                     /* dispatch.c: inside our callback (our driver calls not re-entered) */
  int tid;                       /* mc_tid() */
  int nloaded;                   /* layout.c: modules loaded during this thread's current API call */
  int dev;                       /* mc_ctx_device() of dev_ctx */
  CUcontext dev_ctx;
  /* launch.c: the function this thread launched last, with its compact id */
  void *handle; CUcontext ctx; const char *symkey; const struct mc_entry *e; int64_t fn;
  /* the rest: one owner file each */
  jb_t jb;                                         /* writer.c: jb_thread() */
  uint32_t loaded[MC_TL_LOADED];                   /* layout.c: those modules' ids */
  struct { uint64_t base, size, id; unsigned epoch; } cache[MC_TL_CACHE_N]; /* alloc.c: device hits */
  unsigned next;                                   /* alloc.c: cache slot to fill next */
  struct { uint64_t v; unsigned epoch; } neg[MC_TL_NEG_N];                   /* alloc.c: not device */
  struct { uint64_t v, t_ns; unsigned epoch; } host_neg[MC_TL_HOST_NEG_N];   /* alloc.c: not readable */
  struct { uint32_t corr; int valid; uint64_t order, seq; } pend;            /* alloc.c: a free's stamp */
  void *block;                   /* what mc_malloc gave (the struct sits at its first 64-byte line) */
} __attribute__((aligned(64))) mc_tl_t;
extern __thread mc_tl_t *mc_tl_cur __attribute__((tls_model("initial-exec")));
/* room.c: the address-space guard (a reserve given back when capture turns off; the room checked
 * before the library grows); mc_room_check: 0, or -1 with capture turned off for lack of room */
void mc_room_init(void);
void mc_room_release(void);
int mc_room_check(void);
mc_tl_t *mc_tl_new(void);        /* writer.c: this thread's block, made now; NULL: capture is off */
/* This thread's block, made at its first call: by mc_callback (a thread's first callback) and
 * jb_thread (a record's buffer). Whatever only caches in it (thread id, device, pointer answers,
 * the modules of a call, a free's stamp) reads mc_tl_cur and, NULL (a thread that never came
 * through either, or whose block could not be made), goes without. */
static inline mc_tl_t *mc_tl_get(void) {
  mc_tl_t *t = mc_tl_cur;
  return __builtin_expect(t != NULL, 1) ? t : mc_tl_new();
}
/* The same answers as mc_tid() / mc_ctx_device() from a thread's block already in hand. */
static inline int mc_tl_tid(mc_tl_t *t) { return t->tid ? t->tid : mc_tid(); }
static inline int mc_tl_dev(mc_tl_t *t, CUcontext c) { return c && c == t->dev_ctx ? t->dev : mc_ctx_device(c); }
void mc_meta_write(int final);

/* writer.c: a growable per-thread JSON buffer and the dump files. */
#define JB_SEQ_ROOM 40 /* bytes reserved in front of a record for `{"seq":N,` */
jb_t *jb_thread(void);                 /* this thread's buffer, emptied, room reserved */
int jb_need(jb_t *b, size_t more);       /* 0, or -1 (b->bad set) when memory ran out */
void jb_raw(jb_t *b, const char *s, size_t n);
#define jb_lit(b, s) jb_raw((b), ("" s), sizeof(s) - 1) /* literals only */
void jb_str(jb_t *b, const char *s);   /* JSON string with quotes and escapes */
void jb_u64(jb_t *b, uint64_t v);
void jb_i64(jb_t *b, int64_t v);
void jb_ptr(jb_t *b, uint64_t v);      /* "0x.." */
void jb_hex(jb_t *b, const void *p, size_t n);
enum { MC_F_LAUNCHES, MC_F_MODULES, MC_F_GRAPHS, MC_F_TENSORMAPS, MC_F_ALLOCS, MC_F_FUNCTIONS, MC_F_COPIES,
       MC_F_COUNT };
int mc_files_open(void);               /* 0 ok; makes DIR/pid<N>/ and opens the files */
void mc_files_reset_after_fork(void);
int mc_files_ready(void);              /* opens lazily after a fork; 0 when capture is off */
void mc_files_finalize(void);          /* seal mapped files, cut them to their length (exit) */
const char *mc_writer_name(void);      /* "mmap" | "write" */
int mc_thread_start(void *(*fn)(void *), void *arg); /* our threads: detached, all signals blocked; 0 ok */
/* Writes one record: b holds the body after the opening brace, without the closing one.
 * With seq_file, a per-file sequence number is put in front; returns it (or -1 when dropped). */
int64_t mc_write_record(int file, jb_t *b, int with_seq);
int64_t mc_next_seq(int file);         /* the seq the file's next record gets (no record made) */
int mc_write_file_once(const char *rel, const void *p, size_t n); /* 1 written, 0 existed, -1 err */
const char *mc_pid_dir(void);
void mc_sha256_hex(const void *p, size_t n, char out[65]);

/* layout.c */
typedef struct mc_entry {
  /* first cache line: what every launch of the function reads */
  _Atomic uint64_t fn_tag;  /* compact: (generation << 32) | (function id + 1); 0 none (record.c) */
  uint32_t *off, *size;     /* one block: size = off + nparams */
  int nparams;              /* -1: layout unknown */
  int record;               /* passes include/exclude */
  atomic_uint host_seen;    /* bin: launches whose words were checked for host pointees (alloc.c) */
  atomic_uint host_n;       /* bin: learnt host-pointer words, offsets in host_at (<= MC_HOST_WORDS) */
  const char *symbol_key;   /* CUPTI's pointer seen when cached */
  void *handle; CUcontext ctx;
  /* the rest: read when the function is first seen, or with a host-pointer word */
  CUfunction func;
  int is_kernel;            /* 1 CUkernel, 0 CUfunction, -1 unknown */
  const char *layout_src;   /* "kernel" | "function" | "none" */
  char *symbol;             /* mangled, owned */
  char *frag; size_t frag_n;/* precomputed JSON: "handle".."attrs":{..}, */
  uint32_t host_at[8];      /* bin: parameter-buffer byte offsets of the learnt host-pointer words */
} mc_entry_t;
const mc_entry_t *mc_layout_get(void *handle, CUcontext ctx, const char *cupti_symbol);
void mc_module_loaded(CUcontext ctx, uint32_t id, const void *cubin, size_t size);
void mc_module_unloading(CUcontext ctx, uint32_t id);
void mc_module_note_hmod(CUmodule hmod); /* after cuModuleLoad*: link hmod to this call's module */
void mc_layout_reset_after_fork(void);

/* alloc.c */
typedef struct { uint64_t base, size, id; } mc_alloc_t;
int mc_device_alloc(uint64_t v, mc_alloc_t *out);            /* 1 if v is in a live allocation */
int mc_host_read(uint64_t v, void *dst, unsigned n);          /* bytes read without faulting */
void mc_classify_words(jb_t *b, const unsigned char *p, size_t size); /* "ptrs"/"host"/"tmap" keys */
/* The allocation log (allocs.jsonl, MINE_CAPTURE_ALLOC_LOG=1). An API's parameters become one
 * event: mc_alloc_ev_parse reads them (the out-parameters are valid at API exit only), and
 * mc_alloc_ev_json formats the record body. Both are pure (tested on CPU). */
enum { MC_AE_BASE = 1, MC_AE_SIZE = 2, MC_AE_HANDLE = 4 };
typedef struct {
  const char *event, *api;  /* "alloc", "free", "map", ...; the API's name */
  uint64_t base, size, handle;
  unsigned has;             /* MC_AE_* : which of base/size/handle the API gave */
  int device;               /* 1: base..base+size becomes device memory (ask the driver for its id) */
  int at_entry;             /* 1: ordered at the API's entry (frees, unmaps: before anyone can reuse) */
} mc_alloc_ev_t;
typedef struct { uint64_t seq_before, order, t_ns; int tid, dev; int64_t id; int result; } mc_alloc_stamp_t;
int mc_alloc_ev_parse(CUpti_CallbackId cbid, const void *params, mc_alloc_ev_t *e); /* 0: not logged */
void mc_alloc_ev_json(jb_t *b, const mc_alloc_ev_t *e, const mc_alloc_stamp_t *st);
void mc_alloc_log_entry(CUpti_CallbackId cbid, uint32_t correlation_id);
void mc_alloc_log_exit(CUpti_CallbackId cbid, uint32_t correlation_id, const void *params, CUcontext ctx,
                       int result);

/* record.c: one launch, as the callback saw it; formatting is pure (tested on CPU). */
typedef struct {
  uint64_t t_ns; int tid, dev; CUcontext ctx; CUstream stream;
  int api;                  /* the entry point: an index in mc_api_names (the binary form's api byte) */
  int result;
  int in_graph; CUgraph graph; uint64_t capid;
  unsigned grid[3], block[3], smem;
  const CUlaunchConfig *cfg; void **kp, **extra;
} mc_launch_t;
extern const char *const mc_api_names[MC_API_COUNT]; /* docs/dump-format.md "Binary launch records" */
/* The launch record body; fn >= 0: the compact form ("fn", params without off/size). */
void mc_launch_json(jb_t *b, const mc_launch_t *L, const mc_entry_t *e, int64_t fn);
/* Compact form: e's function id, its functions.jsonl record written first; -1: write the launch
 * in the default form (the record could not be written). */
int64_t mc_fn_id(const mc_entry_t *e);
void mc_fn_json(jb_t *b, const mc_entry_t *e, uint64_t id);  /* a functions.jsonl record body */
void mc_fn_reset_after_fork(void);

/* The binary launch record (MINE_CAPTURE_FORMAT=bin; docs/dump-format.md "Binary launch
 * records"). mc_launch_bin builds it in b (after JB_SEQ_ROOM; seq left 0); 0 ok, -1 dropped. */
#define MC_PARAM_MAX 32768        /* bytes read from a packed `extra` buffer at most: the driver's
                                     parameter limit is 32,764; a larger claimed size is not trusted */
#define MC_BIN_MAGIC 0x314C434Du
#define MC_BIN_HEADER 112
#define MC_HOST_LEARN 8          /* launches of a function whose words are all checked */
#define MC_HOST_WORDS 8          /* host-pointer words remembered per function */
int mc_launch_bin(jb_t *b, const mc_launch_t *L, const mc_entry_t *e, uint32_t fn);
/* One binary launch record written: in place when its length is known up front, else built in
 * this thread's buffer (mc_launch_bin) and copied (mc_write_bin). The seq, or -1 (dropped). */
int64_t mc_record_bin(const mc_launch_t *L, const mc_entry_t *e, uint32_t fn);
int64_t mc_write_bin(int file, jb_t *b);  /* writer.c: seq patched in at +8, header stored last */
/* In place (writer.c): a record of known length built straight into the mapped file, no copy.
 * mc_bin_place reserves len bytes and a seq: 1: build the record at pl->dst except its first
 * 8 bytes (len, magic), then mc_bin_commit stores those last (the record exists from then on)
 * and returns the seq; 0: no place (write writer, sealed file): use mc_write_bin; -1: dropped. */
typedef struct { int file; uint64_t off; size_t len; int64_t seq; unsigned char *dst; jb_t *scratch; } mc_place_t;
int mc_bin_place(int file, size_t len, mc_place_t *pl);
int64_t mc_bin_commit(const mc_place_t *pl, uint64_t head);
/* alloc.c, bin form: appends host sections for the blob's pointer words; returns how many. */
unsigned mc_host_sections(jb_t *b, const mc_entry_t *e, const unsigned char *blob, size_t n);

/* dispatch.c: one row per driver-API callback the library listens to (tables.h MC_CALLBACKS). */
enum {
#define MC_KIND_ENUM(kind, family) MC_K_##kind,
  MC_CB_KINDS(MC_KIND_ENUM)
#undef MC_KIND_ENUM
  MC_K_COUNT
};
enum {
#define MC_FAMILY_ENUM(family) MC_FAM_##family,
  MC_CB_FAMILIES(MC_FAMILY_ENUM)
#undef MC_FAMILY_ENUM
  MC_FAM_COUNT
};
enum { MC_EN_ALWAYS, MC_EN_LAUNCHES, MC_EN_ALLOC_LOG, MC_EN_COPY_LOG };
typedef struct {
  CUpti_CallbackId cbid;
  const char *name;
  unsigned char kind, family, enable; /* MC_K_*, MC_FAM_*, MC_EN_* */
  signed char api;                    /* launch records' api byte (mc_api_names), or -1 */
  unsigned char v1;                   /* kernel nodes: CUDA_KERNEL_NODE_PARAMS_v1 (no kern, ctx) */
  unsigned char ptsz;                 /* a NULL stream is the per-thread default stream */
  unsigned char logged, at_entry;     /* allocation log: written; stamped at the API's entry */
} mc_cb_t;
extern const mc_cb_t mc_cbs[MC_CB_COUNT];
const mc_cb_t *mc_cb_of(CUpti_CallbackId cbid);  /* the row of a driver callback id; NULL: not ours */
void CUPTIAPI mc_callback(void *ud, CUpti_CallbackDomain dom, CUpti_CallbackId cbid, const void *d);
int mc_enable_callbacks(CUpti_SubscriberHandle sub);
void mc_callbacks_reset_after_fork(void);
static inline CUresult mc_cb_result(const CUpti_CallbackData *d) { /* the API's CUresult (at exit) */
  return d->functionReturnValue ? *(const CUresult *)d->functionReturnValue : CUDA_SUCCESS;
}
static inline CUstream mc_cb_stream(const mc_cb_t *row, CUstream s) {
  return (s == NULL && row->ptsz) ? CU_STREAM_PER_THREAD : s;
}

/* launch.c: a launch API's or a kernel node's record */
void mc_on_launch(mc_tl_t *t, const mc_cb_t *row, const CUpti_CallbackData *d);
void mc_on_kernel_node(mc_tl_t *t, const mc_cb_t *row, const CUpti_CallbackData *d);

/* copies.c: a copy's or memset's record (copies.jsonl); parsing and formatting are pure (tested
 * on CPU). */
enum { MC_OP_HTOD, MC_OP_DTOD, MC_OP_MEMSET };   /* copies.jsonl "op" (vocab COPY_OPS) */
typedef struct {
  uint64_t dst, src, size;
  int op; unsigned value; int elem;   /* op; a memset's value and element size (1, 2, 4) */
  CUstream stream; int async;
  int check;                /* the driver is asked whether src is host and dst device memory */
  int is_node; CUgraph graph; CUgraphExec exec; CUgraphNode node; /* a memcpy node's definition */
  int in_graph; CUgraph cap_graph; uint64_t capid;                /* a copy inside a stream capture */
} mc_copy_t;
typedef struct { uint64_t seq_before, t_ns; int tid, dev, result; } mc_copy_stamp_t;
int mc_copy_parse(const mc_cb_t *row, const void *params, mc_copy_t *c); /* 0: not a copy of the log */
void mc_copy_json(jb_t *b, const char *api, const mc_copy_t *c, const mc_copy_stamp_t *st, const void *bytes);
void mc_on_copy(mc_tl_t *t, const mc_cb_t *row, const CUpti_CallbackData *d);

/* graphs.c: stream captures in flight, graph lifecycle events */
void mc_on_graph(const mc_cb_t *row, const CUpti_CallbackData *d);
void mc_capture_note_launch(uint64_t capture_id, int64_t seq); /* a launch recorded inside a capture */
/* Whether stream s is being captured into a graph now, and into which (1: *graph, *capture_id
 * set); the driver is asked only while some capture is open (one atomic load otherwise). */
int mc_stream_capture_ask(CUstream s, CUgraph *graph, uint64_t *capture_id);
static inline int mc_stream_capture(CUstream s, CUgraph *graph, uint64_t *capture_id) {
  return atomic_load_explicit(&mc_capturing, memory_order_relaxed) > 0 && mc_stream_capture_ask(s, graph, capture_id);
}
void mc_graph_line_kernel_node(const char *api, CUgraph graph, CUgraphExec exec, CUgraphNode node, int64_t seq);
void mc_graphs_reset_after_fork(void);

/* tmap.c: tensor maps (a ring the launch path searches without a lock) */
void mc_on_tensormap(const mc_cb_t *row, const CUpti_CallbackData *d);
int64_t mc_tmap_find(const unsigned char *p128);
void mc_tmap_reset_after_fork(void);

/* snapshot.c: the bytes of the live device allocations, once (docs/dump-format.md "Snapshot") */
void mc_snapshot_init(void);                        /* after the knobs: arm it, catch SIGUSR2 */
void mc_snapshot_alloc_event(CUpti_CallbackId cbid, const void *params, int at_entry, int result);
void mc_snapshot_at_launch(const mc_cb_t *row, const CUpti_CallbackData *d); /* a launch API's exit */
void mc_snapshot_reset_after_fork(void);
int mc_launch_stream(const mc_cb_t *row, const void *params, CUstream *s); /* launch.c: 1 when known */

/* toggle.c */
void mc_toggle_start(CUpti_SubscriberHandle sub);   /* MINE_CAPTURE_TOGGLE_MS */
void mc_toggles_json(jb_t *b);                      /* meta.json "toggles" */

#endif
