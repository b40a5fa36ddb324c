/* The address-space guard: under `ulimit -v` the library must never be the reason the host's own
 * allocations fail.
 *
 * Contract: when RLIMIT_AS is finite at start, the library reserves RESERVE bytes of address space
 * (PROT_NONE, no memory behind it). Whenever capture turns off, for any reason, the reserve is given
 * back, so the host regains at least what the library took since. Before the library grows its own
 * address space (a new thread's block, a writer window, a buffer of 1 MiB or more) it checks the room
 * left under the limit; below LOW_ROOM it turns capture off with one line on stderr instead of
 * taking more. Why a reserve and not only the check: the host's own last allocations (thread stacks,
 * the driver's JIT, glibc's lazily made TLS of CUPTI) may come before ours; measured on an H200, a
 * host squeezed to 64 MB of room survived alone 6 of 6 times and with capture 4 of 12
 * (tests/gpu_results/stress). Not checked: RLIMIT_DATA, cgroup memory limits (the kernel's OOM
 * killer is not a failed allocation), and a host that lowers its limit later than our last check.
 */
#include "mc.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#define RESERVE (64ull << 20)
#define LOW_ROOM (128ull << 20)

static void *_Atomic reserve;

static uint64_t as_limit(void) {
  struct rlimit lim;
  if (getrlimit(RLIMIT_AS, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return 0;
  return (uint64_t)lim.rlim_cur;
}

/* The process's address space in bytes (statm's first field, what RLIMIT_AS counts); 0: unknown. */
static uint64_t as_used(void) {
  int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) { mc_note_error(MC_FN_open, errno, 0); return 0; }
  char buf[128];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  if (close(fd) != 0) mc_note_error(MC_FN_close, errno, 0);
  if (n <= 0) return 0;
  buf[n] = 0;
  long page = sysconf(_SC_PAGESIZE);
  unsigned long long pages = strtoull(buf, NULL, 10);
  return page > 0 ? pages * (uint64_t)page : 0;
}

void mc_room_init(void) {
  if (!as_limit()) return;
  void *r = mmap(NULL, RESERVE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED) { mc_note_error(MC_FN_mmap, errno, 0); return; }
  atomic_store(&reserve, r);
}

void mc_room_release(void) {
  void *r = atomic_exchange(&reserve, NULL);
  if (r && munmap(r, RESERVE) != 0) mc_note_error(MC_FN_munmap, errno, 0);
}

int mc_room_check(void) {
  uint64_t limit = as_limit();
  if (!limit) return 0;
  uint64_t used = as_used();
  if (!used) return 0;
  uint64_t left = used < limit ? limit - used : 0;
  if (left >= LOW_ROOM) return 0;
  mc_disable("the address space is nearly full (%llu MB left under ulimit -v %llu MB)",
             (unsigned long long)(left >> 20), (unsigned long long)(limit >> 20));
  return -1;
}
