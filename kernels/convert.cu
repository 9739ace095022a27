// Precision conversions between the fp32 and bf16 copies of a tensor.
//
//   convert_f32_to_bf16:  out[i] = round_to_nearest_even(in[i])   (uploads of f32 checkpoints; later
//                         the bf16 compute weights refreshed from the fp32 masters)
//   convert_bf16_to_f32:  out[i] = in[i]                           (exact)
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
