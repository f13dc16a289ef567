// Deadline-test kernel: a correct product, but on the performance shapes (m >= 1000) its first thread
// then spins for about 30 s (6e10 cycles of clock64 at about 2 GHz) in every launch. The referee must
// stop its first such launch at the launch limit (too_slow) and answer the call in time
// (tests/gpu/test_call_deadline.py).
extern "C" __global__ void matmul_f32(const float* a, const float* b, float* c, int m, int n, int k)
{
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < m && col < n) {
        float sum = 0.0f;
        for (int i = 0; i < k; ++i) sum += a[row * k + i] * b[i * n + col];
        c[row * n + col] = sum;
    }
    if (m >= 1000 && row == 0 && col == 0) {
        long long start = clock64();
        while (clock64() - start < 60000000000LL) {
        }
    }
}
