// abi_probe.cu: small kernels whose only job is to exercise the launch ABI (parameter
// offsets, sizes, alignment) so that mine's offline ABI check can be tested against
// cubins built here. Their arithmetic is deliberately trivial.
#include <cstdint>

struct Pair16 { float a, b, c, d; };           // 16 bytes, 4-aligned
struct Rec40 { double d[5]; };                 // 40 bytes, 8-aligned
struct Blob1024 { int v[256]; };               // 1024 bytes, 4-aligned

extern "C" __global__ void probe_ptrs(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}

extern "C" __global__ void probe_scalars(float* y, char c, long long big, int n, float s) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = s * (float)c + (float)big;
}

extern "C" __global__ void probe_u8_then_ptr(unsigned char flag, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && flag) y[i] = 1.0f;
}

extern "C" __global__ void probe_struct16(float* y, Pair16 p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = p.a + p.b + p.c + p.d;
}

extern "C" __global__ void probe_struct40(int n, Rec40 r, double* y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = r.d[0] + r.d[4];
}

extern "C" __global__ void probe_struct1024(const Blob1024 b, int* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = b.v[i & 255];
}

extern "C" __global__ void probe_shared(const float* x, float* y, int n) {
    extern __shared__ float tile[];
    __shared__ float fixed[64];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    tile[threadIdx.x] = i < n ? x[i] : 0.0f;
    fixed[threadIdx.x & 63] = tile[threadIdx.x];
    __syncthreads();
    if (i < n) y[i] = tile[blockDim.x - 1 - threadIdx.x] + fixed[(threadIdx.x + 1) & 63];
}

extern "C" __global__ void __launch_bounds__(128) probe_bounded(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += 1.0f;
}
