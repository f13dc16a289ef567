// The reference of bench/large_case.py's long-row softmax: one block of 1024 threads per row; each thread's max and sum of exponentials
// are accumulated in double, then reduced across the block in double. Three passes over the row.
#define THREADS 1024
#define WARPS (THREADS / 32)

__device__ double warp_max(double v)
{
    for (int offset = 16; offset > 0; offset >>= 1) {
        v = fmax(v, __shfl_xor_sync(0xffffffffu, v, offset));
    }
    return v;
}

__device__ double warp_sum(double v)
{
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    return v;
}

__device__ double block_reduce(double v, double* scratch, bool is_max)
{
    v = is_max ? warp_max(v) : warp_sum(v);
    if ((threadIdx.x & 31) == 0) {
        scratch[threadIdx.x >> 5] = v;
    }
    __syncthreads();
    double w = scratch[threadIdx.x & 31];
    return is_max ? warp_max(w) : warp_sum(w);
}

extern "C" __global__ void __launch_bounds__(THREADS)
softmax_f32(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    __shared__ double max_scratch[WARPS];
    __shared__ double sum_scratch[WARPS];
    const float* xr = x + (long long)blockIdx.x * cols;
    float* yr = y + (long long)blockIdx.x * cols;

    double max = -1.0 / 0.0;
    for (int j = threadIdx.x; j < cols; j += THREADS) {
        max = fmax(max, (double)xr[j]);
    }
    max = block_reduce(max, max_scratch, true);

    double sum = 0.0;
    for (int j = threadIdx.x; j < cols; j += THREADS) {
        sum += exp((double)xr[j] - max);
    }
    sum = block_reduce(sum, sum_scratch, false);

    for (int j = threadIdx.x; j < cols; j += THREADS) {
        yr[j] = (float)(exp((double)xr[j] - max) / sum);
    }
}
