/* ident.c: when, which thread, which device: the identity every record carries.
 *
 * Kept apart from init.c so the CPU harnesses compile the same code the launch path runs. */
#include "mc.h"

#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static __thread int tl_tid;

uint64_t mc_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void mc_ident_reset_after_fork(void) { tl_tid = 0; } /* the child is another thread */

int mc_tid(void) {
  if (!tl_tid) tl_tid = (int)syscall(SYS_gettid);
  return tl_tid;
}

/* ---- context -> device ordinal, lock-free ---- */
#define NCTX 64
static struct { _Atomic(uintptr_t) ctx; atomic_int dev; } ctxdev[NCTX];

int mc_ctx_device(CUcontext ctx) {
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
