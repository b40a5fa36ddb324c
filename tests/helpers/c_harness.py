"""Build a C test harness around some of the capture library's sources (no GPU, no libcuda).

The writer, record and allocation-log tests each compile their harness text together with the
library files under test, with the CUDA and CUPTI headers `capture.build_support` finds and
warnings as errors, so the tests exercise exactly the code the injected library ships.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from capture import build_support

SRC = Path(__file__).resolve().parents[2] / "capture" / "src"

# What every harness starts with: the headers, the library's globals that init.c would define, and
# the stand-ins for init.c's functions the files under test call (disable, meta.json).
PRELUDE = r"""
#include "mc.h"
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

mc_knobs_t mc_knobs; mc_counters_t mc_cnt; atomic_int mc_off; int mc_pid;
void mc_disable(const char *fmt, ...) {
  int z = 0;
  if (!atomic_compare_exchange_strong(&mc_off, &z, 1)) return;
  va_list ap; va_start(ap, fmt); vfprintf(stderr, fmt, ap); fputc('\n', stderr); va_end(ap);
}
void mc_meta_write(int final) { (void)final; }
/* n threads running worker(t) for t < n, joined */
__attribute__((unused)) static void run_threads_of(void *(*worker)(void *), long n) {
  pthread_t th[64];
  for (long t = 0; t < n && t < 64; t++) pthread_create(&th[t], NULL, worker, (void *)t);
  for (long t = 0; t < n && t < 64; t++) pthread_join(th[t], NULL);
}

/* The cost of one record: one(i) for i < n, timed alone, calls 3 us apart (as launches come);
 * prints {"ns_per_record": ...} after sealing the files. */
__attribute__((unused)) static void bench_spaced(void (*one)(long), long n) {
  struct timespec a, z;
  double ns = 0;
  for (long i = 0; i < n; i++) {
    clock_gettime(CLOCK_MONOTONIC, &a);
    one(i);
    clock_gettime(CLOCK_MONOTONIC, &z);
    ns += (z.tv_sec - a.tv_sec) * 1e9 + (z.tv_nsec - a.tv_nsec);
    do clock_gettime(CLOCK_MONOTONIC, &a); while ((a.tv_sec - z.tv_sec) * 1e9 + (a.tv_nsec - z.tv_nsec) < 3000);
  }
  mc_files_finalize();
  printf("{\"ns_per_record\":%.1f}\n", ns / n);
}
"""


def build(folder: Path, harness: str, *sources: str, libs: tuple[str, ...] = ()) -> Path:
    """Compile `harness` (C text) with capture/src/<sources> (and link `libs`) into folder/harness; its path."""
    src = folder / "harness.c"
    src.write_text(harness)
    paths = build_support.find_cuda()
    exe = folder / "harness"
    subprocess.run(["gcc", "-O2", "-std=gnu11", "-Wall", "-Werror", "-pthread", f"-I{paths.cuda_include}",
                    f"-I{paths.cupti_include}", f"-I{SRC}", str(src), *(str(SRC / s) for s in sources),
                    "-o", str(exe), *libs], check=True)
    return exe
