"""SHA-256 of fixed-size chunks, one chunk per thread, for the judging kernels (judge_source.py).

sha256-tree(data) is the SHA-256 of the concatenated chunk digests (harness/worker_side/buffers.py's
tree_sha256 on the host): a multi-GB output is hashed where it lies, at the device's pace. SHA256_PORTABLE
is part of the judging source's portable part (the tests hold it to hashlib on the host); SHA256_KERNEL is
the device's kernel over it.
"""

SHA256_PORTABLE = r"""
// SHA-256 (FIPS 180-4) of `length` bytes at `data` into `digest` (32 bytes).
JUDGE_CONST judge_u32 judge_sha256_k[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u,
    0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, 0xc19bf174u,
    0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau,
    0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u,
    0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, 0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u,
    0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u,
    0x19a4c116u, 0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u};

JUDGE_HD inline judge_u32 judge_rotr(judge_u32 x, int r) { return (x >> r) | (x << (32 - r)); }

JUDGE_HD inline void judge_sha256_block(judge_u32* state, const unsigned char* block) {
    const judge_u32* k = judge_sha256_k;
    judge_u32 w[64];
    for (int t = 0; t < 16; ++t)
        w[t] = ((judge_u32)block[4 * t] << 24) | ((judge_u32)block[4 * t + 1] << 16)
             | ((judge_u32)block[4 * t + 2] << 8) | (judge_u32)block[4 * t + 3];
    for (int t = 16; t < 64; ++t) {
        judge_u32 s0 = judge_rotr(w[t - 15], 7) ^ judge_rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
        judge_u32 s1 = judge_rotr(w[t - 2], 17) ^ judge_rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    judge_u32 a = state[0], b = state[1], c = state[2], d = state[3];
    judge_u32 e = state[4], f = state[5], g = state[6], h = state[7];
    for (int t = 0; t < 64; ++t) {
        judge_u32 t1 = h + (judge_rotr(e, 6) ^ judge_rotr(e, 11) ^ judge_rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[t] + w[t];
        judge_u32 t2 = (judge_rotr(a, 2) ^ judge_rotr(a, 13) ^ judge_rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    state[0] += a; state[1] += b; state[2] += c; state[3] += d;
    state[4] += e; state[5] += f; state[6] += g; state[7] += h;
}

JUDGE_HD inline void judge_sha256(const unsigned char* data, judge_u64 length, unsigned char* digest) {
    judge_u32 state[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
                          0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
    judge_u64 whole = length / 64;
    for (judge_u64 i = 0; i < whole; ++i) judge_sha256_block(state, data + 64 * i);
    unsigned char tail[128];
    judge_u64 rest = length - 64 * whole;
    for (judge_u64 i = 0; i < 128; ++i) tail[i] = 0;
    for (judge_u64 i = 0; i < rest; ++i) tail[i] = data[64 * whole + i];
    tail[rest] = 0x80;
    judge_u64 blocks = rest + 9 > 64 ? 2 : 1;
    judge_u64 bits = length * 8;
    for (int i = 0; i < 8; ++i) tail[64 * blocks - 1 - i] = (unsigned char)(bits >> (8 * i));
    for (judge_u64 i = 0; i < blocks; ++i) judge_sha256_block(state, tail + 64 * i);
    for (int i = 0; i < 8; ++i) {
        digest[4 * i] = (unsigned char)(state[i] >> 24); digest[4 * i + 1] = (unsigned char)(state[i] >> 16);
        digest[4 * i + 2] = (unsigned char)(state[i] >> 8); digest[4 * i + 3] = (unsigned char)state[i];
    }
}
"""

SHA256_KERNEL = r"""
// One thread per chunk of `chunk` bytes: digests[32 * i] = SHA-256 of chunk i (the last may be shorter).
extern "C" __global__ void referee_chunk_sha256(const unsigned char* data, unsigned long long n,
                                                unsigned long long chunk, unsigned char* digests) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long first = i * chunk;
    if (first >= n) return;
    unsigned long long length = n - first < chunk ? n - first : chunk;
    judge_sha256(data + first, length, digests + 32 * i);
}
"""
