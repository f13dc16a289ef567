// Demo candidate 5, does not compile: a vectorized store written with the wrong type (a float4
// assigned to a float). The referee returns the compiler's log and the attempt is rejected as
// compile_error; it costs an attempt all the same.
extern "C" __global__ void matmul_f32(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ c, int m, int n, int k)
{
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = 4 * (blockIdx.x * blockDim.x + threadIdx.x);
    if (row >= m || col >= n) {
        return;
    }
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int i = 0; i < k; ++i) {
        float x = a[(long long)row * k + i];
        sum.x += x * b[(long long)i * n + col];
        sum.y += x * b[(long long)i * n + col + 1];
        sum.z += x * b[(long long)i * n + col + 2];
        sum.w += x * b[(long long)i * n + col + 3];
    }
    c[(long long)row * n + col] = sum;
}
