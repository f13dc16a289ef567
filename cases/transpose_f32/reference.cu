// Reference: one thread per element of out, out[j, i] = in[i, j].
// Reviewed for: out has cols rows of length rows (out[j, i] = out[j * rows + i]), in has rows rows
// of length cols (in[i, j] = in[i * cols + j]), 64-bit offsets, bounds on both dimensions (the grid
// is rounded up), no shared state between threads.
extern "C" __global__ void transpose_f32(const float* in, float* out, int rows, int cols)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;  // column of out, row of in
    int j = blockIdx.y * blockDim.y + threadIdx.y;  // row of out, column of in
    if (i >= rows || j >= cols) {
        return;
    }
    out[(long long)j * rows + i] = in[(long long)i * cols + j];
}
