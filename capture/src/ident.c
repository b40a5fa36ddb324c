/* ident.c: when, which thread, which device: the identity every record carries.
 *
 * Kept apart from init.c so the CPU harnesses compile the same code the launch path runs. */
#include "mc.h"

#include <errno.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

__thread mc_tl_t mc_tl;

uint64_t mc_now_ns(void) {
  struct timespec ts;
  if (__builtin_expect(clock_gettime(CLOCK_MONOTONIC, &ts) != 0, 0)) { /* counted; the time reads 0 */
    mc_note_error(MC_FN_clock_gettime, errno, 0);
    return 0;
  }
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void mc_ident_reset_after_fork(void) { memset(&mc_tl, 0, sizeof mc_tl); } /* another thread, new ids */

int mc_tid(void) {
  if (!mc_tl.tid) mc_tl.tid = (int)syscall(SYS_gettid);
  return mc_tl.tid;
}

/* ---- context -> device ordinal, lock-free ---- */
#define NCTX 64
static struct { _Atomic(uintptr_t) ctx; atomic_int dev; } ctxdev[NCTX];

static int ctx_device(CUcontext ctx);

int mc_ctx_device(CUcontext ctx) { /* the thread's last context first: one line, no scan */
  if (ctx && ctx == mc_tl.dev_ctx) return mc_tl.dev;
  int dev = ctx_device(ctx);
  if (dev >= 0) { mc_tl.dev_ctx = ctx; mc_tl.dev = dev; }
  return dev;
}

static int ctx_device(CUcontext ctx) {
  if (!ctx) return -1;
  for (int i = 0; i < NCTX; i++) {
    uintptr_t c = atomic_load_explicit(&ctxdev[i].ctx, memory_order_acquire);
    if (c == (uintptr_t)ctx) return atomic_load_explicit(&ctxdev[i].dev, memory_order_acquire) - 1;
    if (c == 0) break;
  }
  CUdevice dev = -1;
  if (MC_CU(cuCtxGetDevice_v2, &dev, ctx) != CUDA_SUCCESS) return -1;
  for (int i = 0; i < NCTX; i++) {
    uintptr_t zero = 0;
    if (atomic_compare_exchange_strong(&ctxdev[i].ctx, &zero, (uintptr_t)ctx) || zero == (uintptr_t)ctx) {
      atomic_store_explicit(&ctxdev[i].dev, dev + 1, memory_order_release);
      break;
    }
  }
  return dev;
}
