// Reference: one thread per element of C, a plain float32 sum over k in order.
// Reviewed for: row-major indexing (a[row, i] = a[row * k + i], b[i, col] = b[i * n + col]),
// bounds on both m and n (the grid is rounded up), no shared state between threads.
extern "C" __global__ void matmul_f32(const float* a, const float* b, float* c, int m, int n, int k)
{
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= m || col >= n) {
        return;
    }
    float sum = 0.0f;
    for (int i = 0; i < k; ++i) {
        sum += a[(long long)row * k + i] * b[(long long)i * n + col];
    }
    c[(long long)row * n + col] = sum;
}
