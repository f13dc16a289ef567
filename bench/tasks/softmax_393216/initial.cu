// Baseline: one block of 256 threads per row. Each thread strides over the row; the max and the
// sum are block reductions (warp shuffles, then one partial per warp through shared memory). The
// row is read three times (max, sum, output); the second and third reads mostly hit the caches.
#define THREADS 256
#define WARPS (THREADS / 32)

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    }
    return v;
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    return v;
}

// Every warp reduces the per-warp partials itself, so all threads get the result after one
// barrier. Each reduction has its own scratch array, so no barrier is needed before reusing it.
__device__ __forceinline__ float block_max(float v, float* scratch)
{
    v = warp_max(v);
    if ((threadIdx.x & 31) == 0) {
        scratch[threadIdx.x >> 5] = v;
    }
    __syncthreads();
    int lane = threadIdx.x & 31;
    return warp_max(lane < WARPS ? scratch[lane] : __int_as_float(0xff800000));  // -inf
}

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
softmax_f32(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    __shared__ float max_scratch[WARPS];
    __shared__ float sum_scratch[WARPS];

    const float* xr = x + (long long)blockIdx.x * cols;
    float* yr = y + (long long)blockIdx.x * cols;

    float max = __int_as_float(0xff800000);  // -inf: the identity for lanes past the row's end
    for (int j = threadIdx.x; j < cols; j += THREADS) {
        max = fmaxf(max, xr[j]);
    }
    max = block_max(max, max_scratch);

    float sum = 0.0f;
    for (int j = threadIdx.x; j < cols; j += THREADS) {
        sum += expf(xr[j] - max);
    }
    sum = block_sum(sum, sum_scratch);

    const float inv = 1.0f / sum;
    for (int j = threadIdx.x; j < cols; j += THREADS) {
        yr[j] = expf(xr[j] - max) * inv;
    }
}
