/* A filesystem that fills up, for a test that cannot mount one (LD_PRELOAD; no root needed).
 *
 * Why: the capture library must keep its counters exact and its meta.json complete when the dump's
 * filesystem runs out of space mid-run (issue 14's stress run). A tmpfs needs a mount; this shim
 * gives the same answers to the calls the library makes, deterministically: FULLFS_DIR names a
 * folder, FULLFS_BUDGET a file whose first 8 bytes hold the bytes that every process sharing it
 * (a fork, an exec'd child: the variables are inherited) may still add to files under that folder.
 * A write(2)/pwrite(2) that would grow such a file past the budget writes what fits (a short write,
 * as a full disk answers) and the next one fails with ENOSPC; fallocate(2) gets all it asks or
 * ENOSPC; writing over bytes a file already holds needs no budget (as on a disk: its blocks are
 * there). Space given back (ftruncate, unlink) is not returned to the budget: the disk stays full.
 * Calls on other files, and every call when the variables are unset, go straight to libc. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static _Atomic long long *budget;
static char dir[4096];
static size_t dirlen;
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static int (*real_fallocate)(int, int, off_t, off_t);

__attribute__((constructor)) static void shim_init(void) {
  real_write = (ssize_t(*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
  real_pwrite = (ssize_t(*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, "pwrite");
  real_fallocate = (int (*)(int, int, off_t, off_t))dlsym(RTLD_NEXT, "fallocate");
  const char *d = getenv("FULLFS_DIR"), *b = getenv("FULLFS_BUDGET");
  if (!d || !b || !*d) return;
  int fd = open(b, O_RDWR | O_CLOEXEC);
  if (fd < 0) return;
  void *m = mmap(NULL, 8, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return;
  snprintf(dir, sizeof dir, "%s/", d);
  dirlen = strlen(dir);
  budget = m;
}

/* the file's size, or -1 when fd is not a file under FULLFS_DIR */
static off_t size_under(int fd) {
  char link[64], path[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0) return -1;
  path[n] = 0;
  struct stat st;
  if (strncmp(path, dir, dirlen) != 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return -1;
  return st.st_size;
}

/* takes up to `want` bytes of the budget (all or nothing with `all`); what it took */
static long long take(long long want, int all) {
  long long have = atomic_load(budget);
  for (;;) {
    long long got = have < want ? (all ? 0 : have) : want;
    if (got <= 0) return 0;
    if (atomic_compare_exchange_weak(budget, &have, have - got)) return got;
  }
}

/* n bytes at off: how many may be written (n, fewer, or 0 with errno ENOSPC) */
static size_t fits(int fd, off_t off, size_t n, off_t size) {
  off_t end = off + (off_t)n, from = off > size ? off : size;
  if (end <= size) return n;
  long long grow = end - from, got = take(grow, 0);
  if (got < grow) errno = ENOSPC;
  return (size_t)((long long)n - (grow - got));
}

ssize_t write(int fd, const void *p, size_t n) {
  off_t size = budget && n ? size_under(fd) : -1;
  if (size < 0) return real_write(fd, p, n);
  off_t off = (fcntl(fd, F_GETFL) & O_APPEND) ? size : lseek(fd, 0, SEEK_CUR);
  size_t k = fits(fd, off, n, size);
  return k ? real_write(fd, p, k) : -1;
}

ssize_t pwrite(int fd, const void *p, size_t n, off_t off) {
  off_t size = budget && n ? size_under(fd) : -1;
  if (size < 0) return real_pwrite(fd, p, n, off);
  size_t k = fits(fd, off, n, size);
  return k ? real_pwrite(fd, p, k, off) : -1;
}
ssize_t pwrite64(int fd, const void *p, size_t n, off_t off) { return pwrite(fd, p, n, off); }

int fallocate(int fd, int mode, off_t off, off_t len) {
  off_t size = budget ? size_under(fd) : -1;
  if (size < 0 || off + len <= size) return real_fallocate(fd, mode, off, len);
  long long grow = off + len - (off > size ? off : size);
  if (take(grow, 1) != grow) { errno = ENOSPC; return -1; }
  return real_fallocate(fd, mode, off, len);
}
int fallocate64(int fd, int mode, off_t off, off_t len) { return fallocate(fd, mode, off, len); }
