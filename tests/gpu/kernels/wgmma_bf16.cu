// matmul_bf16 on Hopper's warpgroup MMA (wgmma: sm_90a only, compiled with -arch=sm_90a). Deliberately small
// and slow: it shows an architecture-specific instruction judged like any other kernel, not a fast GEMM.
// Launch: grid (ceil_div(n, 8), ceil_div(m, 64)), block 128 (one warpgroup per 64 x 8 tile of C).
// Per step of 16 in k: A's 64 x 16 slice goes into registers in the m16n8k16 fragment layout (warp w holds
// rows 16w..16w+15), B's 16 x 8 slice into shared memory as two 8 x 8 core matrices (K-major, no swizzle),
// both zero-padded past the matrix edges; one wgmma.mma_async m64n8k16 accumulates in float32.
#include <cuda_bf16.h>

__device__ __forceinline__ unsigned short bf16_bits(const __nv_bfloat16* p, int row, int col, int rows, int cols)
{
    return (row < rows && col < cols) ? __bfloat16_as_ushort(p[(long long)row * cols + col]) : (unsigned short)0;
}

// Two consecutive k of one row of A, the lower k in the low half.
__device__ __forceinline__ unsigned a_pair(const __nv_bfloat16* a, int row, int col, int m, int k)
{
    return (unsigned)bf16_bits(a, row, col, m, k) | ((unsigned)bf16_bits(a, row, col + 1, m, k) << 16);
}

extern "C" __global__ void __launch_bounds__(128)
matmul_bf16(const __nv_bfloat16* __restrict__ a, const __nv_bfloat16* __restrict__ b,
            float* __restrict__ c, int m, int n, int k)
{
    // Core matrix j (k in [8j, 8j + 8)) holds 8 rows, one per n, of 8 consecutive k: 16 bytes a row.
    __shared__ __align__(128) unsigned short b_tile[2 * 8 * 8];

    const int tid = threadIdx.x;
    const int warp = tid / 32;
    const int lane = tid % 32;
    const int group = lane / 4;
    const int quad = lane % 4;
    const int row0 = blockIdx.y * 64 + warp * 16;
    const int col0 = blockIdx.x * 8;

    // The shared-memory matrix descriptor: start address, leading and stride byte offsets (16-byte units), no
    // swizzle. Both offsets are 128 bytes, the distance between the two core matrices: whichever of them the
    // hardware applies along k is right, and with n = 8 there is no second core matrix along n.
    const unsigned long long start = ((unsigned long long)__cvta_generic_to_shared(b_tile) & 0x3FFFF) >> 4;
    const unsigned long long desc = start | (8ull << 16) | (8ull << 32);

    float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
    for (int t = 0; t < k; t += 16) {
        const int kk = tid / 8;
        const int nn = tid % 8;
        b_tile[(kk / 8) * 64 + nn * 8 + kk % 8] = bf16_bits(b, t + kk, col0 + nn, k, n);
        const unsigned a0 = a_pair(a, row0 + group, t + quad * 2, m, k);
        const unsigned a1 = a_pair(a, row0 + group + 8, t + quad * 2, m, k);
        const unsigned a2 = a_pair(a, row0 + group, t + quad * 2 + 8, m, k);
        const unsigned a3 = a_pair(a, row0 + group + 8, t + quad * 2 + 8, m, k);
        // wgmma reads shared memory through the async proxy: the stores above must be visible to it.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
        asm volatile(
            "{\n"
            ".reg .pred accumulate;\n"
            "setp.ne.b32 accumulate, %9, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, accumulate, 1, 1, 0;\n"
            "}\n"
            : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        __syncthreads();  // every warp has read B's slice before the next step overwrites it
    }

    const int row = row0 + group;
    const int col = col0 + quad * 2;
    if (row < m && col < n) c[(long long)row * n + col] = d0;
    if (row < m && col + 1 < n) c[(long long)row * n + col + 1] = d1;
    if (row + 8 < m && col < n) c[(long long)(row + 8) * n + col] = d2;
    if (row + 8 < m && col + 1 < n) c[(long long)(row + 8) * n + col + 1] = d3;
}
