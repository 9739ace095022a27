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
#else
#define SWERVE_EMU_CALLER
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

// One online-softmax update for a warp's 16 rows (FlashAttention 2's), on mma.sync fragments:
// each thread holds rows group_row and group_row + 8 (r = 0, 1) of the scores `s_acc` (raw
// q.k, -inf where masked) and of the output accumulator `o_acc`. The row max is taken over the
// 4 threads sharing a row; O and this thread's part of the row sum are rescaled by
// exp(old max - new max); the scores become exp(scale * s - scale * max) in place (the P of the
// next MMA). A row with no visible key yet keeps max -inf and contributes zeros.
template <int kNTiles, int kDTiles>
__device__ __forceinline__ void online_softmax_tile(float (&s_acc)[kNTiles][4], float (&o_acc)[kDTiles][4],
                                                    float (&row_max)[2], float (&row_sum)[2], float scale_log2) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) tile_max = fmaxf(tile_max, fmaxf(s_acc[nt][2 * r], s_acc[nt][2 * r + 1]));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float new_max = fmaxf(row_max[r], tile_max);
        const float max_scaled = new_max == -INFINITY ? 0.0f : new_max * scale_log2;
        const float correction = exp2f(row_max[r] * scale_log2 - max_scaled);
        row_max[r] = new_max;
        row_sum[r] *= correction;
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
            o_acc[dt][2 * r] *= correction;
            o_acc[dt][2 * r + 1] *= correction;
        }
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
            const float p0 = exp2f(s_acc[nt][2 * r] * scale_log2 - max_scaled);
            const float p1 = exp2f(s_acc[nt][2 * r + 1] * scale_log2 - max_scaled);
            s_acc[nt][2 * r] = p0;
            s_acc[nt][2 * r + 1] = p1;
            row_sum[r] += p0 + p1;
        }
    }
}

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
