// tma_probe.cu: a kernel taking a CUtensorMap by value (sm_90a), to check that the ABI check
// sees a 128-byte, 64-aligned parameter. It only prefetches the descriptor.
#include <cuda.h>

extern "C" __global__ void probe_tensormap(const __grid_constant__ CUtensorMap map, float* y, int n) {
    if (threadIdx.x == 0) {
        asm volatile("prefetch.tensormap [%0];" :: "l"(reinterpret_cast<uint64_t>(&map)) : "memory");
    }
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 0.0f;
}
