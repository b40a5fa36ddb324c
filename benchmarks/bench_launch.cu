// Launch-bound loop for benchmarks/bench_capture.py: N launches of an empty kernel with the
// typical shape of an elementwise launch (two device pointers, a float, an int), timed on the
// host. Prints one JSON line: {"launches": N, "us_per_launch": ...}.
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>

__global__ void k_empty(float *y, const float *x, float a, int n) {
  if (n < 0) y[0] = a * x[0];
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 200000;
  float *x, *y;
  if (cudaMalloc(&x, 1 << 20) || cudaMalloc(&y, 1 << 20)) { fprintf(stderr, "cudaMalloc failed\n"); return 1; }
  for (int i = 0; i < 1000; i++) k_empty<<<1, 32>>>(y, x, 1.0f, i);  // warm-up, lazy load, caches
  cudaDeviceSynchronize();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; i++) k_empty<<<1, 32>>>(y, x, 1.0f, i);
  cudaDeviceSynchronize();
  auto t1 = std::chrono::steady_clock::now();
  if (cudaGetLastError()) { fprintf(stderr, "launch failed\n"); return 1; }
  double us = std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
  printf("{\"launches\": %d, \"us_per_launch\": %.4f}\n", n, us);
  return 0;
}
