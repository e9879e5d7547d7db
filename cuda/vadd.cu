// Elementwise float32 kernels (launch=elementwise).

// relaxc-kernel: vadd launch=elementwise inputs=2 outputs=1
extern "C" __global__ void vadd(const float* a, const float* b, float* out, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

// relaxc-kernel: vrelu launch=elementwise inputs=1 outputs=1
extern "C" __global__ void vrelu(const float* a, float* out, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] > 0.0f ? a[i] : 0.0f;
}
