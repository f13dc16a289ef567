// Demo candidate 4, a deliberate edge bug: register_blocked.cu with the last, partial step of k
// dropped (the loop runs `t + BK <= k`), as if every k were a multiple of BK = 8. Right on the
// performance cases (k = 2048 and 1000), wrong wherever k % 8 != 0: the referee rejects it with a
// mismatch on the odd correctness case (k = 29) before it is ever timed.
// Launch: grid (ceil_div(n, 128), ceil_div(m, 128)), block (256).
#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#define BK 8
#define THREADS ((BM / 8) * (BN / 8))
static_assert((BM == 64 || BM == 128) && (BN == 64 || BN == 128), "tiles of 64 or 128: every thread then stages "
              "whole float4 of both tiles");
#define A_PAD 4  // rows of as_t 132 floats long: the two halves of a warp's transposed stores hit different banks

__device__ __forceinline__ float4 load4(const float* __restrict__ p, bool vector_ok, int left, bool inside)
{
    // `left`: elements of this row still inside the matrix from p on; `inside`: the row exists.
    if (inside && vector_ok && left >= 4) {
        return *reinterpret_cast<const float4*>(p);
    }
    float4 v;
    v.x = (inside && left > 0) ? p[0] : 0.0f;
    v.y = (inside && left > 1) ? p[1] : 0.0f;
    v.z = (inside && left > 2) ? p[2] : 0.0f;
    v.w = (inside && left > 3) ? p[3] : 0.0f;
    return v;
}

__device__ __forceinline__ void store4(float* __restrict__ p, bool vector_ok, int left, float4 v)
{
    if (vector_ok && left >= 4) {
        *reinterpret_cast<float4*>(p) = v;
        return;
    }
    if (left > 0) p[0] = v.x;
    if (left > 1) p[1] = v.y;
    if (left > 2) p[2] = v.z;
    if (left > 3) p[3] = v.w;
}

extern "C" __global__ void __launch_bounds__(THREADS)
matmul_f32(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c, int m, int n, int k)
{
    __shared__ __align__(16) float as_t[BK][BM + A_PAD];  // as_t[kk][r] = A[row0 + r][t + kk]
    __shared__ __align__(16) float bs[BK][BN];            // bs[kk][j]   = B[t + kk][col0 + j]

    const int tid = threadIdx.x;
    const int tx = tid % (BN / 8), ty = tid / (BN / 8);
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    const bool a_vec = (k & 3) == 0, b_vec = (n & 3) == 0;
    float acc[8][8] = {};

    for (int t = 0; t + BK <= k; t += BK) {  // the bug: drops k % BK trailing products
        // A tile: BM rows x BK columns, two float4 per row.
#pragma unroll
        for (int p = 0; p < BM * (BK / 4) / THREADS; ++p) {
            const int q = tid + p * THREADS;
            const int r = q / (BK / 4), kq = (q % (BK / 4)) * 4;
            const int gr = row0 + r, gk = t + kq;
            const float4 v = load4(a + (long long)gr * k + gk, a_vec, k - gk, gr < m);
            as_t[kq + 0][r] = v.x;
            as_t[kq + 1][r] = v.y;
            as_t[kq + 2][r] = v.z;
            as_t[kq + 3][r] = v.w;
        }
        // B tile: BK rows x BN columns, BN / 4 float4 per row.
#pragma unroll
        for (int p = 0; p < BK * (BN / 4) / THREADS; ++p) {
            const int q = tid + p * THREADS;
            const int kk = q / (BN / 4), j = (q % (BN / 4)) * 4;
            const int gk = t + kk, gc = col0 + j;
            *reinterpret_cast<float4*>(&bs[kk][j]) = load4(b + (long long)gk * n + gc, b_vec, n - gc, gk < k);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            const float4 a0 = *reinterpret_cast<const float4*>(&as_t[kk][ty * 4]);
            const float4 a1 = *reinterpret_cast<const float4*>(&as_t[kk][ty * 4 + BM / 2]);
            const float4 b0 = *reinterpret_cast<const float4*>(&bs[kk][tx * 4]);
            const float4 b1 = *reinterpret_cast<const float4*>(&bs[kk][tx * 4 + BN / 2]);
            const float ra[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float rb[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int i = 0; i < 8; ++i) {
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    acc[i][j] = fmaf(ra[i], rb[j], acc[i][j]);
                }
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int r = row0 + ty * 4 + (i & 3) + (i >> 2) * (BM / 2);
        if (r >= m) {
            continue;
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int gc = col0 + tx * 4 + half * (BN / 2);
            const float4 v = make_float4(acc[i][4 * half], acc[i][4 * half + 1], acc[i][4 * half + 2],
                                         acc[i][4 * half + 3]);
            store4(c + (long long)r * n + gc, b_vec, n - gc, v);
        }
    }
}
