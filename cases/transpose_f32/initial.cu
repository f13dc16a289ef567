// Baseline: the classic shared-memory tiled transpose. Each block reads a 32 x 32 tile of in with
// coalesced row reads, then writes it to out, also along rows, reading the tile by column; the +1
// padding puts a tile column in 32 different banks. Edge tiles check both bounds, so any shape works.
#define TILE 32
#define BLOCK_ROWS 8

extern "C" __global__ void __launch_bounds__(TILE * BLOCK_ROWS)
transpose_f32(const float* __restrict__ in, float* __restrict__ out, int rows, int cols)
{
    __shared__ float tile[TILE][TILE + 1];

    const int in_row0 = blockIdx.y * TILE;  // also the first column of out this block writes
    const int in_col0 = blockIdx.x * TILE;  // also the first row of out this block writes

    const int in_col = in_col0 + threadIdx.x;
#pragma unroll
    for (int r = threadIdx.y; r < TILE; r += BLOCK_ROWS) {
        int in_row = in_row0 + r;
        if (in_row < rows && in_col < cols) {
            tile[r][threadIdx.x] = in[(long long)in_row * cols + in_col];
        }
    }
    __syncthreads();

    const int out_col = in_row0 + threadIdx.x;
#pragma unroll
    for (int r = threadIdx.y; r < TILE; r += BLOCK_ROWS) {
        int out_row = in_col0 + r;
        if (out_row < cols && out_col < rows) {
            out[(long long)out_row * rows + out_col] = tile[threadIdx.x][r];
        }
    }
}
