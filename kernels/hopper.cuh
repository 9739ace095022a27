// Hopper (sm_90a) primitives for the warp-specialised kernels (flash_attn_sm90.cu): mbarrier,
// TMA tensor loads, wgmma with shared-memory descriptors, setmaxnreg, named barriers and the
// async-proxy fence. Each wrapper is the PTX instruction on a GPU and the emulated device's
// model of it under SWERVE_EMU (emu/include/emu_cuda.h declares those, emu/runtime_hopper.cpp
// implements them with the diagnostics that catch misuse).
//
// References ([PTX] = PTX ISA 9.0, section titles):
//   mbarrier      [PTX] "Parallel Synchronization and Communication Instructions: mbarrier"
//   TMA           [PTX] "cp.async.bulk.tensor", "Tensor Map"; the driver's cuTensorMapEncodeTiled
//   wgmma         [PTX] "Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions",
//                 "Matrix Descriptor Format", "Shared Memory Matrix Layout" (swizzle modes)
//   setmaxnreg    [PTX] "setmaxnreg"
//
// Only sm_90a machine code may contain these instructions: build.rs also emits compute_80 PTX,
// whose pass must not see them (the module would not load on an sm_80 GPU). Kernels built on
// them compile their bodies under SWERVE_HOPPER and are launched only on compute capability 9.x.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "mma.cuh"

// A tensor map (CUtensorMap: 128 opaque bytes, 64-byte aligned), encoded on the host by the
// driver's cuTensorMapEncodeTiled and passed to the kernel as a __grid_constant__ parameter.
struct __align__(64) TmaMap {
    uint64_t opaque[16];
};

#if defined(SWERVE_EMU) || (defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL))
#define SWERVE_HOPPER 1
#endif

#ifdef SWERVE_HOPPER

// ---- shared-memory addresses ---------------------------------------------------------------------
// The 32-bit shared-window address of a pointer into the block's shared memory (what mbarrier,
// TMA and wgmma descriptors name).
__device__ __forceinline__ uint32_t smem_addr(const void* p SWERVE_EMU_CALLER) {
#ifdef SWERVE_EMU
    return emu::shared_address(p, emu_file, emu_line);
#else
    return (uint32_t)__cvta_generic_to_shared(p);
#endif
}

// ---- mbarrier --------------------------------------------------------------------------------------
// A 64-bit barrier object in shared memory with an expected arrival count and a transaction count
// (bytes); a phase completes when both reach zero, and the next phase begins. Waiters name the
// phase by its parity.

// mbarrier.init.shared::cta.b64: expected arrivals `count`, phase 0. Make it visible to the
// other threads (and the async proxy) with fence_barrier_init() and a block barrier.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, unsigned count SWERVE_EMU_CALLER) {
#ifdef SWERVE_EMU
    emu::mbarrier_init(bar, count, emu_file, emu_line);
#else
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
#endif
}
// fence.mbarrier_init.release.cluster: the initialisations before it are visible to the async
// proxy (TMA completing transactions on them).
__device__ __forceinline__ void fence_barrier_init(SWERVE_EMU_CALLER_FIRST) {
#ifdef SWERVE_EMU
    emu::fence_barrier_init(emu_file, emu_line);
#else
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
// mbarrier.arrive.shared::cta.b64 (release, CTA scope): one arrival.
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar SWERVE_EMU_CALLER) {
#ifdef SWERVE_EMU
    emu::mbarrier_arrive(bar, emu_file, emu_line);
#else
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
#endif
}
// mbarrier.arrive.expect_tx.shared::cta.b64: expect `bytes` more transaction bytes in the current
// phase (the TMA copies that complete on this barrier), then one arrival.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, unsigned bytes SWERVE_EMU_CALLER) {
#ifdef SWERVE_EMU
    emu::mbarrier_arrive_expect_tx(bar, bytes, emu_file, emu_line);
#else
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
#endif
}
// Waits until the phase of parity `parity` has completed (mbarrier.try_wait.parity in a loop;
// acquire, CTA scope).
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, unsigned parity SWERVE_EMU_CALLER) {
#ifdef SWERVE_EMU
    emu::mbarrier_wait(bar, parity, emu_file, emu_line);
#else
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n"
        "}\n" ::"r"(smem_addr(bar)),
        "r"(parity)
        : "memory");
#endif
}

// ---- TMA -------------------------------------------------------------------------------------------
// cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes: the box at
// coordinates (c0, c1, c2) (innermost first) of the map's tensor into `smem` (laid out and
// swizzled as the map says; elements outside the tensor read as zero); the copy's bytes complete
// transactions on `bar`. `smem` must be aligned to the swizzle's span (128 B swizzle: 1024 B).
__device__ __forceinline__ void tma_load_3d(void* smem, const TmaMap* map, uint64_t* bar, int c0, int c1,
                                            int c2 SWERVE_EMU_CALLER) {
#ifdef SWERVE_EMU
    const int coords[3] = {c0, c1, c2};
    emu::tma_load(smem, map, bar, 3, coords, emu_file, emu_line);
#else
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
        "[%2];\n" ::"r"(smem_addr(smem)),
        "l"(map), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
#endif
}
// prefetch.tensormap: brings the map into the cache ahead of the first copy.
__device__ __forceinline__ void tma_prefetch_map(const TmaMap* map) {
#ifndef SWERVE_EMU
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
#else
    (void)map;
#endif
}

// fence.proxy.async.shared::cta: orders this thread's generic-proxy shared-memory accesses before
// later async-proxy ones (wgmma operands, TMA) and the other way round.
__device__ __forceinline__ void fence_proxy_async(SWERVE_EMU_CALLER_FIRST) {
#ifdef SWERVE_EMU
    emu::fence_proxy_async(emu_file, emu_line);
#else
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// ---- named barriers ([PTX] "bar, barrier") ---------------------------------------------------------
// bar.sync id, threads: waits for `threads` (a multiple of 32) arrivals at barrier `id` (1..15;
// 0 is __syncthreads'). bar.arrive: arrives without waiting.
__device__ __forceinline__ void named_barrier_sync(int id, int threads SWERVE_EMU_CALLER) {
#ifdef SWERVE_EMU
    emu::named_barrier(id, threads, true, emu_file, emu_line);
#else
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#endif
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads SWERVE_EMU_CALLER) {
#ifdef SWERVE_EMU
    emu::named_barrier(id, threads, false, emu_file, emu_line);
#else
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#endif
}

// ---- setmaxnreg ------------------------------------------------------------------------------------
// setmaxnreg.{inc,dec}.sync.aligned.u32 N: a warpgroup's per-thread register budget (24..256, a
// multiple of 8): producers give registers back, consumers take them.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc(SWERVE_EMU_CALLER_FIRST) {
    static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg: 24..256, a multiple of 8");
#ifdef SWERVE_EMU
    emu::setmaxnreg(true, kRegs, emu_file, emu_line);
#else
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec(SWERVE_EMU_CALLER_FIRST) {
    static_assert(kRegs >= 24 && kRegs <= 256 && kRegs % 8 == 0, "setmaxnreg: 24..256, a multiple of 8");
#ifdef SWERVE_EMU
    emu::setmaxnreg(false, kRegs, emu_file, emu_line);
#else
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

// ---- wgmma -----------------------------------------------------------------------------------------
// A warpgroup (4 consecutive warps, the first a multiple of 4) multiplies D (64 x N, fp32, in
// registers) += A (64 x 16, bf16) B (16 x N, bf16). Warp w of the group holds rows 16w .. 16w+15
// of D in the layout of mma.sync m16n8k16's C fragments, one per 8 columns: d[n8][0..3] =
// (g, 8 n8 + 2t), (g, 8 n8 + 2t + 1), (g + 8, 8 n8 + 2t), (g + 8, 8 n8 + 2t + 1) with g = lane / 4,
// t = lane % 4 (the s_acc / o_acc layout of attn_tile.cuh). A from registers has mma.sync's A
// fragment layout (per warp, its 16 rows). Operands in shared memory are named by descriptors.

// Swizzle modes of a descriptor (bits 62-63) and of a tensor map (its own numbering).
enum WgmmaSwizzle : uint32_t { kSwizzleNone = 0, kSwizzle128B = 1, kSwizzle64B = 2, kSwizzle32B = 3 };

// The 64-bit matrix descriptor: start address, leading and stride byte offsets (all >> 4, 14 bits),
// base offset 0 (the operand's swizzle atoms are aligned to their span), swizzle mode.
__device__ __forceinline__ uint64_t wgmma_desc(uint32_t smem_address, uint32_t lbo_bytes, uint32_t sbo_bytes,
                                               WgmmaSwizzle swizzle) {
    return (uint64_t)((smem_address & 0x3ffff) >> 4) | ((uint64_t)((lbo_bytes >> 4) & 0x3fff) << 16) |
           ((uint64_t)((sbo_bytes >> 4) & 0x3fff) << 32) | ((uint64_t)swizzle << 62);
}

// wgmma.fence.sync.aligned: orders this warpgroup's register accesses before the following
// wgmma (required before the first wgmma of a batch whose accumulators were touched since).
__device__ __forceinline__ void wgmma_fence(SWERVE_EMU_CALLER_FIRST) {
#ifdef SWERVE_EMU
    emu::wgmma_fence(emu_file, emu_line);
#else
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
// wgmma.commit_group.sync.aligned: the wgmma issued since the last commit form a group.
__device__ __forceinline__ void wgmma_commit(SWERVE_EMU_CALLER_FIRST) {
#ifdef SWERVE_EMU
    emu::wgmma_commit(emu_file, emu_line);
#else
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// wgmma.wait_group.sync.aligned N: waits until at most N groups are pending; only then may the
// accumulators (and registers of A) of the retired groups be read or written.
template <int kPending>
__device__ __forceinline__ void wgmma_wait(SWERVE_EMU_CALLER_FIRST) {
#ifdef SWERVE_EMU
    emu::wgmma_wait(kPending, emu_file, emu_line);
#else
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}

#ifndef SWERVE_EMU
template <int N>
__device__ __forceinline__ void wgmma_bf16_ss_impl(float (&d)[N / 8][4], uint64_t desc_a, uint64_t desc_b);
template <int N>
__device__ __forceinline__ void wgmma_bf16_rs_tb_impl(float (&d)[N / 8][4], const uint32_t (&a)[4],
                                                      uint64_t desc_b);
// (generated: one instantiation per N, the accumulator registers listed one by one)
template <>
__device__ __forceinline__ void wgmma_bf16_ss_impl<16>(float (&d)[16 / 8][4], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])
        : "l"(desc_a), "l"(desc_b), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_bf16_rs_tb_impl<16>(float (&d)[16 / 8][4], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 1;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_bf16_ss_impl<32>(float (&d)[32 / 8][4], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
        : "l"(desc_a), "l"(desc_b), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_bf16_rs_tb_impl<32>(float (&d)[32 / 8][4], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 1;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_bf16_ss_impl<64>(float (&d)[64 / 8][4], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "l"(desc_a), "l"(desc_b), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_bf16_rs_tb_impl<64>(float (&d)[64 / 8][4], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_bf16_ss_impl<128>(float (&d)[128 / 8][4], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "l"(desc_a), "l"(desc_b), "r"(1));
}
template <>
__device__ __forceinline__ void wgmma_bf16_rs_tb_impl<128>(float (&d)[128 / 8][4], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}
#endif

// D += A B, m64nNk16, A and B from shared memory, both K-major (no transpose).
template <int N>
__device__ __forceinline__ void wgmma_bf16_ss(float (&d)[N / 8][4], uint64_t desc_a, uint64_t desc_b SWERVE_EMU_CALLER) {
#ifdef SWERVE_EMU
    emu::wgmma_mma(N, &d[0][0], nullptr, desc_a, desc_b, false, emu_file, emu_line);
#else
    wgmma_bf16_ss_impl<N>(d, desc_a, desc_b);
#endif
}
// D += A B, m64nNk16, A from registers (mma.sync's A fragment of each warp's 16 rows), B from
// shared memory MN-major (transposed: B's N elements contiguous, e.g. V [keys, head_dim]).
template <int N>
__device__ __forceinline__ void wgmma_bf16_rs_transb(float (&d)[N / 8][4], const uint32_t (&a)[4],
                                                     uint64_t desc_b SWERVE_EMU_CALLER) {
#ifdef SWERVE_EMU
    emu::wgmma_mma(N, &d[0][0], a, 0, desc_b, true, emu_file, emu_line);
#else
    wgmma_bf16_rs_tb_impl<N>(d, a, desc_b);
#endif
}

#endif  // SWERVE_HOPPER
