/* writer.c: JSON building in a per-thread buffer, the dump files, and sha256.
 *
 * Every record is one write(2) on an O_APPEND descriptor, built completely in the calling
 * thread's buffer first, so a SIGKILL leaves files that parse up to their last whole line.
 * Records that carry `seq` take the file's small mutex only around numbering and the write, so
 * file order equals seq order. A failed or short write turns capture off (one stderr line).
 * Not checked: free space ahead of time; MINE_CAPTURE_MAX_BYTES bounds what we write. */
#include "mc.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const file_names[MC_F_COUNT] = {"launches.jsonl", "modules.jsonl",
                                                   "graphs.jsonl", "tensormaps.jsonl"};
static int fds[MC_F_COUNT] = {-1, -1, -1, -1};
static int64_t seqs[MC_F_COUNT];
static pthread_mutex_t file_lock[MC_F_COUNT] = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
                                                PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER};
static pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int need_open;        /* set in a forked child: open files at first record */
static atomic_ullong bytes_written;
static char pid_dir[4200];

static __thread jb_t tl_jb;

jb_t *jb_thread(void) {
  jb_t *b = &tl_jb;
  if (b->cap < 4096) {
    char *p = realloc(b->p, 4096);
    if (!p) return NULL;
    b->p = p; b->cap = 4096;
  }
  b->n = JB_SEQ_ROOM;
  return b;
}

void jb_need(jb_t *b, size_t more) {
  if (b->n + more <= b->cap) return;
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < b->n + more) cap *= 2;
  char *p = realloc(b->p, cap); /* thread-local: nobody else reads it */
  if (!p) abort();              /* out of memory inside the host: nothing sane is left */
  b->p = p; b->cap = cap;
}

void jb_raw(jb_t *b, const char *s, size_t n) {
  jb_need(b, n);
  memcpy(b->p + b->n, s, n);
  b->n += n;
}

void jb_str(jb_t *b, const char *s) {
  static const char hx[] = "0123456789abcdef";
  size_t n = s ? strlen(s) : 0;
  jb_need(b, n * 6 + 2);
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
  jb_need(b, 2 * n + 2);
  char *o = b->p + b->n;
  *o++ = '"';
  for (size_t i = 0; i < n; i++) { *o++ = hx[s[i] >> 4]; *o++ = hx[s[i] & 15]; }
  *o++ = '"';
  b->n = (size_t)(o - b->p);
}

const char *mc_pid_dir(void) { return pid_dir; }

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

int mc_files_open(void) {
  char p[4300];
  snprintf(pid_dir, sizeof pid_dir, "%s/pid%d", mc_knobs.dir, mc_pid);
  if (mkdir_p(pid_dir) != 0) {
    mc_note_error(MC_FN_mkdir, errno, 0);
    mc_disable("cannot create %s (%s)", pid_dir, strerror(errno));
    return -1;
  }
  snprintf(p, sizeof p, "%s/cubins", pid_dir);
  if (mkdir(p, 0755) != 0 && errno != EEXIST) {
    mc_note_error(MC_FN_mkdir, errno, 0);
    mc_disable("cannot create %s (%s)", p, strerror(errno));
    return -1;
  }
  for (int f = 0; f < MC_F_COUNT; f++) {
    snprintf(p, sizeof p, "%s/%s", pid_dir, file_names[f]);
    fds[f] = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (fds[f] < 0) {
      mc_note_error(MC_FN_open, errno, 0);
      mc_disable("cannot open %s (%s)", p, strerror(errno));
      return -1;
    }
    seqs[f] = 0;
  }
  atomic_store(&bytes_written, 0);
  mc_meta_write(0);
  return 0;
}

void mc_files_reset_after_fork(void) {
  for (int f = 0; f < MC_F_COUNT; f++) {
    if (fds[f] >= 0) close(fds[f]);
    fds[f] = -1;
    pthread_mutex_init(&file_lock[f], NULL);
  }
  pthread_mutex_init(&open_lock, NULL);
  atomic_store(&need_open, 1);
}

int mc_files_ready(void) {
  if (atomic_load_explicit(&mc_off, memory_order_relaxed)) return 0;
  if (atomic_load_explicit(&need_open, memory_order_acquire)) {
    pthread_mutex_lock(&open_lock);
    if (atomic_load(&need_open)) {
      mc_files_open();
      atomic_store_explicit(&need_open, 0, memory_order_release);
    }
    pthread_mutex_unlock(&open_lock);
  }
  return !atomic_load_explicit(&mc_off, memory_order_relaxed);
}

static int write_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w; n -= (size_t)w;
  }
  return 0;
}

int64_t mc_write_record(int file, jb_t *b, int with_seq) {
  if (!mc_files_ready()) return -1;
  jb_lit(b, "}\n");
  size_t body = b->n - JB_SEQ_ROOM;
  if (mc_knobs.max_bytes &&
      atomic_fetch_add(&bytes_written, body + 24) + body + 24 > mc_knobs.max_bytes) {
    atomic_fetch_add(&mc_cnt.dropped[MC_DROP_MAX_BYTES], 1);
    return -1;
  }
  char *start;
  int64_t seq = -1;
  int rc;
  pthread_mutex_lock(&file_lock[file]);
  if (with_seq) {
    seq = seqs[file]++;
    char t[JB_SEQ_ROOM]; int i = JB_SEQ_ROOM;
    t[--i] = ',';
    uint64_t v = (uint64_t)seq;
    do { t[--i] = (char)('0' + v % 10); v /= 10; } while (v);
    static const char pre[] = "{\"seq\":";
    i -= (int)sizeof pre - 1;
    memcpy(t + i, pre, sizeof pre - 1);
    start = b->p + JB_SEQ_ROOM - (JB_SEQ_ROOM - i);
    memcpy(start, t + i, (size_t)(JB_SEQ_ROOM - i));
  } else {
    start = b->p + JB_SEQ_ROOM - 1;
    *start = '{';
  }
  rc = fds[file] >= 0 ? write_all(fds[file], start, (size_t)(b->p + b->n - start)) : -1;
  if (rc != 0 && with_seq) seqs[file]--;
  pthread_mutex_unlock(&file_lock[file]);
  if (rc != 0) {
    mc_note_error(MC_FN_write, errno, 0);
    mc_disable("cannot write %s/%s (%s)", pid_dir, file_names[file], strerror(errno));
    return -1;
  }
  return with_seq ? seq : 0;
}

int mc_write_file_once(const char *rel, const void *p, size_t n) {
  char path[4400], tmp[4500];
  snprintf(path, sizeof path, "%s/%s", pid_dir, rel);
  if (access(path, F_OK) == 0) return 0;
  if (mc_knobs.max_bytes && atomic_fetch_add(&bytes_written, n) + n > mc_knobs.max_bytes) {
    atomic_fetch_add(&mc_cnt.dropped[MC_DROP_MAX_BYTES], 1);
    return -1;
  }
  snprintf(tmp, sizeof tmp, "%s.%d.%d.tmp", path, mc_pid, mc_tid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) { mc_note_error(MC_FN_open, errno, 0); mc_disable("cannot open %s (%s)", tmp, strerror(errno)); return -1; }
  int rc = write_all(fd, p, n);
  int e = errno;
  close(fd);
  if (rc != 0 || rename(tmp, path) != 0) {
    unlink(tmp);
    mc_note_error(MC_FN_write, e, 0);
    mc_disable("cannot write %s (%s)", path, strerror(e));
    return -1;
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
