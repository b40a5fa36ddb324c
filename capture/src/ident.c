/* ident.c: when, which thread, which device: the identity every record carries (cached in the
 * thread's block, mc.h mc_tl_t; writer.c makes it).
 *
 * Kept apart from init.c so the CPU harnesses compile the same code the launch path runs. */
#include "mc.h"

#include <errno.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

uint64_t mc_now_ns(void) {
  struct timespec ts;
  if (__builtin_expect(clock_gettime(CLOCK_MONOTONIC, &ts) != 0, 0)) { /* counted; the time reads 0 */
    mc_note_error(MC_FN_clock_gettime, errno, 0);
    return 0;
  }
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The forking thread's block is the child's copy (its key still frees it): what it says about the
 * parent goes -- the thread id, the context seen last (contexts do not cross a fork), the launch
 * cache (layout.c starts over), the pointer caches (the child's driver answers anew), the modules
 * of a call in progress, a free's stamp; its JSON buffer stays, emptied. */
void mc_ident_reset_after_fork(void) {
  mc_tl_t *t = mc_tl_cur;
  if (!t) return;
  jb_t jb = t->jb;
  void *block = t->block;
  memset(t, 0, sizeof *t);
  t->jb = (jb_t){.p = jb.p, .cap = jb.cap};
  t->block = block;
}

int mc_tid(void) {
  mc_tl_t *t = mc_tl_cur;
  if (!t) return (int)syscall(SYS_gettid);
  if (!t->tid) t->tid = (int)syscall(SYS_gettid);
  return t->tid;
}

/* ---- context -> device ordinal, lock-free ---- */
#define NCTX 64
static struct { _Atomic(uintptr_t) ctx; atomic_int dev; } ctxdev[NCTX];

static int ctx_device(CUcontext ctx);

int mc_ctx_device(CUcontext ctx) { /* the thread's last context first: one line, no scan */
  mc_tl_t *t = mc_tl_cur;
  if (!t) return ctx_device(ctx);
  if (ctx && ctx == t->dev_ctx) return t->dev;
  int dev = ctx_device(ctx);
  if (dev >= 0) { t->dev_ctx = ctx; t->dev = dev; }
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
