// mine_reduce: the combine step of split-KV decode attention for a batch of sequences.
//
// vLLM's 3D (split-KV) attention writes, for each query row and head, NUM_SEGMENTS partial results:
// an unnormalised output vector, the running maximum and the exp-sum of its segment of the context.
// vLLM's own combine kernel (Triton reduce_segments) is built per sequence count: in a capture of
// one sequence at a time Triton folds its `num_seqs` of 1 into the build, so that build cannot
// serve a batch. This kernel is the same combine for decode, one query row per sequence (row r is
// sequence r), every count of sequences:
//   the segments the 3D kernel wrote for a context of L tokens: tiles = ceil(L / (S * tile)),
//   active = ceil(L / (tiles * tile)) (the 3D kernel returns before writing the others);
//   out[r, h, :] = sum_s exp(max_s - M) * acc_s / sum_s exp(max_s - M) * sum_s, M = max_s max_s.
// Layouts (f32, row-major): segm_out [rows, heads, S, head_pad], segm_max / segm_expsum [rows,
// heads, S]; out bf16 with the given row and head strides (elements). Grid (rows, heads); any block.
#include <cuda_bf16.h>
#include <stdint.h>

extern "C" __global__ void __launch_bounds__(128) mine_reduce_segments(
    __nv_bfloat16* __restrict__ out, const float* __restrict__ segm_out, const float* __restrict__ segm_max,
    const float* __restrict__ segm_expsum, const int32_t* __restrict__ seq_lens, int64_t out_stride0,
    int64_t out_stride1, int32_t head_size, int32_t head_pad, int32_t segments, int32_t tile) {
  const int32_t r = blockIdx.x, h = blockIdx.y, heads = gridDim.y;
  const int32_t len = seq_lens[r];
  const int32_t span = segments * tile;
  const int32_t tiles = (len + span - 1) / span;
  const int32_t active = tiles > 0 ? (len + tiles * tile - 1) / (tiles * tile) : 0;
  const int64_t base = (static_cast<int64_t>(r) * heads + h) * segments;
  float m = -INFINITY;
  for (int32_t s = 0; s < active; ++s) m = fmaxf(m, segm_max[base + s]);
  float sum = 0.f;
  for (int32_t s = 0; s < active; ++s) sum += segm_expsum[base + s] * __expf(segm_max[base + s] - m);
  __nv_bfloat16* o = out + static_cast<int64_t>(r) * out_stride0 + static_cast<int64_t>(h) * out_stride1;
  for (int32_t d = threadIdx.x; d < head_size; d += blockDim.x) {
    float acc = 0.f;
    for (int32_t s = 0; s < active; ++s) acc += segm_out[(base + s) * head_pad + d] * __expf(segm_max[base + s] - m);
    o[d] = __float2bfloat16(sum == 0.f ? 0.f : acc / sum);
  }
}
