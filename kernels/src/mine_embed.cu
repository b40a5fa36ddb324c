// mine_embed: gather embedding rows, out[t, :] = table[ids[t], :] (bf16).
//
// Part of the handwritten glue the Qwen3 manifest needs around vLLM's mined kernels: vLLM's own
// embedding runs through an ATen gather whose by-value TensorInfo ABI is not worth rebinding.
// One block per token; 16-byte vector copies, so `hidden` must be a multiple of 8.
#include <cuda_bf16.h>
#include <stdint.h>

extern "C" __global__ void mine_embed_rows(const int32_t* __restrict__ ids,
                                           const __nv_bfloat16* __restrict__ table,
                                           __nv_bfloat16* __restrict__ out,
                                           int32_t hidden) {
  const int64_t row = ids[blockIdx.x];
  const uint4* src = reinterpret_cast<const uint4*>(table + row * hidden);
  uint4* dst = reinterpret_cast<uint4*>(out + static_cast<int64_t>(blockIdx.x) * hidden);
  for (int i = threadIdx.x; i < hidden / 8; i += blockDim.x) dst[i] = src[i];
}
