// Diagnostics of the emulated device's sm_90a model (emu/runtime_hopper.cpp, runtime_tma.cpp): each
// deliberately wrong kernel must be an error of its launch naming the problem (a wait on the wrong
// phase, a transaction count that never completes, a descriptor whose swizzle disagrees with the
// tensor map's, wgmma without a fence, a warpgroup at two call sites, setmaxnreg misuse, named
// barriers with different counts, ...), and a consumer that reads a TMA destination without waiting
// on its mbarrier reads the NaN fill; a wgmma reading plain stores without fence.proxy.async (and a
// fenced one reading them correctly). The semantics are tested in unit_hopper.cpp.
#include "unit_hopper_common.h"

static std::vector<uint16_t> g_src = random_bf16(64 * 64, 5);
static const uint32_t kTile = 64 * 64 * 2;

// A 64 x 64 bf16 tile map with the given TMA swizzle (box inner 64 elements needs 128B; 32 for 64B).
static TmaMap tile_map(int swizzle, uint32_t box0 = 64) {
    return encode3(g_src.data(), kBF16, 64, 64, 1, 128, 64 * 128, box0, 64, 1, swizzle);
}

// Thread 0 loads the tile into `dst` completing on `bar` (count 1), after init + fence + barrier.
static void load_tile(uint64_t& bar, unsigned char* dst, const TmaMap& map, uint32_t expect) {
    if (threadIdx.x == 0) {
        mbarrier_init(&bar, 1);
        fence_barrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbarrier_arrive_expect_tx(&bar, expect);
        tma_load_3d(dst, &map, &bar, 0, 0, 0);
    }
}

static void test_mbarrier_diagnostics() {
    printf("mbarrier and TMA diagnostics\n");
    const TmaMap map = tile_map(kMapSw128);
    int e;
    {
        Quiet q;
        e = run("wrong_phase", dim3(1), dim3(64), 0, [&] {
            auto& bar = emu::block_shared<uint64_t>(0);
            if (threadIdx.x == 0) mbarrier_init(&bar, 1);
            __syncthreads();
            if (threadIdx.x == 0) mbarrier_arrive(&bar);  // completes phase 0
            __syncthreads();
            mbarrier_wait(&bar, 1);  // phase 1 never completes: should have waited for parity 0
        });
    }
    expect_error("a wait on the wrong phase", e, "wait for parity 1 on mbarrier");
    CHECK(emu::last_launch_errors().find("current phase 1 (parity 1), 1 of 1 arrivals pending") != std::string::npos,
          "the deadlock names the barrier's phase and pending arrivals:\n%s", emu::last_launch_errors().c_str());
    {
        Quiet q;
        e = run("tx_never_completes", dim3(1), dim3(32), 64 * 1024, [&] {
            auto& bar = emu::block_shared<uint64_t>(0);
            load_tile(bar, smem_aligned(), map, kTile + 16);
            mbarrier_wait(&bar, 0);
        });
    }
    expect_error("a transaction count that never completes", e, "tx-count 8208 bytes expected, 8192 bytes");
    {
        Quiet q;
        e = run("tx_outstanding_at_exit", dim3(1), dim3(32), 64 * 1024, [&] {
            auto& bar = emu::block_shared<uint64_t>(0);
            load_tile(bar, smem_aligned(), map, kTile + 16);
        });
    }
    expect_error("transactions outstanding at block exit", e, "transactions outstanding");
    {
        Quiet q;
        e = run("tx_underflow", dim3(1), dim3(32), 64 * 1024, [&] {
            auto& bar = emu::block_shared<uint64_t>(0);
            load_tile(bar, smem_aligned(), map, kTile - 16);
            mbarrier_wait(&bar, 0);
        });
    }
    expect_error("more TMA bytes than expect_tx", e, "transaction count underflow");
    {
        Quiet q;
        e = run("uninitialised", dim3(1), dim3(32), 0, [&] {
            auto& bar = emu::block_shared<uint64_t>(0);
            mbarrier_wait(&bar, 0);
        });
    }
    expect_error("a wait on an uninitialised mbarrier", e, "not initialised");
    {
        Quiet q;
        e = run("not_fenced", dim3(1), dim3(32), 64 * 1024, [&] {
            auto& bar = emu::block_shared<uint64_t>(0);
            if (threadIdx.x == 0) {
                mbarrier_init(&bar, 1);
                mbarrier_arrive_expect_tx(&bar, kTile);
                tma_load_3d(smem_aligned(), &map, &bar, 0, 0, 0);
            }
            mbarrier_wait(&bar, 0);
        });
    }
    expect_error("TMA on an mbarrier not fenced after init", e, "not fenced before TMA use");
    {
        Quiet q;
        TmaMap junk{};
        e = run("map_not_encoded", dim3(1), dim3(32), 64 * 1024, [&] {
            auto& bar = emu::block_shared<uint64_t>(0);
            load_tile(bar, smem_aligned(), junk, kTile);
        });
    }
    expect_error("a tensor map never encoded", e, "never encoded");
    {
        Quiet q;
        e = run("tma_misaligned", dim3(1), dim3(32), 64 * 1024, [&] {
            auto& bar = emu::block_shared<uint64_t>(0);
            load_tile(bar, smem_aligned() + 512, map, kTile);
        });
    }
    expect_error("a 128B-swizzled TMA destination 512-aligned", e, "not 1024-byte aligned");
}

static void test_nan_fill_without_wait() {
    printf("a consumer that reads a TMA destination without waiting reads the NaN fill\n");
    const TmaMap map = tile_map(kMapSwNone);
    uint16_t early = 0, late = 0;
    const int e = run("read_without_wait", dim3(1), dim3(64), 64 * 1024, [&] {
        auto& bar = emu::block_shared<uint64_t>(0);
        unsigned char* dst = smem_aligned();
        load_tile(bar, dst, map, kTile);
        __syncthreads();  // the copy was issued, and its phase's bytes are all in: it still has not landed
        if (threadIdx.x == 32) memcpy(&early, dst, 2);
        __syncthreads();
        mbarrier_wait(&bar, 0);
        if (threadIdx.x == 32) memcpy(&late, dst, 2);
    });
    expect_clean("read without waiting (the kernel itself is legal)", e);
    CHECK(early == 0xffff, "the early read sees the NaN fill, got 0x%04x", early);
    CHECK(late == g_src[0], "after the wait the data is there: 0x%04x vs 0x%04x", late, g_src[0]);
}

// A warpgroup's wgmma on a 128B-swizzled tile, with knobs for the mistakes.
struct WgKnobs {
    bool fence = true, wait = true, split_commit = false;
    WgmmaSwizzle desc_swizzle = kSwizzle128B;
};
static int wgmma_kernel(const char* name, const WgKnobs& k) {
    const TmaMap map = tile_map(kMapSw128);
    return run(name, dim3(1), dim3(128), 64 * 1024, [&] {
        auto& bar = emu::block_shared<uint64_t>(0);
        unsigned char* tile = smem_aligned();
        load_tile(bar, tile, map, kTile);
        mbarrier_wait(&bar, 0);
        float acc[64 / 8][4] = {};
        const uint64_t desc = wgmma_desc(smem_addr(tile), 16, 1024, k.desc_swizzle);
        if (k.fence) wgmma_fence();
        wgmma_bf16_ss<64>(acc, desc, desc);
        if (k.split_commit && threadIdx.x < 64)
            wgmma_commit();
        else
            wgmma_commit();
        if (k.wait) wgmma_wait<0>();
    });
}

static void test_warpgroup_diagnostics() {
    printf("wgmma, setmaxnreg and named barrier diagnostics\n");
    int e = wgmma_kernel("wgmma_ok", WgKnobs{});
    expect_clean("wgmma on a TMA tile with matching descriptors", e);
    {
        Quiet q;
        WgKnobs k;
        k.desc_swizzle = kSwizzle64B;
        e = wgmma_kernel("swizzle_mismatch", k);
    }
    expect_error("descriptor swizzle vs the tensor map's", e,
                 "descriptor swizzle 64B disagrees with the tensor map's swizzle 128B that wrote this tile");
    {
        Quiet q;
        WgKnobs k;
        k.fence = false;
        e = wgmma_kernel("no_fence", k);
    }
    expect_error("wgmma without wgmma.fence", e, "wgmma.fence required");
    {
        Quiet q;
        WgKnobs k;
        k.split_commit = true;
        e = wgmma_kernel("warpgroup_mismatch", k);
    }
    expect_error("a warpgroup at two call sites", e, "different warpgroup collectives");
    {
        Quiet q;
        WgKnobs k;
        k.wait = false;
        e = wgmma_kernel("never_waited", k);
    }
    expect_error("exit with wgmma not retired", e, "not retired");
    {
        Quiet q;
        e = run("partial_warpgroup", dim3(1), dim3(96), 0, [&] { wgmma_fence(); });
    }
    expect_error("a warpgroup collective in a partial warpgroup", e, "partial");
    {
        Quiet q;
        e = run("setmaxnreg_lower", dim3(1), dim3(128), 0, [&] {
            setmaxnreg_inc<232>();
            setmaxnreg_inc<200>();
        });
    }
    expect_error("setmaxnreg.inc lowering the count", e, "must not lower it");
    {
        Quiet q;
        e = run("setmaxnreg_raise", dim3(1), dim3(128), 0, [&] {
            setmaxnreg_dec<40>();
            setmaxnreg_dec<56>();
        });
    }
    expect_error("setmaxnreg.dec raising the count", e, "must not lower it, .dec must not raise it");
    {
        Quiet q;
        e = run("named_count_mismatch", dim3(1), dim3(128), 0, [&] {
            if (threadIdx.x < 32)
                named_barrier_sync(1, 64);
            else if (threadIdx.x < 64)
                named_barrier_sync(1, 96);
        });
    }
    expect_error("named barrier thread-count mismatch", e, "same thread count");
    {
        Quiet q;
        e = run("named_deadlock", dim3(1), dim3(64), 0, [&] {
            if (threadIdx.x < 32) named_barrier_sync(2, 64);
        });
    }
    expect_error("named barrier never reaching its count", e, "named barrier 2: 32 of 64 threads counted");
    std::vector<int> got(32, -1);
    e = run("named_producer_consumer", dim3(1), dim3(96), 0, [&] {
        auto& v = emu::block_shared<int[32]>(0);
        if (threadIdx.x < 32) {
            v[threadIdx.x] = 7 * (int)threadIdx.x;
            named_barrier_arrive(3, 64);
        } else if (threadIdx.x < 64) {
            named_barrier_sync(3, 64);
            got[threadIdx.x - 32] = v[threadIdx.x - 32];
        }
    });
    expect_clean("bar.arrive producer / bar.sync consumer", e);
    bool ok = true;
    for (int i = 0; i < 32; ++i) ok &= got[i] == 7 * i;
    CHECK(ok, "the consumer warp sees the producer's writes after bar.sync");
}

// fence.proxy.async: A written by the threads' plain stores (or by TMA), B by TMA, one m64n64k16.
enum ProxyMode { kProxyTma, kProxyNoFence, kProxyFence, kProxyFenceAfterIssue, kProxyWriteInFlight };
static int proxy_kernel(const char* name, ProxyMode mode, std::vector<float>& out) {
    const TmaMap map = tile_map(kMapSw128);
    out.assign(128 * 32, 0.0f);
    return run(name, dim3(1), dim3(128), 64 * 1024, [&] {
        auto& bar = emu::block_shared<uint64_t>(0);
        unsigned char* sA = smem_aligned();
        unsigned char* sB = sA + kTile;
        if (threadIdx.x == 0) {
            mbarrier_init(&bar, 1);
            fence_barrier_init();
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            mbarrier_arrive_expect_tx(&bar, mode == kProxyTma ? 2 * kTile : kTile);
            tma_load_3d(sB, &map, &bar, 0, 0, 0);
            if (mode == kProxyTma) tma_load_3d(sA, &map, &bar, 0, 0, 0);
        }
        if (mode != kProxyTma)  // the tile as the 128B-swizzled TMA box places it
            for (int i = threadIdx.x; i < 64 * 64; i += 128)
                memcpy(sA + swz_bits((i / 64) * 128 + 2 * (i % 64), 128), &g_src[i], 2);
        if (mode == kProxyFence || mode == kProxyWriteInFlight) fence_proxy_async();
        __syncthreads();
        mbarrier_wait(&bar, 0);
        float acc[64 / 8][4] = {};
        wgmma_fence();
        wgmma_bf16_ss<64>(acc, wgmma_desc(smem_addr(sA), 16, 1024, kSwizzle128B),
                          wgmma_desc(smem_addr(sB), 16, 1024, kSwizzle128B));
        wgmma_commit();
        if (mode == kProxyFenceAfterIssue) fence_proxy_async();
        if (mode == kProxyWriteInFlight && threadIdx.x == 5) sA[2 * 1024 + 4] ^= 1;  // row 16, k 2: read by it
        wgmma_wait<0>();
        memcpy(&out[threadIdx.x * 32], acc, sizeof acc);
    });
}

static void test_proxy_fence() {
    printf("fence.proxy.async between plain stores and wgmma\n");
    std::vector<float> want, got;
    int e = proxy_kernel("proxy_tma", kProxyTma, want);
    expect_clean("wgmma on TMA-loaded A and B", e);
    {
        Quiet q;
        e = proxy_kernel("proxy_no_fence", kProxyNoFence, got);
    }
    expect_error("plain stores read by wgmma without fence.proxy.async", e, "operand A (shared [0x");
    const std::string errs = emu::last_launch_errors();
    const bool site = errs.find("unit_hopper_diagnostics.cpp") != std::string::npos;
    CHECK(errs.find("written by ordinary stores since the last fence.proxy.async: add fence_proxy_async() after the "
                    "writes (and a barrier before the wgmma)") != std::string::npos &&
              site && errs.find("operand B") == std::string::npos && e == 1,
          "one error, naming the wgmma's call site and operand A only:\n%s", errs.c_str());
    e = proxy_kernel("proxy_fence", kProxyFence, got);
    expect_clean("plain stores, fence_proxy_async, barrier, wgmma", e);
    CHECK(memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0,
          "the fenced stores give the TMA-loaded tile's product bit for bit");
    {
        Quiet q;
        e = proxy_kernel("proxy_fence_after_issue", kProxyFenceAfterIssue, got);
    }
    expect_error("fence.proxy.async after the wgmma's issue", e, "written by ordinary stores since the last");
    {
        Quiet q;
        e = proxy_kernel("proxy_write_in_flight", kProxyWriteInFlight, got);
    }
    expect_error("an operand written while the wgmma is in flight", e, "written after the wgmma's issue");
}

int main() {
    test_mbarrier_diagnostics();
    test_nan_fill_without_wait();
    test_warpgroup_diagnostics();
    test_proxy_fence();
    printf("%d checks, %d failures\n", g_checks.load(), g_failures.load());
    return g_failures ? 1 : 0;
}
