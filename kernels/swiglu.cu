// SwiGLU, forward and backward.
//
//   swiglu_fwd_bf16:  out = silu(gate) * up = gate / (1 + exp(-gate)) * up
//   swiglu_bwd_bf16:  with s = sigmoid(gate):  d_gate += d_out * up * s (1 + gate (1 - s))
//                                              d_up   += d_out * gate * s
//                     (gradients accumulate, each rounded to bf16 once)
//
// Shapes: gate, up, out, d_out, d_gate, d_up: [n] bf16 (any [tokens, intermediate] viewed flat). Computed in fp32 and
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

__device__ __forceinline__ void swiglu_grad(float g, float u, float dy, float& d_gate, float& d_up) {
    const float s = 1.0f / (1.0f + __expf(-g));
    d_gate += dy * u * (s * (1.0f + g * (1.0f - s)));
    d_up += dy * g * s;
}

extern "C" __global__ void __launch_bounds__(SwigluConfig::threads)
    swiglu_bwd_bf16(__nv_bfloat16* __restrict__ d_gate, __nv_bfloat16* __restrict__ d_up,
                    const __nv_bfloat16* __restrict__ gate, const __nv_bfloat16* __restrict__ up,
                    const __nv_bfloat16* __restrict__ d_out, long long n) {
    const long long vectors = n / 8;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < vectors; i += stride) {
        float g[8], u[8], dy[8], dg[8], du[8];
        bf16x8_to_f32(reinterpret_cast<const bf16x8*>(gate)[i], g);
        bf16x8_to_f32(reinterpret_cast<const bf16x8*>(up)[i], u);
        bf16x8_to_f32(reinterpret_cast<const bf16x8*>(d_out)[i], dy);
        bf16x8_to_f32(reinterpret_cast<const bf16x8*>(d_gate)[i], dg);
        bf16x8_to_f32(reinterpret_cast<const bf16x8*>(d_up)[i], du);
#pragma unroll
        for (int j = 0; j < 8; ++j) swiglu_grad(g[j], u[j], dy[j], dg[j], du[j]);
        reinterpret_cast<bf16x8*>(d_gate)[i] = f32_to_bf16x8(dg);
        reinterpret_cast<bf16x8*>(d_up)[i] = f32_to_bf16x8(du);
    }
    for (long long i = vectors * 8 + (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float dg = bf16_to_f32(d_gate[i]), du = bf16_to_f32(d_up[i]);
        swiglu_grad(bf16_to_f32(gate[i]), bf16_to_f32(up[i]), bf16_to_f32(d_out[i]), dg, du);
        d_gate[i] = f32_to_bf16(dg);
        d_up[i] = f32_to_bf16(du);
    }
}
