// RMSNorm, forward (backward arrives with the training issue, in this file).
//
//   rmsnorm_fwd_bf16:      out = x * rsqrt(mean(x^2) + eps) * weight
//   add_rmsnorm_fwd_bf16:  residual += delta (rounded to bf16, as the model's bf16 residual stream
//                          is); out = rmsnorm(residual) * weight
//
// Shapes: x, delta, residual, out: [rows, cols] bf16 row-major; weight: [cols] bf16.
// One block per row; the sum of squares is accumulated in fp32 and the output rounded once.
// The fused add never writes the sum and the normalised row as separate passes over memory:
// the row is read once from global memory (the second pass hits L1/L2), written once.
// Vector path: 16-byte loads when cols % 8 == 0 (every Qwen2.5 hidden size); scalar otherwise.

#include "common.cuh"

struct RmsNormConfig {
    static constexpr int threads = 256;  // 8 warps; hidden sizes 896..8192 need 1..4 vectors per thread
};

template <bool kAdd>
__device__ __forceinline__ void rmsnorm_row(__nv_bfloat16* __restrict__ out, __nv_bfloat16* __restrict__ residual,
                                            const __nv_bfloat16* __restrict__ x_or_delta,
                                            const __nv_bfloat16* __restrict__ weight, int cols, float eps) {
    __shared__ float scratch[RmsNormConfig::threads / SWERVE_WARP];
    const size_t row = blockIdx.x;
    const __nv_bfloat16* x_row = x_or_delta + row * cols;
    __nv_bfloat16* residual_row = kAdd ? residual + row * cols : nullptr;
    __nv_bfloat16* out_row = out + row * cols;

    float sum_sq = 0.0f;
    if (cols % 8 == 0) {
        const int vectors = cols / 8;
        for (int i = threadIdx.x; i < vectors; i += blockDim.x) {
            float v[8];
            bf16x8_to_f32(reinterpret_cast<const bf16x8*>(x_row)[i], v);
            if (kAdd) {
                float r[8];
                bf16x8_to_f32(reinterpret_cast<const bf16x8*>(residual_row)[i], r);
#pragma unroll
                for (int j = 0; j < 8; ++j) v[j] = bf16_to_f32(f32_to_bf16(r[j] + v[j]));
                reinterpret_cast<bf16x8*>(residual_row)[i] = f32_to_bf16x8(v);
            }
#pragma unroll
            for (int j = 0; j < 8; ++j) sum_sq += v[j] * v[j];
        }
    } else {
        for (int i = threadIdx.x; i < cols; i += blockDim.x) {
            float v = bf16_to_f32(x_row[i]);
            if (kAdd) {
                v = bf16_to_f32(f32_to_bf16(bf16_to_f32(residual_row[i]) + v));
                residual_row[i] = f32_to_bf16(v);
            }
            sum_sq += v * v;
        }
    }
    const float inv_rms = rsqrtf(block_sum(sum_sq, scratch) / cols + eps);

    // Second pass: each thread re-reads exactly the elements it wrote or read above.
    const __nv_bfloat16* src = kAdd ? residual_row : x_row;
    if (cols % 8 == 0) {
        const int vectors = cols / 8;
        for (int i = threadIdx.x; i < vectors; i += blockDim.x) {
            float v[8], w[8];
            bf16x8_to_f32(reinterpret_cast<const bf16x8*>(src)[i], v);
            bf16x8_to_f32(reinterpret_cast<const bf16x8*>(weight)[i], w);
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] = v[j] * inv_rms * w[j];
            reinterpret_cast<bf16x8*>(out_row)[i] = f32_to_bf16x8(v);
        }
    } else {
        for (int i = threadIdx.x; i < cols; i += blockDim.x) {
            out_row[i] = f32_to_bf16(bf16_to_f32(src[i]) * inv_rms * bf16_to_f32(weight[i]));
        }
    }
}

extern "C" __global__ void __launch_bounds__(RmsNormConfig::threads)
rmsnorm_fwd_bf16(__nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ x,
                 const __nv_bfloat16* __restrict__ weight, int rows, int cols, float eps) {
    if (blockIdx.x >= rows) return;
    rmsnorm_row<false>(out, nullptr, x, weight, cols, eps);
}

extern "C" __global__ void __launch_bounds__(RmsNormConfig::threads)
add_rmsnorm_fwd_bf16(__nv_bfloat16* __restrict__ out, __nv_bfloat16* __restrict__ residual,
                     const __nv_bfloat16* __restrict__ delta, const __nv_bfloat16* __restrict__ weight, int rows,
                     int cols, float eps) {
    if (blockIdx.x >= rows) return;
    rmsnorm_row<true>(out, residual, delta, weight, cols, eps);
}
