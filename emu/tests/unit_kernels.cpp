// The project's real kernels on the emulated device, against scalar float64 references at small
// shapes, and the emulator's verdict on two deliberately broken variants of flash attention:
//   - kernels/rmsnorm.cu: rmsnorm_fwd_bf16, add_rmsnorm_fwd_bf16;
//   - kernels/flash_attn.cu: the forward at head dims 16..128 (GQA, ragged and length-1
//     sequences, several tiles), under every schedule mode, and the backward (preprocess, main,
//     dq add) against the reference gradients;
//   - flash_attn.cu with the forward's cp_async_wait<1>() made <2> (a copy consumed before it
//     lands): the emulator must report an error (copies never waited for) and the output differ;
//   - flash_attn.cu with the forward's V load ldmatrix_x4_trans made ldmatrix_x4 (a transposition
//     flipped): the output must differ from the reference.
// The sources are build.rs's transform of the kernels (`__shared__` rewritten); tests/emu_unit.rs
// writes them to its temporary directory as rmsnorm.emu.cpp, flash_attn.emu.cpp,
// flash_attn_mut_wait.emu.cpp and flash_attn_mut_trans.emu.cpp and compiles this file with -I there.
#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "common.cuh"
#include "emu_cuda.h"
#include "mma.cuh"
#include "attn_tile.cuh"  // at global scope: the namespaced kernel copies below share it (#pragma once)
#include "rmsnorm.emu.cpp"

// flash_attn.cu and its mutated variants, each in its own namespace (their templates differ; the
// helpers of common.cuh and mma.cuh are shared) with the variants' extern "C" entry points renamed.
namespace orig {
#include "flash_attn.emu.cpp"
}
#define flash_attn_fwd_hd16 mut_wait_flash_attn_fwd_hd16
#define flash_attn_fwd_hd32 mut_wait_flash_attn_fwd_hd32
#define flash_attn_fwd_hd64 mut_wait_flash_attn_fwd_hd64
#define flash_attn_fwd_hd128 mut_wait_flash_attn_fwd_hd128
#define flash_attn_bwd_hd16 mut_wait_flash_attn_bwd_hd16
#define flash_attn_bwd_hd32 mut_wait_flash_attn_bwd_hd32
#define flash_attn_bwd_hd64 mut_wait_flash_attn_bwd_hd64
#define flash_attn_bwd_hd128 mut_wait_flash_attn_bwd_hd128
#define flash_attn_bwd_preprocess mut_wait_flash_attn_bwd_preprocess
#define flash_attn_bwd_dq_add mut_wait_flash_attn_bwd_dq_add
namespace mut_wait {
#include "flash_attn_mut_wait.emu.cpp"
}
#undef flash_attn_fwd_hd16
#undef flash_attn_fwd_hd32
#undef flash_attn_fwd_hd64
#undef flash_attn_fwd_hd128
#undef flash_attn_bwd_hd16
#undef flash_attn_bwd_hd32
#undef flash_attn_bwd_hd64
#undef flash_attn_bwd_hd128
#undef flash_attn_bwd_preprocess
#undef flash_attn_bwd_dq_add
#define flash_attn_fwd_hd16 mut_trans_flash_attn_fwd_hd16
#define flash_attn_fwd_hd32 mut_trans_flash_attn_fwd_hd32
#define flash_attn_fwd_hd64 mut_trans_flash_attn_fwd_hd64
#define flash_attn_fwd_hd128 mut_trans_flash_attn_fwd_hd128
#define flash_attn_bwd_hd16 mut_trans_flash_attn_bwd_hd16
#define flash_attn_bwd_hd32 mut_trans_flash_attn_bwd_hd32
#define flash_attn_bwd_hd64 mut_trans_flash_attn_bwd_hd64
#define flash_attn_bwd_hd128 mut_trans_flash_attn_bwd_hd128
#define flash_attn_bwd_preprocess mut_trans_flash_attn_bwd_preprocess
#define flash_attn_bwd_dq_add mut_trans_flash_attn_bwd_dq_add
namespace mut_trans {
#include "flash_attn_mut_trans.emu.cpp"
}
#undef flash_attn_fwd_hd16
#undef flash_attn_fwd_hd32
#undef flash_attn_fwd_hd64
#undef flash_attn_fwd_hd128
#undef flash_attn_bwd_hd16
#undef flash_attn_bwd_hd32
#undef flash_attn_bwd_hd64
#undef flash_attn_bwd_hd128
#undef flash_attn_bwd_preprocess
#undef flash_attn_bwd_dq_add

static int g_checks = 0, g_failures = 0;
#define CHECK(cond, ...)                                              \
    do {                                                              \
        ++g_checks;                                                   \
        if (!(cond)) {                                                \
            ++g_failures;                                             \
            printf("  FAIL %s:%d: (%s) ", __FILE__, __LINE__, #cond); \
            printf(__VA_ARGS__);                                      \
            printf("\n");                                             \
        }                                                             \
    } while (0)

using bf16 = __nv_bfloat16;
static uint16_t f2bf(float f) { return __float2bfloat16_rn(f).__x; }
static float bf2f(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }
static bf16* B(std::vector<uint16_t>& v) { return reinterpret_cast<bf16*>(v.data()); }

struct Timer {
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    double s() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
};

template <class F>
static int run(const char* name, dim3 grid, dim3 block, size_t smem, F body) {
    emu::set_current_kernel(name);
    return emu::launch(grid, block, smem, std::function<void()>(body));
}

// ---- RMSNorm ---------------------------------------------------------------------------------------
static void test_rmsnorm() {
    printf("rmsnorm.cu\n");
    const float eps = 1e-6f;
    std::mt19937 rng(0);
    std::normal_distribution<float> nd;
    const int shapes[][2] = {{1, 896}, {7, 3584}, {33, 100}, {5, 1}, {3, 1544}, {64, 64}};
    for (auto& sh : shapes) {
        const int rows = sh[0], cols = sh[1];
        std::vector<uint16_t> x(rows * cols), w(cols), out(rows * cols, 0xffff);
        for (auto& v : x) v = f2bf(3 * nd(rng));
        for (auto& v : w) v = f2bf(1.5f * nd(rng));
        Timer t;
        const int e = run("rmsnorm_fwd_bf16", dim3(rows), dim3(256), 0,
                          [&] { rmsnorm_fwd_bf16(B(out), B(x), B(w), rows, cols, eps); });
        double worst = 0;
        for (int r = 0; r < rows; ++r) {
            double ss = 0;
            for (int c = 0; c < cols; ++c) ss += (double)bf2f(x[r * cols + c]) * bf2f(x[r * cols + c]);
            const double inv = 1 / std::sqrt(ss / cols + eps);
            for (int c = 0; c < cols; ++c) {
                const double ref = bf2f(x[r * cols + c]) * inv * bf2f(w[c]);
                const double got = bf2f(out[r * cols + c]);
                worst = std::max(worst, std::isnan(got) ? 1e9 : std::fabs(got - ref) / std::max(std::fabs(ref), 1e-30));
            }
        }
        printf("  rmsnorm_fwd_bf16 [%d, %d]: %d errors, %.1f ms, max rel err %.2e\n", rows, cols, e, 1e3 * t.s(),
               worst);
        CHECK(e == 0 && worst <= 1.0 / 256, "rmsnorm_fwd [%d,%d]: errors %d, max rel err %g (bound 2^-8)", rows, cols,
              e, worst);
    }
    // Fused add: residual += delta (bf16), out = rmsnorm(residual) * w.
    const int rows = 9, cols = 896;
    std::vector<uint16_t> res(rows * cols), delta(rows * cols), w(cols), out(rows * cols, 0xffff);
    for (auto& v : res) v = f2bf(3 * nd(rng));
    for (auto& v : delta) v = f2bf(nd(rng));
    for (auto& v : w) v = f2bf(1.5f * nd(rng));
    std::vector<uint16_t> want_res(rows * cols);
    for (int i = 0; i < rows * cols; ++i) want_res[i] = f2bf(bf2f(res[i]) + bf2f(delta[i]));
    const int e = run("add_rmsnorm_fwd_bf16", dim3(rows), dim3(256), 0,
                      [&] { add_rmsnorm_fwd_bf16(B(out), B(res), B(delta), B(w), rows, cols, eps); });
    double worst = 0;
    for (int r = 0; r < rows; ++r) {
        double ss = 0;
        for (int c = 0; c < cols; ++c) ss += (double)bf2f(want_res[r * cols + c]) * bf2f(want_res[r * cols + c]);
        const double inv = 1 / std::sqrt(ss / cols + eps);
        for (int c = 0; c < cols; ++c) {
            const double ref = bf2f(want_res[r * cols + c]) * inv * bf2f(w[c]);
            worst = std::max(worst, std::fabs(bf2f(out[r * cols + c]) - ref) / std::max(std::fabs(ref), 1e-30));
        }
    }
    printf("  add_rmsnorm_fwd_bf16 [%d, %d]: %d errors, residual %s, max rel err %.2e\n", rows, cols, e,
           res == want_res ? "bit-exact" : "WRONG", worst);
    CHECK(e == 0 && res == want_res && worst <= 1.0 / 256, "add_rmsnorm_fwd: errors %d, max rel err %g", e, worst);
}

// ---- flash attention ---------------------------------------------------------------------------------
using FwdFn = void (*)(const bf16*, const bf16*, const bf16*, bf16*, float*, const int*, int, int, int, float);
static FwdFn fwd_kernel(const char* variant, int D) {
    const std::string v = variant;
    if (v == "mut_wait")
        return D == 16   ? mut_wait::mut_wait_flash_attn_fwd_hd16
               : D == 32 ? mut_wait::mut_wait_flash_attn_fwd_hd32
               : D == 64 ? mut_wait::mut_wait_flash_attn_fwd_hd64
                         : mut_wait::mut_wait_flash_attn_fwd_hd128;
    if (v == "mut_trans")
        return D == 16   ? mut_trans::mut_trans_flash_attn_fwd_hd16
               : D == 32 ? mut_trans::mut_trans_flash_attn_fwd_hd32
               : D == 64 ? mut_trans::mut_trans_flash_attn_fwd_hd64
                         : mut_trans::mut_trans_flash_attn_fwd_hd128;
    return D == 16   ? orig::flash_attn_fwd_hd16
           : D == 32 ? orig::flash_attn_fwd_hd32
           : D == 64 ? orig::flash_attn_fwd_hd64
                     : orig::flash_attn_fwd_hd128;
}

struct Attn {
    std::vector<int> seqlens, cu;
    int heads, kv_heads, D, T;
    float scale;
    std::vector<uint16_t> q, k, v, d_out;
    std::vector<double> ref_out, ref_lse, ref_dq, ref_dk, ref_dv;

    Attn(std::vector<int> s, int h, int kvh, int d, unsigned seed) : seqlens(s), heads(h), kv_heads(kvh), D(d) {
        T = 0;
        cu = {0};
        for (int n : seqlens) cu.push_back(T += n);
        scale = 1.0f / std::sqrt((float)D);
        std::mt19937 rng(seed);
        std::normal_distribution<float> nd;
        q.resize((size_t)T * heads * D);
        k.resize((size_t)T * kv_heads * D);
        v.resize(k.size());
        d_out.resize(q.size());
        for (auto& x : q) x = f2bf(nd(rng));
        for (auto& x : k) x = f2bf(nd(rng));
        for (auto& x : v) x = f2bf(nd(rng));
        for (auto& x : d_out) x = f2bf(nd(rng));
        reference();
    }
    double Q(int t, int h, int d) const { return bf2f(q[((size_t)t * heads + h) * D + d]); }
    double K(int t, int h, int d) const { return bf2f(k[((size_t)t * kv_heads + h) * D + d]); }
    double V(int t, int h, int d) const { return bf2f(v[((size_t)t * kv_heads + h) * D + d]); }
    double dO(int t, int h, int d) const { return bf2f(d_out[((size_t)t * heads + h) * D + d]); }

    // Causal GQA attention and its gradients in float64, straight from the definitions.
    void reference() {
        ref_out.assign(q.size(), 0);
        ref_lse.assign((size_t)T * heads, 0);
        ref_dq.assign(q.size(), 0);
        ref_dk.assign(k.size(), 0);
        ref_dv.assign(v.size(), 0);
        const int group = heads / kv_heads;
        for (size_t s = 0; s < seqlens.size(); ++s) {
            const int n = seqlens[s], s0 = cu[s];
            for (int h = 0; h < heads; ++h) {
                const int kh = h / group;
                std::vector<double> P((size_t)n * n, 0.0), O((size_t)n * D, 0.0);
                for (int i = 0; i < n; ++i) {
                    double m = -INFINITY;
                    for (int j = 0; j <= i; ++j) {
                        double acc = 0;
                        for (int d = 0; d < D; ++d) acc += Q(s0 + i, h, d) * K(s0 + j, kh, d);
                        P[(size_t)i * n + j] = scale * acc;
                        m = std::max(m, scale * acc);
                    }
                    double l = 0;
                    for (int j = 0; j <= i; ++j) l += P[(size_t)i * n + j] = std::exp(P[(size_t)i * n + j] - m);
                    for (int j = 0; j <= i; ++j) P[(size_t)i * n + j] /= l;
                    ref_lse[(size_t)(s0 + i) * heads + h] = m + std::log(l);
                    for (int d = 0; d < D; ++d) {
                        double o = 0;
                        for (int j = 0; j <= i; ++j) o += P[(size_t)i * n + j] * V(s0 + j, kh, d);
                        O[(size_t)i * D + d] = o;
                        ref_out[((size_t)(s0 + i) * heads + h) * D + d] = o;
                    }
                }
                for (int i = 0; i < n; ++i) {
                    double Di = 0;
                    for (int d = 0; d < D; ++d) Di += dO(s0 + i, h, d) * O[(size_t)i * D + d];
                    for (int j = 0; j <= i; ++j) {
                        const double p = P[(size_t)i * n + j];
                        double dp = 0;
                        for (int d = 0; d < D; ++d) {
                            dp += dO(s0 + i, h, d) * V(s0 + j, kh, d);
                            ref_dv[((size_t)(s0 + j) * kv_heads + kh) * D + d] += p * dO(s0 + i, h, d);
                        }
                        const double ds = p * (dp - Di);
                        for (int d = 0; d < D; ++d) {
                            ref_dq[((size_t)(s0 + i) * heads + h) * D + d] += scale * ds * K(s0 + j, kh, d);
                            ref_dk[((size_t)(s0 + j) * kv_heads + kh) * D + d] += scale * ds * Q(s0 + i, h, d);
                        }
                    }
                }
            }
        }
    }

    int max_seqlen() const { return *std::max_element(seqlens.begin(), seqlens.end()); }

    struct FwdResult {
        int errors;
        double err_out, err_lse, seconds;
        int nan;
        std::vector<uint16_t> out;
        std::vector<float> lse;
    };
    FwdResult forward(const char* variant) const {
        FwdResult r;
        r.out.assign(q.size(), 0xffff);  // NaN-poisoned
        r.lse.assign((size_t)T * heads, NAN);
        // Q, K, V tiles, then each thread's folded O (attn_tile.cuh's segment fold).
        const size_t smem = (128 + 2 * 64) * (D + 8) * 2 + 256 * D * 2;
        const dim3 grid((max_seqlen() + 127) / 128, heads, seqlens.size());
        FwdFn fn = fwd_kernel(variant, D);
        Timer t;
        r.errors = run("flash_attn_fwd", grid, dim3(256), smem, [&] {
            fn(reinterpret_cast<const bf16*>(q.data()), reinterpret_cast<const bf16*>(k.data()),
               reinterpret_cast<const bf16*>(v.data()), reinterpret_cast<bf16*>(r.out.data()), r.lse.data(), cu.data(),
               heads, kv_heads, 512, scale);  // 512: the engine's canonical segment (SEGMENT_KEYS)
        });
        r.seconds = t.s();
        r.err_out = r.err_lse = 0;
        r.nan = 0;
        for (size_t i = 0; i < r.out.size(); ++i) {
            const double g = bf2f(r.out[i]);
            r.nan += std::isnan(g);
            r.err_out = std::max(r.err_out, std::isnan(g) ? INFINITY : std::fabs(g - ref_out[i]));
        }
        for (size_t i = 0; i < r.lse.size(); ++i) {
            r.nan += std::isnan(r.lse[i]);
            r.err_lse = std::max(r.err_lse, std::isnan(r.lse[i]) ? INFINITY : std::fabs(r.lse[i] - ref_lse[i]));
        }
        return r;
    }
    std::string name() const {
        std::string s = "hd" + std::to_string(D) + " seqlens [";
        for (size_t i = 0; i < seqlens.size(); ++i) s += (i ? "," : "") + std::to_string(seqlens[i]);
        return s + "] heads " + std::to_string(heads) + "/" + std::to_string(kv_heads);
    }
};

// Error budget of the forward: P rounded to bf16 for the second MMA (relative 2^-9) and the output
// rounded once: ~1e-2 absolute at |v| ~ 1; lse is fp32 throughout.
constexpr double kOutTol = 2e-2, kLseTol = 1e-3;

static void test_flash_forward() {
    printf("flash_attn.cu forward\n");
    const Attn cases[] = {Attn({100, 100}, 2, 1, 64, 0), Attn({37, 200}, 4, 2, 64, 1), Attn({1, 130}, 2, 2, 128, 2),
                          Attn({65, 17}, 3, 1, 32, 3),   Attn({129}, 2, 1, 16, 4),     Attn({40, 90}, 7, 1, 128, 5)};
    for (const Attn& a : cases) {
        const auto r = a.forward("orig");
        printf("  %-34s %d errors, %.3f s, max|out-ref| %.2e, max|lse-ref| %.2e, NaN %d\n", a.name().c_str(), r.errors,
               r.seconds, r.err_out, r.err_lse, r.nan);
        CHECK(r.errors == 0 && r.nan == 0 && r.err_out < kOutTol && r.err_lse < kLseTol, "forward %s",
              a.name().c_str());
    }
    // The kernel is race-free: every schedule gives the same bits.
    const Attn& a = cases[1];
    const auto base = a.forward("orig");
    for (const char* sched : {"reverse", "random:1", "random:2"}) {
        emu::set_schedule(sched);
        const auto r = a.forward("orig");
        emu::set_schedule(nullptr);
        printf("  %-34s schedule %-9s %d errors, %.3f s, output %s\n", a.name().c_str(), sched, r.errors, r.seconds,
               r.out == base.out && memcmp(r.lse.data(), base.lse.data(), 4 * r.lse.size()) == 0 ? "identical"
                                                                                                 : "DIFFERS");
        CHECK(r.errors == 0 && r.out == base.out && memcmp(r.lse.data(), base.lse.data(), 4 * r.lse.size()) == 0,
              "forward under %s differs from forward", sched);
    }
}

static void test_flash_backward() {
    printf("flash_attn.cu backward (preprocess, main, dq add)\n");
    const Attn cases[] = {Attn({100, 100}, 2, 1, 64, 0), Attn({37, 200}, 4, 2, 64, 1), Attn({1, 130}, 2, 2, 128, 2),
                          Attn({65, 17}, 3, 1, 32, 3), Attn({129}, 2, 1, 16, 4)};
    for (const Attn& a : cases) {
        auto fwd = a.forward("orig");
        const int T = a.T, H = a.heads, D = a.D, KVH = a.kv_heads;
        std::vector<float> lse_log2((size_t)H * T, NAN), delta((size_t)H * T, NAN), dq_acc((size_t)T * H * D, NAN);
        std::vector<uint16_t> dq((size_t)T * H * D, 0), dk((size_t)T * KVH * D, 0), dv((size_t)T * KVH * D, 0);
        const size_t chunks = (size_t)T * H * D / 8;
        Timer t;
        const int e1 = run("flash_attn_bwd_preprocess", dim3((chunks + 255) / 256), dim3(256), 0, [&] {
            orig::flash_attn_bwd_preprocess(B(fwd.out), reinterpret_cast<const bf16*>(a.d_out.data()), fwd.lse.data(),
                                            lse_log2.data(), delta.data(), dq_acc.data(), T, H, D);
        });
        const int BN = 128, BM = 64, row = D + 8;
        const size_t smem = 2 * BN * row * 2 + 2 * 2 * BM * row * 2 + BN * (BM + 8) * 2 + 2 * 2 * BM * 4;
        using BwdFn = decltype(&orig::flash_attn_bwd_hd64);
        BwdFn fn = D == 16   ? orig::flash_attn_bwd_hd16
                   : D == 32 ? orig::flash_attn_bwd_hd32
                   : D == 64 ? orig::flash_attn_bwd_hd64
                             : orig::flash_attn_bwd_hd128;
        const int e2 =
            run("flash_attn_bwd", dim3((a.max_seqlen() + BN - 1) / BN, KVH, a.seqlens.size()), dim3(256), smem, [&] {
                fn(reinterpret_cast<const bf16*>(a.q.data()), reinterpret_cast<const bf16*>(a.k.data()),
                   reinterpret_cast<const bf16*>(a.v.data()), reinterpret_cast<const bf16*>(a.d_out.data()),
                   lse_log2.data(), delta.data(), dq_acc.data(), B(dk), B(dv), a.cu.data(), T, H, KVH, a.scale);
            });
        const int e3 = run("flash_attn_bwd_dq_add", dim3((chunks + 255) / 256), dim3(256), 0,
                           [&] { orig::flash_attn_bwd_dq_add(dq_acc.data(), B(dq), chunks, a.scale); });
        const double secs = t.s();
        auto rel = [](const std::vector<uint16_t>& got, const std::vector<double>& ref, int& nan) {
            double err = 0, mx = 0;
            for (size_t i = 0; i < got.size(); ++i) {
                const double g = bf2f(got[i]);
                nan += std::isnan(g);
                err = std::max(err, std::fabs(g - ref[i]));
                mx = std::max(mx, std::fabs(ref[i]));
            }
            return err / mx;
        };
        int nan = 0;
        const double rq = rel(dq, a.ref_dq, nan), rk = rel(dk, a.ref_dk, nan), rv = rel(dv, a.ref_dv, nan);
        printf("  %-34s errors %d/%d/%d, %.3f s, max err / max|ref|: dq %.2e dk %.2e dv %.2e, NaN %d\n",
               a.name().c_str(), e1, e2, e3, secs, rq, rk, rv, nan);
        CHECK(e1 == 0 && e2 == 0 && e3 == 0 && nan == 0 && rq < 2e-2 && rk < 2e-2 && rv < 2e-2, "backward %s",
              a.name().c_str());
    }
}

// ---- mutations -----------------------------------------------------------------------------------------
static void test_mutations() {
    printf("flash_attn.cu forward, deliberately broken\n");
    const Attn a({100, 100}, 2, 1, 64, 0);
    {
        fflush(stdout);
        const auto r = a.forward("mut_wait");
        const std::string& text = emu::last_launch_errors();
        printf("  cp_async_wait<1> -> <2>: %d errors (\"%s\"), max|out-ref| %.2e, NaN %d\n", r.errors,
               text.substr(0, text.find('\n')).c_str(), r.err_out, r.nan);
        CHECK(r.errors > 0 && text.find("never waited for") != std::string::npos,
              "the emulator must report copies never waited for");
        CHECK(!(r.err_out < kOutTol), "the mutated forward must not match the reference");
    }
    {
        const auto r = a.forward("mut_trans");
        printf("  ldmatrix_x4_trans -> ldmatrix_x4 (V): %d errors, max|out-ref| %.2e, NaN %d\n", r.errors, r.err_out,
               r.nan);
        CHECK(!(r.err_out < kOutTol), "a flipped transposition must not match the reference");
    }
}

int main(int argc, char** argv) {
    const std::string only = argc > 1 ? argv[1] : "";
    if (only.empty() || only == "rmsnorm") test_rmsnorm();
    if (only.empty() || only == "forward") test_flash_forward();
    if (only.empty() || only == "backward") test_flash_backward();
    if (only.empty() || only == "mutations") test_mutations();
    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
