// Fault-test kernel: the baseline's tiled product, correct, but its first block first spins for
// about 50 ms, so that every launch, whatever the shape, lasts long enough for a timing job to be
// interrupted from outside (tests/gpu/test_faults.py).
#define TILE 16

extern "C" __global__ void matmul_f32(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ c, int m, int n, int k)
{
    __shared__ float a_tile[TILE][TILE];
    __shared__ float b_tile[TILE][TILE + 1];  // +1 avoids bank conflicts on the column reads

    int row = blockIdx.y * TILE + threadIdx.y;
    int col = blockIdx.x * TILE + threadIdx.x;
    float sum = 0.0f;
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0) {
        long long start = clock64();
        while (clock64() - start < 100000000LL) {
        }
    }

    for (int t = 0; t < k; t += TILE) {
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
