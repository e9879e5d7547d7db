// Row-wise float32 sum (launch=rows): out[r] = sum(in[r, :]), one block per row.

// relaxc-kernel: rowsum launch=rows inputs=1 outputs=1
extern "C" __global__ void rowsum(const float* in, float* out, long long rows, long long cols) {
  extern __shared__ float partial[];
  long long r = blockIdx.x;
  float acc = 0.0f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) acc += in[r * cols + c];
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0 && r < rows) out[r] = partial[0];
}
