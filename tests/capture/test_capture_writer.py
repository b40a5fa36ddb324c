"""CPU tests of the capture library's record writers (capture/src/writer.c) in isolation.

writer.c is compiled into a small C harness (below) with stand-ins for the few symbols it takes
from the rest of the library. Both writers (mmap, write) are driven through many threads, a fork,
SIGKILL mid-run and a file size limit; every file must parse record by record. `-s` prints the
single-thread cost per record of each writer (`test_cost_per_record`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import c_harness


HARNESS = r"""
#include "mc.h"
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

mc_knobs_t mc_knobs; mc_counters_t mc_cnt; atomic_int mc_off; int mc_pid;
void mc_disable(const char *fmt, ...) {
  int z = 0;
  if (!atomic_compare_exchange_strong(&mc_off, &z, 1)) return;
  va_list ap; va_start(ap, fmt);
  fprintf(stderr, "[mine-capture] capture off in pid %d: ", mc_pid); vfprintf(stderr, fmt, ap); fputc('\n', stderr);
  va_end(ap);
}
void mc_note_error(int fn, int code, int fatal) { (void)fn; (void)code; if (fatal) mc_disable("fatal"); }
void mc_meta_write(int final) { (void)final; }
int mc_tid(void) { return 0; }

static long per_thread; static int forever;
static int rec(int file, long t, long i) {
  jb_t *b = jb_thread();
  jb_lit(b, "\"t\":"); jb_u64(b, (uint64_t)t);
  jb_lit(b, ",\"i\":"); jb_u64(b, (uint64_t)i);
  jb_lit(b, ",\"pad\":\"");
  static char pad[2048];
  if (!pad[0]) memset(pad, 'x', sizeof pad);
  jb_raw(b, pad, (size_t)(200 + (i * 7919 + t * 104729) % 1200)); /* 0.2..1.4 KB */
  jb_lit(b, "\"");
  return mc_write_record(file, b, 1) >= 0 || file == MC_F_GRAPHS ? 0 : -1;
}
static void *worker(void *arg) {
  long t = (long)arg;
  for (long i = 0; forever || i < per_thread; i++) {
    if (atomic_load(&mc_off)) break;
    rec(MC_F_LAUNCHES, t, i);
    if (i % 64 == 0) rec(MC_F_GRAPHS, t, i);
  }
  return NULL;
}
static void run_threads(int n) {
  pthread_t th[64];
  for (long t = 0; t < n; t++) pthread_create(&th[t], NULL, worker, (void *)t);
  for (int t = 0; t < n; t++) pthread_join(th[t], NULL);
}
int main(int argc, char **argv) {
  const char *mode = argv[1];
  snprintf(mc_knobs.dir, sizeof mc_knobs.dir, "%s", argv[2]);
  int threads = atoi(argv[3]); per_thread = atol(argv[4]);
  const char *w = getenv("MINE_CAPTURE_WRITER");
  mc_knobs.writer_write = !(w && strcmp(w, "mmap") == 0);
  const char *pf = getenv("MINE_CAPTURE_PREFAULT");
  mc_knobs.no_prefault = pf && strcmp(pf, "0") == 0;
  mc_pid = getpid();
  if (strcmp(mode, "fsize") == 0) {            /* the output fills up: capture off, process runs on */
    struct rlimit r = {1 << 20, 1 << 20};
    signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &r);
  }
  if (mc_files_open() != 0) { printf("{\"open\":\"failed\"}\n"); return 0; }
  if (strcmp(mode, "kill") == 0) { forever = 1; printf("ready\n"); fflush(stdout); }
  if (strcmp(mode, "bench") == 0) {            /* records 3 us apart, like launches; time in rec() only */
    struct timespec a, z;
    double ns = 0;
    for (long i = 0; i < per_thread; i++) {
      clock_gettime(CLOCK_MONOTONIC, &a);
      rec(MC_F_LAUNCHES, 0, i);
      clock_gettime(CLOCK_MONOTONIC, &z);
      ns += (z.tv_sec - a.tv_sec) * 1e9 + (z.tv_nsec - a.tv_nsec);
      do clock_gettime(CLOCK_MONOTONIC, &a); while ((a.tv_sec - z.tv_sec) * 1e9 + (a.tv_nsec - z.tv_nsec) < 3000);
    }
    mc_files_finalize();
    printf("{\"ns_per_record\":%.1f}\n", ns / per_thread);
    return 0;
  }
  if (strcmp(mode, "fork") == 0) {
    run_threads(threads);
    pid_t c = fork();
    if (c == 0) {
      mc_pid = getpid();
      mc_files_reset_after_fork();
      run_threads(threads);
      mc_files_finalize();
      exit(0);
    }
    run_threads(threads);
    int st; waitpid(c, &st, 0);
    printf("{\"child\":%d}\n", (int)c);
  } else run_threads(threads);
  if (strcmp(mode, "noexit") == 0) _exit(0);   /* leaves like os._exit: no finalize */
  mc_files_finalize();
  printf("{\"pid\":%d,\"off\":%d}\n", mc_pid, atomic_load(&mc_off));
  return 0;
}
"""


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    return c_harness.build(tmp_path_factory.mktemp("writer"), HARNESS, 'writer.c', 'room.c')


def _run(exe, mode, out, threads, per, writer="mmap", prefault="1", **kw):
    env = dict(os.environ, MINE_CAPTURE_WRITER=writer, MINE_CAPTURE_PREFAULT=prefault)
    return subprocess.run([str(exe), mode, str(out), str(threads), str(per)], env=env, capture_output=True,
                          text=True, timeout=120, **kw)


def read_records(path: Path) -> tuple[list[dict], int, bytes]:
    """What a tolerant reader does: split lines, keep the bytes after the last NUL of each line."""
    data = path.read_bytes()
    recs, bad = [], 0
    lines = data.split(b"\n")
    for line in lines[:-1]:
        line = line.rpartition(b"\0")[2]
        if not line:
            continue
        try:
            recs.append(json.loads(line))
        except ValueError:
            bad += 1
    return recs, bad, lines[-1]


def _check_complete(pid_dir: Path, threads: int, per: int):
    data = (pid_dir / "launches.jsonl").read_bytes()
    assert b"\0" not in data and data.endswith(b"\n")  # sealed and cut to its true length
    recs = [json.loads(x) for x in data.splitlines()]
    assert [r["seq"] for r in recs] == list(range(threads * per))  # file order is seq order
    assert sorted((r["t"], r["i"]) for r in recs) == [(t, i) for t in range(threads) for i in range(per)]
    for t in range(threads):  # each thread's records in its own order
        assert [r["i"] for r in recs if r["t"] == t] == list(range(per))
    graphs = (pid_dir / "graphs.jsonl").read_bytes()
    assert b"\0" not in graphs
    g = [json.loads(x) for x in graphs.splitlines()]
    assert len(g) == threads * len(range(0, per, 64)) and all("seq" not in r for r in g)


@pytest.mark.parametrize("writer", ["mmap", "write"])
def test_threads_every_record_in_seq_order(harness, tmp_path, writer):
    threads, per = 8, 6000  # ~40 MB: many fallocate steps, crosses a 64 MiB window? no; see next test
    r = _run(harness, "threads", tmp_path, threads, per, writer)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    pid = json.loads(r.stdout)["pid"]
    _check_complete(tmp_path / f"pid{pid}", threads, per)


def test_mmap_without_prefault_every_record_in_seq_order(harness, tmp_path):
    threads, per = 8, 6000  # MINE_CAPTURE_PREFAULT=0: no helper thread, writers grow the file themselves
    r = _run(harness, "threads", tmp_path, threads, per, "mmap", prefault="0")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    _check_complete(tmp_path / f"pid{json.loads(r.stdout)['pid']}", threads, per)


def test_mmap_crosses_windows(harness, tmp_path):
    threads, per = 16, 12000  # ~150 MB: records straddle the 64 MiB window edges (pwrite there)
    r = _run(harness, "threads", tmp_path, threads, per)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    pid_dir = tmp_path / f"pid{json.loads(r.stdout)['pid']}"
    assert (pid_dir / "launches.jsonl").stat().st_size > 128 << 20
    _check_complete(pid_dir, threads, per)


@pytest.mark.parametrize("writer", ["mmap", "write"])
def test_fork_child_gets_its_own_files(harness, tmp_path, writer):
    r = _run(harness, "fork", tmp_path, 4, 3000, writer)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    child = json.loads(r.stdout.splitlines()[0])["child"]
    parent = json.loads(r.stdout.splitlines()[1])["pid"]
    # the parent wrote 2 rounds, the child 1 round into its own folder; neither touched the other's
    data = (tmp_path / f"pid{parent}" / "launches.jsonl").read_bytes()
    recs = [json.loads(x) for x in data.splitlines()]
    assert [x["seq"] for x in recs] == list(range(2 * 4 * 3000)) and b"\0" not in data
    _check_complete(tmp_path / f"pid{child}", 4, 3000)


def test_exit_without_atexit_leaves_nul_tail_only(harness, tmp_path):
    r = _run(harness, "noexit", tmp_path, 4, 2000)
    assert r.returncode == 0
    (pid_dir,) = tmp_path.glob("pid*")
    recs, bad, tail = read_records(pid_dir / "launches.jsonl")
    assert bad == 0 and [x["seq"] for x in recs] == list(range(8000))
    assert set(tail) <= {0}  # after the last record: NUL bytes only (the preallocated rest)


@pytest.mark.parametrize("rep", range(3))
def test_sigkill_mid_run_parses_up_to_the_last_record(harness, tmp_path, rep):
    threads = 8
    env = dict(os.environ, MINE_CAPTURE_WRITER="mmap")
    p = subprocess.Popen([str(harness), "kill", str(tmp_path), str(threads), "0"], env=env,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(0.1 + 0.1 * rep)   # three kill points, each after thousands of records (all parsed below)
    p.send_signal(signal.SIGKILL)
    p.wait()
    (pid_dir,) = tmp_path.glob("pid*")
    recs, bad, tail = read_records(pid_dir / "launches.jsonl")
    assert len(recs) > 1000 and set(tail) <= {0}
    # only records in flight at the kill may be lost: at most one per thread, nothing else
    seqs = [x["seq"] for x in recs]
    assert seqs == sorted(seqs) and bad <= threads
    assert seqs[-1] + 1 - len(seqs) <= threads
    # every record that parses is whole (its padding is intact)
    for x in recs:
        assert len(x["pad"]) == 200 + (x["i"] * 7919 + x["t"] * 104729) % 1200


@pytest.mark.parametrize("writer", ["mmap", "write"])
def test_full_output_turns_capture_off_and_process_runs_on(harness, tmp_path, writer):
    r = _run(harness, "fsize", tmp_path, 4, 5000, writer)  # RLIMIT_FSIZE = 1 MiB
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["off"] == 1
    assert len(r.stderr.strip().splitlines()) == 1 and "capture off" in r.stderr
    (pid_dir,) = tmp_path.glob("pid*")
    recs, bad, _ = read_records(pid_dir / "launches.jsonl")
    assert bad == 0 and [x["seq"] for x in recs] == list(range(len(recs))) and recs


def test_unwritable_dir_turns_capture_off(harness, tmp_path):
    (tmp_path / "f").write_text("a file where the folder should be")
    r = _run(harness, "threads", tmp_path / "f" / "sub", 1, 10)
    assert r.returncode == 0 and json.loads(r.stdout) == {"open": "failed"}
    assert len(r.stderr.strip().splitlines()) == 1 and "capture off" in r.stderr


@pytest.mark.slow
def test_cost_per_record(harness, tmp_path):
    """A measurement for docs/benchmarks.md (`pytest -s -m slow ... -k cost`), not a timing assertion."""
    cost = {}
    for writer, pf in (("write", "1"), ("mmap", "1"), ("mmap", "0")):
        name = writer if pf == "1" else writer + "_noprefault"
        runs = [json.loads(_run(harness, "bench", tmp_path / f"{name}{i}", 1, 200000, writer, pf).stdout)
                for i in range(3)]
        cost[name] = min(x["ns_per_record"] for x in runs)
    print(f"\nwriter cost per ~0.8 KB record built and written, one thread, records 3 us apart: {cost}")
    # a cost report, not a timing assertion (benchmarks/ measures; docs/benchmarks.md records)
    assert all(v > 0 for v in cost.values())


# ---------------------------------------------------------------- the allocation log (alloc.c)
# alloc.c's event parsing, formatting, stamping and writing, compiled with writer.c into a second
# harness and driven with the CUPTI `*_params` structs of generated_cuda_meta.h, as the callback
# would at API entry/exit. The CUPTI dispatch itself (dispatch.c): test_dispatch_paths.py.
# cuPointerGetAttributes is a stand-in that answers "device memory, buffer id = 1000 + low bits".
ALLOC_HARNESS = c_harness.PRELUDE + r"""
mc_driver_t mc_drv;
atomic_uint mc_free_epoch, mc_alloc_epoch;
static atomic_int errors;
void mc_note_error(int fn, int code, int fatal) { (void)fn; (void)code; atomic_fetch_add(&errors, 1); if (fatal) mc_disable("fatal"); }
int mc_tid(void) { return 7; }
int mc_ctx_device(CUcontext ctx) { return ctx ? 0 : -1; }
uint64_t mc_now_ns(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000ull + t.tv_nsec; }
int64_t mc_tmap_find(const unsigned char *p) { (void)p; return -1; }

/* device memory is everything in [0x7f0000000000, 0x7f1000000000); ranges are 1 MiB aligned */
static CUresult fake_attrs(unsigned n, CUpointer_attribute *a, void **d, CUdeviceptr p) {
  int dev = p >= 0x7f0000000000ull && p < 0x7f1000000000ull;
  for (unsigned i = 0; i < n; i++) switch (a[i]) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned *)d[i] = dev ? CU_MEMORYTYPE_DEVICE : 0; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)d[i] = dev ? p & ~0xfffffull : 0; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)d[i] = dev ? 1 << 20 : 0; break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long *)d[i] = dev ? 1000 + ((p >> 20) & 0xff) : 0; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

static void launch(void) {
  jb_t *b = jb_thread();
  jb_lit(b, "\"k\":1");
  mc_write_record(MC_F_LAUNCHES, b, 1);
}
static uint32_t corr;
/* one API call: entry stamp, optional launches by "another thread" in between, exit */
#define CALL(name, res, between, ...)                                                        \
  do {                                                                                      \
    name##_params p_ = {__VA_ARGS__};                                                       \
    uint32_t c_ = ++corr;                                                                   \
    mc_alloc_log_entry(CUPTI_DRIVER_TRACE_CBID_##name, c_);                                 \
    for (int k_ = 0; k_ < (between); k_++) launch();                                        \
    mc_alloc_log_exit(CUPTI_DRIVER_TRACE_CBID_##name, c_, &p_, (CUcontext)0x55aa, (res));   \
  } while (0)

static void *churn(void *arg) {
  long t = (long)arg;
  for (long i = 0; i < 2000; i++) {
    CUdeviceptr d = 0x7f0000000000ull + ((uint64_t)t << 24) + ((uint64_t)i << 8);
    CALL(cuMemAlloc_v2, 0, 0, &d, 256);
    launch();
    CALL(cuMemFree_v2, 0, 0, d);
  }
  return NULL;
}

int main(int argc, char **argv) {
  const char *mode = argv[1];
  snprintf(mc_knobs.dir, sizeof mc_knobs.dir, "%s", argv[2]);
  const char *w = getenv("MINE_CAPTURE_WRITER");
  mc_knobs.writer_write = !(w && strcmp(w, "mmap") == 0);
  mc_knobs.alloc_log = atoi(argv[3]);
  mc_pid = getpid();
  mc_drv.cuPointerGetAttributes = fake_attrs;
  if (mc_files_open() != 0) return 1;
  if (strcmp(mode, "threads") == 0) {
    pthread_t th[8];
    for (long t = 0; t < 8; t++) pthread_create(&th[t], NULL, churn, (void *)t);
    for (int t = 0; t < 8; t++) pthread_join(th[t], NULL);
  } else {
    CUdeviceptr a = 0x7f0000100000ull, b = 0, r = 0x7f0000800000ull, ipc = 0x7f0000a40000ull, pool = 0;
    size_t pitch = 512;
    CUmemGenericAllocationHandle h = 0x4242;
    CUipcMemHandle ih; memset(&ih, 0, sizeof ih);
    void *host = (void *)0x555500001000ull;
    launch();                                                       /* seq 0 */
    CALL(cuMemAlloc_v2, 0, 0, &a, 4096);                            /* seq_before 1 */
    launch(); launch();                                             /* seq 1, 2 */
    CALL(cuMemFree_v2, 0, 2, a);                                    /* stamped at entry: 3 */
    CALL(cuMemAlloc_v2, 2, 0, &b, 1 << 30);                         /* failed: logged, no id */
    CALL(cuMemAllocPitch_v2, 0, 0, &a, &pitch, 100, 8, 4);          /* reuse of a: 512 * 8 */
    CALL(cuMemAddressReserve, 0, 0, &r, 8 << 20, 0, 0, 0);
    CALL(cuMemCreate, 0, 0, &h, 2 << 20, NULL, 0);
    CALL(cuMemMap, 0, 0, r, 2 << 20, 0, h, 0);
    CALL(cuMemSetAccess, 0, 0, r, 2 << 20, NULL, 1);
    launch();                                                       /* seq 5 */
    CALL(cuMemUnmap, 0, 0, r, 2 << 20);
    CALL(cuMemRelease, 0, 0, h);
    CALL(cuMemAddressFree, 0, 0, r, 8 << 20);
    CALL(cuIpcOpenMemHandle_v2, 0, 0, &ipc, ih, 1);                 /* size from the driver */
    CALL(cuIpcCloseMemHandle, 0, 0, ipc);
    CALL(cuMemAllocAsync_ptsz, 0, 0, &a, 64, (CUstream)0x2);
    CALL(cuMemFreeAsync, 0, 0, a, (CUstream)0x0);
    CALL(cuMemAllocFromPoolAsync, 0, 0, &pool, 32, (CUmemoryPool)0x77, NULL);   /* dptr left 0 */
    CALL(cuMemHostAlloc, 0, 0, &host, 4096, 0);
    CALL(cuMemFreeHost, 0, 0, host);
    CALL(cuMemAlloc_v2, 0, 0, NULL, 16);                            /* no out-pointer */
    cuLaunchKernel_params lk; memset(&lk, 0, sizeof lk);            /* not an allocation API */
    mc_alloc_log_exit(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, 99, &lk, NULL, 0);
    mc_alloc_log_exit(CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2, 100, NULL, NULL, 0);
  }
  mc_files_finalize();
  printf("{\"events\":%llu,\"dropped\":%llu,\"errors\":%d,\"off\":%d}\n", (unsigned long long)mc_cnt.alloc_events,
         (unsigned long long)mc_cnt.alloc_dropped, atomic_load(&errors), atomic_load(&mc_off));
  return 0;
}
"""


@pytest.fixture(scope="module")
def alloc_harness(tmp_path_factory) -> Path:
    return c_harness.build(tmp_path_factory.mktemp("allocs"), ALLOC_HARNESS, 'alloc.c', 'writer.c', 'room.c')


def _run_allocs(exe, mode, out, alloc_log=1, writer="write"):
    env = dict(os.environ, MINE_CAPTURE_WRITER=writer)
    r = subprocess.run([str(exe), mode, str(out), str(alloc_log)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    (pid_dir,) = out.glob("pid*")
    return json.loads(r.stdout), pid_dir


@pytest.mark.parametrize("writer", ["write", "mmap"])
def test_alloc_log_records(alloc_harness, tmp_path, writer):
    res, pid_dir = _run_allocs(alloc_harness, "scenario", tmp_path, writer=writer)
    recs = [json.loads(x) for x in (pid_dir / "allocs.jsonl").read_text().splitlines()]
    assert res == {"events": len(recs), "dropped": 0, "errors": 0, "off": 0} and len(recs) == 19
    for r in recs:
        assert r.pop("t_ns") > 0 and r.pop("tid") == 7 and r.pop("dev") == 0
    assert [r.pop("order") for r in recs] == list(range(19))  # one ticket per call, in call order
    key = ("seq_before", "event", "api", "base", "size", "id", "result")
    got = [tuple(r.pop(k) for k in key) + ((r.pop("handle"),) if "handle" in r else ()) for r in recs]
    assert all(r == {} for r in recs)  # no other keys
    assert got == [
        (1, "alloc", "cuMemAlloc_v2", "0x7f0000100000", 4096, 1001, 0),
        (3, "free", "cuMemFree_v2", "0x7f0000100000", None, None, 0),  # entry stamp, not exit's 5
        (5, "alloc", "cuMemAlloc_v2", "0x0", 1 << 30, None, 2),  # failed: base untouched (0), no id
        (5, "alloc", "cuMemAllocPitch_v2", "0x7f0000100000", 512 * 8, 1001, 0),
        (5, "reserve", "cuMemAddressReserve", "0x7f0000800000", 8 << 20, None, 0),
        (5, "create", "cuMemCreate", None, 2 << 20, None, 0, "0x4242"),
        (5, "map", "cuMemMap", "0x7f0000800000", 2 << 20, 1008, 0, "0x4242"),
        (5, "access", "cuMemSetAccess", "0x7f0000800000", 2 << 20, None, 0),
        (6, "unmap", "cuMemUnmap", "0x7f0000800000", 2 << 20, None, 0),
        (6, "release", "cuMemRelease", None, None, None, 0, "0x4242"),
        (6, "unreserve", "cuMemAddressFree", "0x7f0000800000", 8 << 20, None, 0),
        (6, "ipc_open", "cuIpcOpenMemHandle_v2", "0x7f0000a40000", (1 << 20) - 0x40000, 1010, 0),
        (6, "ipc_close", "cuIpcCloseMemHandle", "0x7f0000a40000", None, None, 0),
        (6, "alloc", "cuMemAllocAsync_ptsz", "0x7f0000100000", 64, 1001, 0),
        (6, "free", "cuMemFreeAsync", "0x7f0000100000", None, None, 0),
        (6, "alloc", "cuMemAllocFromPoolAsync", "0x0", 32, None, 0, "0x77"),
        (6, "host_alloc", "cuMemHostAlloc", "0x555500001000", 4096, None, 0),
        (6, "host_free", "cuMemFreeHost", "0x555500001000", None, None, 0),
        (6, "alloc", "cuMemAlloc_v2", None, 16, None, 0),  # no out-pointer: base null
    ]  # and the launch API and the NULL params made no record
    launches = (pid_dir / "launches.jsonl").read_text().splitlines()
    assert [json.loads(x)["seq"] for x in launches] == list(range(6))


def test_alloc_log_off_makes_no_file(alloc_harness, tmp_path):
    res, pid_dir = _run_allocs(alloc_harness, "scenario", tmp_path, alloc_log=0)
    assert res == {"events": 0, "dropped": 0, "errors": 0, "off": 0}
    assert not (pid_dir / "allocs.jsonl").exists() and (pid_dir / "launches.jsonl").exists()


@pytest.mark.parametrize("writer", ["write", "mmap"])
def test_alloc_log_threads(alloc_harness, tmp_path, writer):
    """8 threads x 2000 alloc/launch/free: every record whole, tickets unique, and per address the
    (seq_before, order) order of the log is alloc, free, alloc, free... as the calls happened."""
    res, pid_dir = _run_allocs(alloc_harness, "threads", tmp_path, writer=writer)
    recs = [json.loads(x) for x in (pid_dir / "allocs.jsonl").read_text().splitlines()]
    assert res["events"] == len(recs) == 8 * 2000 * 2 and res["dropped"] == 0
    assert sorted(r["order"] for r in recs) == list(range(len(recs)))
    by_base: dict[str, list] = {}
    for r in sorted(recs, key=lambda r: (r["seq_before"], r["order"])):
        by_base.setdefault(r["base"], []).append(r["event"])
    assert len(by_base) == 8 * 2000 and all(v == ["alloc", "free"] for v in by_base.values())
    n_launch = len((pid_dir / "launches.jsonl").read_text().splitlines())
    assert n_launch == 8 * 2000 and max(r["seq_before"] for r in recs) <= n_launch
