/* snapshot.c: MINE_CAPTURE_SNAPSHOT_AT / _SIGNAL: the bytes of every live device allocation the
 * library knows of, once, into DUMP/pid<N>/snapshot/ (docs/dump-format.md "Snapshot").
 *
 * Why: a launch record names its buffers, not their contents; the weights of a model are the bytes
 * a run only reads, and `mine compile --weights` binds them to a checkpoint's tensors by content
 * (compiler/weights.py). So the library copies the device memory out at a point the user picks.
 *
 * The allocation table: every successful allocation or mapping event of the allocation log
 * (`alloc`, `map`, `ipc_open`, `import`, `ext_map`, `gfx_map`: the events mining/allocs.py makes
 * live) enters it, a free, `ipc_close` or reuse of its base removes it, a `cuMemUnmap` removes the
 * entries whose base it covers. Frees are applied at the API's entry (before the driver can hand
 * the address out again), allocations at its exit. The table needs the allocation-family callbacks,
 * so the snapshot knobs turn the allocation log on (allocs.jsonl, as MINE_CAPTURE_FORMAT=bin does).
 * It is a fixed static array (no heap): past SNAP_LIVE entries an allocation is counted as lost and
 * the snapshot says so. A free that then fails leaves its allocation out (not copied).
 *
 * The trigger: after MINE_CAPTURE_SNAPSHOT_AT=N launch records (N > 0), or a SIGUSR2 with
 * MINE_CAPTURE_SNAPSHOT_SIGNAL=1 (the handler only sets a flag), at the exit of the next launch-API
 * callback whose stream is not being captured into a graph: no capture may be open anywhere in the
 * process (mc_capturing) and the driver must say the launch's stream is not capturing
 * (cuStreamGetCaptureInfo; a failed query defers too), because a synchronization during a stream
 * capture invalidates the engine's graph. There, on the launching thread (inside the callback, so
 * the library's own driver calls are not recorded: the thread's in_cb flag), it synchronizes the
 * launch's context, then copies each allocation in address order through one bounded host buffer
 * (SNAP_CHUNK bytes, mmap'd after the address-space guard's check, room.c) with cuMemcpyDtoH into
 * snapshot/<base hex>.bin (written as .tmp, renamed when whole) and writes one snapshot.jsonl record
 * per allocation, then an `end` record. Allocations are skipped largest first until the rest fits
 * MINE_CAPTURE_SNAPSHOT_BYTES (the KV pool of a serving engine is most of the GPU: it is skipped
 * and recorded so). The snapshot's bytes are not counted by MINE_CAPTURE_MAX_BYTES.
 *
 * Failures: every CUDA and libc result is checked. A region whose copy fails is recorded `failed`
 * with the call and code and the others go on; a failed synchronization, a folder or record that
 * cannot be written, a write that fails (a full disk), not enough free disk for the regions, or no
 * room for the buffer end the snapshot (`end` says `failed` and why). Any failure is one line on
 * stderr; launch capture goes on (only a guard that finds the address space nearly full turns the
 * whole capture off, as for any other growth of the library). Snapshot once per process. Not
 * handled: a capture begun on another thread between the check and the synchronization. */
#include "mc.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define SNAP_LIVE 16384            /* allocations the table holds */
#define SNAP_CHUNK (8ull << 20)    /* the host buffer */
#define DISK_MARGIN (64ull << 20)  /* free disk left to the dump's other files */

typedef struct { uint64_t base, size, id; } live_t;
static live_t live[SNAP_LIVE], taken[SNAP_LIVE];
static int nlive;
static atomic_ullong live_lost;
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;

enum { SNAP_OFF, SNAP_ARMED, SNAP_RUNNING, SNAP_DONE };
static atomic_int state;
static volatile sig_atomic_t signalled;
static atomic_ullong deferred;     /* triggered launches passed over (a capture open) */

/* ---- the table ---- */
static int is_create(const char *ev) {
  static const char *const c[] = {"alloc", "map", "ipc_open", "import", "ext_map", "gfx_map"};
  for (size_t i = 0; i < sizeof c / sizeof *c; i++)
    if (strcmp(ev, c[i]) == 0) return 1;
  return 0;
}
static void drop_where(uint64_t lo, uint64_t hi) { /* entries with base in [lo, hi); under live_lock */
  int k = 0;
  for (int i = 0; i < nlive; i++)
    if (!(live[i].base >= lo && live[i].base < hi)) live[k++] = live[i];
  nlive = k;
}

void mc_snapshot_alloc_event(CUpti_CallbackId cbid, const void *params, int at_entry, int result) {
  if (atomic_load_explicit(&state, memory_order_relaxed) != SNAP_ARMED) return;
  mc_alloc_ev_t e;
  if (!mc_alloc_ev_parse(cbid, params, &e) || e.at_entry != at_entry || !(e.has & MC_AE_BASE) || !e.base) return;
  int create = e.device && is_create(e.event);
  int end = strcmp(e.event, "free") == 0 || strcmp(e.event, "ipc_close") == 0;
  int unmap = strcmp(e.event, "unmap") == 0;
  if (!(create || end || unmap) || (create && result != CUDA_SUCCESS)) return;
  MC_LOCK(&live_lock);
  if (unmap && (e.has & MC_AE_SIZE)) drop_where(e.base, e.base + e.size);
  else drop_where(e.base, e.base + 1);   /* a free, or an allocation reusing the base */
  if (create) {
    if (nlive < SNAP_LIVE) live[nlive++] = (live_t){e.base, (e.has & MC_AE_SIZE) ? e.size : 0, 0};
    else atomic_fetch_add(&live_lost, 1);
  }
  MC_UNLOCK(&live_lock);
}

/* ---- the trigger ---- */
static void on_signal(int sig) { (void)sig; signalled = 1; }

void mc_snapshot_init(void) {
  if (!mc_knobs.snapshot) return;
  atomic_store(&state, SNAP_ARMED);
  if (!mc_knobs.snapshot_signal) return;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGUSR2, &sa, NULL) != 0)
    fprintf(stderr, "[mine-capture] snapshot: SIGUSR2 cannot be caught (%s); only MINE_CAPTURE_SNAPSHOT_AT "
            "triggers it\n", strerror(errno));
}

void mc_snapshot_reset_after_fork(void) {   /* a forked child cannot use its parent's CUDA context */
  atomic_store(&state, SNAP_OFF);
  pthread_mutex_init(&live_lock, NULL);
  nlive = 0;
}

/* The driver's answer: 1 when stream s is not being captured (0: capturing, or the query failed). */
static int stream_free(CUstream s) {
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  CUgraph g = NULL;
  if (MC_CU_ANSWER(cuStreamGetCaptureInfo, s, &st, &id, &g, NULL, NULL, NULL) != CUDA_SUCCESS) return 0;
  return st == CU_STREAM_CAPTURE_STATUS_NONE;
}

static void take(CUcontext ctx);

void mc_snapshot_at_launch(const mc_cb_t *row, const CUpti_CallbackData *d) {
  if (atomic_load_explicit(&state, memory_order_relaxed) != SNAP_ARMED) return;
  int due = signalled || (mc_knobs.snapshot_at &&
                          atomic_load_explicit(&mc_cnt.launches_recorded, memory_order_relaxed) >= mc_knobs.snapshot_at);
  if (!due) return;
  CUstream s = NULL;
  if (atomic_load(&mc_capturing) > 0 || !mc_launch_stream(row, d->functionParams, &s) || !stream_free(s)) {
    atomic_fetch_add(&deferred, 1);
    return;
  }
  int armed = SNAP_ARMED;
  if (!atomic_compare_exchange_strong(&state, &armed, SNAP_RUNNING)) return;
  take(d->context);
  atomic_store(&state, SNAP_DONE);
}

/* ---- the files ---- */
static int write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) { if (w == 0) errno = ENOSPC; return -1; }
    c += w; n -= (size_t)w;
  }
  return 0;
}

typedef struct {
  int fd;                  /* snapshot.jsonl */
  char msg[512];           /* the first failure, one sentence */
  uint64_t seq, t_ns, written, budget, over;
  int ok, skipped, failed, regions;
} snap_t;

static void fail(snap_t *S, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(snap_t *S, const char *fmt, ...) {
  if (S->msg[0]) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(S->msg, sizeof S->msg, fmt, ap);
  va_end(ap);
}

/* One snapshot.jsonl line; 0, or -1 (the failure noted). */
static int line(snap_t *S, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int line(snap_t *S, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof buf - 1) { fail(S, "a snapshot.jsonl record is too long"); return -1; }
  buf[n++] = '\n';
  if (S->fd < 0 || write_all(S->fd, buf, (size_t)n) != 0) {
    if (S->fd >= 0) mc_note_error(MC_FN_write, errno, 0);
    fail(S, "cannot write snapshot.jsonl (%s)", strerror(errno));
    return -1;
  }
  return 0;
}

static int region_line(snap_t *S, const live_t *a, const char *status, const char *file, const char *why) {
  char f[96] = "null", w[400] = "";
  if (file) snprintf(f, sizeof f, "\"%s\"", file);
  if (why) snprintf(w, sizeof w, ",\"reason\":\"%s\"", why);
  return line(S, "{\"event\":\"region\",\"base\":\"0x%llx\",\"size\":%llu,\"id\":%llu,\"seq_before\":%llu,"
              "\"t_ns\":%llu,\"status\":\"%s\",\"file\":%s%s}", (unsigned long long)a->base,
              (unsigned long long)a->size, (unsigned long long)a->id, (unsigned long long)S->seq,
              (unsigned long long)S->t_ns, status, f, w);
}

/* The region's bytes into snapshot/<base>.bin: 0 ok; 1 the copy failed (why in `why`, go on);
 * -1 the file failed (the snapshot ends). */
static int copy_region(snap_t *S, const live_t *a, unsigned char *buf, const char *rel, char *why, size_t nwhy) {
  char path[4400], tmp[4500];
  snprintf(path, sizeof path, "%s/%s", mc_pid_dir(), rel);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    mc_note_error(MC_FN_open, errno, 0);
    fail(S, "cannot open %s (%s)", rel, strerror(errno));
    return -1;
  }
  int rc = 0;
  for (uint64_t off = 0; off < a->size && rc == 0;) {
    size_t n = a->size - off < SNAP_CHUNK ? (size_t)(a->size - off) : (size_t)SNAP_CHUNK;
    CUresult r = MC_CU_ANSWER(cuMemcpyDtoH_v2, buf, (CUdeviceptr)(a->base + off), n);
    if (r != CUDA_SUCCESS) {
      atomic_fetch_add(&mc_cnt.errors[MC_FN_cuMemcpyDtoH_v2], 1);
      snprintf(why, nwhy, "cuMemcpyDtoH failed with code %d at offset %llu", (int)r, (unsigned long long)off);
      rc = 1;
    } else if (write_all(fd, buf, n) != 0) {
      mc_note_error(MC_FN_write, errno, 0);
      fail(S, "cannot write %s (%s)", rel, strerror(errno));
      rc = -1;
    }
    off += n;
  }
  if (close(fd) != 0 && rc == 0) {
    mc_note_error(MC_FN_close, errno, 0);
    fail(S, "cannot write %s (%s)", rel, strerror(errno));
    rc = -1;
  }
  if (rc == 0 && rename(tmp, path) != 0) {
    mc_note_error(MC_FN_rename, errno, 0);
    fail(S, "cannot rename %s (%s)", rel, strerror(errno));
    rc = -1;
  }
  if (rc != 0 && unlink(tmp) != 0) mc_note_error(MC_FN_unlink, errno, 0);
  return rc;
}

static int by_size_desc(const void *x, const void *y) {
  const live_t *a = x, *b = y;
  return a->size < b->size ? 1 : a->size > b->size ? -1 : (a->base > b->base) - (a->base < b->base);
}
static int by_base(const void *x, const void *y) {
  const live_t *a = x, *b = y;
  return (a->base > b->base) - (a->base < b->base);
}

/* The allocations to copy (size and id from the driver), largest skipped first over the budget:
 * taken[0, n) in address order, `skip` marked by size = its own (the caller reads skip[]). */
static int plan(snap_t *S, unsigned char *skip) {
  MC_LOCK(&live_lock);
  int n = nlive;
  memcpy(taken, live, (size_t)n * sizeof *live);
  MC_UNLOCK(&live_lock);
  for (int i = 0; i < n; i++) {   /* the driver's range: a size the API did not give, and the id */
    unsigned long long id = 0;
    size_t size = 0;
    CUdeviceptr start = 0;
    CUpointer_attribute at[3] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                 CU_POINTER_ATTRIBUTE_BUFFER_ID};
    void *data[3] = {&start, &size, &id};
    if (MC_CU(cuPointerGetAttributes, 3, at, data, (CUdeviceptr)taken[i].base) == CUDA_SUCCESS) {
      taken[i].id = id;
      if (!taken[i].size && start && start <= taken[i].base && taken[i].base - start < size)
        taken[i].size = size - (taken[i].base - start);
    }
  }
  qsort(taken, (size_t)n, sizeof *taken, by_size_desc);
  uint64_t total = 0;
  for (int i = 0; i < n; i++) total += taken[i].size;
  for (int i = 0; i < n; i++) {
    skip[i] = total > S->budget;
    if (skip[i]) { total -= taken[i].size; S->over += taken[i].size; }
  }
  /* back to address order, the marks with them */
  for (int i = 0; i < n; i++) if (skip[i]) taken[i].id |= 1ull << 63;
  qsort(taken, (size_t)n, sizeof *taken, by_base);
  for (int i = 0; i < n; i++) { skip[i] = (unsigned char)(taken[i].id >> 63); taken[i].id &= ~(1ull << 63); }
  S->written = total;
  return n;
}

static unsigned char skip_mark[SNAP_LIVE];

static void take(CUcontext ctx) {
  snap_t S = {.fd = -1, .budget = mc_knobs.snapshot_bytes};
  const char *dir = mc_pid_dir();
  char path[4400];
  unsigned char *buf = MAP_FAILED;
  if (!mc_files_ready() || !dir[0]) return;   /* capture is off: no folder to write into */
  CUresult r = MC_CU_ANSWER(cuCtxSynchronize_v2, ctx);
  if (r != CUDA_SUCCESS) {
    atomic_fetch_add(&mc_cnt.errors[MC_FN_cuCtxSynchronize_v2], 1);
    fail(&S, "cuCtxSynchronize failed with code %d", (int)r);
  }
  S.seq = (uint64_t)mc_next_seq(MC_F_LAUNCHES);
  S.t_ns = mc_now_ns();
  snprintf(path, sizeof path, "%s/snapshot", dir);
  if (!S.msg[0] && mkdir(path, 0755) != 0 && errno != EEXIST) {
    mc_note_error(MC_FN_mkdir, errno, 0);
    fail(&S, "cannot make %s (%s)", "snapshot/", strerror(errno));
  }
  struct stat st;
  if (!S.msg[0] && (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))) fail(&S, "snapshot/ is not a folder");
  snprintf(path, sizeof path, "%s/snapshot.jsonl", dir);
  S.fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (S.fd < 0) {
    mc_note_error(MC_FN_open, errno, 0);
    fail(&S, "cannot open snapshot.jsonl (%s)", strerror(errno));
  }
  int n = S.msg[0] ? 0 : plan(&S, skip_mark);
  struct rlimit fl;
  uint64_t fsize = getrlimit(RLIMIT_FSIZE, &fl) == 0 && fl.rlim_cur != RLIM_INFINITY ? (uint64_t)fl.rlim_cur : 0;
  struct statvfs vfs;
  snprintf(path, sizeof path, "%s/snapshot", dir);
  if (!S.msg[0] && statvfs(path, &vfs) == 0 &&
      (uint64_t)vfs.f_bavail * vfs.f_frsize < S.written + DISK_MARGIN)
    fail(&S, "the disk has %llu MB free, the snapshot needs %llu MB (and 64 MB for the dump)",
         (unsigned long long)((uint64_t)vfs.f_bavail * vfs.f_frsize >> 20), (unsigned long long)(S.written >> 20));
  if (!S.msg[0] && n && mc_room_check() != 0) fail(&S, "the address space is nearly full");
  if (!S.msg[0] && n) {
    buf = mmap(NULL, SNAP_CHUNK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
      mc_note_error(MC_FN_mmap, errno, 0);
      fail(&S, "cannot map the %llu MB copy buffer (%s)", SNAP_CHUNK >> 20, strerror(errno));
    }
  }
  char why[256], rel[64], over[160];
  snprintf(over, sizeof over, "largest first over MINE_CAPTURE_SNAPSHOT_BYTES=%llu",
           (unsigned long long)S.budget);
  for (int i = 0; i < n && !S.msg[0]; i++) {
    const live_t *a = &taken[i];
    S.regions++;
    if (skip_mark[i]) { S.skipped++; region_line(&S, a, "skipped", NULL, over); continue; }
    if (fsize && a->size > fsize) {
      S.failed++;
      region_line(&S, a, "failed", NULL, "larger than the file size limit (ulimit -f)");
      continue;
    }
    snprintf(rel, sizeof rel, "snapshot/%llx.bin", (unsigned long long)a->base);
    why[0] = 0;
    int rc = copy_region(&S, a, buf, rel, why, sizeof why);
    if (rc < 0) break;
    if (rc > 0) { S.failed++; region_line(&S, a, "failed", NULL, why); continue; }
    S.ok++;
    region_line(&S, a, "ok", rel, NULL);
  }
  if (buf != MAP_FAILED && munmap(buf, SNAP_CHUNK) != 0) mc_note_error(MC_FN_munmap, errno, 0);
  unsigned long long lost = atomic_load(&live_lost);
  const char *status = S.msg[0] ? "failed" : (S.failed || lost) ? "partial" : "ok";
  if (S.fd >= 0) {
    char msg[600] = "";
    if (S.msg[0]) snprintf(msg, sizeof msg, ",\"reason\":\"%s\"", S.msg);
    line(&S, "{\"event\":\"end\",\"status\":\"%s\",\"seq_before\":%llu,\"t_ns\":%llu,\"end_ns\":%llu,\"regions\":%d,"
         "\"ok\":%d,\"skipped\":%d,\"failed\":%d,\"bytes\":%llu,\"skipped_bytes\":%llu,\"budget\":%llu,"
         "\"lost\":%llu,\"deferred\":%llu%s}", status, (unsigned long long)S.seq, (unsigned long long)S.t_ns,
         (unsigned long long)mc_now_ns(), S.regions, S.ok, S.skipped, S.failed, (unsigned long long)S.written,
         (unsigned long long)S.over, (unsigned long long)S.budget, lost, (unsigned long long)atomic_load(&deferred), msg);
    if (close(S.fd) != 0) mc_note_error(MC_FN_close, errno, 0);
  }
  if (S.msg[0])
    fprintf(stderr, "[mine-capture] snapshot off in pid %d: %s (launch capture goes on)\n", mc_pid, S.msg);
  else if (S.failed || lost)
    fprintf(stderr, "[mine-capture] snapshot in pid %d: %d of %d allocations could not be copied, %llu not known "
            "(snapshot.jsonl says which)\n", mc_pid, S.failed, S.regions, lost);
}
