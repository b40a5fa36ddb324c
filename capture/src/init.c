/* init.c: InitializeInjection, knobs, driver entry points, meta.json, fork and exit.
 *
 * The driver calls InitializeInjection() once per process that has CUDA_INJECTION64_PATH set.
 * A process that exec()s gets a fresh library and its own pid<N>/ folder; a fork()ed child gets
 * fresh locks and, at its first record, its own pid<N>/ folder (so forked helpers that never
 * touch CUDA leave nothing behind). Anything that goes wrong turns capture off with one line
 * on stderr and leaves the host process running. */
#include "mc.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

mc_driver_t mc_drv;
mc_knobs_t mc_knobs;
mc_counters_t mc_cnt;
atomic_int mc_off;
atomic_uint mc_free_epoch;
atomic_uint mc_alloc_epoch;
atomic_int mc_capturing;
int mc_pid;
const char *const mc_fn_names[MC_FN_COUNT] = {
#define MC_NAME(fn) #fn,
    MC_DRIVER_FUNCS(MC_NAME) MC_CUPTI_FUNCS(MC_NAME)
#undef MC_NAME
};
const char *const mc_drop_names[MC_DROP_COUNT] = {
#define DROP_NAME(tail, name) [MC_DROP_##tail] = name,
    MC_DROPS(DROP_NAME)
#undef DROP_NAME
};

static char disabled_reason[512];
static uint64_t start_ns, start_unix_ns;
static int driver_version;
static uint32_t cupti_version;
static atomic_int devices_known;
static pthread_mutex_t meta_lock = PTHREAD_MUTEX_INITIALIZER;

void mc_disable(const char *fmt, ...) {
  int expected = 0;
  if (!atomic_compare_exchange_strong(&mc_off, &expected, 1)) return;
  mc_room_release(); /* first: what follows may allocate, and so may the host */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(disabled_reason, sizeof disabled_reason, fmt, ap);
  va_end(ap);
  fprintf(stderr, "[mine-capture] capture off in pid %d: %s\n", mc_pid, disabled_reason);
  mc_meta_write(1);
}

void mc_note_error(int fn, int code, int fatal) {
  static atomic_int logged;
  atomic_fetch_add(&mc_cnt.errors[fn], 1);
  if (fatal) { mc_disable("%s failed with code %d", mc_fn_names[fn], code); return; }
  if (!atomic_exchange(&logged, 1))
    fprintf(stderr, "[mine-capture] note: %s failed with code %d (counted in meta.json; capture goes on)\n",
            mc_fn_names[fn], code);
}

/* ---- knobs ---- */
static uint64_t env_u64(const char *name, uint64_t dflt) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  char *end;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 10);
  if (errno || *end) {
    fprintf(stderr, "[mine-capture] ignoring %s=%s: not a non-negative integer\n", name, v);
    return dflt;
  }
  return x;
}

static void read_knobs(void) {
  const char *dir = getenv("MINE_CAPTURE_DIR");
  snprintf(mc_knobs.dir, sizeof mc_knobs.dir, "%s", dir && *dir ? dir : "dumped-kernels");
  const char *inc = getenv("MINE_CAPTURE_INCLUDE"), *exc = getenv("MINE_CAPTURE_EXCLUDE");
  if (inc && *inc) {
    snprintf(mc_knobs.include, sizeof mc_knobs.include, "%s", inc);
    mc_knobs.has_include = regcomp(&mc_knobs.include_re, inc, REG_EXTENDED | REG_NOSUB) == 0;
    if (!mc_knobs.has_include) fprintf(stderr, "[mine-capture] ignoring MINE_CAPTURE_INCLUDE: bad regex\n");
  }
  if (exc && *exc) {
    snprintf(mc_knobs.exclude, sizeof mc_knobs.exclude, "%s", exc);
    mc_knobs.has_exclude = regcomp(&mc_knobs.exclude_re, exc, REG_EXTENDED | REG_NOSUB) == 0;
    if (!mc_knobs.has_exclude) fprintf(stderr, "[mine-capture] ignoring MINE_CAPTURE_EXCLUDE: bad regex\n");
  }
  mc_knobs.max_launches = env_u64("MINE_CAPTURE_MAX_LAUNCHES", 0);
  mc_knobs.max_bytes = env_u64("MINE_CAPTURE_MAX_BYTES", 0);
  mc_knobs.skip = env_u64("MINE_CAPTURE_SKIP", 0);
  mc_knobs.modules_only = env_u64("MINE_CAPTURE_MODULES_ONLY", 0) != 0;
  mc_knobs.host_bytes = (unsigned)env_u64("MINE_CAPTURE_HOST_BYTES", 64);
  if (mc_knobs.host_bytes > 4096) mc_knobs.host_bytes = 4096;
  mc_knobs.copy_log = env_u64("MINE_CAPTURE_COPY_LOG", 1) != 0 && !mc_knobs.modules_only;
  uint64_t copy_bytes = env_u64("MINE_CAPTURE_COPY_BYTES", 4096);
  mc_knobs.copy_bytes = copy_bytes > 65536 ? 65536 : (unsigned)copy_bytes;
  const char *w = getenv("MINE_CAPTURE_WRITER"); /* default write: see docs/benchmarks.md */
  mc_knobs.writer_write = 1;
  if (w && *w && strcmp(w, "write") != 0) {
    if (strcmp(w, "mmap") == 0) mc_knobs.writer_write = 0;
    else fprintf(stderr, "[mine-capture] ignoring MINE_CAPTURE_WRITER=%s: not write or mmap\n", w);
  }
  mc_knobs.no_prefault = env_u64("MINE_CAPTURE_PREFAULT", 1) == 0;
  mc_knobs.no_classify = env_u64("MINE_CAPTURE_CLASSIFY", 1) == 0;
  mc_knobs.alloc_log = env_u64("MINE_CAPTURE_ALLOC_LOG", 0) != 0;
  mc_knobs.compact = env_u64("MINE_CAPTURE_COMPACT", 0) != 0;
  mc_knobs.noop = env_u64("MINE_CAPTURE_NOOP", 0) != 0;
  mc_knobs.selftime = env_u64("MINE_CAPTURE_SELFTIME", 0) != 0;
  mc_knobs.alternate = env_u64("MINE_CAPTURE_ALTERNATE", 0);
  mc_knobs.toggle_ms = env_u64("MINE_CAPTURE_TOGGLE_MS", 0);
  const char *fmt = getenv("MINE_CAPTURE_FORMAT");
  if (fmt && *fmt && strcmp(fmt, "json") != 0) {
    if (strcmp(fmt, "bin") == 0) mc_knobs.bin = 1;
    else fprintf(stderr, "[mine-capture] ignoring MINE_CAPTURE_FORMAT=%s: not json or bin\n", fmt);
  }
  mc_knobs.snapshot_at = env_u64("MINE_CAPTURE_SNAPSHOT_AT", 0);
  mc_knobs.snapshot_signal = env_u64("MINE_CAPTURE_SNAPSHOT_SIGNAL", 0) != 0;
  mc_knobs.snapshot_bytes = env_u64("MINE_CAPTURE_SNAPSHOT_BYTES", 8ull << 30);
  mc_knobs.snapshot = (mc_knobs.snapshot_at || mc_knobs.snapshot_signal) && !mc_knobs.modules_only;
  if (mc_knobs.snapshot) mc_knobs.alloc_log = 1; /* the snapshot's table is fed by the allocation callbacks */
  if (mc_knobs.bin) { /* the binary form carries function ids and leaves device pointers to the log */
    mc_knobs.compact = 1;
    mc_knobs.alloc_log = 1;
    mc_knobs.no_classify = 1;
  }
}

/* ---- driver entry points through cuGetProcAddress (no link against libcuda) ---- */
typedef CUresult (*getproc_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static int resolve_driver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!lib) lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) return -1;
  getproc_fn gp = (getproc_fn)dlsym(lib, "cuGetProcAddress_v2");
  if (!gp) return -1;
#define MC_RESOLVE(fn)                                                                     \
  {                                                                                        \
    void *p = NULL;                                                                        \
    CUdriverProcAddressQueryResult q;                                                      \
    char name[64];                                                                         \
    snprintf(name, sizeof name, "%s", #fn);                                                \
    size_t len = strlen(name);                                                             \
    if (len > 3 && strcmp(name + len - 3, "_v2") == 0) name[len - 3] = 0;                  \
    if (gp(name, &p, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &q) == CUDA_SUCCESS &&      \
        q == CU_GET_PROC_ADDRESS_SUCCESS)                                                  \
      mc_drv.fn = (__typeof__(mc_drv.fn))p;                                                \
  }
  MC_DRIVER_FUNCS(MC_RESOLVE)
#undef MC_RESOLVE
  return 0;
}

/* ---- meta.json ---- */
static void json_devices(jb_t *b) {
  int n = 0;
  jb_lit(b, ",\"devices\":[");
  if (atomic_load(&devices_known) && MC_CU(cuDeviceGetCount, &n) == CUDA_SUCCESS) {
    for (int i = 0; i < n; i++) {
      CUdevice d;
      if (MC_CU(cuDeviceGet, &d, i) != CUDA_SUCCESS) continue;
      char name[256] = "";
      int maj = 0, min = 0, sms = 0;
      size_t mem = 0;
      CUuuid u;
      memset(&u, 0, sizeof u);
      MC_CU(cuDeviceGetName, name, sizeof name, d);
      MC_CU(cuDeviceGetAttribute, &maj, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d);
      MC_CU(cuDeviceGetAttribute, &min, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d);
      MC_CU(cuDeviceGetAttribute, &sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d);
      MC_CU(cuDeviceTotalMem, &mem, d);
      MC_CU(cuDeviceGetUuid, &u, d);
      if (i) jb_lit(b, ",");
      jb_lit(b, "{\"ordinal\":"); jb_u64(b, (uint64_t)i);
      jb_lit(b, ",\"name\":"); jb_str(b, name);
      jb_lit(b, ",\"cc\":["); jb_u64(b, (uint64_t)maj); jb_lit(b, ","); jb_u64(b, (uint64_t)min);
      jb_lit(b, "],\"uuid\":"); jb_hex(b, u.bytes, 16);
      jb_lit(b, ",\"sm_count\":"); jb_u64(b, (uint64_t)sms);
      jb_lit(b, ",\"total_mem\":"); jb_u64(b, mem);
      jb_lit(b, "}");
    }
  }
  jb_lit(b, "]");
}

/* `,"argv":[...]` from /proc/self/cmdline (64 KB at most), read once and kept: later meta.json
 * writes (the one at exit among them) need no file, no allocation and no large stack frame for it
 * (a forked child has its parent's command line). Out of memory: an empty list, read again next time. */
static char *argv_json;
static size_t argv_json_n;
static void json_argv(jb_t *b) {
  if (!argv_json) {
    jb_t raw = {0}, a = {0};
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    while (fd >= 0 && raw.n < (64u << 10) && jb_need(&raw, 4097) == 0) {
      ssize_t k = read(fd, raw.p + raw.n, 4096);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) break;
      raw.n += (size_t)k;
    }
    if (fd >= 0 && close(fd) != 0) mc_note_error(MC_FN_close, errno, 0);
    jb_lit(&a, ",\"argv\":[");
    if (!raw.bad && raw.p) {
      raw.p[raw.n] = 0;   /* room kept by jb_need above */
      for (size_t i = 0; i < raw.n;) {
        if (i) jb_lit(&a, ",");
        jb_str(&a, raw.p + i);
        i += strlen(raw.p + i) + 1;
      }
    }
    jb_lit(&a, "]");
    free(raw.p);
    if (raw.bad || a.bad) {
      free(a.p);
      jb_lit(b, ",\"argv\":[]");
      return;
    }
    argv_json = a.p;
    argv_json_n = a.n;
  }
  jb_raw(b, argv_json, argv_json_n);
}

/* `,"env":{...}`: which rank of a multi-GPU job this process is, as its environment says
 * (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, CUDA_VISIBLE_DEVICES; only those set, the key
 * absent when none is). Why: a tensor-parallel engine starts one worker per GPU and a miner lines
 * the workers' dumps up by rank (docs/dump-format.md "meta.json"). Read at every write but the
 * exit's (a launcher may export them after the library was loaded) and kept for that one: the
 * exit path neither calls getenv while the host may be tearing its environment down nor needs
 * memory for it. A section longer than the kept copy's room is written but not kept. */
static const char *const env_names[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                        "CUDA_VISIBLE_DEVICES"};
static char env_json[2048];
static size_t env_json_n;
static void json_env(jb_t *b, int final) {
  if (final) {
    if (env_json_n) jb_raw(b, env_json, env_json_n);
    return;
  }
  size_t start = b->n;
  int n = 0;
  for (size_t i = 0; i < sizeof env_names / sizeof *env_names; i++) {
    const char *v = getenv(env_names[i]);
    if (!v) continue;
    if (n++) jb_lit(b, ","); else jb_lit(b, ",\"env\":{");
    jb_str(b, env_names[i]); jb_lit(b, ":"); jb_str(b, v);
  }
  if (n) jb_lit(b, "}");
  if (b->bad || b->n < start) return;
  if (b->n - start <= sizeof env_json) {
    memcpy(env_json, b->p + start, b->n - start);
    env_json_n = b->n - start;
  }
}

/* ---- meta.json on a full filesystem, or with no memory left ----
 * Why: the counters are written at exit and `disabled` when capture turns off, often just when the
 * dump's filesystem filled up (or the host's memory ran out). So meta.json always holds META_SLACK
 * bytes more than its JSON needs (rounded up to 4 KB): the JSON, then spaces, then a newline (JSON
 * allows trailing whitespace), and the buffer it is built in keeps that capacity. A write goes to a
 * temporary file renamed over meta.json (a reader never sees half of one); when that fails (no
 * room for a second copy), the same bytes overwrite meta.json in place, inside the blocks it
 * already holds: the exit counters need neither new disk space nor new memory. (A copy-on-write
 * filesystem needs new blocks even for that; a final JSON longer than the room only has the
 * rename.) All of it under meta_lock. */
#define META_SLACK (16u << 10)
static jb_t meta_b;             /* the buffer meta.json is built in, kept */
static size_t meta_room;        /* bytes meta.json of this process holds; 0: none written yet */
static int meta_room_pid;
static atomic_int meta_owner;   /* the thread writing meta.json: a disable inside that write (out
                                   of memory) must not write it again (meta_lock is held); it
                                   sets meta_again and the write is made once more after */
static atomic_int meta_again;

static int meta_put(int fd, const jb_t *b, size_t room) {
  char sp[256];
  memset(sp, ' ', sizeof sp);
  for (size_t off = 0; off < room;) {   /* b, spaces, '\n' */
    const char *p = off < b->n ? b->p + off : off + 1 < room ? sp : "\n";
    size_t n = off < b->n ? b->n - off : off + 1 < room ? room - 1 - off : 1;
    if (p == sp && n > sizeof sp) n = sizeof sp;
    ssize_t w = pwrite(fd, p, n, (off_t)off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return w < 0 && errno ? errno : ENOSPC;
    off += (size_t)w;
  }
  return 0;
}

/* meta.json from b; 0, or the errno of what failed */
static int meta_file(const jb_t *b) {
  static char path[4400], tmp[4500];
  snprintf(path, sizeof path, "%s/meta.json", mc_pid_dir());
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  if (meta_room_pid != mc_pid) meta_room = 0, meta_room_pid = mc_pid;
  size_t room = b->n <= meta_room ? meta_room : (b->n + META_SLACK + 4095) / 4096 * 4096;
  int e = 0, fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) e = errno ? errno : EIO;
  else {
    e = meta_put(fd, b, room);
    if (close(fd) != 0 && !e) e = errno ? errno : EIO;
    if (!e && rename(tmp, path) != 0) e = errno ? errno : EIO;
    if (e) unlink(tmp);
  }
  if (!e) { meta_room = room; return 0; }
  if (!meta_room || b->n > meta_room) return e;
  fd = open(path, O_WRONLY | O_CLOEXEC);   /* in place, within what it holds */
  if (fd < 0) return e;
  int e2 = meta_put(fd, b, meta_room);
  if (close(fd) != 0 && !e2) e2 = errno ? errno : EIO;
  return e2 ? e : 0;
}

void mc_meta_write(int final) {
  if (!mc_pid_dir()[0]) return;
  if (!final && !atomic_load(&devices_known)) {
    /* devices can be asked once a context exists (cuInit is still running at injection) */
    CUcontext c = NULL;
    if (MC_CU(cuCtxGetCurrent, &c) == CUDA_SUCCESS && c) atomic_store(&devices_known, 1);
  }
  int tid = (int)syscall(SYS_gettid);   /* (not mc_tid(): no TLS touched on the exit path) */
  if (atomic_load(&meta_owner) == tid) { atomic_store(&meta_again, 1); return; }   /* see meta_owner */
  MC_LOCK(&meta_lock);
  atomic_store(&meta_owner, tid);
  jb_t b = meta_b;
  b.n = 0;
  b.bad = 0;
  jb_lit(&b, "{\"format_version\":1,\"pid\":"); jb_u64(&b, (uint64_t)mc_pid);
  jb_lit(&b, ",\"ppid\":"); jb_u64(&b, (uint64_t)getppid());
  json_argv(&b);
  json_env(&b, final);
  jb_lit(&b, ",\"start_ns\":"); jb_u64(&b, start_ns);
  jb_lit(&b, ",\"start_unix_ns\":"); jb_u64(&b, start_unix_ns);
  jb_lit(&b, ",\"driver_version\":"); jb_i64(&b, driver_version);
  jb_lit(&b, ",\"cupti_version\":"); jb_u64(&b, cupti_version);
  json_devices(&b);
  jb_lit(&b, ",\"options\":{\"dir\":"); jb_str(&b, mc_knobs.dir);
  jb_lit(&b, ",\"include\":"); if (mc_knobs.has_include) jb_str(&b, mc_knobs.include); else jb_lit(&b, "null");
  jb_lit(&b, ",\"exclude\":"); if (mc_knobs.has_exclude) jb_str(&b, mc_knobs.exclude); else jb_lit(&b, "null");
  jb_lit(&b, ",\"max_launches\":"); jb_u64(&b, mc_knobs.max_launches);
  jb_lit(&b, ",\"max_bytes\":"); jb_u64(&b, mc_knobs.max_bytes);
  jb_lit(&b, ",\"skip\":"); jb_u64(&b, mc_knobs.skip);
  jb_lit(&b, ",\"modules_only\":"); jb_u64(&b, (uint64_t)mc_knobs.modules_only);
  jb_lit(&b, ",\"host_bytes\":"); jb_u64(&b, mc_knobs.host_bytes);
  jb_lit(&b, ",\"writer\":"); jb_str(&b, mc_writer_name());
  jb_lit(&b, ",\"prefault\":"); jb_u64(&b, (uint64_t)!mc_knobs.no_prefault);
  jb_lit(&b, ",\"classify\":"); jb_u64(&b, (uint64_t)!mc_knobs.no_classify);
  jb_lit(&b, ",\"alloc_log\":"); jb_u64(&b, (uint64_t)mc_knobs.alloc_log);
  jb_lit(&b, ",\"copy_log\":"); jb_u64(&b, (uint64_t)mc_knobs.copy_log);
  jb_lit(&b, ",\"copy_bytes\":"); jb_u64(&b, mc_knobs.copy_bytes);
  if (mc_knobs.compact) jb_lit(&b, ",\"compact\":1"); /* absent by default: default meta.json unchanged */
  if (mc_knobs.bin) jb_lit(&b, ",\"format\":\"bin\"");
  if (mc_knobs.noop) jb_lit(&b, ",\"noop\":1");
  if (mc_knobs.alternate) { jb_lit(&b, ",\"alternate\":"); jb_u64(&b, mc_knobs.alternate); }
  if (mc_knobs.toggle_ms) { jb_lit(&b, ",\"toggle_ms\":"); jb_u64(&b, mc_knobs.toggle_ms); }
  if (mc_knobs.snapshot) {   /* absent unless armed */
    jb_lit(&b, ",\"snapshot_at\":"); jb_u64(&b, mc_knobs.snapshot_at);
    jb_lit(&b, ",\"snapshot_signal\":"); jb_u64(&b, (uint64_t)mc_knobs.snapshot_signal);
    jb_lit(&b, ",\"snapshot_bytes\":"); jb_u64(&b, mc_knobs.snapshot_bytes);
  }
  jb_lit(&b, "}");
  if (final) {
    jb_lit(&b, ",\"counters\":{\"launches\":"); jb_u64(&b, mc_cnt.launches);
    jb_lit(&b, ",\"launches_recorded\":"); jb_u64(&b, mc_cnt.launches_recorded);
    jb_lit(&b, ",\"modules\":"); jb_u64(&b, mc_cnt.modules);
    jb_lit(&b, ",\"cubin_bytes\":"); jb_u64(&b, mc_cnt.cubin_bytes);
    jb_lit(&b, ",\"no_layout\":"); jb_u64(&b, mc_cnt.no_layout);
    if (mc_knobs.compact) { jb_lit(&b, ",\"functions\":"); jb_u64(&b, mc_cnt.functions); }
    if (mc_knobs.selftime) {
      jb_lit(&b, ",\"self_ns\":"); jb_u64(&b, mc_cnt.self_ns);
      jb_lit(&b, ",\"self_launches\":"); jb_u64(&b, mc_cnt.self_launches);
    }
    if (mc_knobs.alloc_log) {
      jb_lit(&b, ",\"alloc_events\":"); jb_u64(&b, mc_cnt.alloc_events);
      jb_lit(&b, ",\"alloc_dropped\":"); jb_u64(&b, mc_cnt.alloc_dropped);
    }
    if (mc_knobs.copy_log) {
      jb_lit(&b, ",\"copies\":"); jb_u64(&b, mc_cnt.copies);
      jb_lit(&b, ",\"copies_dropped\":"); jb_u64(&b, mc_cnt.copies_dropped);
    }
    jb_lit(&b, ",\"dropped\":{");
    for (int i = 0; i < MC_DROP_COUNT; i++) {
      if (i) jb_lit(&b, ",");
      jb_str(&b, mc_drop_names[i]); jb_lit(&b, ":"); jb_u64(&b, mc_cnt.dropped[i]);
    }
    jb_lit(&b, "},\"errors\":{");
    int first = 1;
    for (int i = 0; i < MC_FN_COUNT; i++) {
      if (!mc_cnt.errors[i]) continue;
      if (!first) jb_lit(&b, ",");
      first = 0;
      jb_str(&b, mc_fn_names[i]); jb_lit(&b, ":"); jb_u64(&b, mc_cnt.errors[i]);
    }
    jb_lit(&b, "}}");
    mc_toggles_json(&b);
    if (!atomic_load(&mc_off) || disabled_reason[0]) { jb_lit(&b, ",\"end_ns\":"); jb_u64(&b, mc_now_ns()); }
  }
  if (disabled_reason[0]) { jb_lit(&b, ",\"disabled\":"); jb_str(&b, disabled_reason); }
  jb_lit(&b, "}\n");
  /* out of memory: the choke point turned capture off; meta.json stays as it was */
  int e = b.bad ? ENOMEM : meta_file(&b);
  int none = e && (meta_room_pid != mc_pid || !meta_room);   /* this process has no meta.json */
  if (e && !b.bad) {   /* counted; noted on stderr unless capture is (or is about to be) off for it */
    if (none) atomic_fetch_add(&mc_cnt.errors[MC_FN_write], 1);
    else mc_note_error(MC_FN_write, e, 0);
  }
  if (!e && b.n < meta_room) {   /* keep the capacity the next write may need */
    size_t n = b.n;
    b.n = 0;
    if (jb_need(&b, meta_room) != 0) b.bad = 0;
    b.n = n;
  }
  meta_b = b;
  atomic_store(&meta_owner, 0);
  MC_UNLOCK(&meta_lock);
  /* a dump without meta.json could never say what it holds: capture stops (writer.c then removes
   * the empty folder) */
  if (none && !final) mc_disable("cannot write %s/meta.json (%s)", mc_pid_dir(), strerror(e));
  else if (atomic_exchange(&meta_again, 0)) mc_meta_write(1);
}

/* ---- exit and fork ---- */
static int files_opened_pid;

static void at_exit(void) {
  static int done_pid;
  if (done_pid == mc_pid) return; /* atexit and the destructor both come here */
  done_pid = mc_pid;
  mc_files_finalize();
  if (files_opened_pid == mc_pid && mc_pid_dir()[0]) {
    mc_meta_write(1);
  }
}

__attribute__((destructor)) static void at_unload(void) {
  if (mc_pid) at_exit();
}

static void fork_child(void) {
  mc_pid = getpid();
  mc_ident_reset_after_fork();
  pthread_mutex_init(&meta_lock, NULL);
  atomic_store(&meta_owner, 0);
  atomic_store(&meta_again, 0);
  memset(&mc_cnt, 0, sizeof mc_cnt);
  mc_files_reset_after_fork();
  mc_layout_reset_after_fork();
  mc_fn_reset_after_fork();
  mc_callbacks_reset_after_fork();
  mc_snapshot_reset_after_fork();
  files_opened_pid = mc_pid; /* the writer opens pid<N>/ lazily at the first record */
}

int InitializeInjection(void) __attribute__((visibility("default")));
int InitializeInjection(void) {
  static atomic_int once;
  if (atomic_exchange(&once, 1)) return 1;
  mc_pid = getpid();
  start_ns = mc_now_ns();
  struct timespec ts = {0, 0};
  if (clock_gettime(CLOCK_REALTIME, &ts) != 0) mc_note_error(MC_FN_clock_gettime, errno, 0);
  start_unix_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
  read_knobs();
  mc_room_init();
  mc_snapshot_init();
  if (resolve_driver() != 0) {
    fprintf(stderr, "[mine-capture] capture off in pid %d: the CUDA driver's cuGetProcAddress_v2 was not found\n",
            mc_pid);
    atomic_store(&mc_off, 1);
    return 1;
  }
  MC_CU(cuDriverGetVersion, &driver_version);
  MC_CUPTI(cuptiGetVersion, &cupti_version);
  if (mc_files_open() != 0) return 1;
  files_opened_pid = mc_pid;
  CUpti_SubscriberHandle sub;
  if (MC_CUPTI_FATAL(cuptiSubscribe, &sub, (CUpti_CallbackFunc)mc_callback, NULL) != CUPTI_SUCCESS) return 1;
  if (mc_enable_callbacks(sub) != 0) return 1;
  mc_toggle_start(sub);
  /* without these a fork's child would write into its parent's files, and the mmap writer's files
   * would keep their preallocated tail: capture stops instead */
  if (MC_C(atexit, 1, atexit(at_exit) ? ENOMEM : 0) != 0) return 1;
  MC_C(pthread_atfork, 1, pthread_atfork(NULL, NULL, fork_child));
  return 1;
}
