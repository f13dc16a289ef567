// Baseline: a register-blocked shared-memory tiled kernel on the CUDA cores, float32 accumulation.
// Each block computes a 64 x 64 tile of C with 16 x 16 threads, each thread 4 x 4 elements strided
// by 16 so that its shared-memory reads are broadcasts or consecutive words. Per step of k the
// block stages a 64 x 16 tile of A and a 16 x 64 tile of B, converted to float and zero-padded
// past the matrix edges, so odd shapes stay correct. No tensor cores.
#include <cuda_bf16.h>

#define BM 64
#define BN 64
#define BK 16
#define THREADS 256

extern "C" __global__ void __launch_bounds__(THREADS)
matmul_bf16(const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ b,
            float* __restrict__ c, int m, int n, int k)
{
    // A is stored k-major so a thread's four rows are four broadcast reads; the +1 spreads the
    // transposing stores over the banks.
    __shared__ float a_tile[BK][BM + 1];
    __shared__ float b_tile[BK][BN];

    const int tx = threadIdx.x;
    const int ty = threadIdx.y;
    const int tid = ty * 16 + tx;
    const int row0 = blockIdx.y * BM;
    const int col0 = blockIdx.x * BN;

    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            acc[i][j] = 0.0f;
        }
    }

    for (int t = 0; t < k; t += BK) {
        // Consecutive threads read consecutive k of one row of A and consecutive columns of B.
#pragma unroll
        for (int i = 0; i < (BM * BK) / THREADS; ++i) {
            int idx = tid + i * THREADS;
            int r = idx / BK;
            int kk = idx % BK;
            int gr = row0 + r;
            int gk = t + kk;
            a_tile[kk][r] = (gr < m && gk < k) ? __bfloat162float(a[(long long)gr * k + gk]) : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < (BK * BN) / THREADS; ++i) {
            int idx = tid + i * THREADS;
            int kk = idx / BN;
            int cc = idx % BN;
            int gk = t + kk;
            int gc = col0 + cc;
            b_tile[kk][cc] = (gk < k && gc < n) ? __bfloat162float(b[(long long)gk * n + gc]) : 0.0f;
        }
        __syncthreads();

#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float av[4];
            float bv[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                av[i] = a_tile[kk][ty + 16 * i];
                bv[i] = b_tile[kk][tx + 16 * i];
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) {
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    acc[i][j] += av[i] * bv[j];
                }
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 4; ++i) {
        int row = row0 + ty + 16 * i;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int col = col0 + tx + 16 * j;
            if (row < m && col < n) {
                c[(long long)row * n + col] = acc[i][j];
            }
        }
    }
}
