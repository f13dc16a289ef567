// Register-blocked tiling: a 16 x 16 block computes a 32 x 32 tile of C, each thread a 2 x 2
// sub-tile held in registers; A is staged transposed so both operands are read along rows.
// Launch: grid (ceil_div(n, 32), ceil_div(m, 32)), block (16, 16).
#define BM 32
#define BN 32
#define BK 32
#define TM 2
#define TN 2

extern "C" __global__ void matmul_f32(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ c, int m, int n, int k)
{
    __shared__ float a_tile[BK][BM + 1];
    __shared__ float b_tile[BK][BN];
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * 16 + tx;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    float acc[TM][TN] = {};

    for (int t = 0; t < k; t += BK) {
        for (int i = tid; i < BM * BK; i += 256) {
            int r = i / BK, kk = i % BK, gr = row0 + r, gk = t + kk;
            a_tile[kk][r] = (gr < m && gk < k) ? a[(long long)gr * k + gk] : 0.0f;
        }
        for (int i = tid; i < BK * BN; i += 256) {
            int kk = i / BN, cc = i % BN, gk = t + kk, gc = col0 + cc;
            b_tile[kk][cc] = (gk < k && gc < n) ? b[(long long)gk * n + gc] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float ra[TM], rb[TN];
#pragma unroll
            for (int i = 0; i < TM; ++i) ra[i] = a_tile[kk][ty * TM + i];
#pragma unroll
            for (int j = 0; j < TN; ++j) rb[j] = b_tile[kk][tx * TN + j];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] += ra[i] * rb[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < TM; ++i) {
        int r = row0 + ty * TM + i;
        for (int j = 0; j < TN; ++j) {
            int col = col0 + tx * TN + j;
            if (r < m && col < n) c[(long long)r * n + col] = acc[i][j];
        }
    }
}
