// matmul_f32, whose first thread writes into the module's constant bank through generic addresses
// (cvta.const) and checks, at every launch, that the bank holds what the module loaded: `counter` 7, the
// padding byte after `tag` 0, `where` the address the loader patched in (&target). It then changes all three
// and checks that its stores landed. Any launch that finds the bank as an earlier launch left it, or whose
// stores did not land, writes a wrong c[0] (off by 1000): a check passes only if the bank is put back,
// padding included, before every launch. Layout (tests/test_module_state.py): tag at 0, counter at 4,
// where at 8, in .nv.constant3.
__constant__ unsigned char tag = 1;
__constant__ unsigned int counter = 7;
__device__ int target;
__constant__ int* where = &target;

template <typename T>
__device__ __forceinline__ volatile T* generic(unsigned long long address) { return (volatile T*)address; }

extern "C" __global__ void matmul_f32(const float* a, const float* b, float* c, int m, int n, int k)
{
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= m || col >= n) return;
    float sum = 0.0f;
    for (int i = 0; i < k; ++i) sum += a[row * k + i] * b[i * n + col];
    if (row == 0 && col == 0) {
        unsigned long long at_tag, at_counter, at_where;
        asm volatile("cvta.const.u64 %0, tag;" : "=l"(at_tag));
        asm volatile("cvta.const.u64 %0, counter;" : "=l"(at_counter));
        asm volatile("cvta.const.u64 %0, where;" : "=l"(at_where));
        volatile unsigned char* padding = generic<unsigned char>(at_tag) + 1;
        volatile unsigned int* count = generic<unsigned int>(at_counter);
        volatile unsigned long long* pointer = generic<unsigned long long>(at_where);
        unsigned int seen = *count;
        unsigned char pad = *padding;
        unsigned long long pointed = *pointer;
        bool as_loaded = seen == 7 && pad == 0 && pointed == (unsigned long long)&target;
        *count = seen + 1;
        *padding = (unsigned char)(pad + 1);
        *pointer = 0;
        __threadfence();
        bool landed = *count == seen + 1 && *padding == (unsigned char)(pad + 1) && *pointer == 0;
        if (!(as_loaded && landed)) sum += 1000.0f;
    }
    c[row * n + col] = sum;
}
