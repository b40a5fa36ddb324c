/* The whole injected library in CPU processes: the stress program of issue 14 without a GPU.
 *
 * Compiled with every source of the library (capture/build_support.py SOURCES, init.c included),
 * so what runs is the library as the driver loads it: InitializeInjection reads the MINE_CAPTURE_*
 * knobs, resolves the driver through cuGetProcAddress_v2, opens the dump, writes meta.json and
 * registers its exit and fork handlers; the exit handler writes the counters. What a GPU process
 * would provide is faked: the driver is a small libcuda.so.1 built from this same file with
 * MC_FAKE_LIBCUDA (its cuGetProcAddress_v2 hands out this program's fake_<name> functions), CUPTI
 * is three stand-ins (subscribe, enable, version), and each launch's callback data is made by hand
 * (API entry, then exit, as CUPTI calls it). tests/capture/test_capture_fullfs.py drives it.
 *
 *   harness MAIN THREADS LAUNCHES TRUTH_DIR [CUBIN [SQUEEZE_MB]]
 *       as benchmarks/stress/stress.c's MAIN: THREADS threads launch LAUNCHES kernels each; once
 *       half of them are half-way, one fork execs this program as CHILD (a fresh library) and
 *       another leaves at once with _exit; with CUBIN ("-": none), each thread reports a module
 *       load of it before its first launch and another half-way (stress.c's lazy loads); with
 *       SQUEEZE_MB >= 0, after the library started, address space is reserved (malloc, untouched)
 *       until malloc fails and SQUEEZE_MB of it given back, so the threads, the library's buffers
 *       and TLS, the fork and the exit run at the edge of `ulimit -v` (stress.c's squeeze)
 *   harness CHILD LAUNCHES TRUTH_DIR [CUBIN]
 *       one thread, as one of MAIN's
 *   harness FORK LAUNCHES TRUTH_DIR [CUBIN]
 *       the main thread launches LAUNCHES kernels and forks without exec (the library's fork
 *       handler): the child launches LAUNCHES more from the forking thread and LAUNCHES from a new
 *       thread, then leaves with exit(0); the parent launches LAUNCHES more and waits for it
 *       (roles "main" and "forked"; every launch's parameter 3 is its thread's id)
 *   harness CHURN THREADS
 *       THREADS threads one after another, each launching 3 kernels and leaving; prints the heap in
 *       use (mallinfo2, one arena) after 16 of them and after all: {"warm", "after", "threads"}
 * With HARNESS_OOM_AT_EXIT=1 in the environment, every allocation of the library fails from the
 * end of the program's work on (its exit handler's meta.json write among them).
 * Built as a shared library (-DMC_HARNESS_SO, as libharness.so) and started through the launcher
 * (this file with -DMC_HARNESS_LAUNCHER), the library is dlopened as the driver loads it: a
 * __thread variable of the default model would be dynamic TLS, allocated by glibc at each thread's
 * first touch, and under the squeeze glibc ended the process when that failed ("cannot allocate
 * memory for thread-local data: ABORT", exit 127); the library's one thread-local is now an
 * initial-exec pointer to a block it allocates itself (mc.h mc_tl_t).
 * Both write TRUTH_DIR/<pid>.json (what the program did, in stress.c's form: pid, role, launches,
 * failed, modules, children, child_status, vm_peak_kb) for benchmarks/stress/check.py. */
#if defined(MC_HARNESS_LAUNCHER)
/* the launcher: dlopens the harness built as a shared library (-DMC_HARNESS_SO), so the library's
 * thread-local storage is a dlopened library's, as when the driver dlopens the injection library */
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
  void *h = dlopen("libharness.so", RTLD_NOW | RTLD_GLOBAL);
  int (*hm)(int, char **) = h ? (int (*)(int, char **))dlsym(h, "harness_main") : NULL;
  if (!hm) { fprintf(stderr, "harness: %s\n", dlerror()); return 2; }
  return hm(argc, argv);
}
#elif defined(MC_FAKE_LIBCUDA)
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status) {
  (void)version; (void)flags;
  char name[160];
  snprintf(name, sizeof name, "fake_%s", symbol);
  *pfn = dlsym(RTLD_DEFAULT, name);
  if (status) *status = *pfn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
#else
#include "mc.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

int InitializeInjection(void);

/* ---- CUPTI: what the library calls at start ---- */
CUptiResult CUPTIAPI cuptiSubscribe(CUpti_SubscriberHandle *s, CUpti_CallbackFunc f, void *ud) {
  (void)f; (void)ud;
  *s = (CUpti_SubscriberHandle)(uintptr_t)0x5b;
  return CUPTI_SUCCESS;
}
CUptiResult CUPTIAPI cuptiEnableCallback(uint32_t enable, CUpti_SubscriberHandle s, CUpti_CallbackDomain d,
                                         CUpti_CallbackId c) {
  (void)enable; (void)s; (void)d; (void)c;
  return CUPTI_SUCCESS;
}
CUptiResult CUPTIAPI cuptiGetVersion(uint32_t *v) {
  *v = 130000;
  return CUPTI_SUCCESS;
}

/* ---- the driver (exported: the fake libcuda.so.1 finds them by name): one runtime kernel with
 * the loop's ABI (float*, const float*, float, int) ---- */
#define KERNEL 0x7a000u
#define FUNC_OF_KERNEL 0x100000u
static const char *const SYM = "_Z7k_emptyPfPKffi";
static const unsigned OFF[4] = {0, 8, 16, 20}, SIZE[4] = {8, 8, 4, 4};
static const CUcontext CTX = (CUcontext)0xc7000;
#define EXPORT __attribute__((visibility("default"), used))
EXPORT CUresult fake_cuDriverGetVersion(int *v) { *v = 13000; return CUDA_SUCCESS; }
EXPORT CUresult fake_cuDeviceGetCount(int *n) { *n = 0; return CUDA_SUCCESS; }
EXPORT CUresult fake_cuCtxGetCurrent(CUcontext *c) { *c = CTX; return CUDA_SUCCESS; }
EXPORT CUresult fake_cuCtxGetDevice(CUdevice *d, CUcontext c) { (void)c; *d = 0; return CUDA_SUCCESS; }
EXPORT CUresult fake_cuFuncGetName(const char **nm, CUfunction f) {
  if ((uintptr_t)f != KERNEL + FUNC_OF_KERNEL) return CUDA_ERROR_INVALID_HANDLE;
  *nm = SYM;
  return CUDA_SUCCESS;
}
EXPORT CUresult fake_cuKernelGetFunction(CUfunction *f, CUkernel k) {
  if ((uintptr_t)k != KERNEL) return CUDA_ERROR_INVALID_HANDLE;
  *f = (CUfunction)(uintptr_t)(KERNEL + FUNC_OF_KERNEL);
  return CUDA_SUCCESS;
}
EXPORT CUresult fake_cuKernelGetName(const char **nm, CUkernel k) {
  if ((uintptr_t)k != KERNEL) return CUDA_ERROR_INVALID_HANDLE;
  *nm = SYM;
  return CUDA_SUCCESS;
}
EXPORT CUresult fake_cuKernelGetParamInfo(CUkernel k, size_t i, size_t *o, size_t *s) {
  if ((uintptr_t)k != KERNEL) return CUDA_ERROR_INVALID_HANDLE;
  if (i >= 4) return CUDA_ERROR_INVALID_VALUE;
  *o = OFF[i]; *s = SIZE[i];
  return CUDA_SUCCESS;
}
EXPORT CUresult fake_cuFuncGetAttribute(int *v, CUfunction_attribute a, CUfunction f) {
  (void)f;
  *v = 10 + (int)a;
  return CUDA_SUCCESS;
}
EXPORT CUresult fake_cuFuncGetModule(CUmodule *m, CUfunction f) { (void)f; *m = NULL; return CUDA_SUCCESS; }
EXPORT CUresult fake_cuPointerGetAttributes(unsigned n, CUpointer_attribute *a, void **d, CUdeviceptr p) {
  (void)p;   /* no device memory here: as the driver answers for a host pointer, every value 0 */
  for (unsigned i = 0; i < n; i++) switch (a[i]) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned *)d[i] = 0; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)d[i] = 0; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)d[i] = 0; break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long *)d[i] = 0; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

/* ---- the host: launches as CUPTI reports them ---- */
static atomic_long launched, modules, halfway;
static atomic_uint corr;
static char self_path[4096], truth_dir[4096];

static void launch(int i) {
  float *y = (float *)0x600000001000ull, *x = (float *)0x600000101000ull, a = 1.0f;
  void *args[4] = {&y, &x, &a, &i};
  cuLaunchKernel_params p = {(CUfunction)(uintptr_t)KERNEL, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL};
  CUresult rc = CUDA_SUCCESS;
  CUpti_CallbackData d;
  memset(&d, 0, sizeof d);
  d.functionName = "cuLaunchKernel"; d.functionParams = &p; d.functionReturnValue = &rc;
  d.symbolName = SYM; d.context = CTX; d.contextUid = 1; d.correlationId = atomic_fetch_add(&corr, 1) + 1;
  d.callbackSite = CUPTI_API_ENTER;
  mc_callback(NULL, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, &d);
  d.callbackSite = CUPTI_API_EXIT;
  mc_callback(NULL, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, &d);
  atomic_fetch_add_explicit(&launched, 1, memory_order_relaxed);
}

static char cubin[1 << 20];
static size_t cubin_n;
static void read_cubin(const char *path) {
  FILE *f = path ? fopen(path, "rb") : NULL;
  if (!f) return;
  cubin_n = fread(cubin, 1, sizeof cubin, f);
  fclose(f);
}

static void load_module(uint32_t id) {   /* as CUPTI reports a module load */
  if (!cubin_n) return;
  CUpti_ModuleResourceData m;
  memset(&m, 0, sizeof m);
  m.moduleId = id; m.pCubin = cubin; m.cubinSize = cubin_n;
  CUpti_ResourceData r;
  memset(&r, 0, sizeof r);
  r.context = CTX; r.resourceDescriptor = &m;
  mc_callback(NULL, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_MODULE_LOADED, &r);
  atomic_fetch_add(&modules, 1);
}

static void write_truth(const char *role, const long *kids, const int *status, int nkids) {
  char path[4200], tmp[4300];
  snprintf(path, sizeof path, "%s/%d.json", truth_dir, (int)getpid());
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) { perror("harness: truth file"); return; }
  fprintf(f, "{\"pid\":%d,\"role\":\"%s\",\"launches\":%ld,\"failed\":0,\"modules\":%ld,\"children\":[",
          (int)getpid(), role, atomic_load(&launched), atomic_load(&modules));
  for (int i = 0; i < nkids; i++) fprintf(f, "%s%ld", i ? "," : "", kids[i]);
  fprintf(f, "],\"child_status\":[");
  for (int i = 0; i < nkids; i++) fprintf(f, "%s%d", i ? "," : "", status[i]);
  fprintf(f, "],\"vm_peak_kb\":0}\n");
  if (fclose(f) == 0) rename(tmp, path);
}

static void squeeze(long give_back_mb) {
  enum { MAXB = 1 << 16 };
  static void *blocks[MAXB];
  static size_t sizes[MAXB];
  int n = 0;
  for (size_t step = 64u << 20; step >= (4u << 10); step /= 16)
    while (n < MAXB && (blocks[n] = malloc(step)) != NULL) sizes[n++] = step;
  size_t back = (size_t)give_back_mb << 20, freed = 0;
  while (n > 0 && freed < back) { freed += sizes[--n]; free(blocks[n]); }
}

static void *no_memory(void *p, size_t n) { (void)p; (void)n; return NULL; }
static int leave(int rc) {
  const char *oom = getenv("HARNESS_OOM_AT_EXIT");
  if (oom && *oom == '1') mc_sys_realloc = no_memory;
  return rc;
}

static long per_thread;
static void *worker(void *arg) {   /* as stress.c's: a module first, another one half-way */
  long t = (long)arg, half = per_thread / 2;
  load_module((uint32_t)(2 + 2 * t));
  for (long i = 0; i < per_thread; i++) {
    if (i == half) {
      load_module((uint32_t)(3 + 2 * t));
      atomic_fetch_add(&halfway, 1);
    }
    launch((int)(t * per_thread + i));
  }
  return NULL;
}

/* ---- mode FORK: the forking thread's block in the child ---- */
static void *fork_worker(void *arg) {
  (void)arg;
  for (long i = 0; i < per_thread; i++) launch((int)syscall(SYS_gettid));
  return NULL;
}

static int run_fork(void) {
  load_module(2);
  for (long i = 0; i < per_thread; i++) launch((int)getpid());
  pid_t c = fork();
  if (c < 0) return 2;
  if (c == 0) {
    atomic_store(&launched, 0);
    atomic_store(&modules, 0);
    for (long i = 0; i < per_thread; i++) launch((int)getpid());
    pthread_t th;
    if (pthread_create(&th, NULL, fork_worker, NULL) != 0 || pthread_join(th, NULL) != 0) exit(3);
    write_truth("forked", NULL, NULL, 0);
    exit(0);
  }
  for (long i = 0; i < per_thread; i++) launch((int)getpid());
  long kids[1] = {c};
  int status[1] = {-1};
  waitpid(c, &status[0], 0);
  write_truth("main", kids, status, 1);
  return 0;
}

/* ---- mode CHURN: a block per thread, freed when the thread leaves ---- */
static void *churn_worker(void *arg) {
  for (int i = 0; i < 3; i++) launch((int)(long)arg);
  return NULL;
}

static size_t churn(long n, long from) {
  for (long t = from; t < from + n; t++) {
    pthread_t th;
    if (pthread_create(&th, NULL, churn_worker, (void *)t) != 0 || pthread_join(th, NULL) != 0) return 0;
  }
  return mallinfo2().uordblks;
}

#ifdef MC_HARNESS_SO
#define main harness_main
EXPORT int harness_main(int argc, char **argv);
#endif
int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "CHURN") == 0) {
    mallopt(M_ARENA_MAX, 1);   /* every thread's allocations in the one arena mallinfo2 reads */
    InitializeInjection();
    long n = atol(argv[2]);
    size_t warm = churn(16, 0), after = churn(n, 16);
    printf("{\"warm\":%zu,\"after\":%zu,\"threads\":%ld}\n", warm, after, n);
    return leave(warm && after ? 0 : 3);
  }
  if (argc < 4) return 2;
  if (strcmp(argv[1], "FORK") == 0) {
    per_thread = atol(argv[2]);
    snprintf(truth_dir, sizeof truth_dir, "%s", argv[3]);
    InitializeInjection();
    read_cubin(argc > 4 ? argv[4] : NULL);
    return leave(run_fork());
  }
  int child = strcmp(argv[1], "CHILD") == 0;
  const char *cubin = argc > (child ? 4 : 5) ? argv[child ? 4 : 5] : NULL;
  if (cubin && strcmp(cubin, "-") == 0) cubin = NULL;
  long squeeze_mb = !child && argc > 6 ? atol(argv[6]) : -1;
  snprintf(truth_dir, sizeof truth_dir, "%s", argv[child ? 3 : 4]);
  ssize_t k = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
  if (k <= 0) return 2;
  self_path[k] = 0;
  InitializeInjection();   /* the driver calls it at cuInit */
  read_cubin(cubin);
  if (child) {
    per_thread = atol(argv[2]);
    worker((void *)0);
    write_truth("child", NULL, NULL, 0);
    return leave(0);
  }
  int nthreads = atoi(argv[2]);
  per_thread = atol(argv[3]);
  if (nthreads < 1 || nthreads > 64 || per_thread < 2) return 2;
  if (squeeze_mb >= 0) squeeze(squeeze_mb);
  pthread_t th[64];
  pthread_attr_t at;   /* small stacks: under the squeeze most threads start, and run at the edge */
  pthread_attr_init(&at);
  pthread_attr_setstacksize(&at, 256 << 10);
  int made = 0;
  for (long t = 0; t < nthreads; t++)
    if (pthread_create(&th[made], &at, worker, (void *)t) == 0) made++;
  while (made && atomic_load(&halfway) < (made + 1) / 2) usleep(200);
  long kids[2] = {-1, -1};
  int status[2] = {-1, -1};
  pid_t a = fork();        /* a fresh injected process, on the filesystem as the parent left it */
  if (a == 0) {
    char n[32];
    snprintf(n, sizeof n, "%ld", per_thread / 10 > 0 ? per_thread / 10 : 1);
    if (cubin) execl(self_path, self_path, "CHILD", n, truth_dir, cubin, (char *)NULL);
    else execl(self_path, self_path, "CHILD", n, truth_dir, (char *)NULL);
    _exit(127);
  }
  pid_t b = fork();        /* leaves at once: the fork handler's path */
  if (b == 0) _exit(0);
  kids[0] = a; kids[1] = b;
  for (int t = 0; t < made; t++) pthread_join(th[t], NULL);
  if (a > 0) waitpid(a, &status[0], 0);
  if (b > 0) waitpid(b, &status[1], 0);
  write_truth("main", kids, status, 2);
  return leave(0);
}
#endif
