// Rollout sampling from fp32 logits, one block per row: the token and its logprob under the
// distribution actually sampled from (DESIGN.md decision 9; the host contract is
// src/engine/sampler.rs, which this kernel follows for rows without filters).
//
//   sample_rows_f32: for each row r with temperature T_r and uniform draw u_r in [0, 1):
//     T_r == 0: token = argmax(logits[r]) (ties to the lowest id, -0.0 equal to +0.0, NaN ignored);
//               logprob = log_softmax(logits[r])[token]
//     T_r  > 0: scores x = logits[r] / T_r (NaN as -inf); token = the first id whose running sum of
//               exp(x - max) in index order exceeds u_r * sum(exp(x - max)) (inverse CDF);
//               logprob = x[token] - logsumexp(x)
//     If some logits are +inf the distribution is uniform over them; if none is above -inf the
//     token is 0 with logprob -inf (the host sampler's limits).
//
// Shapes: logits [rows, vocab] fp32 (the LM head's output for the rows that sample);
// temperatures [rows] fp32; uniforms [rows] f64 (drawn on the host from each request's seeded
// generator, one per sample, so a seed fixes the tokens whatever the batch); out [rows, 2 + 2 shards]
// u32 as (token, x bits, then max and sum bits per vocabulary shard), read back in one copy: x =
// the token's score, (max, sum) each shard's canonical statistics (`shards`: the LM head's
// tensor-parallel ranks, 1 without), from which the host finishes logprob = x - ln(sum over shards)
// in f64 (the trainer's RowStats::merge_shards and logprob); when some score is +inf, shard 0's
// sum is the number of +inf scores and the logprob -ln sum; when none is above -inf, (0, -inf,
// -inf, 0, ...) and the logprob -inf.
//
// Passes over a row: (1) range_chunked_stats per vocabulary shard (logsumexp.cuh), the canonical chunked reduction that
// token_logprob_stats_f32 and the fused loss use, so at T = 1 the logprob equals the trainer's bit
// for bit (`lse_chunk` is the backend's vocabulary chunk); (2, sampling rows) each thread sums the
// weights of one contiguous chunk, a block scan turns the chunk sums into intervals of the CDF, and
// the one thread whose interval holds the target walks its chunk; (2, greedy rows) an argmax.
// The logits row is read two or three times (from L2 for a batch's rows), the [rows, vocab]
// probabilities are never written. Filters (top_k, top_p, min_p) and top-n logprobs need a sort and
// stay on the host sampler.

#include "logsumexp.cuh"

struct SamplingConfig {
    static constexpr int threads = kLseThreads;  // the canonical reduction's block (logsumexp.cuh)
    static constexpr int warps = threads / SWERVE_WARP;
};

struct TemperatureScore {
    float temperature;
    __device__ __forceinline__ float operator()(float z) const {
        if (isnan(z)) return -INFINITY;
        return temperature == 1.0f ? z : z / temperature;
    }
};

// exp(x - max), or the +inf limit: weight 1 for the +inf scores, 0 for the rest.
__device__ __forceinline__ float sample_weight(float x, float max) {
    if (max == INFINITY) return x == INFINITY ? 1.0f : 0.0f;
    return __expf(x - max);
}

// One row's words: token, x, then (max, sum) of each vocabulary shard. `stats` holds the shards'
// statistics; `special` (nothing above -inf, or some +inf score) reports (max, sum) in shard 0's
// place and (-inf, 0) in the others', which the host reads as the limits.
__device__ __forceinline__ void write_sample(uint32_t* o, int token, float x, const ChunkStats* stats, int shards,
                                             bool special, float max, float sum) {
    o[0] = (uint32_t)token;
    o[1] = __float_as_uint(x);
    for (int k = 0; k < shards; ++k) {
        const float m = special ? (k == 0 ? max : -INFINITY) : stats[k].m;
        const float s = special ? (k == 0 ? sum : 0.0f) : stats[k].s;
        o[2 + 2 * k] = __float_as_uint(m);
        o[3 + 2 * k] = __float_as_uint(s);
    }
}

extern "C" __global__ void __launch_bounds__(SamplingConfig::threads)
    sample_rows_f32(uint32_t* __restrict__ out, const float* __restrict__ logits, const float* __restrict__ temperatures,
                    const double* __restrict__ uniforms, int rows, int vocab, int lse_chunk, int shards) {
    __shared__ float scratch[SamplingConfig::warps];
    __shared__ float warp_sum_exp[SamplingConfig::warps];
    __shared__ float warp_offsets[SamplingConfig::warps + 1];
    __shared__ int last_nonzero_thread;
    __shared__ unsigned long long argmax_key;
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* row = logits + (size_t)r * vocab;
    const float temperature = temperatures[r];
    const bool greedy = !(temperature > 0.0f);
    const TemperatureScore score{greedy ? 1.0f : temperature};
    const int lane = threadIdx.x % SWERVE_WARP, warp = threadIdx.x / SWERVE_WARP;

    // (1) Each shard's max and sum of exp, in every thread: exactly token_logprob_stats_f32's and
    // the loss's reduction when T = 1; the row's (for the draw) merges them in order.
    ChunkStats stats[kMaxVocabShards];
    ChunkStats lse{-INFINITY, 0.0f, 0.0f};
    for (int k = 0; k < shards; ++k) {
        const int2 shard = vocab_shard(vocab, shards, k);
        stats[k] = range_chunked_stats(row, shard.x, shard.y, lse_chunk, score, scratch);
        merge_chunk(lse, stats[k], k == 0);
    }
    if (threadIdx.x == 0) {
        last_nonzero_thread = -1;
        argmax_key = 0;
    }
    __syncthreads();
    const float max = lse.m, sum_exp = lse.s;
    uint32_t* const o = out + (2 + 2 * (size_t)shards) * r;
    if (max == -INFINITY) {  // nothing above -inf (or an empty row)
        if (threadIdx.x == 0) write_sample(o, 0, -INFINITY, stats, shards, true, -INFINITY, 0.0f);
        return;
    }

    // (2) Weights of one contiguous chunk per thread, in index order.
    const int chunk = (vocab + blockDim.x - 1) / blockDim.x;
    const int begin = min(vocab, (int)threadIdx.x * chunk), end = min(vocab, begin + chunk);
    float chunk_sum = 0.0f;
    for (int i = begin; i < end; ++i) chunk_sum += sample_weight(score(row[i]), max);
    if (chunk_sum > 0.0f) atomicMax(&last_nonzero_thread, (int)threadIdx.x);

    // Block scan: interval [exclusive, inclusive) of the CDF per thread. Each boundary is computed
    // by one addition shared by both neighbours, so the intervals tile [0, total) exactly.
    float inclusive = chunk_sum;
#pragma unroll
    for (int offset = 1; offset < SWERVE_WARP; offset *= 2) {
        const float up = __shfl_up_sync(0xffffffffu, inclusive, offset);
        if (lane >= offset) inclusive += up;
    }
    float exclusive = __shfl_up_sync(0xffffffffu, inclusive, 1);
    if (lane == SWERVE_WARP - 1) warp_sum_exp[warp] = inclusive;  // reused: warp totals
    __syncthreads();
    if (threadIdx.x == 0) {
        float offset = 0.0f;
        for (int w = 0; w < SamplingConfig::warps; ++w) {
            warp_offsets[w] = offset;
            offset = warp_sum_exp[w] + offset;
        }
        warp_offsets[SamplingConfig::warps] = offset;
    }
    __syncthreads();
    const float total = warp_offsets[SamplingConfig::warps];
    exclusive = lane == 0 ? warp_offsets[warp] : exclusive + warp_offsets[warp];
    inclusive = inclusive + warp_offsets[warp];

    if (greedy) {
        // Argmax with ties to the lowest id: the key orders by value, then by reversed id.
        // Scores are never NaN here; map the float to an order-preserving uint. -0.0 and +0.0 are
        // equal values (the host sampler compares with `>`), so -0.0 is keyed as +0.0: without
        // that, [-0.0, 0.0] would pick token 1 here and token 0 on the host.
        unsigned long long best = 0;
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
            const float x = score(row[i]);
            if (x == -INFINITY) continue;
            const uint32_t raw = __float_as_uint(x);
            const uint32_t bits = raw == 0x80000000u ? 0u : raw;  // bit test: immune to flush-to-zero
            const uint32_t ordered = (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
            const unsigned long long key = ((unsigned long long)ordered << 32) | (uint32_t)(vocab - 1 - i);
            best = key > best ? key : best;
        }
        atomicMax(&argmax_key, best);
        __syncthreads();
        if (threadIdx.x == 0) {
            const int token = vocab - 1 - (int)(uint32_t)(argmax_key & 0xffffffffu);
            write_sample(o, token, row[token], stats, shards, max == INFINITY, max, max == INFINITY ? total : sum_exp);
        }
        return;
    }

    const float target = (float)(uniforms[r] * (double)total);
    const bool holds_target = exclusive <= target && target < inclusive;
    // Rounding can leave target == total: then the last token of nonzero weight (the u -> 1 limit).
    const bool past_end = (int)threadIdx.x == last_nonzero_thread && target >= inclusive;
    if (holds_target || past_end) {
        float cum = exclusive;
        int chosen = begin;
        for (int i = begin; i < end; ++i) {
            const float w = sample_weight(score(row[i]), max);
            if (w > 0.0f) {
                chosen = i;
                cum += w;
                if (cum > target) break;
            }
        }
        // The host finishes x - max - ln sum, as for token_logprob_stats_f32's and the loss's.
        write_sample(o, chosen, score(row[chosen]), stats, shards, max == INFINITY, max,
                     max == INFINITY ? total : sum_exp);
    }
}
