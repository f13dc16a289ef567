// Reference: one thread per row, three plain loops: the row max, the sum of exp(x - max), and the
// output exp(x - max) / sum, all in float32 with the accurate expf.
// Reviewed for: the bound on rows (the grid is rounded up), 64-bit row offsets, the max starting
// from the row's first element (cols >= 1), the same shifted argument in the sum and the output,
// no shared state between threads.
extern "C" __global__ void softmax_f32(const float* x, float* y, int rows, int cols)
{
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= rows) {
        return;
    }
    const float* xr = x + (long long)row * cols;
    float* yr = y + (long long)row * cols;
    float max = xr[0];
    for (int j = 1; j < cols; ++j) {
        max = fmaxf(max, xr[j]);
    }
    float sum = 0.0f;
    for (int j = 0; j < cols; ++j) {
        sum += expf(xr[j] - max);
    }
    for (int j = 0; j < cols; ++j) {
        yr[j] = expf(xr[j] - max) / sum;
    }
}
