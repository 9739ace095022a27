// RMSNorm, forward and backward.
//
//   rmsnorm_fwd_bf16:      out = x * rsqrt(mean(x^2) + eps) * weight
//   add_rmsnorm_fwd_bf16:  residual += delta (rounded to bf16, as the model's bf16 residual stream
//                          is); out = rmsnorm(residual) * weight
//   rmsnorm_bwd_bf16:      with r = rsqrt(mean(x^2) + eps), g = d_out * weight:
//                          d_x += r g - x r^3 mean(g x)     (bf16, `+=`, rounded once)
//                          partial[block, :] = sum over the block's rows of d_out * x * r   (f32)
//   rmsnorm_dw_reduce_f32: d_weight[i] += sum over blocks b, in order, of partial[b, i]  (f32)
//
// The residual form needs no kernel of its own: the caller passes the residual stream's gradient
// as d_x (the skip path's share is already there) and x = the residual after the add.
//
// Shapes: x, delta, residual, out: [rows, cols] bf16 row-major; weight: [cols] bf16.
// One block per row; the sum of squares is accumulated in fp32 and the output rounded once.
// The fused add never writes the sum and the normalised row as separate passes over memory:
// the row is read once from global memory (the second pass hits L1/L2), written once.
// Vector path: 16-byte loads when cols % 8 == 0 (every Qwen2.5 hidden size); scalar otherwise.
//
// Backward: each block owns a contiguous run of rows (a few waves of blocks in all) and keeps its
// share of d_weight in shared memory (one f32 per column, each column owned by one thread, so no
// atomics); a second kernel sums the blocks' partials column by column in a fixed order. Both are
// deterministic. d_weight is a parameter gradient, so f32. Per row: one pass for the two sums
// (sum x^2 and sum g x, reduced together), a second for d_x, whose reads hit L1/L2.

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

// Sums of two values over the whole block; every thread gets both. `scratch`: 2 floats per warp.
__device__ __forceinline__ float2 block_sum2(float2 v, float* scratch) {
    const int lane = threadIdx.x % SWERVE_WARP;
    const int warp = threadIdx.x / SWERVE_WARP;
    const int warps = blockDim.x / SWERVE_WARP;
    v.x = warp_sum(v.x);
    v.y = warp_sum(v.y);
    __syncthreads();  // scratch may still be read by the previous row's call
    if (lane == 0) {
        scratch[2 * warp] = v.x;
        scratch[2 * warp + 1] = v.y;
    }
    __syncthreads();
    v.x = lane < warps ? scratch[2 * lane] : 0.0f;
    v.y = lane < warps ? scratch[2 * lane + 1] : 0.0f;
    v.x = warp_sum(v.x);
    v.y = warp_sum(v.y);
    return v;
}

template <bool kVec>
__device__ __forceinline__ void rmsnorm_bwd_rows(__nv_bfloat16* __restrict__ d_x, float* __restrict__ partial_dw,
                                                 const __nv_bfloat16* __restrict__ x,
                                                 const __nv_bfloat16* __restrict__ weight,
                                                 const __nv_bfloat16* __restrict__ d_out, int rows, int cols,
                                                 int rows_per_block, float eps) {
    extern __shared__ float dw[];  // [cols]: this block's share of d_weight
    __shared__ float scratch[2 * RmsNormConfig::threads / SWERVE_WARP];
    // Thread ownership of columns: vector v (columns 8v..8v+7) or column i, strided by blockDim.
    const int units = kVec ? cols / 8 : cols;
    for (int u = threadIdx.x; u < units; u += blockDim.x) {
        if (kVec) {
#pragma unroll
            for (int j = 0; j < 8; ++j) dw[8 * u + j] = 0.0f;
        } else {
            dw[u] = 0.0f;
        }
    }
    const int first = blockIdx.x * rows_per_block;
    const int last = min(first + rows_per_block, rows);
    for (int row = first; row < last; ++row) {
        const __nv_bfloat16* x_row = x + (size_t)row * cols;
        const __nv_bfloat16* dy_row = d_out + (size_t)row * cols;
        __nv_bfloat16* dx_row = d_x + (size_t)row * cols;
        float2 sums = make_float2(0.0f, 0.0f);  // (sum x^2, sum g x)
        for (int u = threadIdx.x; u < units; u += blockDim.x) {
            if (kVec) {
                float xv[8], dy[8], w[8];
                bf16x8_to_f32(reinterpret_cast<const bf16x8*>(x_row)[u], xv);
                bf16x8_to_f32(reinterpret_cast<const bf16x8*>(dy_row)[u], dy);
                bf16x8_to_f32(reinterpret_cast<const bf16x8*>(weight)[u], w);
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    sums.x += xv[j] * xv[j];
                    sums.y += dy[j] * w[j] * xv[j];
                }
            } else {
                const float xv = bf16_to_f32(x_row[u]);
                sums.x += xv * xv;
                sums.y += bf16_to_f32(dy_row[u]) * bf16_to_f32(weight[u]) * xv;
            }
        }
        sums = block_sum2(sums, scratch);
        const float r = rsqrtf(sums.x / cols + eps);
        const float c = r * r * r * (sums.y / cols);
        for (int u = threadIdx.x; u < units; u += blockDim.x) {
            if (kVec) {
                float xv[8], dy[8], w[8], dx[8];
                bf16x8_to_f32(reinterpret_cast<const bf16x8*>(x_row)[u], xv);
                bf16x8_to_f32(reinterpret_cast<const bf16x8*>(dy_row)[u], dy);
                bf16x8_to_f32(reinterpret_cast<const bf16x8*>(weight)[u], w);
                bf16x8_to_f32(reinterpret_cast<const bf16x8*>(dx_row)[u], dx);
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    dx[j] += r * dy[j] * w[j] - xv[j] * c;
                    dw[8 * u + j] += dy[j] * xv[j] * r;
                }
                reinterpret_cast<bf16x8*>(dx_row)[u] = f32_to_bf16x8(dx);
            } else {
                const float xv = bf16_to_f32(x_row[u]);
                const float dy = bf16_to_f32(dy_row[u]);
                dx_row[u] = f32_to_bf16(bf16_to_f32(dx_row[u]) + r * dy * bf16_to_f32(weight[u]) - xv * c);
                dw[u] += dy * xv * r;
            }
        }
    }
    float* out = partial_dw + (size_t)blockIdx.x * cols;
    for (int u = threadIdx.x; u < units; u += blockDim.x) {
        if (kVec) {
#pragma unroll
            for (int j = 0; j < 8; ++j) out[8 * u + j] = dw[8 * u + j];
        } else {
            out[u] = dw[u];
        }
    }
}

// Dynamic shared memory: cols * 4 bytes.
extern "C" __global__ void __launch_bounds__(RmsNormConfig::threads)
rmsnorm_bwd_bf16(__nv_bfloat16* __restrict__ d_x, float* __restrict__ partial_dw, const __nv_bfloat16* __restrict__ x,
                 const __nv_bfloat16* __restrict__ weight, const __nv_bfloat16* __restrict__ d_out, int rows, int cols,
                 int rows_per_block, float eps) {
    if (cols % 8 == 0) {
        rmsnorm_bwd_rows<true>(d_x, partial_dw, x, weight, d_out, rows, cols, rows_per_block, eps);
    } else {
        rmsnorm_bwd_rows<false>(d_x, partial_dw, x, weight, d_out, rows, cols, rows_per_block, eps);
    }
}

extern "C" __global__ void __launch_bounds__(RmsNormConfig::threads)
rmsnorm_dw_reduce_f32(float* __restrict__ d_weight, const float* __restrict__ partial_dw, int blocks, int cols) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= cols) return;
    float sum = 0.0f;
    for (int b = 0; b < blocks; ++b) sum += partial_dw[(size_t)b * cols + i];
    d_weight[i] += sum;
}
