// Tensor-core and async-copy PTX wrappers shared by the attention kernels (flash_attn.cu,
// paged_attn.cu): cp.async 16- and 4-byte copies with zero fill, ldmatrix (plain and transposed),
// the bf16 m16n8k16 MMA with fp32 accumulation, bf16x2 packing, fp32x2 atomic adds. sm_80 and newer.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#ifdef SWERVE_EMU
// Emulated build (emu/include/emu_cuda.h, emu/runtime.cpp): the wrappers also take their caller's
// file and line (default arguments) so that the emulator's diagnostics name the kernel's call site.
#define SWERVE_EMU_CALLER , const char *emu_file = __builtin_FILE(), int emu_line = __builtin_LINE()
#define SWERVE_EMU_CALLER_FIRST const char *emu_file = __builtin_FILE(), int emu_line = __builtin_LINE()
#else
#define SWERVE_EMU_CALLER
#define SWERVE_EMU_CALLER_FIRST
#endif

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid SWERVE_EMU_CALLER) {
#ifdef SWERVE_EMU
    emu::cp_async(smem, gmem, 16, valid ? 16 : 0, emu_file, emu_line);
#else
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
    const int src_bytes = valid ? 16 : 0;  // 0: write 16 zero bytes, read nothing
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
#endif
}
// 4-byte variant (through L1: .ca is the only cache mode for sizes below 16); 0 bytes read if !valid.
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, bool valid SWERVE_EMU_CALLER) {
#ifdef SWERVE_EMU
    emu::cp_async(smem, gmem, 4, valid ? 4 : 0, emu_file, emu_line);
#else
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
    const int src_bytes = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
#endif
}
#ifdef SWERVE_EMU
__device__ __forceinline__ void cp_async_commit() { emu::cp_async_commit(); }
#else
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
#endif
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#ifdef SWERVE_EMU
    emu::cp_async_wait(kPending);
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
#endif
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* smem SWERVE_EMU_CALLER) {
#ifdef SWERVE_EMU
    emu::ldmatrix(r, 4, smem, false, emu_file, emu_line);
#else
    const unsigned addr = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* smem SWERVE_EMU_CALLER) {
#ifdef SWERVE_EMU
    emu::ldmatrix(r, 4, smem, true, emu_file, emu_line);
#else
    const unsigned addr = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
#endif
}

// d += a b: a 16x16 bf16 (row), b 16x8 bf16 (col), d 16x8 fp32.
__device__ __forceinline__ void mma_bf16_16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1 SWERVE_EMU_CALLER) {
#ifdef SWERVE_EMU
    emu::mma_bf16_m16n8k16(d, a, b0, b1, emu_file, emu_line);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// The A fragment (m16n8k16, bf16) of k-step kk of a product whose left operand is an fp32
// accumulator array of m16n8 tiles (acc[n][0..3]: C fragments of columns 8n .. 8n + 7): tiles
// 2 kk and 2 kk + 1, each value rounded to bf16 once. An accumulator's layout is the A layout
// of the next MMA (P of O += P V, dS of dK += dS^T Q), so no value moves between lanes.
template <int kTiles>
__device__ __forceinline__ void acc_to_a_fragment(uint32_t (&a)[4], const float (&acc)[kTiles][4], int kk) {
    a[0] = pack_bf16x2(acc[2 * kk][0], acc[2 * kk][1]);
    a[1] = pack_bf16x2(acc[2 * kk][2], acc[2 * kk][3]);
    a[2] = pack_bf16x2(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
    a[3] = pack_bf16x2(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
}

// The attention tile routine and its online softmax: attn_tile.cuh.

// addr[0] += a, addr[1] += b (fp32, relaxed, device scope): one vector reduction on sm_90 (8-byte
// aligned address), two scalar ones before.
__device__ __forceinline__ void red_add_f32x2(float* addr, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(addr), "f"(a), "f"(b) : "memory");
#else
    atomicAdd(addr, a);
    atomicAdd(addr + 1, b);
#endif
}
