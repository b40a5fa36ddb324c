// Kernels the probe loads itself as a cubin (cuModuleLoadData) and launches through the driver.
extern "C" __global__ void drv_scale(float *y, int n, float s) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] *= s;
}

extern "C" __global__ void drv_cluster(float *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += 1.0f;
}
