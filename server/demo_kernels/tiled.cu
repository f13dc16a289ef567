// Demo candidate 2, tiled: the classic shared-memory kernel with 32 x 32 tiles (the baseline uses
// 16 x 16). Each block stages one tile of A and one of B per step of k, zero-padded past the
// matrix edges, so every shape is correct; each element staged is reused 32 times.
// Launch: grid (ceil_div(n, 32), ceil_div(m, 32)), block (32, 32).
#define TILE 32

extern "C" __global__ void matmul_f32(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ c, int m, int n, int k)
{
    __shared__ float a_tile[TILE][TILE];
    __shared__ float b_tile[TILE][TILE];

    int row = blockIdx.y * TILE + threadIdx.y;
    int col = blockIdx.x * TILE + threadIdx.x;
    float sum = 0.0f;

    for (int t = 0; t < k; t += TILE) {
        int a_col = t + threadIdx.x;
        int b_row = t + threadIdx.y;
        a_tile[threadIdx.y][threadIdx.x] = (row < m && a_col < k) ? a[(long long)row * k + a_col] : 0.0f;
        b_tile[threadIdx.y][threadIdx.x] = (b_row < k && col < n) ? b[(long long)b_row * n + col] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int i = 0; i < TILE; ++i) {
            sum += a_tile[threadIdx.y][i] * b_tile[i][threadIdx.x];  // a: broadcast, b: one bank per lane
        }
        __syncthreads();
    }
    if (row < m && col < n) {
        c[(long long)row * n + col] = sum;
    }
}
