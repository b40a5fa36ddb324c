// Launch-bound loop for benchmarks/bench_capture.py: N launches of an empty kernel with the
// typical shape of an elementwise launch (two device pointers, a float, an int), timed on the
// host. Prints one JSON line: {"launches": N, "us_per_launch": ...}.
// Under MINE_CAPTURE_ALTERNATE=B (the capture library records launches in alternate blocks of B,
// counted from the process's first launch: the 1000 warm-up launches come first) every block of
// B timed launches is timed on its own, and the line also gives "recorded_us" and "passed_us",
// the mean per launch over blocks recorded and blocks passed unrecorded, and "block_diff_us",
// the median over recorded blocks of (recorded - the mean of its two unrecorded neighbours).
// Under MINE_BENCH_MARKS=B the line also gives "marks_ns": the CLOCK_MONOTONIC time at the start of
// every block of B timed launches and after the last (bench_capture.py sorts the blocks by the
// capture library's MINE_CAPTURE_TOGGLE_MS switch times).
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <vector>

__global__ void k_empty(float *y, const float *x, float a, int n) {
  if (n < 0) y[0] = a * x[0];
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 200000;
  float *x, *y;
  if (cudaMalloc(&x, 1 << 20) || cudaMalloc(&y, 1 << 20)) { fprintf(stderr, "cudaMalloc failed\n"); return 1; }
  for (int i = 0; i < 1000; i++) k_empty<<<1, 32>>>(y, x, 1.0f, i);  // warm-up, lazy load, caches
  cudaDeviceSynchronize();
  const char *alt = getenv("MINE_CAPTURE_ALTERNATE"), *mk = getenv("MINE_BENCH_MARKS");
  long B = alt ? atol(alt) : 0;
  if (mk && atol(mk) > 0) B = atol(mk);
  std::vector<std::chrono::steady_clock::time_point> marks;
  if (B > 0) marks.reserve(n / B + 2);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; i++) {
    if (B > 0 && i % B == 0) marks.push_back(std::chrono::steady_clock::now());
    k_empty<<<1, 32>>>(y, x, 1.0f, i);
  }
  if (B > 0) marks.push_back(std::chrono::steady_clock::now());
  cudaDeviceSynchronize();
  auto t1 = std::chrono::steady_clock::now();
  if (cudaGetLastError()) { fprintf(stderr, "launch failed\n"); return 1; }
  double us = std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
  printf("{\"launches\": %d, \"us_per_launch\": %.4f", n, us);
  if (B > 0 && mk) {  // steady_clock is CLOCK_MONOTONIC with libstdc++ on Linux
    printf(", \"block\": %ld, \"marks_ns\": [", B);
    for (size_t k = 0; k < marks.size(); k++)
      printf("%s%lld", k ? "," : "", (long long)std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         marks[k].time_since_epoch()).count());
    printf("]");
  } else if (B > 0 && marks.size() > 4) {
    std::vector<double> blk;  // us per launch of each whole block
    for (size_t k = 0; k + 1 < marks.size() && (long)(k + 1) * B <= n; k++)
      blk.push_back(std::chrono::duration<double, std::micro>(marks[k + 1] - marks[k]).count() / B);
    auto recorded = [&](size_t k) { return ((1000 + (long)k * B) / B) % 2 == 0; };  // global block parity
    double rs = 0, ps = 0;
    int rn = 0, pn = 0;
    std::vector<double> diffs;
    for (size_t k = 0; k < blk.size(); k++) {
      if (recorded(k)) { rs += blk[k]; rn++; } else { ps += blk[k]; pn++; }
      if (recorded(k) && k > 0 && k + 1 < blk.size()) diffs.push_back(blk[k] - (blk[k - 1] + blk[k + 1]) / 2);
    }
    std::sort(diffs.begin(), diffs.end());
    double med = diffs.empty() ? 0 : diffs[diffs.size() / 2];
    printf(", \"block\": %ld, \"recorded_us\": %.4f, \"passed_us\": %.4f, \"block_diff_us\": %.4f, \"blocks\": %zu",
           B, rn ? rs / rn : 0, pn ? ps / pn : 0, med, blk.size());
  }
  printf("}\n");
  return 0;
}
