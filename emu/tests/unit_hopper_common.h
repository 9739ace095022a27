// What the sm_90a unit tests share (emu/tests/unit_hopper.cpp, unit_hopper_diagnostics.cpp):
// encoding tensor maps through the runtime's cuTensorMapEncodeTiled, random bf16 data, the swizzle
// written out from its bit definition, and the reference of one k16 step as mma.sync sums it.
#pragma once

#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "registry.h"
#include "runtime_internal.h"
// (the runtime's internals and the driver's kernel binding first: their standard headers must not
// see emu_cuda.h's __noinline__)
#include "hopper.cuh"
#include "unit_check.h"

// CUtensorMapDataType / CUtensorMapSwizzle values (cuda.h).
enum { kBF16 = 9, kF32 = 7, kU8 = 0 };
enum { kMapSwNone = 0, kMapSw32 = 1, kMapSw64 = 2, kMapSw128 = 3 };

// A 3D tensor map (dims and box innermost first; strides in bytes for dims 1 and 2).
inline TmaMap encode3(const void* base, int dtype, uint64_t d0, uint64_t d1, uint64_t d2, uint64_t s1, uint64_t s2,
                      uint32_t b0, uint32_t b1, uint32_t b2, int swizzle, int* result = nullptr,
                      std::string* why_out = nullptr) {
    TmaMap map;
    const uint64_t dims[3] = {d0, d1, d2}, strides[2] = {s1, s2};
    const uint32_t box[3] = {b0, b1, b2}, es[3] = {1, 1, 1};
    std::string why;
    // Encoded on the heap (aligned_alloc): a 64-byte aligned stack slot was not always honoured here.
    void* obj = aligned_alloc(64, sizeof(TmaMap));
    const int r = emu::rt::tensor_map_encode_tiled(obj, dtype, 3, (void*)base, dims, strides, box, es, 0, swizzle,
                                                   0, 0, why);
    memcpy(&map, obj, sizeof map);
    free(obj);
    if (result) *result = r;
    if (why_out) *why_out = why;
    if (!result) CHECK(r == 0, "encoding a tensor map: %s", why.c_str());
    return map;
}

// The swizzle from the brief's bit definitions: 128B bits [4,7) ^= [7,10); 64B [4,6) ^= [7,9);
// 32B bit 4 ^= bit 7.
inline uint32_t swz_bits(uint32_t off, int span) {
    if (span == 128) return off ^ (((off >> 7) & 7) << 4);
    if (span == 64) return off ^ (((off >> 7) & 3) << 4);
    if (span == 32) return off ^ (((off >> 7) & 1) << 4);
    return off;
}

inline std::vector<uint16_t> random_bf16(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    std::vector<uint16_t> v(n);
    for (auto& x : v) x = f2bf(u(rng));
    return v;
}

// The first 1024-aligned byte of the dynamic shared memory (in shared-window addresses).
inline unsigned char* smem_aligned(uint32_t align = 1024) {
    unsigned char* s = emu::dynamic_smem();
    const uint32_t a = smem_addr(s);
    return s + ((align - a % align) % align);
}
