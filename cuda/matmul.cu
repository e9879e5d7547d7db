// Tiled float32 matrix multiply (launch=matmul): out[M, N] = a[M, K] @ b[K, N].

// relaxc-kernel: matmul_tiled launch=matmul inputs=2 outputs=1
extern "C" __global__ void matmul_tiled(const float* a, const float* b, float* out, long long M, long long N, long long K) {
  extern __shared__ float tiles[];
  float* ta = tiles;
  float* tb = tiles + 16 * 16;
  int tx = threadIdx.x, ty = threadIdx.y;
  long long row = (long long)blockIdx.y * 16 + ty, col = (long long)blockIdx.x * 16 + tx;
  float acc = 0.0f;
  for (long long k0 = 0; k0 < K; k0 += 16) {
    ta[ty * 16 + tx] = (row < M && k0 + tx < K) ? a[row * K + k0 + tx] : 0.0f;
    tb[ty * 16 + tx] = (col < N && k0 + ty < K) ? b[(k0 + ty) * N + col] : 0.0f;
    __syncthreads();
    for (int k = 0; k < 16; k++) acc += ta[ty * 16 + k] * tb[k * 16 + tx];
    __syncthreads();
  }
  if (row < M && col < N) out[row * N + col] = acc;
}
