/* stress.c: the injected capture library under load (issue 14's host-safety run).
 *
 * Why: the library runs inside someone's production server, so it must survive what such a
 * server does: many threads launching at once while modules load lazily, a child that forks and
 * execs, an address space near its limit, an output filesystem that fills up. This program is
 * that host, with the CUDA driver API only (no nvcc: its kernels are PTX text the driver JITs):
 *
 *   stress MAIN   THREADS LAUNCHES TRUTH_DIR SQUEEZE_MB
 *   stress CHILD  LAUNCHES TRUTH_DIR          (what the forked child execs)
 *
 * MAIN: THREADS threads, each on its own stream, launch LAUNCHES kernels each; every thread
 * loads a module of its own before its first launch and another one half-way (modules arriving
 * while the other threads launch; run with CUDA_MODULE_LOADING=LAZY); half-way through, the main
 * thread forks twice: one child execs this program as CHILD (a fresh injected process), the other
 * leaves at once with _exit (the fork handlers' path). With SQUEEZE_MB > 0, once CUDA is up the
 * program reserves address space (malloc, untouched) until malloc fails and gives back SQUEEZE_MB,
 * so everything after (the driver's and the capture library's allocations, the writer's
 * mappings) runs at the edge of `ulimit -v`. Every launch's result is counted, never fatal.
 * TRUTH_DIR/<pid>.json gets what was done: {"pid", "role", "launches", "failed", "modules",
 * "children": [pid, ...], "child_status": [...], "vm_peak_kb"}, written outside the dump's
 * filesystem.
 * Exit status 0 unless the program itself could not run (no device, no module at all).
 * A fatal signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) is reported on stderr before the
 * program dies of it (same exit status): "stress: signal N at PC in OBJECT (SYMBOL+OFF), fault
 * address A, thread T", then the stack, so a crash names the library it happened in (the driver,
 * the capture library, libc). The handler runs on an alternate stack (a stack overflow is one of
 * the faults it must report). */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

/* ---- a fatal signal, reported ---- */
static void say(const char *s) {
  size_t n = strlen(s);
  while (n) {
    ssize_t w = write(2, s, n);
    if (w <= 0) return;
    s += w; n -= (size_t)w;
  }
}

static void on_fatal(int sig, siginfo_t *si, void *uc_) {
  ucontext_t *uc = uc_;
  void *pc = NULL;
#if defined(__x86_64__)
  pc = (void *)uc->uc_mcontext.gregs[REG_RIP];
#else
  (void)uc;
#endif
  Dl_info di;
  memset(&di, 0, sizeof di);
  char line[1024];
  int ok = pc && dladdr(pc, &di);
  snprintf(line, sizeof line, "stress: signal %d at %p in %s (%s+0x%lx), fault address %p, thread %ld\n", sig, pc,
           ok && di.dli_fname ? di.dli_fname : "?", ok && di.dli_sname ? di.dli_sname : "?",
           ok ? (unsigned long)((char *)pc - (char *)(di.dli_sname ? di.dli_saddr : di.dli_fbase)) : 0ul,
           si ? si->si_addr : NULL, (long)syscall(SYS_gettid));
  say(line);
  void *frames[48];
  int n = backtrace(frames, 48);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);   /* die of it: the exit status run.sh sees stays the signal's */
  raise(sig);
}

static void alt_stack(void) {   /* per thread: where the handler runs */
  stack_t ss;
  ss.ss_sp = malloc(64 << 10);
  ss.ss_size = 64 << 10;
  ss.ss_flags = 0;
  if (ss.ss_sp) sigaltstack(&ss, NULL);
}

static void report_fatal_signals(void) {
  void *warm[2];
  backtrace(warm, 2);   /* loads what backtrace needs now, not in the handler */
  alt_stack();
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fatal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
  for (unsigned i = 0; i < sizeof sigs / sizeof *sigs; i++) sigaction(sigs[i], &sa, NULL);
}

static CUcontext ctx;
static long per_thread;
static atomic_long launched, failed, modules;
static atomic_int halfway;
static char self_path[4096], truth_dir[4096];
static atomic_int go;                  /* the threads start launching together */

/* A module holding one kernel named `name`: (u64 p, u32 i), does nothing. */
static CUresult load_module(const char *name, CUmodule *mod, CUfunction *fn) {
  char ptx[512];
  snprintf(ptx, sizeof ptx,
           ".version 7.0\n.target sm_50\n.address_size 64\n"
           ".visible .entry %s(.param .u64 p, .param .u32 i)\n{\n  ret;\n}\n", name);
  CUresult r = cuModuleLoadData(mod, ptx);
  if (r == CUDA_SUCCESS) r = cuModuleGetFunction(fn, *mod, name);
  if (r == CUDA_SUCCESS) atomic_fetch_add(&modules, 1);
  return r;
}

static long vm_peak_kb(void) {   /* /proc/self/status VmPeak: what `ulimit -v` is measured against */
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long kb = -1;
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, "VmPeak:", 7) == 0) kb = atol(line + 7);
  if (f) fclose(f);
  return kb;
}

static void write_truth(const char *role, const long *kids, const int *status, int nkids) {
  char path[4200], tmp[4300];
  snprintf(path, sizeof path, "%s/%d.json", truth_dir, (int)getpid());
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) { perror("stress: truth file"); return; }
  fprintf(f, "{\"pid\":%d,\"role\":\"%s\",\"launches\":%ld,\"failed\":%ld,\"modules\":%ld,\"children\":[",
          (int)getpid(), role, atomic_load(&launched), atomic_load(&failed), atomic_load(&modules));
  for (int i = 0; i < nkids; i++) fprintf(f, "%s%ld", i ? "," : "", kids[i]);
  fprintf(f, "],\"child_status\":[");
  for (int i = 0; i < nkids; i++) fprintf(f, "%s%d", i ? "," : "", status[i]);
  fprintf(f, "],\"vm_peak_kb\":%ld}\n", vm_peak_kb());
  if (fclose(f) == 0) rename(tmp, path);
}

static void launch_n(CUfunction fn, CUstream s, long from, long to, CUdeviceptr p) {
  for (long i = from; i < to; i++) {
    unsigned iv = (unsigned)i;
    void *args[2] = {&p, &iv};
    CUresult r = cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, s, args, NULL);
    atomic_fetch_add_explicit(&launched, 1, memory_order_relaxed);
    if (r != CUDA_SUCCESS) atomic_fetch_add_explicit(&failed, 1, memory_order_relaxed);
  }
}

static void *worker(void *arg) {
  long t = (long)arg;
  alt_stack();
  if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) { atomic_fetch_add(&failed, per_thread); return NULL; }
  CUstream s = NULL;
  if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) s = NULL;
  char name[64];
  CUmodule m1 = NULL, m2 = NULL;
  CUfunction f1 = NULL, f2 = NULL;
  snprintf(name, sizeof name, "stress_t%ld_a", t);
  CUresult r1 = load_module(name, &m1, &f1);
  while (!atomic_load(&go)) usleep(100);
  CUdeviceptr p = 0x10000ull * (unsigned long long)(t + 1);   /* never dereferenced */
  long half = per_thread / 2;
  if (r1 == CUDA_SUCCESS) launch_n(f1, s, 0, half, p);
  else atomic_fetch_add(&failed, half), atomic_fetch_add(&launched, half);
  snprintf(name, sizeof name, "stress_t%ld_b", t);          /* a module arriving mid-run */
  CUresult r2 = load_module(name, &m2, &f2);
  atomic_fetch_add(&halfway, 1);
  CUfunction f = r2 == CUDA_SUCCESS ? f2 : f1;
  if (f) launch_n(f, s, half, per_thread, p);
  else atomic_fetch_add(&failed, per_thread - half), atomic_fetch_add(&launched, per_thread - half);
  if (s) cuStreamSynchronize(s);
  if (s) cuStreamDestroy(s);
  if (m1) cuModuleUnload(m1);
  if (m2) cuModuleUnload(m2);
  return NULL;
}

static void squeeze(long give_back_mb) {
  /* reserve address space in 64 MB, then 1 MB steps until malloc fails; free give_back_mb of it */
  enum { MAXB = 1 << 16 };
  static void *blocks[MAXB];
  static size_t sizes[MAXB];
  int n = 0;
  for (size_t step = 64u << 20; step >= (1u << 20); step /= 64)
    while (n < MAXB && (blocks[n] = malloc(step)) != NULL) sizes[n++] = step;
  size_t back = (size_t)give_back_mb << 20, freed = 0;
  while (n > 0 && freed < back) { freed += sizes[--n]; free(blocks[n]); }
  fprintf(stderr, "stress: address space squeezed, %zu MB given back\n", freed >> 20);
}

static int init_cuda(void) {
  CUdevice dev;
  if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
      cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
    fprintf(stderr, "stress: no CUDA device\n");
    return -1;
  }
  return 0;
}

static int run_child(long n) {
  if (init_cuda() != 0) return 3;
  CUmodule m;
  CUfunction f;
  if (load_module("stress_child", &m, &f) != CUDA_SUCCESS) return 3;
  launch_n(f, NULL, 0, n, 0x10000);
  cuCtxSynchronize();
  write_truth("child", NULL, NULL, 0);
  return 0;
}

int main(int argc, char **argv) {
  report_fatal_signals();
  if (argc >= 4 && strcmp(argv[1], "CHILD") == 0) {
    snprintf(truth_dir, sizeof truth_dir, "%s", argv[3]);
    return run_child(atol(argv[2]));
  }
  if (argc < 6 || strcmp(argv[1], "MAIN") != 0) {
    fprintf(stderr, "usage: stress MAIN THREADS LAUNCHES TRUTH_DIR SQUEEZE_MB | stress CHILD LAUNCHES TRUTH_DIR\n");
    return 2;
  }
  int nthreads = atoi(argv[2]);
  per_thread = atol(argv[3]);
  snprintf(truth_dir, sizeof truth_dir, "%s", argv[4]);
  long squeeze_mb = atol(argv[5]);
  ssize_t k = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
  if (k <= 0 || nthreads < 1 || nthreads > 256 || per_thread < 2) return 2;
  self_path[k] = 0;
  if (init_cuda() != 0) return 3;
  if (squeeze_mb > 0) squeeze(squeeze_mb);
  pthread_t th[256];
  int made = 0;
  for (long t = 0; t < nthreads; t++) {
    if (pthread_create(&th[t], NULL, worker, (void *)t) != 0) {
      fprintf(stderr, "stress: thread %ld not started (%s)\n", t, strerror(errno));
      break;
    }
    made++;
  }
  atomic_store(&go, 1);
  while (atomic_load(&halfway) < (made + 1) / 2) usleep(1000);
  long kids[2] = {-1, -1};
  int status[2] = {-1, -1};
  pid_t a = fork();                    /* child 1: a fresh injected process */
  if (a == 0) {
    char n[32];
    snprintf(n, sizeof n, "%ld", per_thread / 10 > 0 ? per_thread / 10 : 1);
    execl(self_path, self_path, "CHILD", n, truth_dir, (char *)NULL);
    _exit(127);
  }
  pid_t b = fork();                    /* child 2: leaves at once */
  if (b == 0) _exit(0);
  kids[0] = a; kids[1] = b;
  for (int t = 0; t < made; t++) pthread_join(th[t], NULL);
  cuCtxSynchronize();
  if (a > 0) waitpid(a, &status[0], 0);
  if (b > 0) waitpid(b, &status[1], 0);
  write_truth("main", kids, status, 2);
  return 0;
}
