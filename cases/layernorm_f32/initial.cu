// Baseline: one block of 256 threads per row, two passes for the statistics. Each thread strides
// over the row; the sum and then the sum of squared deviations are block reductions (warp shuffles,
// then one partial per warp through shared memory). The row is read three times (mean, variance,
// output); the second and third reads mostly hit the caches.
#define THREADS 256
#define WARPS (THREADS / 32)

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    return v;
}

// Every warp reduces the per-warp partials itself, so all threads get the result after one
// barrier. Each reduction gets its own scratch array, so no barrier is needed before reusing one.
__device__ __forceinline__ float block_sum(float v, float* scratch)
{
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0) {
        scratch[threadIdx.x >> 5] = v;
    }
    __syncthreads();
    int lane = threadIdx.x & 31;
    return warp_sum(lane < WARPS ? scratch[lane] : 0.0f);
}

extern "C" __global__ void __launch_bounds__(THREADS)
layernorm_f32(const float* __restrict__ x, const float* __restrict__ weight, const float* __restrict__ bias,
              float* __restrict__ y, int rows, int cols, float eps)
{
    __shared__ float mean_scratch[WARPS];
    __shared__ float var_scratch[WARPS];

    const float* xr = x + (long long)blockIdx.x * cols;
    float* yr = y + (long long)blockIdx.x * cols;

    float sum = 0.0f;
    for (int j = threadIdx.x; j < cols; j += THREADS) {
        sum += xr[j];
    }
    const float mean = block_sum(sum, mean_scratch) / cols;

    float squares = 0.0f;
    for (int j = threadIdx.x; j < cols; j += THREADS) {
        float d = xr[j] - mean;
        squares += d * d;
    }
    const float var = block_sum(squares, var_scratch) / cols;
    const float inv_std = rsqrtf(var + eps);

    for (int j = threadIdx.x; j < cols; j += THREADS) {
        yr[j] = (xr[j] - mean) * inv_std * weight[j] + bias[j];
    }
}
