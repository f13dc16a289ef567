// Reference: one thread per element of C, a plain float32 sum over k in order.
// Reviewed for: row-major indexing (a[row, i] = a[row * k + i], b[i, col] = b[i * n + col]),
// 64-bit offsets, bounds on both m and n (the grid is rounded up), conversion of each bfloat16 to
// float before the product (exact, so contracting into an FMA cannot change the result), no shared
// state between threads.
#include <cuda_bf16.h>

extern "C" __global__ void matmul_bf16(const __nv_bfloat16* a, const __nv_bfloat16* b, float* c, int m, int n, int k)
{
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= m || col >= n) {
        return;
    }
    float sum = 0.0f;
    for (int i = 0; i < k; ++i) {
        sum += __bfloat162float(a[(long long)row * k + i]) * __bfloat162float(b[(long long)i * n + col]);
    }
    c[(long long)row * n + col] = sum;
}
