// Unit tests of the emulated device's sm_90a model (emu/runtime_hopper.cpp, runtime_tma.cpp) through
// kernels/hopper.cuh: wgmma m64nNk16 from descriptors in every canonical layout of [PTX] "Shared
// Memory Matrix Layout" (tiles placed there by TMA loads, as kernels do) against a scalar product and
// bit for bit against the matching mma.sync m16n8k16 sequence, A from registers too; TMA boxes with
// every swizzle, out-of-bounds fill and 3D maps; mbarrier phases and parity waits; cuTensorMapEncodeTiled's
// checks; and a warp-specialised TMA + wgmma GEMM pipeline under every schedule. The diagnostics are
// in unit_hopper_diagnostics.cpp.
#include "unit_hopper_common.h"

// ---- wgmma layouts ---------------------------------------------------------------------------------

struct WgCase {
    int span;   // swizzle span of both operands' tiles (0: none)
    bool b_mn;  // B MN-major (N contiguous) instead of K-major
    int n;
};

// One operand tile: how the TMA places it and how a descriptor names it.
struct Tile {
    TmaMap map;
    int boxes;            // boxes along N (MN-major swizzled), else 1
    uint32_t box_bytes;   // per box
    uint32_t box_step;    // N elements per box
    uint32_t lbo, sbo;    // descriptor
    uint32_t k16_step;    // bytes the start address advances per k16 step
};

static int map_swizzle(int span) { return span == 0 ? kMapSwNone : span == 32 ? kMapSw32 : span == 64 ? kMapSw64 : kMapSw128; }
static WgmmaSwizzle desc_swizzle(int span) {
    return span == 0 ? kSwizzleNone : span == 32 ? kSwizzle32B : span == 64 ? kSwizzle64B : kSwizzle128B;
}

// K-major rows x KT (global: rows of KT elements).
static Tile kmajor_tile(const uint16_t* g, int rows, int kt, int span) {
    Tile t{};
    t.boxes = 1;
    if (span) {  // box {S/2, rows}: rows S bytes apart, 8-row groups 8S apart
        t.map = encode3(g, kBF16, kt, rows, 1, kt * 2, (uint64_t)rows * kt * 2, span / 2, rows, 1, map_swizzle(span));
        t.lbo = 16, t.sbo = 8 * span, t.k16_step = 32;
    } else {  // box {8, rows, KT/8}: core matrices of 8 rows x 16 B; K-adjacent ones rows*16 apart
        t.map = encode3(g, kBF16, 8, rows, kt / 8, kt * 2, 16, 8, rows, kt / 8, kMapSwNone);
        t.lbo = rows * 16, t.sbo = 128, t.k16_step = 2 * t.lbo;
    }
    t.box_bytes = rows * kt * 2;
    return t;
}

// MN-major KT x n (global: KT rows of n elements).
static Tile mnmajor_tile(const uint16_t* g, int n, int kt, int span) {
    Tile t{};
    if (span) {  // boxes {S/2 (n), KT}: K rows S bytes apart, 8-row groups 8S (SBO), N atoms a box apart (LBO)
        t.map = encode3(g, kBF16, n, kt, 1, n * 2, (uint64_t)n * kt * 2, span / 2, kt, 1, map_swizzle(span));
        t.boxes = (n + span / 2 - 1) / (span / 2);
        t.box_step = span / 2;
        t.box_bytes = kt * span;
        t.lbo = t.box_bytes, t.sbo = 8 * span, t.k16_step = 2 * t.sbo;
    } else {  // box {8 (n), KT, n/8}: core matrices 8 k x 16 B; N-adjacent ones KT*16 apart (SBO), K-adjacent 128 (LBO)
        t.map = encode3(g, kBF16, 8, kt, n / 8, n * 2, 16, 8, kt, n / 8, kMapSwNone);
        t.boxes = 1;
        t.box_bytes = kt * n * 2;
        t.lbo = 128, t.sbo = kt * 16, t.k16_step = 2 * t.lbo;
    }
    return t;
}

static inline uint32_t pack2(uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); }

// This thread's mma.sync A fragment for k16 step s (rows of its warp) from the global A [64][kt].
static void a_fragment(uint32_t a[4], const uint16_t* A, int kt, int s) {
    const int w = threadIdx.x / 32 % 4, g = lane_id() / 4, t = lane_id() % 4, r = 16 * w + g, c = 16 * s + 2 * t;
    a[0] = pack2(A[r * kt + c], A[r * kt + c + 1]);
    a[1] = pack2(A[(r + 8) * kt + c], A[(r + 8) * kt + c + 1]);
    a[2] = pack2(A[r * kt + c + 8], A[r * kt + c + 9]);
    a[3] = pack2(A[(r + 8) * kt + c + 8], A[(r + 8) * kt + c + 9]);
}

// Accumulators <-> a row-major 64 x n matrix, in the C-fragment layout.
static void frag_io(float* d, float* m, int n, bool store) {
    const int w = threadIdx.x / 32 % 4, g = lane_id() / 4, t = lane_id() % 4;
    for (int n8 = 0; n8 < n / 8; ++n8)
        for (int e = 0; e < 4; ++e) {
            float& x = m[(16 * w + g + 8 * (e / 2)) * n + 8 * n8 + 2 * t + e % 2];
            if (store)
                x = d[4 * n8 + e];
            else
                d[4 * n8 + e] = x;
        }
}

static void wgmma_case(const WgCase& c, uint32_t seed) {
    const int S = c.span, N = c.n, KT = S ? S / 2 : 32, steps = KT / 16;
    const std::vector<uint16_t> A = random_bf16(64 * KT, seed), Bk = random_bf16((size_t)N * KT, seed + 1);
    std::vector<uint16_t> Bmn((size_t)KT * N);
    for (int k = 0; k < KT; ++k)
        for (int n = 0; n < N; ++n) Bmn[k * N + n] = Bk[n * KT + k];
    const std::vector<uint16_t> c_bits = random_bf16(64 * N, seed + 2);
    std::vector<float> C0(64 * N);
    for (size_t i = 0; i < C0.size(); ++i) C0[i] = bf2f(c_bits[i]);
    const Tile ta = kmajor_tile(A.data(), 64, KT, S);
    const Tile tb = c.b_mn ? mnmajor_tile(Bmn.data(), N, KT, S) : kmajor_tile(Bk.data(), N, KT, S);
    const uint32_t off_b = (ta.box_bytes + 1023) / 1024 * 1024;
    std::vector<float> out_ss(64 * N), out_rs(64 * N), out_mma(64 * N);
    const int e = run("wgmma_layouts", dim3(1), dim3(128), 96 * 1024, [&] {
        auto& bar = emu::block_shared<uint64_t>(0);
        unsigned char* sA = smem_aligned();
        unsigned char* sB = sA + off_b;
        if (threadIdx.x == 0) {
            mbarrier_init(&bar, 1);
            fence_barrier_init();
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            mbarrier_arrive_expect_tx(&bar, ta.box_bytes + tb.boxes * tb.box_bytes);
            tma_load_3d(sA, &ta.map, &bar, 0, 0, 0);
            for (int b = 0; b < tb.boxes; ++b) tma_load_3d(sB + b * tb.box_bytes, &tb.map, &bar, b * tb.box_step, 0, 0);
        }
        mbarrier_wait(&bar, 0);
        float d[16 * 4], r[16 * 4], m[16 * 4];
        frag_io(d, C0.data(), N, false);
        frag_io(r, C0.data(), N, false);
        frag_io(m, C0.data(), N, false);
        wgmma_fence();
        for (int s = 0; s < steps; ++s) {
            const uint64_t da = wgmma_desc(smem_addr(sA) + s * ta.k16_step, ta.lbo, ta.sbo, desc_swizzle(S));
            const uint64_t db = wgmma_desc(smem_addr(sB) + s * tb.k16_step, tb.lbo, tb.sbo, desc_swizzle(S));
            emu::wgmma_mma(N, d, nullptr, da, db, c.b_mn, __FILE__, __LINE__);
            uint32_t a[4];
            a_fragment(a, A.data(), KT, s);
            emu::wgmma_mma(N, r, a, 0, db, c.b_mn, __FILE__, __LINE__);
        }
        wgmma_commit();
        wgmma_wait<0>();
        for (int s = 0; s < steps; ++s) {
            uint32_t a[4];
            a_fragment(a, A.data(), KT, s);
            for (int n8 = 0; n8 < N / 8; ++n8) {
                const int n = 8 * n8 + lane_id() / 4, k = 16 * s + 2 * (lane_id() % 4);
                const uint32_t b0 = pack2(Bk[n * KT + k], Bk[n * KT + k + 1]);
                const uint32_t b1 = pack2(Bk[n * KT + k + 8], Bk[n * KT + k + 9]);
                mma_bf16_16816(m + 4 * n8, a, b0, b1);
            }
        }
        frag_io(d, out_ss.data(), N, true);
        frag_io(r, out_rs.data(), N, true);
        frag_io(m, out_mma.data(), N, true);
    });
    char what[96];
    snprintf(what, sizeof what, "wgmma m64n%dk16 %s B, swizzle %d", N, c.b_mn ? "MN-major" : "K-major", S);
    expect_clean(what, e);
    int bad_ref = 0, bad_mma = 0, bad_rs = 0;
    for (int row = 0; row < 64; ++row)
        for (int col = 0; col < N; ++col) {
            float v = C0[row * N + col];
            for (int s = 0; s < steps; ++s) {
                double acc = 0;
                for (int k = 16 * s; k < 16 * s + 16; ++k) acc += (double)bf2f(A[row * KT + k]) * bf2f(Bk[col * KT + k]);
                v = (float)((double)v + acc);
            }
            const uint32_t want = __float_as_uint(v), got = __float_as_uint(out_ss[row * N + col]);
            bad_ref += got != want;
            bad_mma += got != __float_as_uint(out_mma[row * N + col]);
            bad_rs += __float_as_uint(out_rs[row * N + col]) != want;
        }
    CHECK(bad_ref == 0, "%s: %d of %d outputs differ from the scalar product", what, bad_ref, 64 * N);
    CHECK(bad_mma == 0, "%s: %d outputs differ (bits) from the mma.sync m16n8k16 sequence", what, bad_mma);
    CHECK(bad_rs == 0, "%s, A from registers: %d outputs differ from the scalar product", what, bad_rs);
}

static void test_wgmma_layouts() {
    printf("wgmma: every canonical layout, N 16/64/128, vs a scalar product and mma.sync (bitwise)\n");
    uint32_t seed = 100;
    for (int span : {0, 32, 64, 128})
        for (bool b_mn : {false, true})
            for (int n : {16, 64, 128}) wgmma_case(WgCase{span, b_mn, n}, seed += 7);
}

// ---- TMA boxes -------------------------------------------------------------------------------------

// A 3D bf16 tensor {80, 20, 3} whose elements are 1 + their index (never 0, so the zero fill shows).
static void tma_case(int span, int c0, int c1, int c2) {
    const int D0 = 80, D1 = 20, D2 = 3;
    std::vector<uint16_t> T(D0 * D1 * D2);
    for (size_t i = 0; i < T.size(); ++i) T[i] = (uint16_t)(1 + i);
    const int B0 = span ? span / 2 : 40, B1 = 10, B2 = 2;
    const TmaMap map = encode3(T.data(), kBF16, D0, D1, D2, D0 * 2, D0 * D1 * 2, B0, B1, B2, map_swizzle(span));
    const uint32_t bytes = B0 * B1 * B2 * 2;
    std::vector<uint16_t> out(bytes / 2);
    const int e = run("tma_box", dim3(1), dim3(32), 16 * 1024, [&] {
        auto& bar = emu::block_shared<uint64_t>(0);
        unsigned char* dst = smem_aligned();
        if (threadIdx.x == 0) {
            mbarrier_init(&bar, 1);
            fence_barrier_init();
            mbarrier_arrive_expect_tx(&bar, bytes);
            tma_load_3d(dst, &map, &bar, c0, c1, c2);
        }
        __syncwarp();
        mbarrier_wait(&bar, 0);
        if (threadIdx.x == 0) memcpy(out.data(), dst, bytes);
    });
    char what[96];
    snprintf(what, sizeof what, "TMA box swizzle %d at (%d, %d, %d)", span, c0, c1, c2);
    expect_clean(what, e);
    int bad = 0;
    for (int i2 = 0; i2 < B2; ++i2)
        for (int i1 = 0; i1 < B1; ++i1)
            for (int i0 = 0; i0 < B0; ++i0) {
                const int g0 = c0 + i0, g1 = c1 + i1, g2 = c2 + i2;
                const bool in = g0 >= 0 && g0 < D0 && g1 >= 0 && g1 < D1 && g2 >= 0 && g2 < D2;
                const uint16_t want = in ? T[(g2 * D1 + g1) * D0 + g0] : 0;
                const uint32_t off = swz_bits(2 * ((i2 * B1 + i1) * B0 + i0), span);
                bad += out[off / 2] != want;
            }
    CHECK(bad == 0, "%s: %d of %u elements misplaced", what, bad, bytes / 2);
}

static void test_tma_boxes() {
    printf("TMA: box loads with every swizzle, zero fill out of bounds, 3D\n");
    for (int span : {0, 32, 64, 128}) {
        tma_case(span, 0, 0, 0);
        tma_case(span, -8, -3, -1);  // before the start in every dimension
        tma_case(span, 40, 15, 2);   // past the end in every dimension
    }
}

static void test_tensor_map_checks() {
    printf("cuTensorMapEncodeTiled's argument checks\n");
    alignas(64) static uint16_t buf[4096];
    std::string why0;
    struct Bad {
        const char* what;
        const void* base;
        uint64_t d0, s1;
        uint32_t b0, b1;
        int swizzle, dtype;
        const char* needle;
    } cases[] = {
        {"misaligned global address", buf + 1, 64, 128, 64, 8, kMapSw128, kBF16, "globalAddress"},
        {"stride not a multiple of 16", buf, 60, 120, 16, 8, kMapSwNone, kBF16, "globalStrides[0]"},
        {"box above 256", buf, 64, 128, 8, 300, kMapSwNone, kBF16, "boxDim[1]"},
        {"box inner bytes not a multiple of 16", buf, 64, 128, 12, 8, kMapSwNone, kBF16, "multiple of 16"},
        {"box inner bytes above the swizzle span", buf, 64, 128, 64, 8, kMapSw64, kBF16, "exceeds the swizzle span"},
        {"unknown data type", buf, 64, 128, 64, 8, kMapSwNone, 99, "tensorDataType"},
        {"zero global dimension", buf, 0, 128, 8, 8, kMapSwNone, kBF16, "globalDim[0]"},
    };
    for (const Bad& c : cases) {
        int r = 0;
        std::string why;
        encode3(c.base, c.dtype, c.d0, 16, 1, c.s1, 4096, c.b0, c.b1, 1, c.swizzle, &r, &why);
        CHECK(r == 1 && why.find(c.needle) != std::string::npos, "%s: result %d, message \"%s\"", c.what, r,
              why.c_str());
        printf("  %-44s -> %s\n", c.what, why.c_str());
    }
    int r = 0;
    encode3(buf, kF32, 32, 16, 1, 128, 2048, 32, 16, 1, kMapSw128, &r, &why0);
    CHECK(r == 0, "a valid f32 map with 128B swizzle encodes: %s", why0.c_str());
    alignas(64) unsigned char raw[192];
    const uint64_t dims[1] = {64};
    const uint32_t box[1] = {64}, es[1] = {1}, bad_es[1] = {9};
    std::string why;
    CHECK(emu::rt::tensor_map_encode_tiled(raw + 8, kBF16, 1, buf, dims, nullptr, box, es, 0, 0, 0, 0, why) == 1 &&
              why.find("tensorMap") != std::string::npos,
          "a tensor map object not 64-byte aligned: %s", why.c_str());
    CHECK(emu::rt::tensor_map_encode_tiled(raw, kBF16, 6, buf, dims, nullptr, box, es, 0, 0, 0, 0, why) == 1 &&
              why.find("tensorRank") != std::string::npos,
          "rank 6: %s", why.c_str());
    CHECK(emu::rt::tensor_map_encode_tiled(raw, kBF16, 1, buf, dims, nullptr, box, bad_es, 0, 0, 0, 0, why) == 1 &&
              why.find("elementStrides[0]") != std::string::npos,
          "element stride 9: %s", why.c_str());
    CHECK(emu::rt::tensor_map_encode_tiled(raw, kBF16, 1, buf, dims, nullptr, box, es, 1, 0, 0, 0, why) == 1 &&
              why.find("interleave") != std::string::npos,
          "interleave 16B is refused as not emulated: %s", why.c_str());
    CHECK(emu::rt::tensor_map_encode_tiled(raw, kBF16, 1, buf, dims, nullptr, box, es, 0, 0, 0, 0, why) == 0,
          "a rank-1 map encodes: %s", why.c_str());
}

// ---- mbarrier phases -------------------------------------------------------------------------------

static void test_mbarrier_phases() {
    printf("mbarrier: phases, parity waits, expect_tx with several copies\n");
    std::vector<int> seen(4 * 64, -1);
    int early = 0;
    // Two arrivals per phase (thread 0 and thread 32); everyone waits for each of 4 phases.
    int e = run("mbarrier_phases", dim3(1), dim3(64), 0, [&] {
        auto& bar = emu::block_shared<uint64_t>(0);
        auto& value = emu::block_shared<int>(1);
        if (threadIdx.x == 0) mbarrier_init(&bar, 2);
        __syncthreads();
        mbarrier_wait(&bar, 1);  // the phase before phase 0 counts as completed: returns at once
        ++early;
        __syncthreads();
        for (int p = 0; p < 4; ++p) {
            if (threadIdx.x == 0) value = 100 + p;
            if (threadIdx.x % 32 == 0) mbarrier_arrive(&bar);
            mbarrier_wait(&bar, p & 1);
            seen[p * 64 + threadIdx.x] = value;
            __syncthreads();  // nobody arrives for phase p + 1 before all saw phase p
        }
    });
    expect_clean("mbarrier phases", e);
    bool ok = early == 64;
    for (int p = 0; p < 4; ++p)
        for (int t = 0; t < 64; ++t) ok &= seen[p * 64 + t] == 100 + p;
    CHECK(ok, "every thread passes each phase's wait after both arrivals, and wait(1) passes at phase 0");

    // expect_tx from two threads (count 2), each issuing two copies; all four land.
    std::vector<float> src(64 * 16);
    for (size_t i = 0; i < src.size(); ++i) src[i] = (float)i;
    const TmaMap map = encode3(src.data(), kF32, 64, 16, 1, 256, 4096, 32, 4, 1, kMapSwNone);
    std::vector<float> got(4 * 128);
    e = run("expect_tx_copies", dim3(1), dim3(64), 16 * 1024, [&] {
        auto& bar = emu::block_shared<uint64_t>(0);
        float* dst = reinterpret_cast<float*>(smem_aligned());
        if (threadIdx.x == 0) {
            mbarrier_init(&bar, 2);
            fence_barrier_init();
        }
        __syncthreads();
        if (threadIdx.x % 32 == 0) {
            const int w = threadIdx.x / 32;
            mbarrier_arrive_expect_tx(&bar, 2 * 512);
            tma_load_3d(dst + 256 * w, &map, &bar, 0, 4 * w, 0);
            tma_load_3d(dst + 256 * w + 128, &map, &bar, 32, 4 * w, 0);
        }
        mbarrier_wait(&bar, 0);
        if (threadIdx.x == 0) memcpy(got.data(), dst, 4 * 128 * sizeof(float));
    });
    expect_clean("expect_tx with four copies", e);
    ok = true;
    for (int w = 0; w < 2; ++w)
        for (int h = 0; h < 2; ++h)
            for (int r = 0; r < 4; ++r)
                for (int c = 0; c < 32; ++c) ok &= got[256 * w + 128 * h + 32 * r + c] == src[(4 * w + r) * 64 + 32 * h + c];
    CHECK(ok, "the four boxes landed where each was sent");
}

// ---- a warp-specialised pipeline -------------------------------------------------------------------

// C (64 x 64, f32) = A (64 x K) B^T (B: 64 x K), both K-major bf16 with 128B-swizzled 64 x 64 tiles.
// Warpgroup 0 consumes (wgmma), warpgroup 1's first lane produces (TMA) into a 2-stage ring guarded
// by full / empty mbarriers; named barrier 1 joins the consumers before the store.
constexpr int kPipeK = 256, kStages = 2;
constexpr uint32_t kTileBytes = 64 * 64 * 2;

__global__ void pipeline_gemm(const __grid_constant__ TmaMap map_a, const __grid_constant__ TmaMap map_b, float* c) {
    auto& full = emu::block_shared<uint64_t[kStages]>(0);
    auto& empty = emu::block_shared<uint64_t[kStages]>(1);
    unsigned char* tiles = smem_aligned();
    const int wg = threadIdx.x / 128;
    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; ++s) {
            mbarrier_init(&full[s], 1);
            mbarrier_init(&empty[s], 128);
        }
        fence_barrier_init();
    }
    __syncthreads();
    if (wg == 1) {
        setmaxnreg_dec<40>();
        if (threadIdx.x != 128) return;
        for (int kt = 0; kt < kPipeK / 64; ++kt) {
            const int s = kt % kStages;
            mbarrier_wait(&empty[s], ((kt / kStages) & 1) ^ 1);
            mbarrier_arrive_expect_tx(&full[s], 2 * kTileBytes);
            tma_load_3d(tiles + 2 * s * kTileBytes, &map_a, &full[s], kt * 64, 0, 0);
            tma_load_3d(tiles + (2 * s + 1) * kTileBytes, &map_b, &full[s], kt * 64, 0, 0);
        }
        return;
    }
    setmaxnreg_inc<232>();
    float acc[64 / 8][4] = {};
    for (int kt = 0; kt < kPipeK / 64; ++kt) {
        const int s = kt % kStages;
        mbarrier_wait(&full[s], (kt / kStages) & 1);
        const uint32_t a = smem_addr(tiles + 2 * s * kTileBytes), b = smem_addr(tiles + (2 * s + 1) * kTileBytes);
        wgmma_fence();
        for (int kk = 0; kk < 4; ++kk)
            wgmma_bf16_ss<64>(acc, wgmma_desc(a + 32 * kk, 16, 1024, kSwizzle128B),
                              wgmma_desc(b + 32 * kk, 16, 1024, kSwizzle128B));
        wgmma_commit();
        wgmma_wait<0>();
        mbarrier_arrive(&empty[s]);
    }
    named_barrier_sync(1, 128);
    frag_io(&acc[0][0], c, 64, true);
}

static void test_pipeline() {
    printf("warp-specialised TMA + wgmma GEMM pipeline under every schedule\n");
    const std::vector<uint16_t> A = random_bf16(64 * kPipeK, 7), B = random_bf16(64 * kPipeK, 8);
    TmaMap ma = encode3(A.data(), kBF16, kPipeK, 64, 1, kPipeK * 2, 64 * kPipeK * 2, 64, 64, 1, kMapSw128);
    TmaMap mb = encode3(B.data(), kBF16, kPipeK, 64, 1, kPipeK * 2, 64 * kPipeK * 2, 64, 64, 1, kMapSw128);
    std::vector<float> want(64 * 64);
    for (int r = 0; r < 64; ++r)
        for (int col = 0; col < 64; ++col) {
            float v = 0;
            for (int k0 = 0; k0 < kPipeK; k0 += 16) {
                double acc = 0;
                for (int k = k0; k < k0 + 16; ++k) acc += (double)bf2f(A[r * kPipeK + k]) * bf2f(B[col * kPipeK + k]);
                v = (float)((double)v + acc);
            }
            want[r * 64 + col] = v;
        }
    for (const char* sched : {"forward", "reverse", "random:1", "random:2", "random:3"}) {
        std::vector<float> c(64 * 64, NAN);
        float* cp = c.data();
        void* params[3] = {&ma, &mb, &cp};
        emu::KernelBody body = emu::bind_arguments(pipeline_gemm, params);
        emu::set_schedule(sched);
        const int e = run("pipeline_gemm", dim3(1), dim3(256), 2 * kStages * kTileBytes + 1024, body);
        emu::set_schedule(nullptr);
        expect_clean(sched, e);
        CHECK(memcmp(c.data(), want.data(), sizeof(float) * c.size()) == 0,
              "pipeline GEMM (%s) matches the reference bit for bit", sched);
    }
}

int main() {
    test_wgmma_layouts();
    test_tma_boxes();
    test_tensor_map_checks();
    test_mbarrier_phases();
    test_pipeline();
    printf("%d checks, %d failures\n", g_checks.load(), g_failures.load());
    return g_failures ? 1 : 0;
}
