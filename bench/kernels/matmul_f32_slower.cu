// The baseline (cases/matmul_f32/initial.cu) made about 2% slower by extra work: the k loop runs
// k / 50 further steps over zero padding, which adds 0 * 0 to every sum (bench/timing.py).
#define TILE 16

extern "C" __global__ void matmul_f32(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ c, int m, int n, int k)
{
    __shared__ float a_tile[TILE][TILE];
    __shared__ float b_tile[TILE][TILE + 1];  // +1 avoids bank conflicts on the column reads

    int row = blockIdx.y * TILE + threadIdx.y;
    int col = blockIdx.x * TILE + threadIdx.x;
    float sum = 0.0f;

    for (int t = 0; t < k + k / 50; t += TILE) {
        int a_col = t + threadIdx.x;
        int b_row = t + threadIdx.y;
        a_tile[threadIdx.y][threadIdx.x] = (row < m && a_col < k) ? a[(long long)row * k + a_col] : 0.0f;
        b_tile[threadIdx.y][threadIdx.x] = (b_row < k && col < n) ? b[(long long)b_row * n + col] : 0.0f;
        __syncthreads();
#pragma unroll
        for (int i = 0; i < TILE; ++i) {
            sum += a_tile[threadIdx.y][i] * b_tile[i][threadIdx.x];
        }
        __syncthreads();
    }
    if (row < m && col < n) {
        c[(long long)row * n + col] = sum;
    }
}
