// copies_probe.cu: known host-to-device copies between kernel launches, for the copy log's GPU check
// (tests/gpu_results/run_copies.sh). Every copy and launch the program makes is printed as one JSON
// line, so the checker can hold copies.jsonl against it:
//   {"copy": {"how", "dst", "size", "hex" (what was copied), "launches_before", "graph": 0|1}}
//   {"not_copied": {"dst", "size"}}   a copy that is not host-to-device (must not be in the log)
//   {"done": {"launches": N}}
// The copies: the runtime's cudaMemcpy (sync, pageable), cudaMemcpyAsync from pinned and from
// pageable memory, cudaMemcpy with cudaMemcpyDefault (unified addressing), the driver's
// cuMemcpyHtoD and cuMemcpyHtoDAsync, two overlapping copies into one buffer, one larger than
// the default byte knob (4096), one inside a stream capture (a memcpy node of the graph), a
// memcpy node added by hand (cuGraphAddMemcpyNode), and device-to-host / device-to-device copies
// (not logged). Each launch reads the buffer it follows, so the launches are real consumers.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define CD(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { fprintf(stderr, "%s: %d\n", #x, (int)r_); exit(1); } } while (0)

__global__ void sum_bytes(const unsigned char *p, int n, unsigned long long *out) {
  unsigned long long s = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += p[i];
  atomicAdd(out, s);
}

static long launches;
static unsigned long long *d_out;
static void launch(const void *p, int n, cudaStream_t s) {
  sum_bytes<<<1, 64, 0, s>>>((const unsigned char *)p, n, d_out);
  CK(cudaGetLastError());
  launches++;
}

static void fill(unsigned char *h, size_t n, int salt) {
  for (size_t i = 0; i < n; i++) h[i] = (unsigned char)(i * 31 + salt * 17 + 5);
}

static void print_copy(const char *how, const void *dst, const unsigned char *h, size_t n, int graph) {
  printf("{\"copy\":{\"how\":\"%s\",\"dst\":\"0x%llx\",\"size\":%zu,\"launches_before\":%ld,\"graph\":%d,\"hex\":\"", how,
         (unsigned long long)(uintptr_t)dst, n, launches, graph);
  for (size_t i = 0; i < n; i++) printf("%02x", h[i]);
  printf("\"}}\n");
}

int main(void) {
  CK(cudaSetDevice(0));
  CK(cudaFree(0));
  unsigned char *d_buf, *d_big, *d_other;
  CK(cudaMalloc(&d_buf, 1 << 16));
  CK(cudaMalloc(&d_big, 1 << 16));
  CK(cudaMalloc(&d_other, 1 << 16));
  CK(cudaMalloc(&d_out, 8));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned char *pinned;
  CK(cudaMallocHost(&pinned, 1 << 16));
  unsigned char *pageable = (unsigned char *)malloc(1 << 16), back[256];

  for (int round = 0; round < 3; round++) {
    launch(d_buf, 64, 0);
    fill(pageable, 64, 10 * round + 1);   // cudaMemcpy, pageable, sync
    CK(cudaMemcpy(d_buf, pageable, 64, cudaMemcpyHostToDevice));
    print_copy("cudaMemcpy", d_buf, pageable, 64, 0);
    launch(d_buf, 64, 0);
    fill(pinned, 48, 10 * round + 2);     // cudaMemcpyAsync from pinned memory, overlapping the first
    CK(cudaMemcpyAsync(d_buf + 32, pinned, 48, cudaMemcpyHostToDevice, s));
    print_copy("cudaMemcpyAsync_pinned", d_buf + 32, pinned, 48, 0);
    CK(cudaStreamSynchronize(s));         // (the pinned buffer is not reused before the DMA ran)
    launch(d_buf, 80, s);
    fill(pageable, 40, 10 * round + 3);   // cudaMemcpyAsync from pageable memory
    CK(cudaMemcpyAsync(d_other, pageable, 40, cudaMemcpyHostToDevice, s));
    print_copy("cudaMemcpyAsync_pageable", d_other, pageable, 40, 0);
    fill(pageable, 24, 10 * round + 4);   // cudaMemcpyDefault: the direction from unified addressing
    CK(cudaMemcpy(d_other + 100, pageable, 24, cudaMemcpyDefault));
    print_copy("cudaMemcpyDefault", d_other + 100, pageable, 24, 0);
    fill(pageable, 32, 10 * round + 5);   // the driver API
    CD(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)(d_other + 256), pageable, 32));
    print_copy("cuMemcpyHtoD", d_other + 256, pageable, 32, 0);
    fill(pinned, 16, 10 * round + 6);
    CD(cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)(d_other + 512), pinned, 16, (CUstream)s));
    print_copy("cuMemcpyHtoDAsync", d_other + 512, pinned, 16, 0);
    CK(cudaStreamSynchronize(s));
    launch(d_other, 528, 0);
    fill(pageable, 8192, 10 * round + 7); // larger than the default byte knob: recorded, no bytes
    CK(cudaMemcpy(d_big, pageable, 8192, cudaMemcpyHostToDevice));
    print_copy("cudaMemcpy_big", d_big, pageable, 8192, 0);
    launch(d_big, 8192, 0);
    // not host-to-device: must not be in the log
    CK(cudaMemcpy(back, d_buf, 64, cudaMemcpyDeviceToHost));
    printf("{\"not_copied\":{\"dst\":\"0x%llx\",\"size\":64}}\n", (unsigned long long)(uintptr_t)back);
    CK(cudaMemcpy(d_big + 20000, d_buf, 64, cudaMemcpyDeviceToDevice));
    printf("{\"not_copied\":{\"dst\":\"0x%llx\",\"size\":64}}\n", (unsigned long long)(uintptr_t)(d_big + 20000));
    CK(cudaMemcpy(back, d_buf, 64, cudaMemcpyDefault));
    printf("{\"not_copied\":{\"dst\":\"0x%llx\",\"size\":64}}\n", (unsigned long long)(uintptr_t)back);
  }

  // a copy inside a stream capture: a memcpy node of the graph, run at each replay
  cudaGraph_t g;
  cudaGraphExec_t x;
  fill(pinned + 4096, 32, 99);
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CK(cudaMemcpyAsync(d_buf + 1024, pinned + 4096, 32, cudaMemcpyHostToDevice, s));
  print_copy("captured", d_buf + 1024, pinned + 4096, 32, 1);
  launch(d_buf + 1024, 32, s);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&x, g, 0));
  CK(cudaGraphLaunch(x, s));
  CK(cudaStreamSynchronize(s));
  // a memcpy node added by hand
  CUgraph hg;
  CD(cuGraphCreate(&hg, 0));
  CUDA_MEMCPY3D m;
  memset(&m, 0, sizeof m);
  fill(pinned + 8192, 24, 77);
  m.srcMemoryType = CU_MEMORYTYPE_HOST; m.srcHost = pinned + 8192;
  m.dstMemoryType = CU_MEMORYTYPE_DEVICE; m.dstDevice = (CUdeviceptr)(uintptr_t)(d_buf + 2048);
  m.WidthInBytes = 24; m.Height = 1; m.Depth = 1;
  CUcontext ctx;
  CD(cuCtxGetCurrent(&ctx));
  CUgraphNode node;
  CD(cuGraphAddMemcpyNode(&node, hg, NULL, 0, &m, ctx));
  print_copy("memcpy_node", d_buf + 2048, pinned + 8192, 24, 1);
  CK(cudaDeviceSynchronize());
  printf("{\"done\":{\"launches\":%ld}}\n", launches);
  return 0;
}
