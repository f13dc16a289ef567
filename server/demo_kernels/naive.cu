// Demo candidate 1, naive: one thread per element of C, a plain float32 sum over k read straight
// from global memory. Correct on every shape, and slower than the tiled baseline: each product
// costs two global loads (mostly served by L1/L2), no reuse is planned.
// Launch: grid (ceil_div(n, 16), ceil_div(m, 16)), block (16, 16).
extern "C" __global__ void matmul_f32(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ c, int m, int n, int k)
{
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= m || col >= n) {
        return;
    }
    const float* a_row = a + (long long)row * k;
    float sum = 0.0f;
    for (int i = 0; i < k; ++i) {
        sum += a_row[i] * b[(long long)i * n + col];
    }
    c[(long long)row * n + col] = sum;
}
