// Fused AdamW over the f32 master weights and moments (RL-SPEC "Optimizer and schedule"), in
// torch.optim.AdamW's order, one pass over memory: per element
//
//   g = grad * grad_scale                       (grad_scale: the global-norm clipping factor)
//   p = master * decay                          (decay = 1 - lr * weight_decay; 1 off 2-D weights)
//   m = m + (1 - beta1) (g - m)
//   v = beta2 v + (1 - beta2) g g
//   master = p - step_size * (m / (sqrt(v) / bias_correction2_sqrt + eps))
//
// Shapes: master, grad, exp_avg, exp_avg_sq: [n] f32 (any parameter viewed flat). The per-step
// scalars (step_size = lr / (1 - beta1^t), bias_correction2_sqrt, decay, 1 - beta1, 1 - beta2) come
// from the host, computed by the same Rust code as the CPU reference (`AdamWStep::scalars`).
//
// Bitwise equal to the CPU reference: every operation is an explicit round-to-nearest intrinsic
// (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn), so neither --use_fast_math's approximate division
// and square root nor FMA contraction applies, and the order of operations is Rust's. build.rs
// compiles this family with --ftz=false, so denormals (tiny gradients, long-decayed second
// moments) are kept as the CPU keeps them.
// Memory-bound: 16 bytes read from each of four arrays and written to three per float4.

#include "common.cuh"

struct AdamWConfig {
    static constexpr int threads = 256;
};

struct AdamWScalars {
    float grad_scale, decay, one_minus_beta1, beta2, one_minus_beta2, bias_correction2_sqrt, eps, step_size;
};

__device__ __forceinline__ void adamw_element(float& p, float grad, float& m, float& v, const AdamWScalars& s) {
    const float g = __fmul_rn(grad, s.grad_scale);
    const float decayed = __fmul_rn(p, s.decay);
    const float m_new = __fadd_rn(m, __fmul_rn(s.one_minus_beta1, __fsub_rn(g, m)));
    const float v_new = __fadd_rn(__fmul_rn(s.beta2, v), __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v_new), s.bias_correction2_sqrt), s.eps);
    p = __fsub_rn(decayed, __fmul_rn(s.step_size, __fdiv_rn(m_new, denom)));
    m = m_new;
    v = v_new;
}

extern "C" __global__ void __launch_bounds__(AdamWConfig::threads)
    adamw_f32(float* __restrict__ master, const float* __restrict__ grad, float* __restrict__ exp_avg,
              float* __restrict__ exp_avg_sq, long long n, AdamWScalars s) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long vectors = n % 4 == 0 ? n / 4 : 0;
    for (long long i = first; i < vectors; i += stride) {
        float4 p = reinterpret_cast<const float4*>(master)[i];
        const float4 g = reinterpret_cast<const float4*>(grad)[i];
        float4 m = reinterpret_cast<const float4*>(exp_avg)[i];
        float4 v = reinterpret_cast<const float4*>(exp_avg_sq)[i];
        adamw_element(p.x, g.x, m.x, v.x, s);
        adamw_element(p.y, g.y, m.y, v.y, s);
        adamw_element(p.z, g.z, m.z, v.z, s);
        adamw_element(p.w, g.w, m.w, v.w, s);
        reinterpret_cast<float4*>(master)[i] = p;
        reinterpret_cast<float4*>(exp_avg)[i] = m;
        reinterpret_cast<float4*>(exp_avg_sq)[i] = v;
    }
    for (long long i = vectors * 4 + first; i < n; i += stride) {
        adamw_element(master[i], grad[i], exp_avg[i], exp_avg_sq[i], s);
    }
}
