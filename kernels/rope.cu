// Rotary position embedding (plain and YaRN), forward and backward, applied to q and k in place.
//
//   rope_fwd_bf16:  for every token t, head h (query heads, then kv heads) and pair i < half:
//       angle = positions[t] * inv_freq[i]
//       (x[i], x[i + half]) <- (x[i] cos - x[i + half] sin, x[i + half] cos + x[i] sin) * scaling
//
//   rope_bwd_bf16:  the transpose of the forward, in place on the gradients d_q, d_k:
//       (d[i], d[i + half]) <- (d[i] cos + d[i + half] sin, d[i + half] cos - d[i] sin) * scaling
//       i.e. the rotation by -angle, with the same scaling (the forward's map is scaling * R(angle),
//       its transpose scaling * R(-angle)).
//
// HF's rotate-half pairing. `inv_freq` carries plain or YaRN frequencies (config.rs computes them)
// and `attention_scaling` is YaRN's mscale (1 without YaRN). Shapes: q [tokens, heads, head_dim],
// k [tokens, kv_heads, head_dim] bf16; positions [tokens] u32; inv_freq [head_dim / 2] f64.
//
// The angle and its sine and cosine are computed in double precision: at position 131,071 an fp32
// angle is already off by ~0.01 rad, which the fp64 CPU reference would see. That is head_dim / 2
// fp64 sincos per token, shared by all heads: noise next to the bytes moved. One block per token;
// thread (x, y) owns the pairs 2x and 2x + 1 of heads y, y + blockDim.y, ... so q and k are read
// and written once, as bf16x2.

#include "common.cuh"

struct RopeConfig {
    static constexpr int threads = 256;  // blockDim = (head_dim / 4, threads / (head_dim / 4))
};

template <bool kInverse>
__device__ __forceinline__ void rope_rotate(__nv_bfloat16* __restrict__ q, __nv_bfloat16* __restrict__ k,
                                            const uint32_t* __restrict__ positions, const double* __restrict__ inv_freq,
                                            int tokens, int heads, int kv_heads, int head_dim,
                                            float attention_scaling) {
    const int t = blockIdx.x;
    if (t >= tokens) return;
    const int half = head_dim / 2;
    const int i = 2 * threadIdx.x;  // first of this thread's two pairs
    if (i >= half) return;
    const double position = (double)positions[t];
    float cos_v[2], sin_v[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        double s, c;
        sincos(position * inv_freq[i + j], &s, &c);
        cos_v[j] = (float)c * attention_scaling;
        sin_v[j] = (kInverse ? -(float)s : (float)s) * attention_scaling;
    }
    for (int h = threadIdx.y; h < heads + kv_heads; h += blockDim.y) {
        __nv_bfloat16* x = h < heads ? q + ((size_t)t * heads + h) * head_dim
                                     : k + ((size_t)t * kv_heads + (h - heads)) * head_dim;
        const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(x + i));
        const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(x + half + i));
        *reinterpret_cast<__nv_bfloat162*>(x + i) =
            __floats2bfloat162_rn(lo.x * cos_v[0] - hi.x * sin_v[0], lo.y * cos_v[1] - hi.y * sin_v[1]);
        *reinterpret_cast<__nv_bfloat162*>(x + half + i) =
            __floats2bfloat162_rn(hi.x * cos_v[0] + lo.x * sin_v[0], hi.y * cos_v[1] + lo.y * sin_v[1]);
    }
}

extern "C" __global__ void __launch_bounds__(RopeConfig::threads)
    rope_fwd_bf16(__nv_bfloat16* __restrict__ q, __nv_bfloat16* __restrict__ k, const uint32_t* __restrict__ positions,
                  const double* __restrict__ inv_freq, int tokens, int heads, int kv_heads, int head_dim,
                  float attention_scaling) {
    rope_rotate<false>(q, k, positions, inv_freq, tokens, heads, kv_heads, head_dim, attention_scaling);
}

// Same launch shape and arguments as the forward; q and k are the gradients d_q and d_k.
extern "C" __global__ void __launch_bounds__(RopeConfig::threads)
    rope_bwd_bf16(__nv_bfloat16* __restrict__ d_q, __nv_bfloat16* __restrict__ d_k,
                  const uint32_t* __restrict__ positions, const double* __restrict__ inv_freq, int tokens, int heads,
                  int kv_heads, int head_dim, float attention_scaling) {
    rope_rotate<true>(d_q, d_k, positions, inv_freq, tokens, heads, kv_heads, head_dim, attention_scaling);
}
