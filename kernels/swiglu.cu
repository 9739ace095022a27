// SwiGLU, forward (the backward arrives with the training issue, in this file).
//
//   swiglu_fwd_bf16:  out = silu(gate) * up = gate / (1 + exp(-gate)) * up
//
// Shapes: gate, up, out: [n] bf16 (any [tokens, intermediate] viewed flat). Computed in fp32 and
// rounded once (transformers rounds silu(gate) to bf16 first; ours is the more exact of the two).
// Memory-bound: 16-byte vectors, a grid-stride loop, and a scalar tail for n % 8 != 0.

#include "common.cuh"

struct SwigluConfig {
    static constexpr int threads = 256;
};

__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + __expf(-g)) * u; }

extern "C" __global__ void __launch_bounds__(SwigluConfig::threads)
    swiglu_fwd_bf16(__nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ gate,
                    const __nv_bfloat16* __restrict__ up, long long n) {
    const long long vectors = n / 8;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < vectors; i += stride) {
        float g[8], u[8];
        bf16x8_to_f32(reinterpret_cast<const bf16x8*>(gate)[i], g);
        bf16x8_to_f32(reinterpret_cast<const bf16x8*>(up)[i], u);
#pragma unroll
        for (int j = 0; j < 8; ++j) g[j] = silu_times(g[j], u[j]);
        reinterpret_cast<bf16x8*>(out)[i] = f32_to_bf16x8(g);
    }
    for (long long i = vectors * 8 + (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = f32_to_bf16(silu_times(bf16_to_f32(gate[i]), bf16_to_f32(up[i])));
    }
}
