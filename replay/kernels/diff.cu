// Which chunks of two device ranges differ: the device side of a forward replay's compare.
//
// Why on the device: a replayed launch's regions are tens of MiB (an allocator segment, a window
// of a KV pool) and a kernel writes a few KiB of them. Downloading every region after every run to
// compare it on the host was most of a replay's time; here the region is compared with a shadow
// copy of what it was given, and only the chunks that differ come back.
//
// flags[k] is set to 1 when any 8-byte word of chunk k (1 << shift words) differs; flags must be
// zeroed before. Built into diff.ptx by replay/kernels/build.sh (nvcc -ptx, compute_80).
extern "C" __global__ void mine_diff_chunks(const unsigned long long* __restrict__ a,
                                            const unsigned long long* __restrict__ b,
                                            unsigned long long words, unsigned int shift,
                                            unsigned char* __restrict__ flags) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (; i < words; i += stride) {
        if (a[i] != b[i]) flags[i >> shift] = 1;
    }
}
