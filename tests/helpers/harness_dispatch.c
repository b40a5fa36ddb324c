/* The injected library driven on CPU, CUPTI's and the driver's sides played by hand.
 *
 * Compiled (tests/helpers/c_harness.py HEADERS in front) with every library source
 * (capture.build_support.SOURCES, init.c included): exactly the code the library runs, from
 * mc_callback() down to the bytes in the dump and meta.json. What a GPU process would provide is
 * faked here: the driver entry points the library calls (a kernel table answering
 * cuKernelGetParamInfo & co., stream-capture state, one device), CUPTI's enable calls (recorded)
 * and the CUPTI callback data of each call (API entry, then exit, as CUPTI calls it).
 *
 *   harness records DIR json|bin N       N launches of three kernels through three launch APIs;
 *                                        prints what was launched (one JSON line per launch)
 *   harness all DIR json|bin [KNOB...]   every row of the library's callback table (tables.h)
 *                                        dispatched once, plus the resource callbacks and (knob
 *                                        toggle=MS) the toggler; prints, per row, what the dump
 *                                        must then hold (one JSON line each), then what was
 *                                        enabled and toggled. KNOBs: compact alloc_log selftime
 *                                        noop modules_only classify0 alternate=N toggle=MS max_launches=N
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
 *                                        "failed_in", "off", "host_launches"}
 *   harness copies DIR json|bin ROUNDS [KNOB...]
 *                                        host-to-device copies between launches (and two generic
 *                                        copies that are not host-to-device), each printed with its
 *                                        bytes and the launches made before it; then {"done": ...}.
 *                                        KNOBs: copy_log0 copy_bytes=N writer=write fail=N (the
 *                                        library's Nth allocation from the first copy round on fails)
 *   harness snapshot DIR json|bin N [KNOB...]
 *                                        device allocations (alloc, free, map, unmap, a host and a
 *                                        failed allocation), then N launches, with the snapshot knobs
 *                                        (snapshot_at=K snapshot_signal snapshot_bytes=B) and what the
 *                                        host does around them (signal_at=K: SIGUSR2 after launch K;
 *                                        capture=C:M: launches C+1..C+M inside a stream capture, on its
 *                                        stream and another; hidden=C:M: the driver alone says the
 *                                        launch stream is capturing; dtoh_fail=K; sync_fail;
 *                                        block_dir: a file where snapshot/ goes); prints the
 *                                        allocations, then {"done": ...} (snapshot.c's tests)
 *   harness copybench DIR json|bin N SIZE [KNOB...]
 *                                        N async copies of SIZE bytes back to back (under callgrind,
 *                                        --toggle-collect=mc_callback: instructions per copy) */

/* ---- CUPTI: subscription, version, and every enable call, recorded ---- */
#define MAX_CBID 4096
static atomic_int enabled_now[MAX_CBID];     /* driver domain: 1 enabled, 0 disabled (last call) */
static atomic_int enable_calls[MAX_CBID];    /* driver domain: calls made */
static atomic_int disable_calls[MAX_CBID];   /* driver domain: calls with enable = 0 (the toggler) */
static atomic_int resource_enabled[64];
CUptiResult CUPTIAPI cuptiEnableCallback(uint32_t enable, CUpti_SubscriberHandle s, CUpti_CallbackDomain d,
                                         CUpti_CallbackId c) {
  (void)s;
  if (d == CUPTI_CB_DOMAIN_RESOURCE && c < 64) atomic_store(&resource_enabled[c], (int)enable);
  if (d == CUPTI_CB_DOMAIN_DRIVER_API && c < MAX_CBID) {
    atomic_store(&enabled_now[c], (int)enable);
    atomic_fetch_add(&enable_calls[c], 1);
    if (!enable) atomic_fetch_add(&disable_calls[c], 1);
  }
  return CUPTI_SUCCESS;
}
CUptiResult CUPTIAPI cuptiSubscribe(CUpti_SubscriberHandle *s, CUpti_CallbackFunc f, void *u) {
  (void)f; (void)u;
  *s = (CUpti_SubscriberHandle)0x5ab;
  return CUPTI_SUCCESS;
}
CUptiResult CUPTIAPI cuptiGetVersion(uint32_t *v) {
  *v = 999;
  return CUPTI_SUCCESS;
}

/* ---- a failing allocator (mode oom): the choke point's FAIL_AT-th call fails ---- */
static long alloc_n, fail_at;
static const char *phase = "start", *failed_in = "none";
static void *failing_realloc(void *p, size_t n) {
  if (++alloc_n == fail_at) { failed_in = phase; return NULL; }
  return realloc(p, n);
}

/* ---- the fake driver: the kernels ----
 * 0: a runtime kernel (CUkernel handle) with the loop's ABI (float*, const float*, float, int)
 * 1: a driver function (CUfunction handle) launched with a packed `extra` buffer
 * 2: a runtime kernel with a 24-byte struct by value, launched with cuLaunchKernelEx + attributes
 * 3: a runtime kernel taking a 128-byte tensor map by value (mode all: the tmap link)
 * 4..8: driver functions named as the fixture cubin's entry, one per module-load API (mode all:
 *    the CUmodule each one's cuFuncGetModule answers is the one that API call returned) */
typedef struct { uintptr_t handle; int is_kernel; const char *sym; int np; unsigned off[8], size[8]; } fk_t;
#define NFK 9
#define MOD_KERNEL0 4
static const fk_t fk[NFK] = {
    {0x7a000, 1, "_Z7k_emptyPfPKffi", 4, {0, 8, 16, 20}, {8, 8, 4, 4}},
    {0x8b000, 0, "_Z4gemm6Params", 6, {0, 8, 16, 24, 28, 32}, {8, 8, 8, 4, 4, 8}},
    {0x7c000, 1, "_Z3mix3Seg", 2, {0, 24}, {24, 8}},
    {0x7d000, 1, "_Z3tma14CUtensorMap_st", 1, {0}, {128}},
    {0x9a000, 0, "mine_argmax_rows", 1, {0}, {8}}, {0x9b000, 0, "mine_argmax_rows", 1, {0}, {8}},
    {0x9c000, 0, "mine_argmax_rows", 1, {0}, {8}}, {0x9d000, 0, "mine_argmax_rows", 1, {0}, {8}},
    {0x9e000, 0, "mine_argmax_rows", 1, {0}, {8}},
};
#define FUNC_OF_KERNEL 0x100000u
static const fk_t *by_handle(uintptr_t h) {
  for (int i = 0; i < NFK; i++)
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
  uintptr_t h = (uintptr_t)f;   /* kernels 4..8: the CUmodule of "their" module-load call */
  *m = NULL;
  for (int i = MOD_KERNEL0; i < NFK; i++)
    if (fk[i].handle == h) *m = (CUmodule)(0x4d000 + 0x100 * (uintptr_t)(i - MOD_KERNEL0));
  return CUDA_SUCCESS;
}
static CUresult f_CtxGetDevice(CUdevice *d, CUcontext c) {
  (void)c;
  *d = 0;
  return CUDA_SUCCESS;
}
/* Device memory: only [DEV_LO, DEV_HI), in 1 MiB allocations (the copy log's destinations);
 * everything else is "not a CUDA pointer": zeros and success, as the driver answers. */
#define DEV_LO 0x7d0000000000ull
#define DEV_HI 0x7d0100000000ull
static CUresult f_PointerGetAttributes(unsigned n, CUpointer_attribute *a, void **d, CUdeviceptr p) {
  int dev = p >= DEV_LO && p < DEV_HI;
  for (unsigned i = 0; i < n; i++) {
    switch (a[i]) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned *)d[i] = dev ? CU_MEMORYTYPE_DEVICE : 0; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)d[i] = dev ? (p & ~0xfffffull) : 0; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)d[i] = dev ? (1u << 20) : 0; break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long *)d[i] = dev ? 1 + ((p - DEV_LO) >> 20) : 0; break;
    default: memset(d[i], 0, 8);
    }
  }
  return CUDA_SUCCESS;
}
/* streams being captured: the harness opens a capture before calling cuStreamBeginCapture */
static CUstream cap_stream;
static uint64_t cap_id;
static CUgraph cap_graph;
static CUresult f_StreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                       const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *n) {
  (void)deps; (void)edges; (void)n;
  int on = cap_id && s == cap_stream;
  *st = on ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  if (id) *id = on ? cap_id : 0;
  if (g) *g = on ? cap_graph : NULL;
  return CUDA_SUCCESS;
}
/* every captured graph holds 3 nodes: two kernels and a memcpy */
static CUresult f_GraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *n) {
  (void)g;
  if (nodes)
    for (size_t i = 0; i < *n && i < 3; i++) nodes[i] = (CUgraphNode)(uintptr_t)(0x7100 + i);
  *n = 3;
  return CUDA_SUCCESS;
}
static CUresult f_GraphNodeGetType(CUgraphNode node, CUgraphNodeType *t) {
  *t = (uintptr_t)node == 0x7102 ? CU_GRAPH_NODE_TYPE_MEMCPY : CU_GRAPH_NODE_TYPE_KERNEL;
  return CUDA_SUCCESS;
}
/* one device, asked for meta.json once a context exists */
static CUresult f_CtxGetCurrent(CUcontext *c) { *c = (CUcontext)0xc7000; return CUDA_SUCCESS; }
static CUresult f_DeviceGetCount(int *n) { *n = 1; return CUDA_SUCCESS; }
static CUresult f_DeviceGet(CUdevice *d, int i) { *d = i; return CUDA_SUCCESS; }
static CUresult f_DeviceGetName(char *s, int n, CUdevice d) { (void)d; snprintf(s, (size_t)n, "Fake GPU"); return CUDA_SUCCESS; }
static CUresult f_DeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) { (void)d; *v = (int)a % 100; return CUDA_SUCCESS; }
static CUresult f_DeviceTotalMem(size_t *m, CUdevice d) { (void)d; *m = (size_t)1 << 30; return CUDA_SUCCESS; }
static CUresult f_DeviceGetUuid(CUuuid *u, CUdevice d) { (void)d; memset(u, 0xab, sizeof *u); return CUDA_SUCCESS; }

/* device memory for the snapshot (mode snapshot): [DEV_LO, DEV_LO + DEVMEM) backed by devmem, a
 * pattern of the offset; synchronizing "completes" the launches made: their count lands in the
 * first 8 bytes (so a snapshot taken before its synchronization shows an older count) */
#define DEVMEM (32u << 20)
static unsigned char devmem[DEVMEM];
static long launching, synced_at = -1, sync_calls, sync_capturing, dtoh_calls, dtoh_fail;
static int sync_fail;
static unsigned char pattern(size_t o) { return (unsigned char)((o * 7u) ^ (o >> 8) ^ (o >> 16)); }
static CUresult f_CtxSynchronize(CUcontext c) {
  (void)c;
  sync_calls++;
  if (cap_id) sync_capturing++;
  if (sync_fail) return CUDA_ERROR_LAUNCH_FAILED;
  synced_at = launching;
  memcpy(devmem, &launching, sizeof launching);
  return CUDA_SUCCESS;
}
static CUresult f_MemcpyDtoH(void *dst, CUdeviceptr src, size_t n) {
  if (++dtoh_calls == dtoh_fail) return CUDA_ERROR_INVALID_VALUE;
  if (src < DEV_LO || src - DEV_LO > DEVMEM || n > DEVMEM - (src - DEV_LO)) return CUDA_ERROR_INVALID_VALUE;
  memcpy(dst, devmem + (src - DEV_LO), n);
  return CUDA_SUCCESS;
}

static void fake_driver(void) {
  mc_drv.cuCtxSynchronize_v2 = f_CtxSynchronize;
  mc_drv.cuMemcpyDtoH_v2 = f_MemcpyDtoH;
  mc_drv.cuFuncGetName = f_FuncGetName;
  mc_drv.cuKernelGetFunction = f_KernelGetFunction;
  mc_drv.cuKernelGetName = f_KernelGetName;
  mc_drv.cuKernelGetParamInfo = f_KernelGetParamInfo;
  mc_drv.cuFuncGetParamInfo = f_FuncGetParamInfo;
  mc_drv.cuFuncGetAttribute = f_FuncGetAttribute;
  mc_drv.cuFuncGetModule = f_FuncGetModule;
  mc_drv.cuCtxGetDevice_v2 = f_CtxGetDevice;
  mc_drv.cuPointerGetAttributes = f_PointerGetAttributes;
  mc_drv.cuStreamGetCaptureInfo = f_StreamGetCaptureInfo;
  mc_drv.cuGraphGetNodes = f_GraphGetNodes;
  mc_drv.cuGraphNodeGetType = f_GraphNodeGetType;
  mc_drv.cuCtxGetCurrent = f_CtxGetCurrent;
  mc_drv.cuDeviceGetCount = f_DeviceGetCount;
  mc_drv.cuDeviceGet = f_DeviceGet;
  mc_drv.cuDeviceGetName = f_DeviceGetName;
  mc_drv.cuDeviceGetAttribute = f_DeviceGetAttribute;
  mc_drv.cuDeviceTotalMem = f_DeviceTotalMem;
  mc_drv.cuDeviceGetUuid = f_DeviceGetUuid;
}

/* ---- one call, as CUPTI reports it: the entry site, then the exit site ---- */
static const CUcontext CTX = (CUcontext)0xc7000;
static uint32_t corr;
static void cupti_call(CUpti_CallbackId cbid, const char *fname, const char *sym, const void *params, CUresult rc) {
  CUpti_CallbackData d;
  memset(&d, 0, sizeof d);
  d.functionName = fname; d.functionParams = params; d.functionReturnValue = &rc;
  d.symbolName = sym; d.context = CTX; d.contextUid = 1; d.correlationId = ++corr;
  d.callbackSite = CUPTI_API_ENTER;
  mc_callback(NULL, CUPTI_CB_DOMAIN_DRIVER_API, cbid, &d);
  d.callbackSite = CUPTI_API_EXIT;
  mc_callback(NULL, CUPTI_CB_DOMAIN_DRIVER_API, cbid, &d);
}
static void cupti_launch(CUpti_CallbackId cbid, const char *fname, const char *sym, const void *params) {
  cupti_call(cbid, fname, sym, params, CUDA_SUCCESS);
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
  cupti_call(cbid, fname, NULL, params, CUDA_SUCCESS);
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

/* ---- mode all: every row of the library's callback table, dispatched once ----
 * For each row (the library's own mc_cbs, so a row added to vocab/capture_tables.py without a
 * driver here fails the run), a call shaped like the real one, then one line naming the row and
 * what the dump must hold because of it: {"name", "family", "expect": {FILE: [record subsets]}}. */
static void expect_begin(const mc_cb_t *row) {
  static const char *const fam[] = {
#define FAM_NAME(f) #f,
      MC_CB_FAMILIES(FAM_NAME)
#undef FAM_NAME
  };
  printf("{\"name\":\"%s\",\"family\":\"%s\",\"expect\":{", row->name, fam[row->family]);
}
#define EXPECT_END() printf("}}\n")

static CUstream row_stream(const mc_cb_t *row, uintptr_t s) { return row->ptsz ? NULL : (CUstream)s; }
static uintptr_t seen_stream(const mc_cb_t *row, uintptr_t s) { return row->ptsz ? 0x2 : s; }

/* every launch attribute of the table, plus one it does not know (kept as attr_13) */
static CUlaunchAttribute all_attrs[MC_LAUNCH_ATTR_COUNT + 1];
static unsigned fill_attrs(void) {
  unsigned n = 0;
  memset(all_attrs, 0, sizeof all_attrs);
#define ATTR_SET(nm, id_, key, shape, member) all_attrs[n++].id = CU_LAUNCH_ATTRIBUTE_##nm;
  MC_LAUNCH_ATTRS(ATTR_SET)
#undef ATTR_SET
  for (unsigned i = 0; i < n; i++) {
    CUlaunchAttributeValue *v = &all_attrs[i].value;
    switch (all_attrs[i].id) {
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: v->clusterDim.x = 2; v->clusterDim.y = 1; v->clusterDim.z = 1; break;
    case CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION: v->clusterDim.x = 4; v->clusterDim.y = 2; v->clusterDim.z = 1; break;
    case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT:
      v->programmaticEvent.event = (CUevent)0xe1; v->programmaticEvent.flags = 1;
      v->programmaticEvent.triggerAtBlockStart = 1; break;
    case CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT:
      v->launchCompletionEvent.event = (CUevent)0xe2; v->launchCompletionEvent.flags = 3; break;
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP: v->memSyncDomainMap.default_ = 1; v->memSyncDomainMap.remote = 0; break;
    case CU_LAUNCH_ATTRIBUTE_PRIORITY: v->priority = -3; break;
    case CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: v->sharedMemCarveout = 50; break;
    default: v->cooperative = 1; break;   /* the int-valued ones */
    }
  }
  all_attrs[n].id = (CUlaunchAttributeID)13;
  memset(&all_attrs[n].value, 0x5c, sizeof all_attrs[n].value);
  return n + 1;
}

static void drive_launch(const mc_cb_t *row) {
  static int iv = 7;
  float a = 2.0f;
  void *args[4] = {&Y, &X, &a, &iv};
  uintptr_t s = 0x5a00 + 0x10 * (uintptr_t)row->api;
  CUfunction f = (CUfunction)fk[0].handle;
  if (row->kind == MC_K_LAUNCH) {
    cuLaunchKernel_params p = {f, 2, 1, 1, 64, 1, 1, 0, row_stream(row, s), args, NULL};
    cupti_launch(row->cbid, row->name, fk[0].sym, &p);
  } else if (row->kind == MC_K_LAUNCH_COOP) {
    cuLaunchCooperativeKernel_params p = {f, 2, 1, 1, 64, 1, 1, 0, row_stream(row, s), args};
    cupti_launch(row->cbid, row->name, fk[0].sym, &p);
  } else {
    CUlaunchConfig cfg = {.gridDimX = 2, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 64, .blockDimY = 1,
                          .blockDimZ = 1, .hStream = row_stream(row, s), .attrs = all_attrs,
                          .numAttrs = fill_attrs()};
    cuLaunchKernelEx_params p = {&cfg, f, args, NULL};
    cupti_launch(row->cbid, row->name, fk[0].sym, &p);
  }
  expect_begin(row);
  printf("\"launches\":[{\"api\":\"%s\",\"stream\":\"0x%lx\",\"symbol\":\"%s\",\"grid\":[2,1,1],\"block\":[64,1,1]",
         row->name, (unsigned long)seen_stream(row, s), fk[0].sym);
  if (row->kind == MC_K_LAUNCH_EX) printf(",\"all_attrs\":true");
  printf("}]");
  EXPECT_END();
}

static void drive_kernel_node(const mc_cb_t *row) {
  static uint64_t w[6] = {0x600000401000ull, 0x600000402000ull, 3, 4, 5, 6};
  void *args[6] = {&w[0], &w[1], &w[2], &w[3], &w[4], &w[5]};
  uintptr_t g = 0x9700 + 0x10 * (uintptr_t)row->api, x = 0xe700 + 0x10 * (uintptr_t)row->api;
  CUgraphNode node = (CUgraphNode)(0xd700 + 0x10 * (uintptr_t)row->api);
  /* v1 calls name a CUfunction; v2 and later a CUkernel through `kern` (func NULL) */
  CUDA_KERNEL_NODE_PARAMS_v1 k1 = {.func = (CUfunction)fk[1].handle, .gridDimX = 3, .gridDimY = 1, .gridDimZ = 1,
                                   .blockDimX = 32, .blockDimY = 1, .blockDimZ = 1, .kernelParams = args};
  CUDA_KERNEL_NODE_PARAMS_v2 k2 = {.gridDimX = 3, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 32, .blockDimY = 1,
                                   .blockDimZ = 1, .kernelParams = args, .kern = (CUkernel)fk[2].handle};
  void *args2[2] = {&w[0], &w[1]};
  k2.kernelParams = args2;
  CUgraphNodeParams gp;
  memset(&gp, 0, sizeof gp);
  gp.type = CU_GRAPH_NODE_TYPE_KERNEL;
  memcpy(&gp.kernel, &k2, sizeof k2);
  const void *np = row->v1 ? (const void *)&k1 : (const void *)&k2;
  int has_graph = 0, has_exec = 0;
  switch (row->kind) {
  case MC_K_NODE_ADD: { cuGraphAddKernelNode_params p = {&node, (CUgraph)g, NULL, 0, np}; has_graph = 1;
    cupti_api(row->cbid, row->name, &p); break; }
  case MC_K_NODE_ADD_ANY: { cuGraphAddNode_params p = {&node, (CUgraph)g, NULL, 0, &gp}; has_graph = 1;
    cupti_api(row->cbid, row->name, &p); break; }
  case MC_K_NODE_ADD_ANY_V2: { cuGraphAddNode_v2_params p = {&node, (CUgraph)g, NULL, NULL, 0, &gp}; has_graph = 1;
    cupti_api(row->cbid, row->name, &p); break; }
  case MC_K_NODE_SET: { cuGraphKernelNodeSetParams_params p = {node, np};
    cupti_api(row->cbid, row->name, &p); break; }
  case MC_K_NODE_EXEC_SET: { cuGraphExecKernelNodeSetParams_params p = {(CUgraphExec)x, node, np}; has_exec = 1;
    cupti_api(row->cbid, row->name, &p); break; }
  case MC_K_NODE_SET_ANY: { cuGraphNodeSetParams_params p = {node, &gp};
    cupti_api(row->cbid, row->name, &p); break; }
  case MC_K_NODE_EXEC_SET_ANY: { cuGraphExecNodeSetParams_params p = {(CUgraphExec)x, node, &gp}; has_exec = 1;
    cupti_api(row->cbid, row->name, &p); break; }
  default: printf("{\"error\":\"no driver for %s\"}\n", row->name); return;
  }
  const fk_t *k = row->v1 ? &fk[1] : &fk[2];
  expect_begin(row);
  printf("\"launches\":[{\"api\":\"%s\",\"symbol\":\"%s\",\"stream\":\"0x0\",\"grid\":[3,1,1],\"block\":[32,1,1]",
         row->name, k->sym);
  if (has_graph || has_exec)
    printf(",\"graph\":{\"graph\":\"0x%lx\",\"capture_id\":0}", (unsigned long)(has_exec ? x : g));
  printf("}],\"graphs\":[{\"event\":\"kernel_node\",\"api\":\"%s\",\"node\":\"0x%lx\"", row->name,
         (unsigned long)(uintptr_t)node);
  if (has_graph) printf(",\"graph\":\"0x%lx\"", (unsigned long)g);
  if (has_exec) printf(",\"exec\":\"0x%lx\"", (unsigned long)x);
  printf("}]");
  EXPECT_END();
}

/* A module-load call: CUPTI reports the load inside it; the CUmodule it returns is then the one
 * kernel 4 + k's cuFuncGetModule answers. A second copy of the cubin loaded afterwards (no API
 * call around it) makes the link unambiguous only through that CUmodule: without it, the
 * newest copy would win. */
static char cubin[1 << 20];
static size_t cubin_n;
static void cupti_module(CUpti_CallbackId cbid, uint32_t id, const char *bytes, size_t n);
static void drive_module(const mc_cb_t *row) {
  static int k = 0;
  uint32_t id = 100 + 2 * (uint32_t)k;
  CUmodule hmod = (CUmodule)(0x4d000 + 0x100 * (uintptr_t)k);
  CUmodule out = NULL;
  CUmodule *pm = &out;   /* every module-load call's parameters begin with the out-pointer */
  CUresult rc = CUDA_SUCCESS;
  CUpti_CallbackData d;
  memset(&d, 0, sizeof d);
  d.functionName = row->name; d.functionParams = &pm; d.functionReturnValue = &rc; d.context = CTX;
  d.correlationId = ++corr; d.callbackSite = CUPTI_API_ENTER;
  mc_callback(NULL, CUPTI_CB_DOMAIN_DRIVER_API, row->cbid, &d);
  cupti_module(CUPTI_CBID_RESOURCE_MODULE_LOADED, id, cubin, cubin_n);   /* inside the call */
  out = hmod;
  d.callbackSite = CUPTI_API_EXIT;
  mc_callback(NULL, CUPTI_CB_DOMAIN_DRIVER_API, row->cbid, &d);
  cupti_module(CUPTI_CBID_RESOURCE_MODULE_LOADED, id + 1, cubin, cubin_n); /* the copy, outside any call */
  cuMemFree_v2_params fr = {0};  /* an API call of the host's: ends "loaded during this call" */
  cupti_api(CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2, "cuMemFree_v2", &fr);
  const fk_t *f = &fk[MOD_KERNEL0 + k];
  uint64_t word = 0x600000501000ull;
  void *args[1] = {&word};
  cuLaunchKernel_params p = {(CUfunction)f->handle, 1, 1, 1, 32, 1, 1, 0, (CUstream)0x5e00, args, NULL};
  cupti_launch(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, "cuLaunchKernel", NULL, &p);
  expect_begin(row);
  printf("\"launches\":[{\"func\":\"0x%lx\",\"module\":%u}],\"modules\":[{\"event\":\"load\",\"module\":%u}]",
         (unsigned long)f->handle, id, id);
  EXPECT_END();
  k++;
}

static void drive_memory(const mc_cb_t *row) {
  static unsigned char zero[512];   /* every field NULL or 0: the log records the call, no address */
  cupti_api(row->cbid, row->name, zero);
  expect_begin(row);
  printf("\"allocs\":[{\"api\":\"%s\",\"result\":0}]", row->name);
  EXPECT_END();
}

static unsigned char tmap_bytes[128];
static void drive_tensormap(const mc_cb_t *row) {
  static cuuint64_t dims[2] = {64, 32}, strides[1] = {128};
  static cuuint32_t box[2] = {16, 16}, es[2] = {1, 1};
  static int n;
  CUtensorMap map;
  for (int i = 0; i < 128; i++) ((unsigned char *)&map)[i] = (unsigned char)(i * 3 + 17 * n + 1);
  void *global = (void *)(0x600000601000ull + 0x1000 * (uintptr_t)n);
  if (row->kind == MC_K_TMAP_TILED) {
    cuTensorMapEncodeTiled_params p = {&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, global, dims, strides, box, es,
                                       CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                       CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE};
    cupti_api(row->cbid, row->name, &p);
    memcpy(tmap_bytes, &map, 128);
  } else if (row->kind == MC_K_TMAP_IM2COL) {
    static int lo[1] = {0}, hi[1] = {0};
    cuTensorMapEncodeIm2col_params p = {&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, global, dims, strides, lo, hi,
                                        8, 4, es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                        CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE};
    p.tensorRank = 2;
    cupti_api(row->cbid, row->name, &p);
  } else {
    cuTensorMapEncodeIm2colWide_params p;
    memset(&p, 0, sizeof p);
    p.tensorMap = &map; p.tensorDataType = CU_TENSOR_MAP_DATA_TYPE_FLOAT16; p.tensorRank = 2; p.globalAddress = global;
    p.globalDim = dims; p.globalStrides = strides; p.elementStrides = es;
    cupti_api(row->cbid, row->name, &p);
  }
  expect_begin(row);
  printf("\"tensormaps\":[{\"api\":\"%s\",\"rank\":2,\"global\":\"0x%lx\"}]", row->name, (unsigned long)(uintptr_t)global);
  EXPECT_END();
  n++;
}

/* One capture on stream s (id, graph), a launch inside it, and its end: through `begin` or `end`
 * as the row asks (the other end of the pair by the plain call). */
static void capture_pair(const mc_cb_t *row, CUpti_CallbackId begin, CUpti_CallbackId end, uintptr_t s) {
  static uint64_t next_id = 200;
  cap_stream = (CUstream)seen_stream(row, s); cap_id = next_id++; cap_graph = (CUgraph)(0x9900 + cap_id);
  CUstream hs = row_stream(row, s);
  cuStreamBeginCaptureToGraph_params b = {.hStream = hs};  /* every begin: hStream first */
  cupti_api(begin, row->name, &b);
  static int iv = 1;
  float a = 1.0f;
  void *args[4] = {&Y, &X, &a, &iv};
  cuLaunchKernel_params p = {(CUfunction)fk[0].handle, 1, 1, 1, 32, 1, 1, 0, hs, args, NULL};
  cupti_launch(row->ptsz ? CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz : CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
               "cuLaunchKernel", fk[0].sym, &p);
  CUgraph out = cap_graph;
  cuStreamEndCapture_params e = {hs, &out};
  cupti_api(end, row->name, &e);
  expect_begin(row);
  unsigned long ss = (unsigned long)seen_stream(row, s), id = (unsigned long)cap_id, g = (unsigned long)(uintptr_t)cap_graph;
  printf("\"graphs\":[{\"event\":\"capture_begin\",\"stream\":\"0x%lx\",\"capture_id\":%lu,\"graph\":\"0x%lx\"},"
         "{\"event\":\"capture_end\",\"stream\":\"0x%lx\",\"capture_id\":%lu,\"graph\":\"0x%lx\",\"nodes\":3}],"
         "\"launches\":[{\"stream\":\"0x%lx\",\"graph\":{\"graph\":\"0x%lx\",\"capture_id\":%lu}}]",
         ss, id, g, ss, id, g, ss, g, id);
  EXPECT_END();
  cap_id = 0;
}

static void drive_graph(const mc_cb_t *row) {
  static int n;
  uintptr_t s = 0x5b00 + 0x10 * (uintptr_t)n, g = 0x9800 + 0x10 * (uintptr_t)n, x = 0xe800 + 0x10 * (uintptr_t)n;
  n++;
  switch (row->kind) {
  case MC_K_CAPTURE_BEGIN:
    capture_pair(row, row->cbid, row->ptsz ? CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture_ptsz
                                           : CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture, s);
    return;
  case MC_K_CAPTURE_END:
    capture_pair(row, row->ptsz ? CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_ptsz
                                : CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture, row->cbid, s);
    return;
  case MC_K_INSTANTIATE: {
    CUgraphExec out = (CUgraphExec)x;
    cuGraphInstantiateWithFlags_params p = {&out, (CUgraph)g, 0};  /* every instantiate: these two first */
    cupti_api(row->cbid, row->name, &p);
    expect_begin(row);
    printf("\"graphs\":[{\"event\":\"instantiate\",\"graph\":\"0x%lx\",\"exec\":\"0x%lx\"}]", (unsigned long)g,
           (unsigned long)x);
    break;
  }
  case MC_K_GRAPH_LAUNCH: {
    cuGraphLaunch_params p = {(CUgraphExec)x, row_stream(row, s)};
    cupti_api(row->cbid, row->name, &p);
    expect_begin(row);
    printf("\"graphs\":[{\"event\":\"launch\",\"exec\":\"0x%lx\",\"stream\":\"0x%lx\"}]", (unsigned long)x,
           (unsigned long)seen_stream(row, s));
    break;
  }
  case MC_K_EXEC_DESTROY: {
    cuGraphExecDestroy_params p = {(CUgraphExec)x};
    cupti_api(row->cbid, row->name, &p);
    expect_begin(row);
    printf("\"graphs\":[{\"event\":\"exec_destroy\",\"exec\":\"0x%lx\"}]", (unsigned long)x);
    break;
  }
  case MC_K_GRAPH_DESTROY: {
    cuGraphDestroy_params p = {(CUgraph)g};
    cupti_api(row->cbid, row->name, &p);
    expect_begin(row);
    printf("\"graphs\":[{\"event\":\"graph_destroy\",\"graph\":\"0x%lx\"}]", (unsigned long)g);
    break;
  }
  default: printf("{\"error\":\"no driver for %s\"}\n", row->name); return;
  }
  EXPECT_END();
}

/* ---- host-to-device copies (copies.jsonl) ---- */
static unsigned char copy_src[8192];
static void fill_src(size_t n, int salt) {
  for (size_t i = 0; i < n; i++) copy_src[i] = (unsigned char)(i * 7 + (size_t)salt * 13 + 1);
}
static void memcpy3d_1d(CUDA_MEMCPY3D *m, CUdeviceptr dst, size_t n) {
  memset(m, 0, sizeof *m);
  m->srcMemoryType = CU_MEMORYTYPE_HOST; m->srcHost = copy_src;
  m->dstMemoryType = CU_MEMORYTYPE_DEVICE; m->dstDevice = dst;
  m->WidthInBytes = n; m->Height = 1; m->Depth = 1;
}
#define DTOD_SRC (DEV_LO + 0x80000)   /* the device-to-device copies' source */
#define MEMSET_VALUE 0x5a
/* One call of a copy row: n bytes of copy_src to dst (s: the stream of the async calls); a
 * device-to-device copy of n bytes from DTOD_SRC, a memset of n bytes of MEMSET_VALUE elements. */
static void copy_call(const mc_cb_t *row, CUdeviceptr dst, size_t n, uintptr_t s, CUgraph g, CUgraphExec x,
                      CUgraphNode node, CUresult rc) {
  CUDA_MEMCPY3D m;
  memcpy3d_1d(&m, dst, n);
  CUdeviceptr src = (CUdeviceptr)(uintptr_t)copy_src;
  switch (row->kind) {
  case MC_K_COPY_HTOD: { cuMemcpyHtoD_v2_params p = {dst, copy_src, n}; cupti_call(row->cbid, row->name, NULL, &p, rc); break; }
  case MC_K_COPY_HTOD_ASYNC: { cuMemcpyHtoDAsync_v2_params p = {dst, copy_src, n, row_stream(row, s)};
    cupti_call(row->cbid, row->name, NULL, &p, rc); break; }
  case MC_K_COPY_ANY: { cuMemcpy_params p = {dst, src, n}; cupti_call(row->cbid, row->name, NULL, &p, rc); break; }
  case MC_K_COPY_ANY_ASYNC: { cuMemcpyAsync_params p = {dst, src, n, row_stream(row, s)};
    cupti_call(row->cbid, row->name, NULL, &p, rc); break; }
  case MC_K_COPY_NODE_ADD: { cuGraphAddMemcpyNode_params p = {&node, g, NULL, 0, &m, CTX};
    cupti_call(row->cbid, row->name, NULL, &p, rc); break; }
  case MC_K_COPY_NODE_SET: { cuGraphMemcpyNodeSetParams_params p = {node, &m}; cupti_call(row->cbid, row->name, NULL, &p, rc); break; }
  case MC_K_COPY_NODE_EXEC_SET: { cuGraphExecMemcpyNodeSetParams_params p = {x, node, &m, CTX};
    cupti_call(row->cbid, row->name, NULL, &p, rc); break; }
  case MC_K_COPY_DTOD: { cuMemcpyDtoD_v2_params p = {dst, DTOD_SRC, n}; cupti_call(row->cbid, row->name, NULL, &p, rc); break; }
  case MC_K_COPY_DTOD_ASYNC: { cuMemcpyDtoDAsync_v2_params p = {dst, DTOD_SRC, n, row_stream(row, s)};
    cupti_call(row->cbid, row->name, NULL, &p, rc); break; }
  case MC_K_MEMSET_D8: { cuMemsetD8_v2_params p = {dst, MEMSET_VALUE, n}; cupti_call(row->cbid, row->name, NULL, &p, rc); break; }
  case MC_K_MEMSET_D16: { cuMemsetD16_v2_params p = {dst, MEMSET_VALUE, n / 2}; cupti_call(row->cbid, row->name, NULL, &p, rc); break; }
  case MC_K_MEMSET_D32: { cuMemsetD32_v2_params p = {dst, MEMSET_VALUE, n / 4}; cupti_call(row->cbid, row->name, NULL, &p, rc); break; }
  case MC_K_MEMSET_D8_ASYNC: { cuMemsetD8Async_params p = {dst, MEMSET_VALUE, n, row_stream(row, s)};
    cupti_call(row->cbid, row->name, NULL, &p, rc); break; }
  case MC_K_MEMSET_D16_ASYNC: { cuMemsetD16Async_params p = {dst, MEMSET_VALUE, n / 2, row_stream(row, s)};
    cupti_call(row->cbid, row->name, NULL, &p, rc); break; }
  case MC_K_MEMSET_D32_ASYNC: { cuMemsetD32Async_params p = {dst, MEMSET_VALUE, n / 4, row_stream(row, s)};
    cupti_call(row->cbid, row->name, NULL, &p, rc); break; }
  default: printf("{\"error\":\"no driver for %s\"}\n", row->name);
  }
}
static int copy_async(const mc_cb_t *row) {
  switch (row->kind) {
  case MC_K_COPY_HTOD_ASYNC: case MC_K_COPY_ANY_ASYNC: case MC_K_COPY_DTOD_ASYNC: case MC_K_MEMSET_D8_ASYNC:
  case MC_K_MEMSET_D16_ASYNC: case MC_K_MEMSET_D32_ASYNC: return 1;
  default: return 0;
  }
}
/* what the record's op is: "dtod" / "memset" for those rows, "htod" for the rest */
static const char *copy_op(const mc_cb_t *row) {
  if (row->kind == MC_K_COPY_DTOD || row->kind == MC_K_COPY_DTOD_ASYNC) return "dtod";
  if (row->kind >= MC_K_MEMSET_D8 && row->kind <= MC_K_MEMSET_D32_ASYNC) return "memset";
  return "htod";
}
static int memset_elem(const mc_cb_t *row) {
  switch (row->kind) {
  case MC_K_MEMSET_D16: case MC_K_MEMSET_D16_ASYNC: return 2;
  case MC_K_MEMSET_D32: case MC_K_MEMSET_D32_ASYNC: return 4;
  default: return 1;
  }
}
static int copy_node(const mc_cb_t *row) { return row->kind >= MC_K_COPY_NODE_ADD && row->kind <= MC_K_COPY_NODE_EXEC_SET; }

static void drive_copy(const mc_cb_t *row) {
  static int n;
  CUdeviceptr dst = DEV_LO + 0x1000 * (CUdeviceptr)n;
  uintptr_t s = 0x5c00 + 0x10 * (uintptr_t)n;
  CUgraph g = (CUgraph)(0x9a00 + 0x10 * (uintptr_t)n);
  CUgraphExec x = (CUgraphExec)(0xea00 + 0x10 * (uintptr_t)n);
  CUgraphNode node = (CUgraphNode)(0xda00 + 0x10 * (uintptr_t)n);
  fill_src(24, n);
  copy_call(row, dst, 24, s, g, x, node, CUDA_SUCCESS);
  expect_begin(row);
  const char *op = copy_op(row);
  printf("\"copies\":[{\"api\":\"%s\",\"dst\":\"0x%lx\",\"size\":24,\"async\":%d,\"result\":0,\"op\":\"%s\"", row->name,
         (unsigned long)dst, copy_async(row), op);
  if (strcmp(op, "htod") == 0) { printf(",\"hex\":\""); hexs(copy_src, 24); printf("\""); }
  else if (strcmp(op, "dtod") == 0) printf(",\"src\":\"0x%lx\"", (unsigned long)DTOD_SRC);
  else printf(",\"src\":\"0x0\",\"value\":%d,\"elem\":%d", MEMSET_VALUE, memset_elem(row));
  printf(",\"stream\":\"0x%lx\"", copy_async(row) ? (unsigned long)seen_stream(row, s) : (unsigned long)(row->ptsz ? 2 : 0));
  if (copy_node(row)) {
    uintptr_t gh = row->kind == MC_K_COPY_NODE_ADD ? (uintptr_t)g : row->kind == MC_K_COPY_NODE_EXEC_SET ? (uintptr_t)x : 0;
    printf(",\"node\":\"0x%lx\",\"graph\":{\"graph\":\"0x%lx\",\"capture_id\":0}", (unsigned long)(uintptr_t)node,
           (unsigned long)gh);
  } else {
    printf(",\"graph\":null");
  }
  printf("}]");
  EXPECT_END();
  n++;
}

/* ---- mode copies: copies made between launches, each printed with the launch seq it precedes ---- */
static long launches_made, copies_made, copies_fail_at;
static const mc_cb_t *row_named(const char *name) {
  for (size_t i = 0; i < MC_CB_COUNT; i++)
    if (strcmp(mc_cbs[i].name, name) == 0) return &mc_cbs[i];
  return NULL;
}
/* A copy through row `name`; printed as {"copy": {...}} with what the record must hold. */
static void one_copy(const char *name, CUdeviceptr dst, size_t n, int salt, uintptr_t s, CUresult rc, uint64_t capid) {
  const mc_cb_t *row = row_named(name);
  fill_src(n, salt);
  phase = "copy";
  copy_call(row, dst, n, s, NULL, NULL, NULL, rc);
  phase = "launch";
  copies_made++;
  printf("{\"copy\":{\"api\":\"%s\",\"dst\":\"0x%lx\",\"size\":%zu,\"seq_before\":%ld,\"result\":%d,\"async\":%d,"
         "\"stream\":\"0x%lx\",\"capture_id\":%lu,\"op\":\"%s\",\"bytes\":\"", name, (unsigned long)dst, n, launches_made,
         (int)rc, copy_async(row), copy_async(row) ? (unsigned long)seen_stream(row, s) : (unsigned long)(row->ptsz ? 2 : 0),
         (unsigned long)capid, copy_op(row));
  hexs(copy_src, n);
  printf("\"}}\n");
}

static int run_copies(long rounds) {
  static unsigned char host_dst[64];
  fail_at = copies_fail_at;   /* the library's FAIL_AT-th allocation from here on fails (0: none) */
  mc_sys_realloc = failing_realloc;
  for (long r = 0; r < rounds; r++) {
    launch_loop_kernel((int)r, 0); launches_made++;
    one_copy("cuMemcpyHtoD_v2", DEV_LO, 32, (int)(4 * r), 0, CUDA_SUCCESS, 0);
    one_copy("cuMemcpyHtoDAsync_v2_ptsz", DEV_LO + 16, 32, (int)(4 * r + 1), 0, CUDA_SUCCESS, 0); /* overlaps */
    launch_packed((int)r); launches_made++;
    one_copy("cuMemcpyHtoDAsync_v2", DEV_LO + 0x10000, 8192, (int)(4 * r + 2), 0x5d00, CUDA_SUCCESS, 0);
    one_copy("cuMemcpy_ptds", DEV_LO + 0x30000, 8, (int)(4 * r + 3), 0, CUDA_SUCCESS, 0);
    one_copy("cuMemcpyHtoD_v2", DEV_LO + 0x60000, 4096, (int)r, 0, CUDA_SUCCESS, 0); /* its record grows the buffer */
    one_copy("cuMemcpyHtoD_v2_ptds", DEV_LO + 0x40000, 8, 99, 0, CUDA_ERROR_INVALID_VALUE, 0); /* failed: no bytes */
    /* device -> host and host -> host through the generic calls: not host-to-device, not recorded */
    cuMemcpyAsync_params d2h = {(CUdeviceptr)(uintptr_t)host_dst, DEV_LO + 0x20000, 16, (CUstream)0x5d00};
    cupti_api(row_named("cuMemcpyAsync")->cbid, "cuMemcpyAsync", &d2h);
    cuMemcpy_params h2h = {(CUdeviceptr)(uintptr_t)host_dst, (CUdeviceptr)(uintptr_t)copy_src, 16};
    cupti_api(row_named("cuMemcpy")->cbid, "cuMemcpy", &h2h);
    printf("{\"not_copied\":[\"0x%lx\"]}\n", (unsigned long)(uintptr_t)host_dst);
    /* device -> device (typed and generic) and a memset: recorded with their op, never their bytes */
    one_copy("cuMemcpyDtoDAsync_v2", DEV_LO + 0x70000, 64, 0, 0x5d00, CUDA_SUCCESS, 0);
    one_copy("cuMemsetD32Async", DEV_LO + 0x70000, 64, 0, 0x5d00, CUDA_SUCCESS, 0);
    one_copy("cuMemsetD8_v2_ptds", DEV_LO + 0x70040, 8, 0, 0, CUDA_SUCCESS, 0);
    cuMemcpyAsync_params d2d = {DEV_LO + 0x70100, DTOD_SRC, 16, (CUstream)0x5d00};
    cupti_api(row_named("cuMemcpyAsync")->cbid, "cuMemcpyAsync", &d2d);
    copies_made++;
    printf("{\"copy\":{\"api\":\"cuMemcpyAsync\",\"dst\":\"0x%lx\",\"size\":16,\"seq_before\":%ld,\"result\":0,"
           "\"async\":1,\"stream\":\"0x%lx\",\"capture_id\":0,\"op\":\"dtod\",\"bytes\":\"\"}}\n",
           (unsigned long)(DEV_LO + 0x70100), launches_made,
           (unsigned long)seen_stream(row_named("cuMemcpyAsync"), 0x5d00));
    launch_ex((int)r); launches_made++;
    if (r == 1) {   /* an async copy on a stream being captured: it belongs to the graph */
      cap_stream = (CUstream)0x5e00; cap_id = 777; cap_graph = (CUgraph)0x9e77;
      cuStreamBeginCapture_params b = {.hStream = cap_stream};
      cupti_api(row_named("cuStreamBeginCapture")->cbid, "cuStreamBeginCapture", &b);
      one_copy("cuMemcpyHtoDAsync_v2", DEV_LO + 0x50000, 16, 55, 0x5e00, CUDA_SUCCESS, 777);
      one_copy("cuMemcpyDtoDAsync_v2", DEV_LO + 0x50100, 32, 0, 0x5e00, CUDA_SUCCESS, 777);
      CUgraph out = cap_graph;
      cuStreamEndCapture_params e = {cap_stream, &out};
      cupti_api(row_named("cuStreamEndCapture")->cbid, "cuStreamEndCapture", &e);
      cap_id = 0;
    }
  }
  mc_files_finalize();
  mc_meta_write(1);
  printf("{\"done\":{\"copies_made\":%ld,\"launches_made\":%ld,\"off\":%d,\"allocs\":%ld,\"failed_in\":\"%s\"}}\n",
         copies_made, launches_made, atomic_load(&mc_off), alloc_n, failed_in);
  return 0;
}

/* ---- mode copybench: N async copies of SIZE bytes back to back (for callgrind: instructions per copy) ---- */
static int run_copybench(long n, size_t size) {
  const mc_cb_t *row = row_named("cuMemcpyHtoDAsync_v2");
  fill_src(size, 1);
  for (long i = 0; i < 100; i++) copy_call(row, DEV_LO, size, 0x5d00, NULL, NULL, NULL, CUDA_SUCCESS);
  double t0 = now_ns();
  for (long i = 0; i < n; i++) copy_call(row, DEV_LO + 64 * (CUdeviceptr)(i & 1023), size, 0x5d00, NULL, NULL, NULL,
                                         CUDA_SUCCESS);
  printf("{\"ns_per_copy_back_to_back\":%.1f}\n", (now_ns() - t0) / n);
  mc_files_finalize();
  return 0;
}

/* A launch whose parameter is the tiled encode's 128 bytes: linked to that encode (json form). */
static void launch_with_tmap(void) {
  void *args[1] = {tmap_bytes};
  cuLaunchKernel_params p = {(CUfunction)fk[3].handle, 1, 1, 1, 128, 1, 1, 0, (CUstream)0x5f00, args, NULL};
  cupti_launch(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, "cuLaunchKernel", fk[3].sym, &p);
  printf("{\"tmap_launch\":{\"symbol\":\"%s\"}}\n", fk[3].sym);
}

static void print_names(const char *key, atomic_int *tab, int from_calls) {
  printf("{\"%s\":[", key);
  int first = 1;
  for (size_t i = 0; i < MC_CB_COUNT; i++) {
    CUpti_CallbackId c = mc_cbs[i].cbid;
    if (c >= MAX_CBID || !(from_calls ? atomic_load(&tab[c]) > 0 : atomic_load(&tab[c]) != 0)) continue;
    printf("%s\"%s\"", first ? "" : ",", mc_cbs[i].name);
    first = 0;
  }
  printf("]}\n");
}

/* The toggler at work until it has switched the launch callbacks off and on again (at most 10 s). */
static void wait_toggles(void) {
  struct timespec ms = {0, 1000000};
  for (int i = 0; i < 10000; i++) {
    int done = 1;
    for (size_t k = 0; k < MC_CB_COUNT; k++)
      if (mc_cbs[k].family == MC_FAM_LAUNCH && atomic_load(&disable_calls[mc_cbs[k].cbid]) < 1) done = 0;
    if (done && atomic_load(&enable_calls[mc_cbs[0].cbid]) >= 3) return;
    nanosleep(&ms, NULL);
  }
}

static void cupti_resource(CUpti_CallbackId cbid) {
  CUpti_ResourceData r;
  memset(&r, 0, sizeof r);
  r.context = CTX;
  mc_callback(NULL, CUPTI_CB_DOMAIN_RESOURCE, cbid, &r);
}

static int run_all(const char *cubin_path) {
  FILE *f = fopen(cubin_path, "rb");
  if (!f) return 1;
  cubin_n = fread(cubin, 1, sizeof cubin, f);
  fclose(f);
  CUpti_SubscriberHandle sub = (CUpti_SubscriberHandle)0x5ab;
  if (mc_enable_callbacks(sub) != 0) return 1;
  print_names("enabled", enabled_now, 0);
  printf("{\"resource_enabled\":[%d,%d,%d]}\n", atomic_load(&resource_enabled[CUPTI_CBID_RESOURCE_MODULE_LOADED]),
         atomic_load(&resource_enabled[CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING]),
         atomic_load(&resource_enabled[CUPTI_CBID_RESOURCE_CONTEXT_CREATED]));
  cupti_resource(CUPTI_CBID_RESOURCE_CONTEXT_CREATED);   /* meta.json with the device */
  for (size_t i = 0; i < MC_CB_COUNT; i++) {
    const mc_cb_t *row = &mc_cbs[i];
    switch (row->family) {
    case MC_FAM_LAUNCH: drive_launch(row); break;
    case MC_FAM_KERNEL_NODE: drive_kernel_node(row); break;
    case MC_FAM_MODULE: drive_module(row); break;
    case MC_FAM_FREE: case MC_FAM_ALLOC: case MC_FAM_ALLOC_LOG: drive_memory(row); break;
    case MC_FAM_TENSORMAP: drive_tensormap(row); break;
    case MC_FAM_GRAPH: drive_graph(row); break;
    case MC_FAM_COPY: drive_copy(row); break;
    default: printf("{\"error\":\"no driver for %s\"}\n", row->name);
    }
  }
  launch_with_tmap();
  cupti_module(CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING, 100, cubin, cubin_n);
  printf("{\"unloaded\":100}\n");
  if (mc_knobs.toggle_ms) {
    mc_toggle_start(sub);
    wait_toggles();
    print_names("toggled", disable_calls, 1);
  }
  mc_files_finalize();
  mc_meta_write(1);
  return 0;
}

#include <signal.h>

/* ---- mode snapshot: allocations, then launches with the snapshot's trigger among them ---- */
static long signal_at = -1, cap_from = -1, cap_len, hidden_from = -1, hidden_len;
static int block_dir;
static void launch_on(CUstream s, int i) {
  float a = 1.0f;
  void *args[4] = {&Y, &X, &a, &i};
  cuLaunchKernel_params p = {(CUfunction)fk[0].handle, 1, 1, 1, 32, 1, 1, 0, s, args, NULL};
  launching++;
  cupti_launch(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, "cuLaunchKernel", fk[0].sym, &p);
}
static void alloc_at(CUdeviceptr at, size_t size, CUresult rc, int live) {
  CUdeviceptr out = at;
  cuMemAlloc_v2_params a = {&out, size};
  cupti_call(CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2, "cuMemAlloc_v2", NULL, &a, rc);
  printf("{\"alloc\":{\"base\":\"0x%lx\",\"size\":%zu,\"live\":%d}}\n", (unsigned long)at, size, live);
}
static void map_at(CUdeviceptr at, size_t size, int live) {
  cuMemMap_params m = {at, size, 0, (CUmemGenericAllocationHandle)0x77, 0};
  cupti_api(CUPTI_DRIVER_TRACE_CBID_cuMemMap, "cuMemMap", &m);
  printf("{\"alloc\":{\"base\":\"0x%lx\",\"size\":%zu,\"live\":%d}}\n", (unsigned long)at, size, live);
}

static int run_snapshot(const char *dir, long n) {
  for (size_t o = 0; o < DEVMEM; o++) devmem[o] = pattern(o);
  if (block_dir) {   /* a plain file where the snapshot's folder goes */
    char path[4400];
    snprintf(path, sizeof path, "%s/snapshot", mc_pid_dir());
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
  }
  (void)dir;
  alloc_at(DEV_LO, 64u << 10, CUDA_SUCCESS, 1);                         /* small: a norm's page */
  alloc_at(DEV_LO + 0x100000, (9u << 20) + 100, CUDA_SUCCESS, 1);       /* more than the copy buffer */
  alloc_at(DEV_LO + 0x1000000, 12u << 20, CUDA_SUCCESS, 1);             /* the largest: a KV pool */
  alloc_at(DEV_LO + 0xB00000, 1u << 20, CUDA_SUCCESS, 0);               /* freed below */
  alloc_at(DEV_LO + 0xC00000, 4096, CUDA_ERROR_OUT_OF_MEMORY, 0);       /* failed: nothing */
  map_at(DEV_LO + 0xD00000, 2u << 20, 1);
  map_at(DEV_LO + 0xF00000, 1u << 20, 0);                               /* unmapped below */
  void *host = (void *)(uintptr_t)0x600000901000ull;
  cuMemAllocHost_v2_params h = {&host, 4096};                           /* host memory: never copied */
  cupti_api(CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost_v2, "cuMemAllocHost_v2", &h);
  cuMemFree_v2_params fr = {DEV_LO + 0xB00000};
  cupti_api(CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2, "cuMemFree_v2", &fr);
  cuMemUnmap_params um = {DEV_LO + 0xF00000, 1u << 20};
  cupti_api(CUPTI_DRIVER_TRACE_CBID_cuMemUnmap, "cuMemUnmap", &um);
  long made = 0;
  for (long i = 0; i < n; i++) {
    if (i == cap_from) {   /* a capture the library hears begin */
      cap_stream = (CUstream)0x5e00; cap_id = 901; cap_graph = (CUgraph)0x9e01;
      cuStreamBeginCapture_params b = {.hStream = cap_stream};
      cupti_api(CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture, "cuStreamBeginCapture", &b);
    }
    if (i == hidden_from) { cap_stream = (CUstream)0x5e00; cap_id = 902; cap_graph = (CUgraph)0x9e02; }
    int in_cap = cap_from >= 0 && i >= cap_from && i < cap_from + cap_len;
    int in_hidden = hidden_from >= 0 && i >= hidden_from && i < hidden_from + hidden_len;
    /* inside a capture, launches alternate between its stream and another one */
    launch_on(in_hidden || (in_cap && i % 2 == 0) ? (CUstream)0x5e00 : (CUstream)0x5f00, (int)i);
    made++;
    if (in_cap && i == cap_from + cap_len - 1) {
      CUgraph out = cap_graph;
      cuStreamEndCapture_params e = {cap_stream, &out};
      cupti_api(CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture, "cuStreamEndCapture", &e);
      cap_id = 0;
    }
    if (in_hidden && i == hidden_from + hidden_len - 1) cap_id = 0;
    if (i + 1 == signal_at) raise(SIGUSR2);
  }
  mc_files_finalize();
  mc_meta_write(1);
  printf("{\"done\":{\"launches_made\":%ld,\"synced_at\":%ld,\"sync_calls\":%ld,\"sync_capturing\":%ld,"
         "\"dtoh_calls\":%ld,\"off\":%d,\"devmem\":%u}}\n", made, synced_at, sync_calls, sync_capturing, dtoh_calls,
         atomic_load(&mc_off), DEVMEM);
  return 0;
}

static int set_knob(const char *k) {
  if (strcmp(k, "compact") == 0) mc_knobs.compact = 1;
  else if (strcmp(k, "alloc_log") == 0) mc_knobs.alloc_log = 1;
  else if (strcmp(k, "selftime") == 0) mc_knobs.selftime = 1;
  else if (strcmp(k, "noop") == 0) mc_knobs.noop = 1;
  else if (strcmp(k, "modules_only") == 0) mc_knobs.modules_only = 1;
  else if (strcmp(k, "classify0") == 0) mc_knobs.no_classify = 1;
  else if (strncmp(k, "alternate=", 10) == 0) mc_knobs.alternate = strtoull(k + 10, NULL, 10);
  else if (strncmp(k, "toggle=", 7) == 0) mc_knobs.toggle_ms = strtoull(k + 7, NULL, 10);
  else if (strncmp(k, "max_launches=", 13) == 0) mc_knobs.max_launches = strtoull(k + 13, NULL, 10);
  else if (strcmp(k, "copy_log0") == 0) mc_knobs.copy_log = 0;
  else if (strncmp(k, "copy_bytes=", 11) == 0) mc_knobs.copy_bytes = (unsigned)strtoul(k + 11, NULL, 10);
  else if (strcmp(k, "writer=write") == 0) mc_knobs.writer_write = 1;
  else if (strncmp(k, "fail=", 5) == 0) copies_fail_at = atol(k + 5);
  else if (strncmp(k, "snapshot_at=", 12) == 0) mc_knobs.snapshot_at = strtoull(k + 12, NULL, 10);
  else if (strcmp(k, "snapshot_signal") == 0) mc_knobs.snapshot_signal = 1;
  else if (strncmp(k, "snapshot_bytes=", 15) == 0) mc_knobs.snapshot_bytes = strtoull(k + 15, NULL, 10);
  else if (strncmp(k, "signal_at=", 10) == 0) signal_at = atol(k + 10);
  else if (strncmp(k, "capture=", 8) == 0) sscanf(k + 8, "%ld:%ld", &cap_from, &cap_len);
  else if (strncmp(k, "hidden=", 7) == 0) sscanf(k + 7, "%ld:%ld", &hidden_from, &hidden_len);
  else if (strncmp(k, "dtoh_fail=", 10) == 0) dtoh_fail = atol(k + 10);
  else if (strcmp(k, "sync_fail") == 0) sync_fail = 1;
  else if (strcmp(k, "block_dir") == 0) block_dir = 1;
  else return -1;
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 5) return 2;
  const char *mode = argv[1], *form = argv[3];
  long n = atol(argv[4]);
  snprintf(mc_knobs.dir, sizeof mc_knobs.dir, "%s", argv[2]);
  mc_knobs.writer_write = 0;           /* the capture's default writer: mmap */
  mc_knobs.host_bytes = 64;
  mc_knobs.copy_log = 1;               /* on here, to drive its rows (init.c: off by default until proven on a GPU) */
  mc_knobs.copy_bytes = 4096;
  if (strcmp(form, "json") != 0) {     /* bin, noop, filtered: the binary form's knobs */
    mc_knobs.bin = 1; mc_knobs.compact = 1; mc_knobs.alloc_log = 1; mc_knobs.no_classify = 1;
  }
  if (strcmp(form, "noop") == 0) mc_knobs.noop = 1;
  if (strcmp(form, "filtered") == 0) {
    mc_knobs.has_include = regcomp(&mc_knobs.include_re, "^no_such_kernel$", REG_EXTENDED | REG_NOSUB) == 0;
  }
  mc_knobs.snapshot_bytes = 8ull << 30;   /* init.c's default */
  if (strcmp(mode, "all") == 0 || strcmp(mode, "copies") == 0 || strcmp(mode, "copybench") == 0 ||
      strcmp(mode, "snapshot") == 0)
    for (int i = strcmp(mode, "copybench") == 0 ? 6 : 5; i < argc; i++)
      if (set_knob(argv[i]) != 0) { fprintf(stderr, "unknown knob %s\n", argv[i]); return 2; }
  mc_knobs.snapshot = (mc_knobs.snapshot_at || mc_knobs.snapshot_signal) && !mc_knobs.modules_only;
  if (mc_knobs.snapshot) mc_knobs.alloc_log = 1;   /* as init.c's read_knobs */
  mc_pid = getpid();
  fake_driver();
  mc_snapshot_init();
  if (strcmp(mode, "oom") == 0) {
    mc_knobs.alloc_log = 1;
    fail_at = n;
  }
  if (mc_files_open() != 0) { printf("{\"open\":\"failed\"}\n"); return 1; }
  if (strcmp(mode, "oom") == 0 && argc > 5) return run_oom(argv[5]);
  if (strcmp(mode, "all") == 0) return run_all(argv[4]);
  if (strcmp(mode, "copies") == 0) return run_copies(n);
  if (strcmp(mode, "snapshot") == 0) return run_snapshot(argv[2], n);
  if (strcmp(mode, "copybench") == 0 && argc > 5) return run_copybench(n, (size_t)atol(argv[5]));
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
        mc_launch_t L = {.ctx = CTX, .grid = {1, 1, 1}, .block = {32, 1, 1}, .kp = args};
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
