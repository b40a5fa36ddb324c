/* The launch path of the injected library, driven on CPU: CUPTI's side played by hand.
 *
 * Compiled (tests/helpers/c_harness.py PRELUDE in front) with callbacks.c, layout.c, alloc.c, record.c,
 * writer.c and ident.c: exactly the code the library runs per launch, from mc_callback() down to
 * the bytes in the dump. What a GPU process would provide is faked here: the driver entry points
 * the library calls (a kernel table answering cuKernelGetParamInfo & co.) and the CUPTI callback
 * data of each launch (API entry, then exit, as CUPTI calls it).
 *
 *   harness records DIR json|bin N       N launches of three kernels through three launch APIs;
 *                                        prints what was launched (one JSON line per launch)
 *   harness bench DIR json|bin|noop|filtered N THRASH_KB
 *                                        N launches of the loop kernel 3 us apart; between two,
 *                                        THRASH_KB of memory is written (the driver's own launch
 *                                        work evicts our data the same way); prints ns per launch
 *                                        spent in mc_callback (entry + exit); THRASH_KB < 0: back
 *                                        to back, not spaced (for a profiler).
 *   harness oom DIR json|bin FAIL_AT CUBIN
 *                                        the module, allocation-log and launch paths (a module
 *                                        load of the real CUBIN, an allocation, 30 launches, a
 *                                        free, an unload) with the library's allocator failing
 *                                        its FAIL_AT-th allocation (0: none); the host's own work
 *                                        goes on to the end; prints (last line) {"allocs",
 *                                        "failed_in", "off", "host_launches"} */

/* ---- CUPTI: the library enables callbacks at start; never called here ---- */
CUptiResult CUPTIAPI cuptiEnableCallback(uint32_t enable, CUpti_SubscriberHandle s, CUpti_CallbackDomain d,
                                         CUpti_CallbackId c) {
  (void)enable; (void)s; (void)d; (void)c;
  return CUPTI_SUCCESS;
}

mc_driver_t mc_drv;
atomic_uint mc_free_epoch, mc_alloc_epoch;
atomic_int mc_capturing;
const char *const mc_fn_names[MC_FN_COUNT] = {
#define MC_NAME(fn) #fn,
    MC_DRIVER_FUNCS(MC_NAME) MC_CUPTI_FUNCS(MC_NAME)
#undef MC_NAME
};
void mc_note_error(int fn, int code, int fatal) { /* as init.c's: counted; fatal ones turn capture off */
  atomic_fetch_add(&mc_cnt.errors[fn], 1);
  if (fatal) mc_disable("[mine-capture] capture off in pid %d: %s failed with code %d", mc_pid, mc_fn_names[fn], code);
}

/* ---- a failing allocator (mode oom): the choke point's FAIL_AT-th call fails ---- */
static long alloc_n, fail_at;
static const char *phase = "start", *failed_in = "none";
static void *failing_realloc(void *p, size_t n) {
  if (++alloc_n == fail_at) { failed_in = phase; return NULL; }
  return realloc(p, n);
}

/* ---- the fake driver: three kernels ----
 * 0: a runtime kernel (CUkernel handle) with the loop's ABI (float*, const float*, float, int)
 * 1: a driver function (CUfunction handle) launched with a packed `extra` buffer
 * 2: a runtime kernel with a 24-byte struct by value, launched with cuLaunchKernelEx + attributes */
typedef struct { uintptr_t handle; int is_kernel; const char *sym; int np; unsigned off[8], size[8]; } fk_t;
static const fk_t fk[3] = {
    {0x7a000, 1, "_Z7k_emptyPfPKffi", 4, {0, 8, 16, 20}, {8, 8, 4, 4}},
    {0x8b000, 0, "_Z4gemm6Params", 6, {0, 8, 16, 24, 28, 32}, {8, 8, 8, 4, 4, 8}},
    {0x7c000, 1, "_Z3mix3Seg", 2, {0, 24}, {24, 8}},
};
#define FUNC_OF_KERNEL 0x100000u
static const fk_t *by_handle(uintptr_t h) {
  for (int i = 0; i < 3; i++)
    if (fk[i].handle == h || (fk[i].is_kernel && fk[i].handle + FUNC_OF_KERNEL == h)) return &fk[i];
  return NULL;
}
static CUresult f_FuncGetName(const char **nm, CUfunction f) {
  const fk_t *k = by_handle((uintptr_t)f);
  if (!k || k->is_kernel) return CUDA_ERROR_INVALID_HANDLE; /* a CUkernel is not a CUfunction */
  *nm = k->sym;
  return CUDA_SUCCESS;
}
static CUresult f_KernelGetFunction(CUfunction *f, CUkernel k) {
  const fk_t *x = by_handle((uintptr_t)k);
  if (!x || !x->is_kernel) return CUDA_ERROR_INVALID_HANDLE;
  *f = (CUfunction)(x->handle + FUNC_OF_KERNEL);
  return CUDA_SUCCESS;
}
static CUresult f_KernelGetName(const char **nm, CUkernel k) {
  const fk_t *x = by_handle((uintptr_t)k);
  if (!x) return CUDA_ERROR_INVALID_HANDLE;
  *nm = x->sym;
  return CUDA_SUCCESS;
}
static CUresult param_info(uintptr_t h, int want_kernel, size_t i, size_t *o, size_t *s) {
  const fk_t *x = by_handle(h);
  if (!x || x->is_kernel != want_kernel) return CUDA_ERROR_INVALID_HANDLE;
  if ((int)i >= x->np) return CUDA_ERROR_INVALID_VALUE;
  *o = x->off[i]; *s = x->size[i];
  return CUDA_SUCCESS;
}
static CUresult f_KernelGetParamInfo(CUkernel k, size_t i, size_t *o, size_t *s) {
  return param_info((uintptr_t)k, 1, i, o, s);
}
static CUresult f_FuncGetParamInfo(CUfunction f, size_t i, size_t *o, size_t *s) {
  return param_info((uintptr_t)f, 0, i, o, s);
}
static CUresult f_FuncGetAttribute(int *v, CUfunction_attribute a, CUfunction f) {
  (void)f;
  *v = 10 + (int)a;
  return CUDA_SUCCESS;
}
static CUresult f_FuncGetModule(CUmodule *m, CUfunction f) {
  (void)f;
  *m = NULL;
  return CUDA_SUCCESS;
}
static CUresult f_CtxGetDevice(CUdevice *d, CUcontext c) {
  (void)c;
  *d = 0;
  return CUDA_SUCCESS;
}
static CUresult f_PointerGetAttributes(unsigned n, CUpointer_attribute *a, void **d, CUdeviceptr p) {
  (void)n; (void)a; (void)d; (void)p;
  return CUDA_ERROR_INVALID_VALUE; /* no device memory on this machine */
}

static void fake_driver(void) {
  mc_drv.cuFuncGetName = f_FuncGetName;
  mc_drv.cuKernelGetFunction = f_KernelGetFunction;
  mc_drv.cuKernelGetName = f_KernelGetName;
  mc_drv.cuKernelGetParamInfo = f_KernelGetParamInfo;
  mc_drv.cuFuncGetParamInfo = f_FuncGetParamInfo;
  mc_drv.cuFuncGetAttribute = f_FuncGetAttribute;
  mc_drv.cuFuncGetModule = f_FuncGetModule;
  mc_drv.cuCtxGetDevice_v2 = f_CtxGetDevice;
  mc_drv.cuPointerGetAttributes = f_PointerGetAttributes;
}

/* ---- one launch, as CUPTI reports it: the entry site, then the exit site ---- */
static const CUcontext CTX = (CUcontext)0xc7000;
static uint32_t corr;
static void cupti_launch(CUpti_CallbackId cbid, const char *fname, const char *sym, const void *params) {
  CUresult rc = CUDA_SUCCESS;
  CUpti_CallbackData d;
  memset(&d, 0, sizeof d);
  d.functionName = fname; d.functionParams = params; d.functionReturnValue = &rc;
  d.symbolName = sym; d.context = CTX; d.contextUid = 1; d.correlationId = ++corr;
  d.callbackSite = CUPTI_API_ENTER;
  mc_callback(NULL, CUPTI_CB_DOMAIN_DRIVER_API, cbid, &d);
  d.callbackSite = CUPTI_API_EXIT;
  mc_callback(NULL, CUPTI_CB_DOMAIN_DRIVER_API, cbid, &d);
}

/* what was launched, for the test to compare with the dump */
static void hexs(const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++) printf("%02x", p[i]);
}

static float *Y = (float *)0x600000001000ull, *X = (float *)0x600000101000ull;  /* not mapped */
static void launch_loop_kernel(int i, int print) {
  float a = 1.0f;
  void *args[4] = {&Y, &X, &a, &i};
  cuLaunchKernel_params p = {(CUfunction)fk[0].handle, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL};
  cupti_launch(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, "cuLaunchKernel", fk[0].sym, &p);
  if (print) {
    printf("{\"api\":\"cuLaunchKernel\",\"symbol\":\"%s\",\"grid\":[1,1,1],\"block\":[32,1,1],\"smem\":0,\"params\":[\"",
           fk[0].sym);
    hexs((void *)&Y, 8); printf("\",\""); hexs((void *)&X, 8); printf("\",\"");
    hexs((void *)&a, 4); printf("\",\""); hexs((void *)&i, 4); printf("\"]}\n");
  }
}

static void launch_packed(int i) {
  unsigned char buf[40];
  for (int b = 0; b < 40; b++) buf[b] = (unsigned char)(b * 7 + i);
  size_t n = sizeof buf;
  void *extra[5] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &n, CU_LAUNCH_PARAM_END};
  cuLaunchKernel_params p = {(CUfunction)fk[1].handle, 132, 1, 1, 384, 1, 1, 232448, (CUstream)0x5500, NULL, extra};
  cupti_launch(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz, "cuLaunchKernel_ptsz", NULL, &p);
  printf("{\"api\":\"cuLaunchKernel_ptsz\",\"symbol\":\"%s\",\"grid\":[132,1,1],\"block\":[384,1,1],\"smem\":232448,"
         "\"params\":[", fk[1].sym);
  for (int k = 0; k < fk[1].np; k++) {
    printf(k ? ",\"" : "\""); hexs(buf + fk[1].off[k], fk[1].size[k]); printf("\"");
  }
  printf("]}\n");
}

static void launch_ex(int i) {
  struct { uint64_t ptr, n; int32_t s[2]; } seg = {0x600000201000ull + 256u * (unsigned)i, (uint64_t)i * 3, {i, -i}};
  uint64_t tail = 0xabcdef00u + (unsigned)i;
  void *args[2] = {&seg, &tail};
  CUlaunchAttribute at[2];
  memset(at, 0, sizeof at);
  at[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  at[0].value.clusterDim.x = 2; at[0].value.clusterDim.y = 1; at[0].value.clusterDim.z = 1;
  at[1].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  at[1].value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.gridDimX = 4; cfg.gridDimY = 2; cfg.gridDimZ = 1; cfg.blockDimX = 128; cfg.blockDimY = 1; cfg.blockDimZ = 1;
  cfg.sharedMemBytes = 1024; cfg.hStream = (CUstream)0x6600; cfg.attrs = at; cfg.numAttrs = 2;
  cuLaunchKernelEx_params p = {&cfg, (CUfunction)fk[2].handle, args, NULL};
  cupti_launch(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx, "cuLaunchKernelEx", fk[2].sym, &p);
  printf("{\"api\":\"cuLaunchKernelEx\",\"symbol\":\"%s\",\"grid\":[4,2,1],\"block\":[128,1,1],\"smem\":1024,"
         "\"cluster\":[2,1,1],\"params\":[\"", fk[2].sym);
  hexs((void *)&seg, sizeof seg); printf("\",\""); hexs((void *)&tail, 8); printf("\"]}\n");
}

/* ---- timing ---- */
static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

static unsigned char *thrash_buf;
static size_t thrash_n;
static void thrash(int i) { /* writes every cache line of thrash_buf, as a large working set does */
  for (size_t o = 0; o < thrash_n; o += 64) thrash_buf[o] = (unsigned char)(o + (size_t)i);
}

/* ---- mode oom: one module, one allocation, launches, a free, an unload ---- */
static void cupti_api(CUpti_CallbackId cbid, const char *fname, const void *params) {
  CUresult rc = CUDA_SUCCESS;
  CUpti_CallbackData d;
  memset(&d, 0, sizeof d);
  d.functionName = fname; d.functionParams = params; d.functionReturnValue = &rc;
  d.context = CTX; d.contextUid = 1; d.correlationId = ++corr;
  d.callbackSite = CUPTI_API_ENTER;
  mc_callback(NULL, CUPTI_CB_DOMAIN_DRIVER_API, cbid, &d);
  d.callbackSite = CUPTI_API_EXIT;
  mc_callback(NULL, CUPTI_CB_DOMAIN_DRIVER_API, cbid, &d);
}

static void cupti_module(CUpti_CallbackId cbid, uint32_t id, const char *cubin, size_t n) {
  CUpti_ModuleResourceData m;
  memset(&m, 0, sizeof m);
  m.moduleId = id; m.pCubin = cubin; m.cubinSize = n;
  CUpti_ResourceData r;
  memset(&r, 0, sizeof r);
  r.context = CTX; r.resourceDescriptor = &m;
  mc_callback(NULL, CUPTI_CB_DOMAIN_RESOURCE, cbid, &r);
}

static CUdeviceptr oom_dptr = 0x7f0000200000ull;
static void *alloc_thread(void *arg) {
  (void)arg;
  cuMemAlloc_v2_params a = {&oom_dptr, 1 << 20};
  cupti_api(CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2, "cuMemAlloc_v2", &a);
  return NULL;
}

static int run_oom(const char *cubin_path) {
  FILE *f = fopen(cubin_path, "rb");
  if (!f) return 1;
  static char cubin[1 << 20];
  size_t n = fread(cubin, 1, sizeof cubin, f);
  fclose(f);
  mc_sys_realloc = failing_realloc;
  phase = "module";
  cupti_module(CUPTI_CBID_RESOURCE_MODULE_LOADED, 7, cubin, n);
  phase = "alloc_log";   /* on a thread of its own, as a host's allocator thread: its own buffers */
  pthread_t th;
  if (pthread_create(&th, NULL, alloc_thread, NULL) != 0 || pthread_join(th, NULL) != 0) return 1;
  long host = 0;
  for (int i = 0; i < 30; i++) {   /* the host's launches: each one made whatever capture does */
    phase = "launch";
    if (i % 3 == 0) launch_loop_kernel(i, 0);
    else if (i % 3 == 1) launch_packed(i);   /* (these two print what they launched) */
    else launch_ex(i);
    host++;
  }
  phase = "alloc_log";
  cuMemFree_v2_params fr = {oom_dptr};
  cupti_api(CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2, "cuMemFree_v2", &fr);
  phase = "module";
  cupti_module(CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING, 7, cubin, n);
  phase = "exit";
  mc_files_finalize();
  printf("{\"allocs\":%ld,\"failed_in\":\"%s\",\"off\":%d,\"host_launches\":%ld}\n", alloc_n, failed_in,
         atomic_load(&mc_off), host);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 5) return 2;
  const char *mode = argv[1], *form = argv[3];
  long n = atol(argv[4]);
  snprintf(mc_knobs.dir, sizeof mc_knobs.dir, "%s", argv[2]);
  mc_knobs.writer_write = 0;           /* the capture's default writer: mmap */
  mc_knobs.host_bytes = 64;
  if (strcmp(form, "json") != 0) {     /* bin, noop, filtered: the binary form's knobs */
    mc_knobs.bin = 1; mc_knobs.compact = 1; mc_knobs.alloc_log = 1; mc_knobs.no_classify = 1;
  }
  if (strcmp(form, "noop") == 0) mc_knobs.noop = 1;
  if (strcmp(form, "filtered") == 0) {
    mc_knobs.has_include = regcomp(&mc_knobs.include_re, "^no_such_kernel$", REG_EXTENDED | REG_NOSUB) == 0;
  }
  mc_pid = getpid();
  fake_driver();
  if (strcmp(mode, "oom") == 0) {
    mc_knobs.alloc_log = 1;
    fail_at = n;
  }
  if (mc_files_open() != 0) { printf("{\"open\":\"failed\"}\n"); return 1; }
  if (strcmp(mode, "oom") == 0 && argc > 5) return run_oom(argv[5]);
  if (strcmp(mode, "records") == 0) {
    for (long i = 0; i < n; i++) {
      if (i % 3 == 0) launch_loop_kernel((int)i, 1);
      else if (i % 3 == 1) launch_packed((int)i);
      else launch_ex((int)i);
    }
  } else if (strcmp(mode, "bench") == 0 && argc > 5) {
    long kb = atol(argv[5]);
    for (int i = 0; i < 1000; i++) launch_loop_kernel(i, 0); /* as the GPU loop's warm-up */
    if (kb < 0) { /* back to back, for a profiler: the mean cost, clock calls included */
      double t0 = now_ns();
      for (long i = 0; i < n; i++) launch_loop_kernel((int)i, 0);
      printf("{\"ns_per_launch_back_to_back\":%.1f}\n", (now_ns() - t0) / n);
      mc_files_finalize();
      return 0;
    }
    thrash_n = (size_t)kb * 1024;
    thrash_buf = calloc(thrash_n + 64, 1);
    double ns = 0;
    for (long i = 0; i < n; i++) {
      thrash((int)i);
      double t0 = now_ns();
      launch_loop_kernel((int)i, 0);
      ns += now_ns() - t0;
      double t1 = now_ns();
      while (now_ns() - t1 < 3000) {}
    }
    printf("{\"ns_per_launch\":%.1f}\n", ns / n);
  } else if (strcmp(mode, "phases") == 0 && argc > 5) { /* the launch path's steps, each timed alone */
    thrash_n = (size_t)atol(argv[5]) * 1024;
    thrash_buf = calloc(thrash_n + 64, 1);
    for (int i = 0; i < 1000; i++) launch_loop_kernel(i, 0);
    const char *names[] = {"clock", "layout_get", "now_tid_dev", "fn_id", "record_bin", "callback"};
    double ns[6] = {0};
    float a = 1.0f;
    int iv = 0;
    void *args[4] = {&Y, &X, &a, &iv};
    for (long i = 0; i < n; i++) {
      for (int ph = 0; ph < 6; ph++) {
        thrash((int)i);
        const mc_entry_t *e = mc_layout_get((void *)fk[0].handle, CTX, fk[0].sym);
        mc_launch_t L = {0, 0, 0, CTX, NULL, 0, 0, 0, NULL, 0, {1, 1, 1}, {32, 1, 1}, 0, NULL, args, NULL};
        int64_t fn = mc_fn_id(e);
        thrash((int)i);
        double t0 = now_ns();
        switch (ph) {
        case 0: break;
        case 1: e = mc_layout_get((void *)fk[0].handle, CTX, fk[0].sym); break;
        case 2: L.t_ns = mc_now_ns(); L.tid = mc_tid(); L.dev = mc_ctx_device(CTX); break;
        case 3: fn = mc_fn_id(e); break;
        case 4: mc_record_bin(&L, e, (uint32_t)fn); break;
        case 5: launch_loop_kernel((int)i, 0); break;
        }
        ns[ph] += now_ns() - t0;
        double t1 = now_ns();
        while (now_ns() - t1 < 3000) {}
      }
    }
    printf("{");
    for (int ph = 0; ph < 6; ph++) printf("%s\"%s\":%.1f", ph ? "," : "", names[ph], ns[ph] / n);
    printf("}\n");
  } else return 2;
  mc_files_finalize();
  return 0;
}
