// Token embedding, forward and backward.
//
//   embedding_fwd_bf16:  out[t, :] = table[ids[t], :]           (0 for id 0xffffffff: a token of
//                                                              another rank's vocabulary shard)
//   embedding_bwd_f32:   d_table[ids[t], :] += d_out[t, :]   (scatter-add; repeated ids add up;
//                                                              the host drops other shards' ids)
//
// Shapes: table [vocab, d] bf16 row-major; ids [tokens] u32; out, d_out [tokens, d] bf16;
// d_table [vocab, d] f32 (a parameter gradient: f32 so micro-batches accumulate without loss).
// A pure gather: one block per token row, 16-byte vector copies when d % 8 == 0 (every Qwen2.5
// hidden size), scalar otherwise. Ids are validated on the host before launch; an id outside the
// table still never reads out of bounds here: its row is written as NaN, loudly wrong.
//
// The backward is deterministic, without atomics: the host groups the token rows by id (a stable
// sort of the ids it already holds) into `segments`, each one distinct id with its token rows in
// ascending order. One block owns a segment, so one id's row is written by one block, and each
// column adds its token rows in order, starting from the table's value: bit for bit the CPU
// reference's `table[id] += d_out[t]` for t ascending.
//
//   order [tokens] u32       token rows, grouped by id (ascending token index within a group)
//   seg_start [segments + 1] offsets into `order`; unique_ids [segments] the id of each group

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
    if (id == 0xffffffffu) {  // OTHER_SHARD: the vocabulary-parallel ranks' rows add up
        for (int i = threadIdx.x; i < d; i += blockDim.x) out_row[i] = __float2bfloat16(0.0f);
        return;
    }
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

extern "C" __global__ void __launch_bounds__(EmbeddingConfig::threads)
    embedding_bwd_f32(float* __restrict__ d_table, const __nv_bfloat16* __restrict__ d_out,
                      const uint32_t* __restrict__ order, const uint32_t* __restrict__ seg_start,
                      const uint32_t* __restrict__ unique_ids, int segments, int d, int vocab) {
    for (int seg = blockIdx.x; seg < segments; seg += gridDim.x) {
        const uint32_t id = unique_ids[seg];
        if (id >= (uint32_t)vocab) continue;  // validated on the host; never write out of bounds
        const uint32_t first = seg_start[seg], last = seg_start[seg + 1];
        float* row = d_table + (size_t)id * d;
        for (int i = threadIdx.x; i < d; i += blockDim.x) {
            float acc = row[i];
            for (uint32_t s = first; s < last; ++s) acc += bf16_to_f32(d_out[(size_t)order[s] * d + i]);
            row[i] = acc;
        }
    }
}
