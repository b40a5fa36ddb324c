/* toggle.c: MINE_CAPTURE_TOGGLE_MS (diagnostic): the launch callbacks switched off and on every
 * T ms.
 *
 * Why: launch cost moves by more than the capture's cost between two processes on one machine
 * (docs/benchmarks.md), so benchmarks/bench_launch.cu times blocks of launches inside one process
 * and bench_capture.py sorts them into "callbacks on" and "off" by the switch times kept here.
 * A thread of its own (all signals blocked, never calls CUDA) flips every callback of the launch
 * family (tables.h); the times go to meta.json ("toggles": [[t_ns, on], ...]) at exit. A switch
 * CUPTI refuses is counted under cuptiEnableCallback and ends the toggling (callbacks stay as the
 * last complete switch left them, which meta.json's last entry says). */
#include "mc.h"

#include <time.h>

#define NTOGGLE 4096
static uint64_t toggle_t[NTOGGLE];
static unsigned char toggle_on[NTOGGLE];
static atomic_uint ntoggle;

static int switch_launches(CUpti_SubscriberHandle sub, int on) {
  for (size_t k = 0; k < MC_CB_COUNT; k++)
    if (mc_cbs[k].family == MC_FAM_LAUNCH &&
        MC_CUPTI(cuptiEnableCallback, (uint32_t)on, sub, CUPTI_CB_DOMAIN_DRIVER_API, mc_cbs[k].cbid) != CUPTI_SUCCESS)
      return -1;
  return 0;
}

static void *toggle_main(void *arg) {
  CUpti_SubscriberHandle sub = arg;
  int on = 1;
  const struct timespec period = {(time_t)(mc_knobs.toggle_ms / 1000), (long)(mc_knobs.toggle_ms % 1000) * 1000000L};
  for (unsigned i = 0; i < NTOGGLE; i++) {
    struct timespec left = period;
    while (nanosleep(&left, &left) != 0) {}
    on = !on;
    if (switch_launches(sub, on) != 0) return NULL;
    toggle_t[i] = mc_now_ns();
    toggle_on[i] = (unsigned char)on;
    atomic_store_explicit(&ntoggle, i + 1, memory_order_release);
  }
  return NULL;
}

void mc_toggle_start(CUpti_SubscriberHandle sub) {
  if (!mc_knobs.toggle_ms || mc_knobs.modules_only) return;
  mc_thread_start(toggle_main, sub);   /* a failure is counted by the choke point under its call */
}

void mc_toggles_json(jb_t *b) {
  unsigned n = atomic_load_explicit(&ntoggle, memory_order_acquire);
  if (!n) return;
  jb_lit(b, ",\"toggles\":[");
  for (unsigned i = 0; i < n; i++) {
    if (i) jb_lit(b, ",");
    jb_lit(b, "["); jb_u64(b, toggle_t[i]); jb_lit(b, ","); jb_u64(b, toggle_on[i]); jb_lit(b, "]");
  }
  jb_lit(b, "]");
}
