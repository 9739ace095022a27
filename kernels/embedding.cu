// Token embedding, forward (the backward scatter-add arrives with the training issue, in this file).
//
//   embedding_fwd_bf16:  out[t, :] = table[ids[t], :]
//
// Shapes: table [vocab, d] bf16 row-major; ids [tokens] u32; out [tokens, d] bf16.
// A pure gather: one block per token row, 16-byte vector copies when d % 8 == 0 (every Qwen2.5
// hidden size), scalar otherwise. Ids are validated on the host before launch; an id outside the
// table still never reads out of bounds here: its row is written as NaN, loudly wrong.

#include "common.cuh"

struct EmbeddingConfig {
    static constexpr int threads = 128;  // d = 896..8192 is 112..1024 vectors: 1..8 per thread
};

extern "C" __global__ void __launch_bounds__(EmbeddingConfig::threads)
    embedding_fwd_bf16(__nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ table,
                       const uint32_t* __restrict__ ids, int tokens, int d, int vocab) {
    const int t = blockIdx.x;
    if (t >= tokens) return;
    const uint32_t id = ids[t];
    __nv_bfloat16* out_row = out + (size_t)t * d;
    if (id >= (uint32_t)vocab) {
        for (int i = threadIdx.x; i < d; i += blockDim.x) out_row[i] = __float2bfloat16(__int_as_float(0x7fc00000));
        return;
    }
    const __nv_bfloat16* row = table + (size_t)id * d;
    if (d % 8 == 0) {
        const bf16x8* src = reinterpret_cast<const bf16x8*>(row);
        bf16x8* dst = reinterpret_cast<bf16x8*>(out_row);
        for (int i = threadIdx.x; i < d / 8; i += blockDim.x) dst[i] = src[i];
    } else {
        for (int i = threadIdx.x; i < d; i += blockDim.x) out_row[i] = row[i];
    }
}
