/* writer.c: JSON building in a per-thread buffer, the dump files, and sha256.
 *
 * Two writers (MINE_CAPTURE_WRITER; docs/dump-format.md "Writers"):
 *
 * mmap (opt-in; default write until the eager-forward regression in docs/benchmarks.md is understood)
 * for launches.jsonl and graphs.jsonl, the per-launch files. The file is a
 * MAP_SHARED mapping in fixed 64 MiB windows, each mapped once and never unmapped while the
 * process may write (so no thread can ever write into a vanished mapping). A record is built whole
 * in the calling thread's buffer, then its place is reserved with one lock-free 16-byte
 * compare-and-swap on {end offset, next seq} (x86-64 cmpxchg16b; elsewhere a mutex held for a few
 * instructions), so file order equals seq order with no lock on the launch path and no syscall.
 * The record's last byte ('\n') is stored first, then the rest: a record cut short by SIGKILL is
 * one bad line of its own and never glues onto a neighbour. The file is preallocated with
 * fallocate(2) ahead of the writers (geometric steps, 64 KiB .. 8 MiB) by whichever thread first
 * needs more; nobody touches a byte past what fallocate granted, so a full disk is an error return
 * (capture off, one stderr line), never a SIGBUS. A helper thread (started with the files, all
 * signals blocked, never calls CUDA) keeps 1 MiB ahead of the writers granted and faulted in
 * (MADV_POPULATE_WRITE): a first touch of a page costs ~2 us in a VM, which would otherwise land
 * on every ~6th launch. Woken by the record that crosses a 256 KiB mark. MINE_CAPTURE_PREFAULT=0
 * (diagnostic) starts no helper and faults nothing in ahead: pages fault on first touch, and the
 * writing thread grows the file itself.
 * A record that straddles two windows (or finds no mapping) is written with pwrite(2) at its
 * reserved offset (same page cache). At exit (atexit and the library destructor) the file is
 * sealed and truncated to its true length; records made after the seal are pwrite(2) appends.
 * Dirty pages of a shared file mapping belong to the page cache, so they survive SIGKILL; a
 * killed process (or one that leaves through _exit/exec) leaves a tail of NUL bytes after the
 * last record, and a record that was being written at the kill may be a line holding NULs or a
 * run of NULs in front of the next record. Readers: take the bytes after the last NUL of each line.
 * A filesystem without fallocate makes that file use the write writer.
 *
 * write for modules.jsonl, tensormaps.jsonl, allocs.jsonl and functions.jsonl (rare records; the file stays exact after any
 * death), and for all four files by default (MINE_CAPTURE_WRITER=write): one write(2) per record on an
 * O_APPEND descriptor, seq taken under the file's mutex together with the write.
 *
 * A failed write/fallocate turns capture off (one stderr line). Fork: the child drops the
 * parent's descriptors and mappings (without touching the parent's files) and opens its own
 * files at its first record. MINE_CAPTURE_MAX_BYTES bounds what we write. */
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
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static const char *const file_names[MC_F_COUNT] = {"launches.jsonl", "modules.jsonl", "graphs.jsonl",
                                                   "tensormaps.jsonl", "allocs.jsonl", "functions.jsonl",
                                                   "copies.jsonl"};
static const int file_seq[MC_F_COUNT] = {1, 0, 0, 1, 0, 0, 1};   /* records carry seq */
static const int file_hot[MC_F_COUNT] = {1, 0, 1, 0, 0, 0, 1};   /* mmap writer when chosen */
/* allocs.jsonl exists only with MINE_CAPTURE_ALLOC_LOG=1, functions.jsonl only with
 * MINE_CAPTURE_COMPACT=1, copies.jsonl unless MINE_CAPTURE_COPY_LOG=0 (their descriptors stay -1
 * otherwise). */
static const char *file_name(int f) {
  return f == MC_F_LAUNCHES && mc_knobs.bin ? "launches.bin" : file_names[f];
}
static int file_wanted(int f) {
  return (f != MC_F_ALLOCS || mc_knobs.alloc_log) && (f != MC_F_FUNCTIONS || mc_knobs.compact) &&
         (f != MC_F_COPIES || mc_knobs.copy_log);
}

#define WIN_SHIFT 26                           /* 64 MiB windows */
#define WIN_SIZE (1ull << WIN_SHIFT)
#define MAX_WIN 16384                          /* 1 TiB per file */
#define GROW_MIN (64ull << 10)
#define GROW_MAX (8ull << 20)
#ifndef PREFAULT
#define PREFAULT (256ull << 10)
#endif
#define SEALED (1ull << 63)

typedef struct {
  _Alignas(16) uint64_t st[2];  /* mmap: st[0] bytes reserved (= end), st[1] next seq | SEALED */
  int fd, mapped;               /* mapped: this file uses the mmap writer */
  int final;                    /* sealed and truncated (under grow) */
  int full;                     /* mmap: a record found no room; the file grows no more (under grow) */
  atomic_ullong size;           /* bytes fallocate granted; nobody touches a byte past it */
  atomic_ullong cut;            /* mmap: offset of the first record that could not be written (the
                                   file is cut there at exit); UINT64_MAX: none */
  uint64_t end;                 /* write writer: bytes of whole records in the file (under lock) */
  pthread_mutex_t grow;         /* fallocate, window mapping, seal */
  pthread_mutex_t lock;         /* write writer; mmap after the seal; reservation off x86-64 */
  int64_t seq;                  /* write writer */
  uint64_t populated;           /* helper thread only: prefaulted up to here */
  char *_Atomic win[MAX_WIN];
} wfile_t;

static wfile_t files[MC_F_COUNT];
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int need_open;        /* set in a forked child: open files at first record */
static atomic_ullong bytes_written;
static atomic_int populate_off;
static char pid_dir[4200];
#define AHEAD (1ull << 20)             /* the helper keeps this much ahead granted and faulted in */
static pthread_mutex_t helper_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t helper_cond = PTHREAD_COND_INITIALIZER;
static int helper_work, helper_on;
static int files_pid;               /* the process the open files belong to */
static uint64_t fsize_max;          /* RLIMIT_FSIZE at open (0: none): a write past it would raise
                                       SIGXFSZ in the host, so the writers stop short of it */

/* ---- the allocation choke point (mc.h) ---- */
void *(*mc_sys_realloc)(void *, size_t) = realloc;

void *mc_realloc(void *p, size_t n) {
  if (n >= (1u << 20) && mc_room_check() != 0) return NULL; /* room.c: never the host's last MB */
  void *q = mc_sys_realloc(p, n ? n : 1);
  if (!q) mc_note_error(MC_FN_malloc, ENOMEM, 1);
  return q;
}

void *mc_malloc(size_t n) { return mc_realloc(NULL, n); }

void *mc_calloc(size_t k, size_t n) {
  if (n && k > SIZE_MAX / n) { mc_note_error(MC_FN_malloc, EOVERFLOW, 1); return NULL; }
  void *p = mc_realloc(NULL, k * n);
  if (p) memset(p, 0, k * n);
  return p;
}

char *mc_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = mc_realloc(NULL, n);
  if (p) memcpy(p, s, n);
  return p;
}

__thread mc_tl_t *mc_tl_cur __attribute__((tls_model("initial-exec")));

/* ---- the thread's block (mc.h mc_tl_t) ----
 * Made through the choke point (a failure turns capture off with its one line; this thread then
 * keeps no block and its callbacks return at once, as every thread's do once capture is off) and
 * registered under a key whose destructor frees it when the thread exits. Hazard: glibc runs key
 * destructors only at a thread's exit, not at exit(); the main thread's block is the process's.
 * The library is never unloaded (the driver keeps its injection library for the process's life),
 * so the destructor's code outlives every thread. */
static pthread_key_t tl_key;
static pthread_once_t tl_key_once = PTHREAD_ONCE_INIT;
static int tl_key_ok;

static void tl_free(void *p) {
  mc_tl_t *t = p;
  if (mc_tl_cur == t) mc_tl_cur = NULL; /* a callback after this (another key's destructor) makes a new one */
  free(t->jb.p);
  free(t->block);
}

static void tl_key_make(void) { tl_key_ok = MC_C(pthread_key_create, 1, pthread_key_create(&tl_key, tl_free)) == 0; }

mc_tl_t *mc_tl_new(void) {
  if (MC_C(pthread_once, 1, pthread_once(&tl_key_once, tl_key_make)) != 0 || !tl_key_ok) return NULL;
  if (mc_room_check() != 0) return NULL;
  char *block = mc_malloc(sizeof(mc_tl_t) + 63);
  if (!block) return NULL;
  mc_tl_t *t = (mc_tl_t *)(((uintptr_t)block + 63) & ~(uintptr_t)63);
  memset(t, 0, sizeof *t);
  t->block = block;
  if (MC_C(pthread_setspecific, 1, pthread_setspecific(tl_key, t)) != 0) { free(block); return NULL; }
  mc_tl_cur = t;
  return t;
}

jb_t *jb_thread(void) { /* NULL: this thread has no block (capture is off) */
  mc_tl_t *t = mc_tl_get();
  if (!t) return NULL;
  jb_t *b = &t->jb;
  if (b->cap < 4096) {
    char *p = mc_realloc(b->p, 4096);
    if (!p) return NULL;
    b->p = p; b->cap = 4096;
  }
  b->n = JB_SEQ_ROOM;
  b->bad = 0;
  return b;
}

/* Out of memory inside the host is the host's problem to meet, not ours to cause: the record
 * being built is marked bad, every later append is a no-op, mc_write_record drops it, and the
 * choke point has turned capture off. */
int jb_need(jb_t *b, size_t more) {
  if (b->bad) return -1;
  if (b->n + more <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < b->n + more) cap *= 2;
  char *p = mc_realloc(b->p, cap); /* thread-local: nobody else reads it */
  if (!p) { b->bad = 1; return -1; }
  b->p = p; b->cap = cap;
  return 0;
}

void jb_raw(jb_t *b, const char *s, size_t n) {
  if (jb_need(b, n)) return;
  memcpy(b->p + b->n, s, n);
  b->n += n;
}

void jb_str(jb_t *b, const char *s) {
  static const char hx[] = "0123456789abcdef";
  size_t n = s ? strlen(s) : 0;
  if (jb_need(b, n * 6 + 2)) return;
  char *o = b->p + b->n;
  *o++ = '"';
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') { *o++ = '\\'; *o++ = (char)c; }
    else if (c < 0x20 || c >= 0x7f) { /* keep output ASCII: bytes as \u00XX */
      *o++ = '\\'; *o++ = 'u'; *o++ = '0'; *o++ = '0'; *o++ = hx[c >> 4]; *o++ = hx[c & 15];
    } else *o++ = (char)c;
  }
  *o++ = '"';
  b->n = (size_t)(o - b->p);
}

void jb_u64(jb_t *b, uint64_t v) {
  char t[24]; int i = 24;
  do { t[--i] = (char)('0' + v % 10); v /= 10; } while (v);
  jb_raw(b, t + i, (size_t)(24 - i));
}

void jb_i64(jb_t *b, int64_t v) {
  if (v < 0) { jb_lit(b, "-"); jb_u64(b, (uint64_t)(-(v + 1)) + 1); }
  else jb_u64(b, (uint64_t)v);
}

void jb_ptr(jb_t *b, uint64_t v) {
  static const char hx[] = "0123456789abcdef";
  char t[24]; int i = 24;
  t[--i] = '"';
  do { t[--i] = hx[v & 15]; v >>= 4; } while (v);
  t[--i] = 'x'; t[--i] = '0'; t[--i] = '"';
  jb_raw(b, t + i, (size_t)(24 - i));
}

void jb_hex(jb_t *b, const void *p, size_t n) {
  static const char hx[] = "0123456789abcdef";
  const unsigned char *s = p;
  if (jb_need(b, 2 * n + 2)) return;
  char *o = b->p + b->n;
  *o++ = '"';
  for (size_t i = 0; i < n; i++) { *o++ = hx[s[i] >> 4]; *o++ = hx[s[i] & 15]; }
  *o++ = '"';
  b->n = (size_t)(o - b->p);
}

/* A failed call that turns capture off: counted under its name, with no "capture goes on" note
 * (the one stderr line is the disable's). */
static void counted(int fn) { atomic_fetch_add(&mc_cnt.errors[fn], 1); }

const char *mc_pid_dir(void) { return pid_dir; }
const char *mc_writer_name(void) { return mc_knobs.writer_write ? "write" : "mmap"; }
static int mkdir_p(const char *path) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *s = tmp + 1; *s; s++) {
    if (*s != '/') continue;
    *s = 0;
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
    *s = '/';
  }
  if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
  struct stat st;
  if (stat(tmp, &st) != 0 || !S_ISDIR(st.st_mode)) { errno = ENOTDIR; return -1; }
  return 0;
}

static void wfile_init(wfile_t *F) {
  F->fd = -1; F->mapped = 0; F->final = 0; F->full = 0; F->seq = 0; F->populated = 0; F->end = 0;
  F->st[0] = F->st[1] = 0;
  atomic_store(&F->size, 0);
  atomic_store(&F->cut, UINT64_MAX);
  pthread_mutex_init(&F->grow, NULL);
  pthread_mutex_init(&F->lock, NULL);
}

/* Grants bytes up to at least `want` (geometric steps; never past RLIMIT_FSIZE). 0 when `end` is
 * granted afterwards (it may be although the grow failed: a record that fits is written); else -1
 * with errno (fallocate's, or EFBIG at the size limit). Under F->grow. */
static int grow_locked(wfile_t *F, uint64_t end, uint64_t want) {
  uint64_t size = atomic_load_explicit(&F->size, memory_order_relaxed);
  if (size >= want || F->final || F->full) { errno = ENOSPC; return end <= size ? 0 : -1; }
  uint64_t step = size < GROW_MIN ? GROW_MIN : size > GROW_MAX ? GROW_MAX : size;
  uint64_t to = size + step;
  if (to < want) to = (want + GROW_MIN - 1) / GROW_MIN * GROW_MIN;
  if (fsize_max && to > fsize_max) to = fsize_max;
  if (to <= size) { errno = EFBIG; return end <= size ? 0 : -1; }
  int r;
  do r = fallocate(F->fd, 0, (off_t)size, (off_t)(to - size)); while (r != 0 && errno == EINTR);
  if (r != 0) return end <= size ? 0 : -1;
  atomic_store_explicit(&F->size, to, memory_order_release);
  if (to < want) errno = EFBIG;
  return end <= to ? 0 : -1;
}

static char *window(wfile_t *F, uint64_t k) {
  char *w = atomic_load_explicit(&F->win[k], memory_order_acquire);
  if (w) return w;
  MC_LOCK(&F->grow);
  w = atomic_load_explicit(&F->win[k], memory_order_relaxed);
  if (!w && F->fd >= 0 && mc_room_check() == 0) {
    void *m = mmap(NULL, WIN_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, F->fd, (off_t)(k << WIN_SHIFT));
    if (m == MAP_FAILED) mc_note_error(MC_FN_mmap, errno, 0); /* records here go through pwrite */
    else atomic_store_explicit(&F->win[k], w = m, memory_order_release);
  }
  MC_UNLOCK(&F->grow);
  return w;
}

/* The helper thread: grants and faults in the next AHEAD bytes of each mapped file, so the
 * launch path finds its pages present (a first touch costs microseconds in a VM). Woken when a
 * record crosses a PREFAULT mark; it never calls CUDA and has every signal blocked. If it is
 * missing or behind, the launching thread grows and faults by itself: slower, never wrong. */
static void prefault_ahead(wfile_t *F) {
  uint64_t end = __atomic_load_n(&F->st[0], __ATOMIC_RELAXED);
  uint64_t target = end / PREFAULT * PREFAULT + AHEAD;
  MC_LOCK(&F->grow);
  int ok = !F->final && F->fd >= 0 && grow_locked(F, 0, target) == 0;
  uint64_t size = atomic_load_explicit(&F->size, memory_order_relaxed);
  MC_UNLOCK(&F->grow);
  if (!ok) return;
  if (target > size) target = size; /* a failed grow is seen, and reported, by the record that needs it */
  if (F->populated < end / PREFAULT * PREFAULT) F->populated = end / PREFAULT * PREFAULT;
  while (F->populated < target && !atomic_load_explicit(&populate_off, memory_order_relaxed)) {
    char *w = window(F, F->populated >> WIN_SHIFT);
    if (!w) return;
    if (madvise(w + (F->populated & (WIN_SIZE - 1)), PREFAULT, MADV_POPULATE_WRITE) != 0) {
      if (errno == EINVAL) atomic_store(&populate_off, 1); /* kernel before 5.14 */
      return; /* EFAULT after the seal cut the file: nothing to do */
    }
    F->populated += PREFAULT;
  }
}

static void *helper_main(void *arg) {
  (void)arg;
  for (;;) {
    MC_LOCK(&helper_lock);
    while (!helper_work) pthread_cond_wait(&helper_cond, &helper_lock);
    helper_work = 0;
    MC_UNLOCK(&helper_lock);
    for (int f = 0; f < MC_F_COUNT; f++)
      if (files[f].mapped) prefault_ahead(&files[f]);
  }
  return NULL;
}

static void helper_kick(void) {
  MC_LOCK(&helper_lock);
  helper_work = 1;
  pthread_cond_signal(&helper_cond);
  MC_UNLOCK(&helper_lock);
}

/* Our own threads (the mmap writer's helper, the callback toggler) are detached, small, and block
 * every signal, so the host's signals never land in them. 0 ok. */
int mc_thread_start(void *(*fn)(void *), void *arg) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_t t;
  pthread_attr_t a;
  if (MC_C(pthread_attr, 0, pthread_attr_init(&a)) != 0) return -1;
  int rc = MC_C(pthread_attr, 0, pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED));
  if (rc == 0) rc = MC_C(pthread_attr, 0, pthread_attr_setstacksize(&a, 64 << 10));
  if (rc == 0 && MC_C(pthread_sigmask, 0, pthread_sigmask(SIG_SETMASK, &all, &old)) == 0) {
    rc = MC_C(pthread_create, 0, pthread_create(&t, &a, fn, arg));
    MC_C(pthread_sigmask, 0, pthread_sigmask(SIG_SETMASK, &old, NULL));
  } else if (rc == 0) rc = -1;
  MC_C(pthread_attr, 0, pthread_attr_destroy(&a));
  return rc == 0 ? 0 : -1;
}

static void helper_start(void) {
  helper_on = mc_thread_start(helper_main, NULL) == 0;
  if (helper_on) helper_kick();
}

static int open_one(int f) {
  wfile_t *F = &files[f];
  char p[4300];
  if (!file_wanted(f)) return 0;
  snprintf(p, sizeof p, "%s/%s", pid_dir, file_name(f));
  int mapped = file_hot[f] && !mc_knobs.writer_write;
  F->fd = open(p, (mapped ? O_RDWR : O_WRONLY | O_APPEND) | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (F->fd < 0) {
    counted(MC_FN_open);
    mc_disable("cannot open %s (%s)", p, strerror(errno));
    return -1;
  }
  if (mapped) {
    MC_LOCK(&F->grow);
    int r = grow_locked(F, GROW_MIN, GROW_MIN);
    int e = errno;
    MC_UNLOCK(&F->grow);
    if (r != 0 && (e == EOPNOTSUPP || e == ENOSYS || e == EINVAL)) {
      mapped = 0; /* no fallocate here: a sparse mapping could SIGBUS on a full disk */
      if (fcntl(F->fd, F_SETFL, O_APPEND) != 0) mc_note_error(MC_FN_open, errno, 0);
    } else if (r != 0) {
      counted(MC_FN_fallocate);
      mc_disable("cannot allocate %s (%s)", p, strerror(e));
      return -1;
    }
  }
  F->mapped = mapped;
  return 0;
}

int mc_files_open(void) {
  char p[4300];
  snprintf(pid_dir, sizeof pid_dir, "%s/pid%d", mc_knobs.dir, mc_pid);
  if (mkdir_p(pid_dir) != 0) {
    counted(MC_FN_mkdir);
    mc_disable("cannot create %s (%s)", pid_dir, strerror(errno));
    return -1;
  }
  snprintf(p, sizeof p, "%s/cubins", pid_dir);
  if (mkdir(p, 0755) != 0 && errno != EEXIST) {
    counted(MC_FN_mkdir);
    mc_disable("cannot create %s (%s)", p, strerror(errno));
    return -1;
  }
  struct rlimit lim;
  fsize_max = getrlimit(RLIMIT_FSIZE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY ? (uint64_t)lim.rlim_cur : 0;
  /* meta.json first, with the room its exit rewrite needs (init.c): a process whose meta.json
   * cannot be written has turned capture off and leaves no folder behind */
  mc_meta_write(0);
  if (atomic_load(&mc_off)) {
    rmdir(p);
    rmdir(pid_dir);
    return -1;
  }
  files_pid = mc_pid;
  for (int f = 0; f < MC_F_COUNT; f++) {
    wfile_init(&files[f]);
    if (open_one(f) != 0) return -1;
  }
  atomic_store(&bytes_written, 0);
  if ((files[MC_F_LAUNCHES].mapped || files[MC_F_GRAPHS].mapped) && !mc_knobs.no_prefault) helper_start();
  return 0;
}

void mc_files_reset_after_fork(void) {
  /* Only this (child) process's view goes: the parent's files stay as they are. */
  for (int f = 0; f < MC_F_COUNT; f++) {
    wfile_t *F = &files[f];
    for (int k = 0; k < MAX_WIN; k++) {
      char *w = atomic_load(&F->win[k]);
      if (w && munmap(w, WIN_SIZE) != 0) mc_note_error(MC_FN_munmap, errno, 0);
      atomic_store(&F->win[k], NULL);
    }
    if (F->fd >= 0 && close(F->fd) != 0) mc_note_error(MC_FN_close, errno, 0);
    wfile_init(F);
    F->final = 1; /* nothing to seal until the child opens its own */
  }
  pthread_mutex_init(&open_lock, NULL);
  pthread_mutex_init(&helper_lock, NULL); /* the helper thread is not in the child */
  pthread_cond_init(&helper_cond, NULL);
  helper_work = helper_on = 0;
  files_pid = 0;
  atomic_store(&need_open, 1);
}

int mc_files_ready(void) {
  if (atomic_load_explicit(&mc_off, memory_order_relaxed)) return 0;
  if (atomic_load_explicit(&need_open, memory_order_acquire)) {
    MC_LOCK(&open_lock);
    if (atomic_load(&need_open)) {
      mc_files_open();
      atomic_store_explicit(&need_open, 0, memory_order_release);
    }
    MC_UNLOCK(&open_lock);
  }
  return !atomic_load_explicit(&mc_off, memory_order_relaxed);
}

static int write_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) { if (w == 0) errno = ENOSPC; return -1; }
    p += w; n -= (size_t)w;
  }
  return 0;
}

static int pwrite_all(int fd, const char *p, size_t n, uint64_t off) {
  while (n) {
    ssize_t w = pwrite(fd, p, n, (off_t)off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) { if (w == 0) errno = ENOSPC; return -1; }
    p += w; n -= (size_t)w; off += (uint64_t)w;
  }
  return 0;
}

static unsigned ndigits(uint64_t v) {
  unsigned n = 1;
  while (v >= 10) { v /= 10; n++; }
  return n;
}

/* Puts `{"seq":N,` (or `{`) right in front of the body at b->p + JB_SEQ_ROOM; returns the start. */
static char *put_prefix(jb_t *b, int with_seq, uint64_t seq) {
  char *body = b->p + JB_SEQ_ROOM;
  if (with_seq == 2) { memcpy(body + 8, &seq, 8); return body; } /* binary: seq at +8 */
  if (!with_seq) { body[-1] = '{'; return body - 1; }
  char *o = body;
  *--o = ',';
  do { *--o = (char)('0' + seq % 10); seq /= 10; } while (seq);
  static const char pre[] = "{\"seq\":";
  o -= sizeof pre - 1;
  memcpy(o, pre, sizeof pre - 1);
  return o;
}

#if defined(__x86_64__)
/* 16-byte compare-and-swap: on failure `e` holds the current value. */
static inline int cas16(uint64_t *p, uint64_t e[2], uint64_t lo, uint64_t hi) {
  unsigned char ok;
  __asm__ __volatile__("lock cmpxchg16b %1\n\tsetz %0"
                       : "=q"(ok), "+m"(*(volatile __int128 *)p), "+a"(e[0]), "+d"(e[1])
                       : "b"(lo), "c"(hi)
                       : "memory", "cc");
  return ok;
}
#endif

/* Reserves len bytes (and a seq) in a mapped file. 0 ok, 1 sealed (use the locked path), -1 full. */
static int reserve(wfile_t *F, size_t body, int with_seq, uint64_t *off, uint64_t *seq, size_t *len) {
#if defined(__x86_64__)
  uint64_t e[2] = {__atomic_load_n(&F->st[0], __ATOMIC_RELAXED), __atomic_load_n(&F->st[1], __ATOMIC_RELAXED)};
  for (;;) {
    if (e[1] & SEALED) return 1;
    size_t l = with_seq == 2 ? body : body + (with_seq ? 8 + ndigits(e[1]) : 1);
    if (e[0] + l > (uint64_t)MAX_WIN << WIN_SHIFT) return -1;
    if (cas16(F->st, e, e[0] + l, e[1] + (with_seq ? 1 : 0))) {
      *off = e[0]; *seq = e[1]; *len = l;
      return 0;
    }
  }
#else
  MC_LOCK(&F->lock);
  int rc = 0;
  if (F->st[1] & SEALED) rc = 1;
  else {
    size_t l = with_seq == 2 ? body : body + (with_seq ? 8 + ndigits(F->st[1]) : 1);
    if (F->st[0] + l > (uint64_t)MAX_WIN << WIN_SHIFT) rc = -1;
    else { *off = F->st[0]; *seq = F->st[1]; *len = l; F->st[0] += l; F->st[1] += with_seq ? 1 : 0; }
  }
  MC_UNLOCK(&F->lock);
  return rc;
#endif
}

static int64_t write_failed(int file, int fn, int e) {
  counted(fn);
  mc_disable("cannot write %s/%s (%s)", pid_dir, file_name(file), strerror(e));
  return -1;
}

/* One record appended at the file's end [p, p+n) under F->lock (the write writer; the mmap writer
 * after the seal, at `F->end` = the sealed length): whole or not at all. A write cut short (the
 * filesystem filled up mid-record) is cut back off with ftruncate, so the file holds whole records
 * only and the record counts as not written; a write past RLIMIT_FSIZE is not tried (it would
 * raise SIGXFSZ in the host). Once capture is off nothing more is written: a record whose thread
 * was already past the gate is dropped (counted under "off"). 0 written; 1 dropped; -1 failed
 * (errno set). */
static int append_locked(wfile_t *F, const char *p, size_t n) {
  if (atomic_load_explicit(&mc_off, memory_order_relaxed)) return 1;
  if (F->fd < 0) { errno = EBADF; return -1; }
  if (fsize_max && F->end + n > fsize_max) { errno = EFBIG; return -1; }
  if ((F->mapped ? pwrite_all(F->fd, p, n, F->end) : write_all(F->fd, p, n)) == 0) {
    F->end += n;
    return 0;
  }
  int e = errno;
  if (ftruncate(F->fd, (off_t)F->end) != 0) mc_note_error(MC_FN_ftruncate, errno, 0);
  errno = e;
  return -1;
}

static int64_t append_failed(int file, int rc, int e) {
  if (rc > 0) { atomic_fetch_add(&mc_cnt.dropped[MC_DROP_OFF], 1); return -1; }
  return write_failed(file, files[file].mapped ? MC_FN_pwrite : MC_FN_write, e);
}

/* A mapped file's record at `off` could not be written (no room for it, or its pwrite failed):
 * the file grows no more, so every record reserved after it fails too and every one before it
 * fits; at exit the file is cut at the lowest such offset, leaving whole records only. */
static void lost_at(wfile_t *F, uint64_t off) {
  MC_LOCK(&F->grow);
  F->full = 1;
  MC_UNLOCK(&F->grow);
  uint64_t c = atomic_load(&F->cut);
  while (off < c && !atomic_compare_exchange_weak(&F->cut, &c, off)) {}
}

/* After a record's place [off, off+len) was reserved: makes sure the file covers it (grows it
 * when the helper is behind). 0 ok; -1 capture turned off. */
static int cover(int file, wfile_t *F, uint64_t off, uint64_t end) {
  if (end + PREFAULT <= atomic_load_explicit(&F->size, memory_order_acquire)) return 0;
  MC_LOCK(&F->grow);
  int g = grow_locked(F, end, end + PREFAULT);
  int e = errno;
  MC_UNLOCK(&F->grow);
  if (g == 0) return 0;
  lost_at(F, off);
  counted(MC_FN_fallocate);
  mc_disable("cannot allocate %s/%s (%s)", pid_dir, file_name(file), strerror(e));
  return -1;
}

/* The window address of [off, off+len), or NULL when it straddles two windows or has no mapping
 * (such a record goes through pwrite(2) at its offset). */
static char *place_of(wfile_t *F, uint64_t off, size_t len) {
  uint64_t k = off >> WIN_SHIFT;
  char *w = ((off + len - 1) >> WIN_SHIFT) == k ? window(F, k) : NULL;
  return w ? w + (off & (WIN_SIZE - 1)) : NULL;
}

/* After a record ending at `end` was stored at dst (NULL: pwrite): the next records' cache lines
 * are asked for now (for writing), so the next launch, microseconds later, does not wait for them;
 * and a record that crossed a PREFAULT mark has the helper fault in what comes next (or, without
 * it, does so itself). */
static void after_store(wfile_t *F, char *dst, uint64_t off, uint64_t end) {
  if (dst) { /* past the window's end the hint is simply not given */
    uint64_t len = end - off, at = (off & (WIN_SIZE - 1)) + len;
    for (unsigned k = 0; k < 4 && at + 64 * k < WIN_SIZE; k++) __builtin_prefetch(dst + len + 64 * k, 1, 3);
  }
  if (off / PREFAULT == end / PREFAULT) return;
  if (helper_on) { helper_kick(); return; }
  if (mc_knobs.no_prefault || atomic_load_explicit(&populate_off, memory_order_relaxed)) return;
  uint64_t at = end / PREFAULT * PREFAULT + PREFAULT;
  if (at + PREFAULT <= atomic_load_explicit(&F->size, memory_order_acquire) && !F->final) {
    char *pw = window(F, at >> WIN_SHIFT);
    if (pw && madvise(pw + (at & (WIN_SIZE - 1)), PREFAULT, MADV_POPULATE_WRITE) != 0 && errno == EINVAL)
      atomic_store(&populate_off, 1); /* kernel before 5.14: faults happen on first touch */
  }
}

static int64_t write_mapped(int file, jb_t *b, int with_seq) {
  wfile_t *F = &files[file];
  uint64_t off, seq;
  size_t len;
  int r = reserve(F, b->n - JB_SEQ_ROOM, with_seq, &off, &seq, &len);
  if (r < 0) return write_failed(file, MC_FN_pwrite, EFBIG);
  if (r > 0) { /* sealed at exit: appends under the lock, after everything reserved before */
    MC_LOCK(&F->lock);
    off = __atomic_load_n(&F->st[0], __ATOMIC_RELAXED);
    seq = __atomic_load_n(&F->st[1], __ATOMIC_RELAXED) & ~SEALED;
    char *start = put_prefix(b, with_seq, seq);
    len = (size_t)(b->p + b->n - start);
    F->end = off;    /* the file was cut here at the seal (a record lost before: nothing more) */
    int rc = atomic_load(&F->cut) != UINT64_MAX ? 1 : append_locked(F, start, len);
    int e = errno;
    if (rc == 0) {
      __atomic_store_n(&F->st[0], off + len, __ATOMIC_RELAXED);
      __atomic_store_n(&F->st[1], (seq + (with_seq ? 1 : 0)) | SEALED, __ATOMIC_RELAXED);
    }
    MC_UNLOCK(&F->lock);
    return rc == 0 ? (int64_t)seq : append_failed(file, rc, e);
  }
  char *start = put_prefix(b, with_seq, seq);
  uint64_t end = off + len;
  if (cover(file, F, off, end) != 0) return -1;
  char *dst = place_of(F, off, len);
  if (dst) {
    if (with_seq == 2) {                        /* binary: the header's len+magic last (commit) */
      memcpy(dst + 8, start + 8, len - 8);
      atomic_signal_fence(memory_order_seq_cst);
      uint64_t head;
      memcpy(&head, start, 8);
      __atomic_store_n((uint64_t *)(void *)dst, head, __ATOMIC_RELAXED);
    } else {
      dst[len - 1] = '\n';                      /* first: a cut record stays a line of its own */
      atomic_signal_fence(memory_order_seq_cst);
      memcpy(dst, start, len - 1);
    }
  } else if (pwrite_all(F->fd, start, len, off) != 0) {
    return write_failed(file, MC_FN_pwrite, errno);
  }
  after_store(F, with_seq == 2 ? dst : NULL, off, end);
  return with_seq ? (int64_t)seq : 0;
}

/* A binary record built where it will stay (no copy): see mc.h. */
int mc_bin_place(int file, size_t len, mc_place_t *pl) {
  wfile_t *F = &files[file];
  if (!F->mapped || !mc_files_ready()) return 0;
  if (mc_knobs.max_bytes && atomic_fetch_add(&bytes_written, len) + len > mc_knobs.max_bytes) {
    atomic_fetch_add(&mc_cnt.dropped[MC_DROP_MAX_BYTES], 1);
    return -1;
  }
  uint64_t off, seq;
  size_t l;
  int r = reserve(F, len, 2, &off, &seq, &l);
  if (r < 0) { write_failed(file, MC_FN_pwrite, EFBIG); return -1; }
  if (r > 0) {  /* sealed at exit: the buffer path appends under the lock */
    if (mc_knobs.max_bytes) atomic_fetch_sub(&bytes_written, len);
    return 0;
  }
  if (cover(file, F, off, off + len) != 0) return -1;
  pl->file = file; pl->off = off; pl->len = len; pl->seq = (int64_t)seq;
  pl->dst = (unsigned char *)place_of(F, off, len);
  pl->scratch = NULL;
  if (!pl->dst) { /* straddles two windows: built in this thread's buffer, then pwrite(2) */
    jb_t *b = jb_thread();
    if (!b || jb_need(b, len)) { write_failed(file, MC_FN_pwrite, ENOMEM); return -1; }
    pl->dst = (unsigned char *)b->p + JB_SEQ_ROOM;
    pl->scratch = b;
  }
  return 1;
}

int64_t mc_bin_commit(const mc_place_t *pl, uint64_t head) {
  wfile_t *F = &files[pl->file];
  if (pl->scratch) {
    memcpy(pl->dst, &head, 8);
    if (pwrite_all(F->fd, (const char *)pl->dst, pl->len, pl->off) != 0)
      return write_failed(pl->file, MC_FN_pwrite, errno);
    after_store(F, NULL, pl->off, pl->off + pl->len);
    return pl->seq;
  }
  atomic_signal_fence(memory_order_seq_cst);    /* everything else first: the header commits it */
  __atomic_store_n((uint64_t *)(void *)pl->dst, head, __ATOMIC_RELAXED);
  after_store(F, (char *)pl->dst, pl->off, pl->off + pl->len);
  return pl->seq;
}

/* A binary record (MINE_CAPTURE_FORMAT=bin): b holds it whole after JB_SEQ_ROOM, a multiple of 8
 * bytes, seq 0 at +8; the file's seq is patched in. Returns the seq, or -1 when dropped. */
int64_t mc_write_bin(int file, jb_t *b) {
  if (!mc_files_ready()) return -1;
  if (b->bad) {
    atomic_fetch_add(&mc_cnt.dropped[MC_DROP_NO_MEMORY], 1);
    return -1;
  }
  size_t body = b->n - JB_SEQ_ROOM;
  if (mc_knobs.max_bytes &&
      atomic_fetch_add(&bytes_written, body) + body > mc_knobs.max_bytes) {
    atomic_fetch_add(&mc_cnt.dropped[MC_DROP_MAX_BYTES], 1);
    return -1;
  }
  wfile_t *F = &files[file];
  if (F->mapped) return write_mapped(file, b, 2);
  MC_LOCK(&F->lock);
  int64_t seq = F->seq;
  char *start = put_prefix(b, 2, (uint64_t)seq);
  int rc = append_locked(F, start, body);
  int e = errno;
  if (rc == 0) F->seq++;
  MC_UNLOCK(&F->lock);
  return rc == 0 ? seq : append_failed(file, rc, e);
}

/* The seq the next record of `file` will get (launches: the counter an allocation event is
 * stamped with). Mapped: one atomic load; write writer: read under the file's lock. */
int64_t mc_next_seq(int file) {
  wfile_t *F = &files[file];
  if (F->mapped) return (int64_t)(__atomic_load_n(&F->st[1], __ATOMIC_ACQUIRE) & ~SEALED);
  MC_LOCK(&F->lock);
  int64_t s = F->seq;
  MC_UNLOCK(&F->lock);
  return s;
}

int64_t mc_write_record(int file, jb_t *b, int with_seq) {
  if (!mc_files_ready()) return -1;
  jb_lit(b, "}\n");
  if (b->bad) {
    atomic_fetch_add(&mc_cnt.dropped[MC_DROP_NO_MEMORY], 1);
    return -1;
  }
  size_t body = b->n - JB_SEQ_ROOM;
  if (mc_knobs.max_bytes &&
      atomic_fetch_add(&bytes_written, body + 24) + body + 24 > mc_knobs.max_bytes) {
    atomic_fetch_add(&mc_cnt.dropped[MC_DROP_MAX_BYTES], 1);
    return -1;
  }
  wfile_t *F = &files[file];
  with_seq = with_seq && file_seq[file];
  if (F->mapped) return write_mapped(file, b, with_seq);
  int64_t seq = 0;
  int rc;
  MC_LOCK(&F->lock);
  if (with_seq) seq = F->seq;
  char *start = put_prefix(b, with_seq, (uint64_t)seq);
  rc = append_locked(F, start, (size_t)(b->p + b->n - start));
  int e = errno;
  if (rc == 0 && with_seq) F->seq++;
  MC_UNLOCK(&F->lock);
  return rc == 0 ? seq : append_failed(file, rc, e);
}

/* Seals the mapped files and cuts them to their true length. Idempotent; atexit and destructor. */
void mc_files_finalize(void) {
  if (files_pid != mc_pid || !files_pid) return;
  for (int f = 0; f < MC_F_COUNT; f++) {
    wfile_t *F = &files[f];
    if (!F->mapped || F->fd < 0) continue;
    MC_LOCK(&F->grow);
    if (!F->final) {
#if defined(__x86_64__)
      uint64_t e[2] = {__atomic_load_n(&F->st[0], __ATOMIC_RELAXED), __atomic_load_n(&F->st[1], __ATOMIC_RELAXED)};
      while (!(e[1] & SEALED) && !cas16(F->st, e, e[0], e[1] | SEALED)) {}
#else
      MC_LOCK(&F->lock);
      F->st[1] |= SEALED;
      uint64_t e[2] = {F->st[0], F->st[1]};
      MC_UNLOCK(&F->lock);
#endif
      uint64_t end = e[0], size = atomic_load(&F->size), cut = atomic_load(&F->cut);
      if (end > cut) end = cut;   /* records from the first that found no room on: none written */
      if (end > size) { /* a thread reserved but has not grown yet: grant it exactly */
        if (grow_locked(F, end, end) != 0) { mc_note_error(MC_FN_fallocate, errno, 0); end = size; }
      }
      F->final = 1;
      if (ftruncate(F->fd, (off_t)end) != 0) mc_note_error(MC_FN_ftruncate, errno, 0);
    }
    MC_UNLOCK(&F->grow);
  }
}

static int write_failed_path(const char *path, int fn, int e) {
  counted(fn);
  mc_disable("cannot write %s (%s)", path, strerror(e));
  return -1;
}

int mc_write_file_once(const char *rel, const void *p, size_t n) {
  char path[4400], tmp[4500];
  snprintf(path, sizeof path, "%s/%s", pid_dir, rel);
  if (access(path, F_OK) == 0) return 0;
  if (mc_knobs.max_bytes && atomic_fetch_add(&bytes_written, n) + n > mc_knobs.max_bytes) {
    atomic_fetch_add(&mc_cnt.dropped[MC_DROP_MAX_BYTES], 1);
    return -1;
  }
  if (fsize_max && n > fsize_max) return write_failed_path(path, MC_FN_write, EFBIG); /* no SIGXFSZ */
  snprintf(tmp, sizeof tmp, "%s.%d.%d.tmp", path, mc_pid, mc_tid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) { counted(MC_FN_open); mc_disable("cannot open %s (%s)", tmp, strerror(errno)); return -1; }
  int rc = write_all(fd, p, n);
  int e = errno, fn = MC_FN_write;
  if (close(fd) != 0 && rc == 0) { rc = -1; e = errno; fn = MC_FN_close; }  /* a late write error */
  if (rc == 0 && rename(tmp, path) != 0) { rc = -1; e = errno; fn = MC_FN_rename; }
  if (rc != 0) {
    unlink(tmp);
    return write_failed_path(path, fn, e);
  }
  return 1;
}

/* ---- sha256 (FIPS 180-4), small and self-contained ---- */
#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))
static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static void sha_block(uint32_t h[8], const unsigned char *p) {
  uint32_t w[64];
  for (int i = 0; i < 16; i++)
    w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (int i = 0; i < 64; i++) {
    uint32_t t1 = k + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
    uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    k = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
  }
  h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += k;
}

void mc_sha256_hex(const void *data, size_t n, char out[65]) {
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  const unsigned char *p = data;
  size_t full = n / 64;
  for (size_t i = 0; i < full; i++) sha_block(h, p + 64 * i);
  unsigned char tail[128] = {0};
  size_t r = n - full * 64;
  memcpy(tail, p + full * 64, r);
  tail[r] = 0x80;
  size_t tl = r + 1 + 8 <= 64 ? 64 : 128;
  uint64_t bits = (uint64_t)n * 8;
  for (int i = 0; i < 8; i++) tail[tl - 1 - i] = (unsigned char)(bits >> (8 * i));
  sha_block(h, tail);
  if (tl == 128) sha_block(h, tail + 64);
  static const char hx[] = "0123456789abcdef";
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 4; j++) {
      unsigned char c = (unsigned char)(h[i] >> (24 - 8 * j));
      out[8 * i + 2 * j] = hx[c >> 4];
      out[8 * i + 2 * j + 1] = hx[c & 15];
    }
  out[64] = 0;
}
