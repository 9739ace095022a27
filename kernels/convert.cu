// Precision conversions between the fp32 and bf16 copies of a tensor, and the element-wise
// helpers of training: accumulation (`+=`) and the sum of squares behind the gradient norm.
//
//   convert_f32_to_bf16:  out[i] = round_to_nearest_even(in[i])   (uploads of f32 checkpoints; later
//                         the bf16 compute weights refreshed from the fp32 masters)
//   convert_bf16_to_f32:  out[i] = in[i]                           (exact)
//   add_into_bf16:        dst[i] = round(dst[i] + src[i])           (bf16 += bf16: residual adds,
//                                                                     activation gradients)
//   add_into_f32:         dst[i] += src[i]                          (f32 += f32: gradients)
//   add_f32_into_bf16:    dst[i] = round(dst[i] + src[i])           (bf16 += an f32 accumulator)
//   sum_squares_{f32,bf16}: partials[block] = sum of x[i]^2 over the block's grid-stride share, in
//                         f64; the host adds the (at most a few thousand) partials in order, so
//                         the result is deterministic for a given grid size
//
// Shapes: [n] flat. Memory-bound grid-stride loops, 8 elements per thread per step (32-byte f32
// reads, 16-byte bf16 writes) when n % 8 == 0, element by element otherwise.

#include "common.cuh"

struct ConvertConfig {
    static constexpr int threads = 256;
};

extern "C" __global__ void __launch_bounds__(ConvertConfig::threads)
    convert_f32_to_bf16(__nv_bfloat16* __restrict__ out, const float* __restrict__ in, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long vectors = n % 8 == 0 ? n / 8 : 0;
    for (long long i = first; i < vectors; i += stride) {
        const float4 a = reinterpret_cast<const float4*>(in)[2 * i];
        const float4 b = reinterpret_cast<const float4*>(in)[2 * i + 1];
        const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        reinterpret_cast<bf16x8*>(out)[i] = f32_to_bf16x8(v);
    }
    for (long long i = vectors * 8 + first; i < n; i += stride) out[i] = f32_to_bf16(in[i]);
}

extern "C" __global__ void __launch_bounds__(ConvertConfig::threads)
    convert_bf16_to_f32(float* __restrict__ out, const __nv_bfloat16* __restrict__ in, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long vectors = n % 8 == 0 ? n / 8 : 0;
    for (long long i = first; i < vectors; i += stride) {
        float v[8];
        bf16x8_to_f32(reinterpret_cast<const bf16x8*>(in)[i], v);
        reinterpret_cast<float4*>(out)[2 * i] = make_float4(v[0], v[1], v[2], v[3]);
        reinterpret_cast<float4*>(out)[2 * i + 1] = make_float4(v[4], v[5], v[6], v[7]);
    }
    for (long long i = vectors * 8 + first; i < n; i += stride) out[i] = bf16_to_f32(in[i]);
}

extern "C" __global__ void __launch_bounds__(ConvertConfig::threads)
    add_into_bf16(__nv_bfloat16* __restrict__ dst, const __nv_bfloat16* __restrict__ src, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long vectors = n % 8 == 0 ? n / 8 : 0;
    for (long long i = first; i < vectors; i += stride) {
        float a[8], b[8];
        bf16x8_to_f32(reinterpret_cast<const bf16x8*>(dst)[i], a);
        bf16x8_to_f32(reinterpret_cast<const bf16x8*>(src)[i], b);
#pragma unroll
        for (int j = 0; j < 8; ++j) a[j] += b[j];
        reinterpret_cast<bf16x8*>(dst)[i] = f32_to_bf16x8(a);
    }
    for (long long i = vectors * 8 + first; i < n; i += stride) dst[i] = f32_to_bf16(bf16_to_f32(dst[i]) + bf16_to_f32(src[i]));
}

extern "C" __global__ void __launch_bounds__(ConvertConfig::threads)
    add_into_f32(float* __restrict__ dst, const float* __restrict__ src, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] += src[i];
}

extern "C" __global__ void __launch_bounds__(ConvertConfig::threads)
    add_f32_into_bf16(__nv_bfloat16* __restrict__ dst, const float* __restrict__ src, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        dst[i] = f32_to_bf16(bf16_to_f32(dst[i]) + src[i]);
    }
}

template <typename T>
__device__ __forceinline__ float load_as_f32(const T* p, long long i);
template <>
__device__ __forceinline__ float load_as_f32<float>(const float* p, long long i) { return p[i]; }
template <>
__device__ __forceinline__ float load_as_f32<__nv_bfloat16>(const __nv_bfloat16* p, long long i) {
    return bf16_to_f32(p[i]);
}

template <typename T>
__device__ __forceinline__ void sum_squares(double* __restrict__ partials, const T* __restrict__ x, long long n) {
    __shared__ double scratch[ConvertConfig::threads / SWERVE_WARP];
    const long long stride = (long long)gridDim.x * blockDim.x;
    double sum = 0.0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const double v = load_as_f32(x, i);
        sum += v * v;
    }
#pragma unroll
    for (int offset = SWERVE_WARP / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    const int lane = threadIdx.x % SWERVE_WARP, warp = threadIdx.x / SWERVE_WARP;
    if (lane == 0) scratch[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0.0;
        for (int w = 0; w < (int)(blockDim.x / SWERVE_WARP); ++w) total += scratch[w];
        partials[blockIdx.x] = total;
    }
}

extern "C" __global__ void __launch_bounds__(ConvertConfig::threads)
    sum_squares_f32(double* __restrict__ partials, const float* __restrict__ x, long long n) {
    sum_squares(partials, x, n);
}

extern "C" __global__ void __launch_bounds__(ConvertConfig::threads)
    sum_squares_bf16(double* __restrict__ partials, const __nv_bfloat16* __restrict__ x, long long n) {
    sum_squares(partials, x, n);
}
