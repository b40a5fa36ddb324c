// mine_argmax: greedy sampling, out[r] = argmax_j logits[r, j] over bf16 logits.
//
// Ties resolve to the lowest index, as torch.argmax does, so kern's tokens can be compared with
// vLLM's greedy tokens exactly. NaN never wins. One block of 1024 threads per row.
#include <cuda_bf16.h>
#include <stdint.h>

extern "C" __global__ void __launch_bounds__(1024) mine_argmax_rows(const __nv_bfloat16* __restrict__ logits,
                                                                   int32_t* __restrict__ out,
                                                                   int32_t vocab) {
  __shared__ float s_val[32];
  __shared__ int32_t s_idx[32];
  const __nv_bfloat16* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  float best = -INFINITY;
  int32_t best_i = 0x7fffffff;
  for (int32_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    float v = __bfloat162float(row[j]);
    if (v > best || (v == best && j < best_i)) { best = v; best_i = j; }
  }
  for (int off = 16; off > 0; off >>= 1) {
    float ov = __shfl_down_sync(0xffffffffu, best, off);
    int32_t oi = __shfl_down_sync(0xffffffffu, best_i, off);
    if (ov > best || (ov == best && oi < best_i)) { best = ov; best_i = oi; }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) { s_val[warp] = best; s_idx[warp] = best_i; }
  __syncthreads();
  if (warp == 0) {
    const int nwarps = (blockDim.x + 31) >> 5;
    best = lane < nwarps ? s_val[lane] : -INFINITY;
    best_i = lane < nwarps ? s_idx[lane] : 0x7fffffff;
    for (int off = 16; off > 0; off >>= 1) {
      float ov = __shfl_down_sync(0xffffffffu, best, off);
      int32_t oi = __shfl_down_sync(0xffffffffu, best_i, off);
      if (ov > best || (ov == best && oi < best_i)) { best = ov; best_i = oi; }
    }
    if (lane == 0) out[blockIdx.x] = best_i == 0x7fffffff ? 0 : best_i;
  }
}
