// Unit tests of the emulated CUDA device (emu/include/emu_cuda.h, emu/runtime*.cpp), with small
// kernels written here: fragment layouts of ldmatrix and mma.sync against the PTX ISA's tables and
// against a scalar matmul, shuffles and votes, atomics, cp.async groups, and shared memory. The
// diagnostics on deliberately bad kernels, the schedule modes, launches on several OS threads and
// the guard pages are in emu/tests/unit_diagnostics.cpp.
//
//   g++ -std=c++17 -O2 -fno-strict-aliasing -DSWERVE_EMU -I emu/include -I kernels
//       emu/runtime*.cpp emu/tests/unit.cpp -o emu_unit -lpthread && ./emu_unit
// (tests/emu_unit.rs does this, and also runs emu/tests/unit_kernels.cpp on the real kernels.)
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "unit_check.h"


// =================================================================================================
// ldmatrix: register-level layout against the PTX ISA's figure for ldmatrix .m8n8 .b16 (each row
// of a matrix is spread over 4 consecutive lanes, 2 elements each; .trans spreads the columns).
// The rows are stored in shuffled order with a padded stride, so each lane's row address matters.
// =================================================================================================
static void test_ldmatrix_layout() {
    printf("ldmatrix fragment layouts (.x1 .x2 .x4, plain and .trans)\n");
    const int stride = 24;                         // elements per stored row (48 bytes: 16-byte aligned)
    const int perm[8] = {5, 2, 7, 0, 3, 6, 1, 4};  // row r of each matrix is stored in slot perm[r]
    auto value = [](int m, int r, int c) { return (uint16_t)(0x1000 * (m + 1) + 16 * r + c); };
    for (int num : {1, 2, 4}) {
        for (int trans = 0; trans < 2; ++trans) {
            std::vector<uint32_t> out(32 * 4, 0);
            const int errors = run("ldmatrix_layout", dim3(1), dim3(32), 4 * 8 * stride * 2, [&] {
                uint16_t* s = reinterpret_cast<uint16_t*>(emu::dynamic_smem());
                const int l = lane_id();
                // Lane l writes matrix l / 8, row l % 8.
                const int m = l / 8, r = l % 8;
                for (int c = 0; c < 8; ++c) s[(m * 8 + perm[r]) * stride + c] = value(m, r, c);
                __syncthreads();
                uint32_t regs[4] = {0, 0, 0, 0};
                emu::ldmatrix(regs, num, s + (m * 8 + perm[r]) * stride, trans, __FILE__, __LINE__);
                for (int i = 0; i < 4; ++i) out[l * 4 + i] = regs[i];
            });
            expect_clean("ldmatrix_layout", errors);
            int bad = 0;
            for (int l = 0; l < 32; ++l) {
                for (int m = 0; m < num; ++m) {
                    // PTX ISA, ldmatrix: "each thread receives 2 elements of a row (or, .trans, of a
                    // column): thread 4r + j holds elements (r, 2j) and (r, 2j + 1)".
                    const int r = l / 4, j = l % 4;
                    const uint16_t lo = trans ? value(m, 2 * j, r) : value(m, r, 2 * j);
                    const uint16_t hi = trans ? value(m, 2 * j + 1, r) : value(m, r, 2 * j + 1);
                    const uint32_t want = lo | ((uint32_t)hi << 16);
                    if (out[l * 4 + m] != want && bad++ < 4)
                        printf("  lane %d matrix %d: got 0x%08x want 0x%08x\n", l, m, out[l * 4 + m], want);
                }
                for (int m = num; m < 4; ++m) bad += out[l * 4 + m] != 0;  // untouched registers
            }
            CHECK(bad == 0, "ldmatrix .x%d%s: %d wrong registers", num, trans ? ".trans" : "", bad);
        }
    }
}

// =================================================================================================
// mma.sync m16n8k16 bf16: registers built by the PTX ISA's fragment formulas ("Matrix Fragments for
// mma.m16n8k16 with floating point type"), written here independently of the runtime.
// =================================================================================================
static void test_mma_fragments() {
    printf("mma.sync m16n8k16 fragments against the PTX ISA formulas\n");
    std::mt19937 rng(3);
    std::uniform_int_distribution<int> small(-8, 8);
    float A[16][16], B[16][8], C[16][8];
    for (auto& r : A)
        for (float& x : r) x = small(rng) * 0.25f;  // exact in bf16, products and sums exact in f32
    for (auto& r : B)
        for (float& x : r) x = small(rng) * 0.5f;
    for (auto& r : C)
        for (float& x : r) x = small(rng);
    std::vector<float> D(32 * 4);
    const int errors = run("mma_fragments", dim3(1), dim3(32), 0, [&] {
        const int lane = lane_id(), group = lane >> 2, tig = lane % 4;
        uint16_t a[8], b[4];
        for (int i = 0; i < 8; ++i) {
            const int row = (i < 2 || (i >= 4 && i < 6)) ? group : group + 8;
            const int col = tig * 2 + (i & 1) + (i >= 4 ? 8 : 0);
            a[i] = f2bf(A[row][col]);
        }
        for (int i = 0; i < 4; ++i) {
            const int row = tig * 2 + (i & 1) + (i >= 2 ? 8 : 0), col = group;
            b[i] = f2bf(B[row][col]);
        }
        float d[4];
        for (int i = 0; i < 4; ++i) d[i] = C[group + (i >= 2 ? 8 : 0)][tig * 2 + (i & 1)];
        const uint32_t areg[4] = {a[0] | (uint32_t)a[1] << 16, a[2] | (uint32_t)a[3] << 16, a[4] | (uint32_t)a[5] << 16,
                                  a[6] | (uint32_t)a[7] << 16};
        emu::mma_bf16_m16n8k16(d, areg, b[0] | (uint32_t)b[1] << 16, b[2] | (uint32_t)b[3] << 16, __FILE__, __LINE__);
        for (int i = 0; i < 4; ++i) D[lane * 4 + i] = d[i];
    });
    expect_clean("mma_fragments", errors);
    int bad = 0;
    for (int lane = 0; lane < 32; ++lane) {
        for (int i = 0; i < 4; ++i) {
            const int row = (lane >> 2) + (i >= 2 ? 8 : 0), col = (lane % 4) * 2 + (i & 1);
            float want = C[row][col];
            for (int k = 0; k < 16; ++k) want += A[row][k] * B[k][col];
            if (D[lane * 4 + i] != want && bad++ < 4)
                printf("  lane %d c%d: got %g want %g\n", lane, i, D[lane * 4 + i], want);
        }
    }
    CHECK(bad == 0, "mma fragments: %d wrong accumulators", bad);
}

// =================================================================================================
// A 16 x 32 x 16 product through shared memory, ldmatrix and mma.sync, the way the attention kernels
// address their tiles (A: ldmatrix x4; B stored [n][k]: plain ldmatrix x4 like K; B stored [k][n]:
// ldmatrix x4 .trans like V), against a scalar matmul.
// =================================================================================================
static void test_mma_product() {
    printf("16x32x16 matmul via ldmatrix (+ .trans) and mma.sync against a scalar model\n");
    constexpr int M = 16, K = 32, N = 16, S = 40;  // S: padded row stride in elements (80 bytes)
    std::mt19937 rng(5);
    std::normal_distribution<float> nd;
    std::vector<uint16_t> a(M * K), b(K * N);  // row-major
    for (auto& x : a) x = f2bf(nd(rng));
    for (auto& x : b) x = f2bf(nd(rng));
    double want[M][N];
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
            double s = 0;
            for (int k = 0; k < K; ++k) s += (double)bf2f(a[i * K + k]) * bf2f(b[k * N + j]);
            want[i][j] = s;
        }
    for (int via_trans = 0; via_trans < 2; ++via_trans) {
        std::vector<float> out(M * N, NAN);
        const size_t smem = (M * S + K * S + N * S) * 2;
        const int errors = run("mma_product", dim3(1), dim3(32), smem, [&] {
            uint16_t* sA = reinterpret_cast<uint16_t*>(emu::dynamic_smem());
            uint16_t* sB = sA + M * S;   // [k][n]
            uint16_t* sBt = sB + K * S;  // [n][k]
            const int lane = lane_id();
            for (int i = lane; i < M * K; i += 32) sA[(i / K) * S + i % K] = a[i];
            for (int i = lane; i < K * N; i += 32) {
                sB[(i / N) * S + i % N] = b[i];
                sBt[(i % N) * S + i / N] = b[i];
            }
            __syncthreads();
            float acc[2][4] = {};  // two n8 tiles
            for (int kk = 0; kk < K / 16; ++kk) {
                uint32_t af[4], bf[4];
                emu::ldmatrix(af, 4, sA + (lane % 8 + ((lane / 8) % 2) * 8) * S + kk * 16 + (lane / 16) * 8, false,
                              __FILE__, __LINE__);
                if (via_trans) {
                    emu::ldmatrix(bf, 4, sB + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * S + (lane / 16) * 8, true,
                                  __FILE__, __LINE__);
                } else {
                    emu::ldmatrix(bf, 4, sBt + (lane % 8 + (lane / 16) * 8) * S + kk * 16 + ((lane / 8) % 2) * 8, false,
                                  __FILE__, __LINE__);
                }
                emu::mma_bf16_m16n8k16(acc[0], af, bf[0], bf[1], __FILE__, __LINE__);
                emu::mma_bf16_m16n8k16(acc[1], af, bf[2], bf[3], __FILE__, __LINE__);
            }
            for (int nt = 0; nt < 2; ++nt)
                for (int e = 0; e < 4; ++e)
                    out[(lane / 4 + (e / 2) * 8) * N + nt * 8 + 2 * (lane % 4) + e % 2] = acc[nt][e];
        });
        expect_clean("mma_product", errors);
        double worst = 0;
        for (int i = 0; i < M; ++i)
            for (int j = 0; j < N; ++j)
                worst = std::max(worst, std::fabs(out[i * N + j] - want[i][j]) / (1 + std::fabs(want[i][j])));
        CHECK(worst < 1e-6, "matmul with B via %s: max relative error %g", via_trans ? "ldmatrix .trans" : "ldmatrix",
              worst);
    }
}

// =================================================================================================
// Shuffles: every mode at widths 32..1 with several offsets, for 2-, 4- and 8-byte types, against
// the CUDA Programming Guide's "Warp Shuffle Functions" definitions; a half-warp mask; votes;
// __syncwarp as a rendezvous.
// =================================================================================================
static int shfl_model(int mode, int lane, int arg, int w) {
    const int seg = lane / w * w;
    switch (mode) {
        case 0:
            return seg + ((arg % w) + w) % w;  // srcLane modulo width
        case 1:
            return lane - seg >= arg ? lane - arg : lane;  // up: unchanged below delta
        case 2:
            return lane - seg + arg < w ? lane + arg : lane;  // down: unchanged past the end
        default:
            return (lane ^ arg) < seg + w ? (lane ^ arg) : lane;  // xor: later segments not visible
    }
}

static void test_shfl() {
    printf("shuffles (idx/up/down/xor, widths 32..1, 16/32/64-bit), votes, __syncwarp\n");
    const int widths[] = {32, 16, 8, 4, 2, 1};
    const int args[] = {0, 1, 3, 5, 8, 17, 31, -1};
    struct Combo {
        int mode, w, arg;
    };
    std::vector<Combo> combos;
    for (int mode = 0; mode < 4; ++mode)
        for (int w : widths)
            for (int arg : args)
                if (mode == 0 || arg >= 0) combos.push_back({mode, w, arg});
    const int n = 64;
    std::vector<int> got_i(combos.size() * n), got_f(combos.size() * n);
    std::vector<long long> got_d(combos.size() * n);
    std::vector<int> got_h(combos.size() * n);
    const int errors = run("shfl_all", dim3(1), dim3(n), 0, [&] {
        const int t = threadIdx.x;
        for (size_t c = 0; c < combos.size(); ++c) {
            const Combo k = combos[c];
            const int vi = 1000 + t;
            const float vf = 0.5f * t;
            const double vd = 1e12 + t;  // needs all 8 bytes
            const __nv_bfloat16 vh = __float2bfloat16_rn((float)t);
            int ri;
            float rf;
            double rd;
            __nv_bfloat16 rh;
            switch (k.mode) {
                case 0:
                    ri = __shfl_sync(0xffffffffu, vi, k.arg, k.w);
                    rf = __shfl_sync(0xffffffffu, vf, k.arg, k.w);
                    rd = __shfl_sync(0xffffffffu, vd, k.arg, k.w);
                    rh = __shfl_sync(0xffffffffu, vh, k.arg, k.w);
                    break;
                case 1:
                    ri = __shfl_up_sync(0xffffffffu, vi, k.arg, k.w);
                    rf = __shfl_up_sync(0xffffffffu, vf, k.arg, k.w);
                    rd = __shfl_up_sync(0xffffffffu, vd, k.arg, k.w);
                    rh = __shfl_up_sync(0xffffffffu, vh, k.arg, k.w);
                    break;
                case 2:
                    ri = __shfl_down_sync(0xffffffffu, vi, k.arg, k.w);
                    rf = __shfl_down_sync(0xffffffffu, vf, k.arg, k.w);
                    rd = __shfl_down_sync(0xffffffffu, vd, k.arg, k.w);
                    rh = __shfl_down_sync(0xffffffffu, vh, k.arg, k.w);
                    break;
                default:
                    ri = __shfl_xor_sync(0xffffffffu, vi, k.arg, k.w);
                    rf = __shfl_xor_sync(0xffffffffu, vf, k.arg, k.w);
                    rd = __shfl_xor_sync(0xffffffffu, vd, k.arg, k.w);
                    rh = __shfl_xor_sync(0xffffffffu, vh, k.arg, k.w);
                    break;
            }
            got_i[c * n + t] = ri;
            got_f[c * n + t] = (int)(rf * 2);
            got_d[c * n + t] = (long long)(rd - 1e12);
            got_h[c * n + t] = (int)__bfloat162float(rh);
        }
    });
    expect_clean("shfl_all", errors);
    int bad = 0;
    for (size_t c = 0; c < combos.size(); ++c) {
        for (int t = 0; t < n; ++t) {
            const int lane = t % 32, warp_base = t - lane;
            const int src = warp_base + shfl_model(combos[c].mode, lane, combos[c].arg, combos[c].w);
            const bool ok = got_i[c * n + t] == 1000 + src && got_f[c * n + t] == src && got_d[c * n + t] == src &&
                            got_h[c * n + t] == src;
            if (!ok && bad++ < 5)
                printf("  mode %d width %d arg %d thread %d: got %d/%d/%lld/%d, want source %d\n", combos[c].mode,
                       combos[c].w, combos[c].arg, t, got_i[c * n + t] - 1000, got_f[c * n + t], got_d[c * n + t],
                       got_h[c * n + t], src);
        }
    }
    CHECK(bad == 0, "shuffles: %d wrong results over %zu combinations", bad, combos.size());

    // Half-warp masks: lanes 0-15 and 16-31 shuffle separately (different call sites).
    std::vector<int> half(32);
    int e = run("shfl_half_masks", dim3(1), dim3(32), 0, [&] {
        const int l = lane_id();
        int v;
        if (l < 16)
            v = __shfl_xor_sync(0x0000ffffu, l, 1);
        else
            v = __shfl_down_sync(0xffff0000u, l, 2, 16);
        half[l] = v;
    });
    expect_clean("shfl_half_masks", e);
    bad = 0;
    for (int l = 0; l < 32; ++l) bad += half[l] != (l < 16 ? (l ^ 1) : (l % 16 + 2 < 16 ? l + 2 : l));
    CHECK(bad == 0, "half-warp shuffles: %d wrong", bad);

    // Votes and __activemask.
    std::vector<unsigned> votes(32 * 4);
    e = run("votes", dim3(1), dim3(32), 0, [&] {
        const int l = lane_id();
        votes[l * 4 + 3] = __activemask();  // first: no lane has exited yet (see emu_cuda.h)
        votes[l * 4 + 0] = __ballot_sync(0xffffffffu, l % 3 == 0);
        votes[l * 4 + 1] = __any_sync(0xffffffffu, l == 17);
        votes[l * 4 + 2] = __all_sync(0xffffffffu, l < 31);
    });
    expect_clean("votes", e);
    unsigned want_ballot = 0;
    for (int l = 0; l < 32; l += 3) want_ballot |= 1u << l;
    bad = 0;
    for (int l = 0; l < 32; ++l)
        bad += votes[l * 4] != want_ballot || votes[l * 4 + 1] != 1 || votes[l * 4 + 2] != 0 ||
               votes[l * 4 + 3] != 0xffffffffu;
    CHECK(bad == 0, "votes: %d lanes wrong", bad);

    // __syncwarp orders shared-memory traffic between the lanes of a warp in every schedule.
    for (const char* sched : {"forward", "reverse", "random:11"}) {
        emu::set_schedule(sched);
        std::vector<float> got(32);
        e = run("syncwarp", dim3(1), dim3(32), 0, [&] {
            auto& s = emu::block_shared<float[32]>(1);
            const int l = lane_id();
            s[l] = (float)l;
            __syncwarp();
            got[l] = s[(l + 1) % 32];
        });
        expect_clean("syncwarp", e);
        bad = 0;
        for (int l = 0; l < 32; ++l) bad += got[l] != (float)((l + 1) % 32);
        CHECK(bad == 0, "__syncwarp under %s: %d lanes read a stale value", sched, bad);
    }
    emu::set_schedule(nullptr);
}

// =================================================================================================
// Atomics: float/double/int/unsigned/64-bit add, max/min (incl. 64-bit, as sampling.cu's argmax),
// CAS loops, exchange, bitwise, inc/dec.
// =================================================================================================
static void test_atomics() {
    printf("atomics\n");
    const int blocks = 4, threads = 128, n = blocks * threads;
    float fsum = 0;
    double dsum = 0;
    int counter = 0, imax = -1000, imin = 1000, cas_counter = 0, sub = 0;
    unsigned umax = 0, uor = 0, inc = 0, dec = 0;
    unsigned long long ull_sum = 0, ull_max = 0;
    int exch = -1;
    std::vector<int> tickets(n, -1), exch_old(n, -2);
    const int e = run("atomics", dim3(blocks), dim3(threads), 0, [&] {
        const int i = blockIdx.x * blockDim.x + threadIdx.x;
        atomicAdd(&fsum, 0.5f);
        atomicAdd(&dsum, 0.25);
        tickets[i] = atomicAdd(&counter, 1);
        atomicMax(&imax, (i * 37) % 1001 - 500);
        atomicMin(&imin, (i * 37) % 1001 - 500);
        atomicMax(&umax, (unsigned)i * 3u);
        atomicOr(&uor, 1u << (i % 32));
        atomicSub(&sub, 2);
        atomicAdd(&ull_sum, 1ull << 33);
        // sampling.cu's argmax key: value bits above, reversed index below.
        const unsigned long long key =
            ((unsigned long long)(0x80000000u | (unsigned)(i % 100)) << 32) | (uint32_t)(n - 1 - i);
        atomicMax(&ull_max, key);
        int old = cas_counter, assumed;
        do {
            assumed = old;
            old = atomicCAS(&cas_counter, assumed, assumed + 1);
        } while (old != assumed);
        exch_old[i] = atomicExch(&exch, i);
        atomicInc(&inc, 1000000u);
        atomicDec(&dec, 7u);
    });
    expect_clean("atomics", e);
    CHECK(fsum == 0.5f * n, "float atomicAdd: %g", fsum);
    CHECK(dsum == 0.25 * n, "double atomicAdd: %g", dsum);
    CHECK(counter == n, "int atomicAdd: %d", counter);
    std::vector<int> sorted = tickets;
    std::sort(sorted.begin(), sorted.end());
    bool perm = true;
    for (int i = 0; i < n; ++i) perm &= sorted[i] == i;
    CHECK(perm, "atomicAdd return values are not a permutation of 0..n-1");
    int want_max = -1000, want_min = 1000;
    for (int i = 0; i < n; ++i) {
        want_max = std::max(want_max, (i * 37) % 1001 - 500);
        want_min = std::min(want_min, (i * 37) % 1001 - 500);
    }
    CHECK(imax == want_max && imin == want_min, "atomicMax/Min int: %d %d (want %d %d)", imax, imin, want_max,
          want_min);
    CHECK(umax == (unsigned)(n - 1) * 3u, "atomicMax unsigned: %u", umax);
    CHECK(uor == 0xffffffffu, "atomicOr: 0x%x", uor);
    CHECK(sub == -2 * n, "atomicSub: %d", sub);
    CHECK(ull_sum == (unsigned long long)n << 33, "64-bit atomicAdd: %llu", ull_sum);
    // Largest value 0x80000000|99 is reached by i = 99, 199, ...; ties go to the lowest index (99).
    const unsigned long long want_key = ((unsigned long long)(0x80000000u | 99u) << 32) | (uint32_t)(n - 1 - 99);
    CHECK(ull_max == want_key, "64-bit atomicMax: 0x%llx want 0x%llx", ull_max, want_key);
    CHECK(cas_counter == n, "atomicCAS loop: %d", cas_counter);
    std::vector<int> seen = exch_old;
    seen.push_back(exch);
    std::sort(seen.begin(), seen.end());
    bool exch_ok = seen[0] == -1;
    for (int i = 0; i < n; ++i) exch_ok &= seen[i + 1] == i;
    CHECK(exch_ok, "atomicExch: old values and the final value are not exactly the initial and written values");
    CHECK(inc == (unsigned)n, "atomicInc: %u", inc);
    unsigned want_dec = 0;
    for (int i = 0; i < n; ++i) want_dec = (want_dec == 0 || want_dec > 7) ? 7 : want_dec - 1;
    CHECK(dec == want_dec, "atomicDec: %u want %u", dec, want_dec);
}

// =================================================================================================
// cp.async: wait_group N lands exactly the committed groups older than the N most recent; copies
// not yet committed are not waited for; src-size 0 (and partial) zero-fills; 4- and 16-byte copies.
// =================================================================================================
static void test_cp_async_groups() {
    printf("cp.async groups\n");
    constexpr int n = 32;
    std::vector<uint32_t> g0(n * 4), g1(n * 4), g2(n), g3(n);
    for (int i = 0; i < n * 4; ++i) {
        g0[i] = 0x10000 + i;
        g1[i] = 0x20000 + i;
    }
    for (int i = 0; i < n; ++i) {
        g2[i] = 0x30000 + i;
        g3[i] = 0x40000 + i;
    }
    // obs[t][step][slot]: whether slot (0: g0 copy, 1: g1 copy, 2: g2 copy, 3: zero fill, 4: partial
    // copy, 5: the uncommitted copy) had landed after step (0: wait 2, 1: wait 1, 2: wait 0, 3: commit + wait 0).
    std::vector<int> obs(n * 4 * 6, -1);
    const size_t smem = n * (16 + 16 + 4 + 16 + 16 + 4);
    const int e = run("cp_async_groups", dim3(1), dim3(n), smem, [&] {
        unsigned char* s = emu::dynamic_smem();
        const int t = threadIdx.x;
        uint32_t* s0 = reinterpret_cast<uint32_t*>(s) + 4 * t;
        uint32_t* s1 = reinterpret_cast<uint32_t*>(s + 16 * n) + 4 * t;
        uint32_t* sz = reinterpret_cast<uint32_t*>(s + 32 * n) + 4 * t;
        uint32_t* sp = reinterpret_cast<uint32_t*>(s + 48 * n) + 4 * t;
        uint32_t* s2 = reinterpret_cast<uint32_t*>(s + 64 * n) + t;
        uint32_t* s3 = reinterpret_cast<uint32_t*>(s + 68 * n) + t;
        emu::cp_async(s0, &g0[4 * t], 16, 16, __FILE__, __LINE__);
        emu::cp_async_commit();  // group A
        emu::cp_async(s1, &g1[4 * t], 16, 16, __FILE__, __LINE__);
        emu::cp_async_commit();  // group B
        emu::cp_async(s2, &g2[t], 4, 4, __FILE__, __LINE__);
        emu::cp_async(sz, &g1[4 * t], 16, 0, __FILE__, __LINE__);  // src-size 0: 16 zero bytes
        emu::cp_async(sp, &g1[4 * t], 16, 8, __FILE__, __LINE__);  // 8 bytes read, 8 zeros
        emu::cp_async_commit();                                    // group C
        emu::cp_async(s3, &g3[t], 4, 4, __FILE__, __LINE__);       // not committed yet
        auto observe = [&](int step) {
            int* o = &obs[(t * 4 + step) * 6];
            o[0] = s0[0] == g0[4 * t] && s0[3] == g0[4 * t + 3];
            o[1] = s1[0] == g1[4 * t] && s1[3] == g1[4 * t + 3];
            o[2] = s2[0] == g2[t];
            o[3] = sz[0] == 0 && sz[1] == 0 && sz[2] == 0 && sz[3] == 0;
            o[4] = sp[0] == g1[4 * t] && sp[1] == g1[4 * t + 1] && sp[2] == 0 && sp[3] == 0;
            o[5] = s3[0] == g3[t];
            // Not landed means still the NaN fill.
            if (!o[0]) o[0] = is_nan_bits(s0[0]) ? 0 : -2;
            if (!o[5]) o[5] = is_nan_bits(s3[0]) ? 0 : -2;
        };
        emu::cp_async_wait(2);
        observe(0);
        emu::cp_async_wait(1);
        observe(1);
        emu::cp_async_wait(0);
        observe(2);
        emu::cp_async_commit();
        emu::cp_async_wait(0);
        observe(3);
    });
    expect_clean("cp_async_groups", e);
    const int want[4][6] = {{1, 0, 0, 0, 0, 0}, {1, 1, 0, 0, 0, 0}, {1, 1, 1, 1, 1, 0}, {1, 1, 1, 1, 1, 1}};
    int bad = 0;
    for (int t = 0; t < n; ++t)
        for (int step = 0; step < 4; ++step)
            for (int slot = 0; slot < 6; ++slot) {
                const int got = obs[(t * 4 + step) * 6 + slot];
                if (got != want[step][slot] && bad++ < 4)
                    printf("  thread %d step %d slot %d: landed=%d, want %d\n", t, step, slot, got, want[step][slot]);
            }
    CHECK(bad == 0, "cp.async group landing: %d wrong observations", bad);
}

// =================================================================================================
// Shared memory: static (block_shared) and dynamic regions are NaN-filled at the start of every
// block; a static variable is one object per block; alignment.
// =================================================================================================
static void test_shared_memory() {
    printf("shared memory: NaN fill per block, one object per block, alignment\n");
    const int blocks = 3;
    std::vector<uint32_t> first_read(blocks * 2, 0);
    std::vector<float> sums(blocks);
    std::vector<uintptr_t> addrs(blocks * 64);
    const int e = run("smem_fill", dim3(blocks), dim3(64), 256, [&] {
        auto& st = emu::block_shared<float[64]>(1);
        auto& one = emu::block_shared<double>(2);
        auto& big = emu::block_shared<float4[3], 64>(3);
        float* dyn = reinterpret_cast<float*>(emu::dynamic_smem());
        const int t = threadIdx.x, b = blockIdx.x;
        addrs[b * 64 + t] = (uintptr_t)&st[0];
        if (t == 0) {
            first_read[b * 2] = __float_as_uint(st[5]);
            first_read[b * 2 + 1] = __float_as_uint(dyn[7]);
            if ((uintptr_t)&one % 16 || (uintptr_t)&big % 64 || (uintptr_t)dyn % 16)
                first_read[b * 2] = 1;  // flagged below
        }
        __syncthreads();
        st[t] = 1.0f;
        dyn[t] = 2.0f;
        __syncthreads();
        if (t == 0) {
            float s = 0;
            for (int i = 0; i < 64; ++i) s += st[i] + dyn[i];
            sums[b] = s;
        }
    });
    expect_clean("smem_fill", e);
    int bad = 0;
    for (int b = 0; b < blocks; ++b) {
        bad += !is_nan_bits(first_read[b * 2]) || !is_nan_bits(first_read[b * 2 + 1]);
        bad += sums[b] != 192.0f;
        for (int t = 0; t < 64; ++t) bad += addrs[b * 64 + t] != addrs[b * 64];
    }
    CHECK(bad == 0, "shared memory NaN fill / sharing / alignment: %d problems", bad);
}

int main() {
    test_ldmatrix_layout();
    test_mma_fragments();
    test_mma_product();
    test_shfl();
    test_atomics();
    test_cp_async_groups();
    test_shared_memory();
    printf("%d checks, %d failures\n", g_checks.load(), g_failures.load());
    return g_failures ? 1 : 0;
}
