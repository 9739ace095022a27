// Shared device helpers for every swerve kernel family: bf16 <-> f32 conversion, vector loads,
// warp and block reductions. Header-only; every kernels/*.cu includes it.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#define SWERVE_WARP 32

// 8 bf16 values moved as one 16-byte transaction.
struct __align__(16) bf16x8 {
    __nv_bfloat162 v[4];
};

__device__ __forceinline__ float bf16_to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ __nv_bfloat16 f32_to_bf16(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ void bf16x8_to_f32(const bf16x8& in, float out[8]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float2 f = __bfloat1622float2(in.v[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
}

__device__ __forceinline__ bf16x8 f32_to_bf16x8(const float in[8]) {
    bf16x8 out;
#pragma unroll
    for (int i = 0; i < 4; ++i) out.v[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
    return out;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int offset = SWERVE_WARP / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

// Sum over the whole block; every thread gets the result. `scratch` holds one float per warp.
// blockDim.x must be a multiple of 32 and at most 1024.
__device__ __forceinline__ float block_sum(float x, float* scratch) {
    const int lane = threadIdx.x % SWERVE_WARP;
    const int warp = threadIdx.x / SWERVE_WARP;
    const int warps = blockDim.x / SWERVE_WARP;
    x = warp_sum(x);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    x = lane < warps ? scratch[lane] : 0.0f;
    return warp_sum(x);
}
