// Tests of the stand-in libcublasLt (emu/cublaslt.cpp) through its C API, called the way cudarc
// 0.19 calls it: the library is dlopened with RTLD_LAZY | RTLD_LOCAL (as libloading does) and every
// entry point is looked up by name, with cudarc's cuda-13000 enum values and struct layouts.
//
//   cublaslt_test LIB.so                      numerics against a float64 reference, error cases
//   cublaslt_test LIB.so --driver DRIVER.so   the same through a fake emulated driver (this file
//                                             built with -DSWERVE_FAKE_DRIVER as libcuda.so.1,
//                                             dlopened RTLD_LOCAL first, as cudarc loads libcuda),
//                                             plus stream capture / replay / refusal
//   cublaslt_test LIB.so --flip-transpose     sets TRANSA opposite to the reference on a square
//                                             problem: must report MISMATCH and exit 1 (proves
//                                             the comparison can fail)
//
// Exit 0 when everything passes, 1 on any mismatch or wrong status, 2 on a setup/API failure.
// Driven by tests/emu_cublaslt.rs.

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <random>
#include <string>
#include <vector>

// ---- the fake driver (shared by the driver .so and the test program) --------------------------
struct FakeItem { void (*run)(void*); void* ctx; void (*drop)(void*); };
struct FakeStream {
    int capturing = 0, refuse = 0, enqueued = 0, dropped = 0;
    std::vector<FakeItem> graph;  // what a capture recorded
};

#ifdef SWERVE_FAKE_DRIVER
// The contract of emu/driver.cpp: run now, or only record while capturing (replays run it);
// drop exactly once when no longer needed, also on refusal. The NULL stream runs immediately.
extern "C" __attribute__((visibility("default"))) int swerve_emu_stream_enqueue(
    void* stream, void (*run)(void*), void* ctx, void (*drop)(void*)) {
    auto* s = static_cast<FakeStream*>(stream);
    if (!s) { run(ctx); drop(ctx); return 0; }
    if (s->refuse) { drop(ctx); s->dropped++; return 901; }  // CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
    s->enqueued++;
    if (s->capturing) { s->graph.push_back({run, ctx, drop}); return 0; }
    run(ctx);
    drop(ctx);
    s->dropped++;
    return 0;
}
#else

// ---- cudarc's declarations --------------------------------------------------------------------
enum { OK = 0, NOT_INITIALIZED = 1, INVALID_VALUE = 7, EXECUTION_FAILED = 13, NOT_SUPPORTED = 15 };
enum { R_32F = 0, R_16F = 2, R_16BF = 14, COMPUTE_32F = 68, COMPUTE_32F_FAST_TF32 = 77 };
enum { D_SCALE = 1, D_POINTER_MODE = 2, D_TRANSA = 3, D_TRANSB = 4, D_EPILOGUE = 7,
       D_BIAS_POINTER = 8, D_BIAS_BATCH_STRIDE = 10, D_A_SCALE = 17, D_BIAS_TYPE = 26 };
enum { L_ORDER = 1, L_BATCH = 5, L_STRIDE = 6 };
enum { P_MAX_WORKSPACE = 1, P_REDUCTION_MASK = 3, P_ALIGN_A = 5 };
enum { A_ID = 0, A_TILE_ID = 1, A_SPLITK_NUM = 2, A_REDUCTION_SCHEME = 3, A_CTA_SWIZZLING = 4 };
enum { EPI_DEFAULT = 1, EPI_RELU = 2, EPI_BIAS = 4 };
struct Algo { uint64_t data[8]; };
struct Heuristic { Algo algo; size_t workspaceSize; int state; float wavesCount; int reserved[4]; };
static_assert(sizeof(Heuristic) == 96, "cublasLtMatmulHeuristicResult_t");

struct Api {
    int (*create)(void**);
    int (*destroy)(void*);
    int (*desc_create)(void**, int, int);
    int (*desc_destroy)(void*);
    int (*desc_set)(void*, int, const void*, size_t);
    int (*layout_create)(void**, int, uint64_t, uint64_t, int64_t);
    int (*layout_destroy)(void*);
    int (*layout_set)(void*, int, const void*, size_t);
    int (*pref_create)(void**);
    int (*pref_destroy)(void*);
    int (*pref_set)(void*, int, const void*, size_t);
    int (*heuristic)(void*, void*, void*, void*, void*, void*, void*, int, Heuristic*, int*);
    int (*matmul)(void*, void*, const void*, const void*, void*, const void*, void*, const void*,
                  const void*, void*, void*, void*, const Algo*, void*, size_t, void*);
    int (*algo_check)(void*, void*, void*, void*, void*, void*, const Algo*, Heuristic*);
    int (*algo_get)(const Algo*, int, void*, size_t, size_t*);
    int (*algo_set)(Algo*, int, const void*, size_t);
} api;

FakeStream* g_stream = nullptr;  // the stream every GEMM goes to (NULL without a driver)
bool g_flip_transa = false;
int g_failures = 0;

#define REQUIRE(call)                                                                   \
    do {                                                                                \
        int st_ = (call);                                                               \
        if (st_ != OK) { printf("API ERROR %d: %s (line %d)\n", st_, #call, __LINE__); exit(2); } \
    } while (0)

void fail_check(const std::string& what) {
    if (g_failures++ < 20) printf("MISMATCH %s\n", what.c_str());
}

uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return uint16_t((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}
float bf2f(uint16_t h) { uint32_t u = uint32_t(h) << 16; float f; memcpy(&f, &u, 4); return f; }

// A device buffer (host memory in emulation), 256-byte aligned like cudaMalloc's.
struct Buf {
    void* p = nullptr;
    size_t bytes = 0;
    int type = R_16BF;
    Buf(size_t n, int t) : bytes(std::max<size_t>(n, 1) * (t == R_32F ? 4 : 2)), type(t) {
        p = aligned_alloc(256, (bytes + 255) / 256 * 256);
    }
    ~Buf() { free(p); }
    Buf(const Buf&) = delete;
    Buf& operator=(const Buf&) = delete;
    double get(size_t i) const { return type == R_32F ? ((float*)p)[i] : bf2f(((uint16_t*)p)[i]); }
    void set(size_t i, float v) {
        if (type == R_32F) ((float*)p)[i] = v; else ((uint16_t*)p)[i] = f2bf(v);
    }
    uint32_t bits(size_t i) const { return type == R_32F ? ((uint32_t*)p)[i] : ((uint16_t*)p)[i]; }
    void fill_bits(uint32_t b) {
        for (size_t i = 0; i < bytes / (type == R_32F ? 4 : 2); ++i)
            if (type == R_32F) ((uint32_t*)p)[i] = b; else ((uint16_t*)p)[i] = uint16_t(b);
    }
};
const uint32_t kNaN32 = 0x7fc00001, kNaN16 = 0x7fc1, kSentinel32 = 0x4640e400, kSentinel16 = 0x4640;

struct Case {
    bool ta, tb;
    int m, n, k;
    int ab_type = R_16BF, cd_type = R_16BF;
    float alpha = 1.0f, beta = 0.0f;
    bool bias = false, in_place = true;
    int pad = 0, batch = 1;
    bool broadcast_a = false;  // A's batch stride 0
};

std::string describe(const Case& c) {
    char s[256];
    snprintf(s, sizeof s, "ta=%d tb=%d m=%d n=%d k=%d ab=%s cd=%s alpha=%g beta=%g bias=%d "
             "in_place=%d pad=%d batch=%d bcast=%d", c.ta, c.tb, c.m, c.n, c.k,
             c.ab_type == R_32F ? "f32" : "bf16", c.cd_type == R_32F ? "f32" : "bf16", c.alpha,
             c.beta, c.bias, c.in_place, c.pad, c.batch, c.broadcast_a);
    return s;
}

void* layout(int type, uint64_t rows, uint64_t cols, int64_t ld, int batch, int64_t stride) {
    void* l;
    REQUIRE(api.layout_create(&l, type, rows, cols, ld));
    if (batch > 1) {
        int32_t b = batch;
        REQUIRE(api.layout_set(l, L_BATCH, &b, sizeof b));
        REQUIRE(api.layout_set(l, L_STRIDE, &stride, sizeof stride));
    }
    return l;
}

// One GEMM as gemm.rs issues it (descriptor, layouts, preference with alignments, heuristic, bias
// pointer set after planning, matmul), checked element by element against float64, including
// that padding (ld > rows, batch gaps) is neither read (NaN-poisoned) nor written (sentinel).
double run_case(const Case& c, std::mt19937& rng) {
    std::uniform_real_distribution<float> U(-1.0f, 1.0f);
    const int64_t ar = c.ta ? c.k : c.m, ac = c.ta ? c.m : c.k;
    const int64_t br = c.tb ? c.n : c.k, bc = c.tb ? c.k : c.n;
    const int64_t lda = ar + c.pad, ldb = br + (c.pad + 1) % 3, ldd = c.m + c.pad;
    const int64_t ldc = c.in_place ? ldd : c.m + (c.pad + 2) % 3;
    const int64_t sa = c.broadcast_a ? 0 : lda * ac + 5, sb = ldb * bc + 3;
    const int64_t sc = ldc * c.n + 2, sd = c.in_place ? sc : ldd * c.n + 7, sbias = c.m + 1;
    const int nb = c.batch;
    Buf A(sa * (nb - 1) + lda * ac, c.ab_type), B(sb * (nb - 1) + ldb * bc, c.ab_type);
    Buf D(sd * (nb - 1) + ldd * c.n, c.cd_type), Cs(sc * (nb - 1) + ldc * c.n, c.cd_type);
    Buf bias(sbias * nb, c.cd_type);
    const uint32_t nan = c.ab_type == R_32F ? kNaN32 : kNaN16;
    const uint32_t cd_nan = c.cd_type == R_32F ? kNaN32 : kNaN16;
    const uint32_t sentinel = c.cd_type == R_32F ? kSentinel32 : kSentinel16;
    A.fill_bits(nan), B.fill_bits(nan), Cs.fill_bits(cd_nan), D.fill_bits(sentinel);
    bias.fill_bits(cd_nan);
    Buf& C = c.in_place ? D : Cs;
    for (int b = 0; b < nb; ++b) {
        for (int64_t j = 0; j < ac; ++j) for (int64_t i = 0; i < ar; ++i)
            A.set(b * sa + i + j * lda, U(rng));
        for (int64_t j = 0; j < bc; ++j) for (int64_t i = 0; i < br; ++i)
            B.set(b * sb + i + j * ldb, U(rng));
        // C's values; NaN when beta == 0 (cuBLAS must not read C then).
        for (int64_t j = 0; j < c.n; ++j) for (int64_t i = 0; i < c.m; ++i)
            C.set(b * (c.in_place ? sd : sc) + i + j * ldc, c.beta != 0 ? U(rng) : NAN);
        for (int64_t i = 0; i < c.m; ++i) bias.set(b * sbias + i, U(rng));
    }
    std::vector<double> c_before(size_t(nb) * c.m * c.n);
    for (int b = 0; b < nb; ++b)
        for (int64_t j = 0; j < c.n; ++j) for (int64_t i = 0; i < c.m; ++i)
            c_before[(size_t(b) * c.n + j) * c.m + i] = C.get(b * (c.in_place ? sd : sc) + i + j * ldc);

    void *h, *desc, *pref;
    REQUIRE(api.create(&h));
    REQUIRE(api.desc_create(&desc, COMPUTE_32F, R_32F));
    int32_t ta = c.ta ^ g_flip_transa, tb = c.tb;
    REQUIRE(api.desc_set(desc, D_TRANSA, &ta, sizeof ta));
    REQUIRE(api.desc_set(desc, D_TRANSB, &tb, sizeof tb));
    uint32_t epi = c.bias ? EPI_BIAS : EPI_DEFAULT;
    REQUIRE(api.desc_set(desc, D_EPILOGUE, &epi, sizeof epi));
    void* la = layout(c.ab_type, ar, ac, lda, nb, sa);
    void* lb = layout(c.ab_type, br, bc, ldb, nb, sb);
    void* ld = layout(c.cd_type, c.m, c.n, ldd, nb, sd);
    void* lc = c.in_place ? ld : layout(c.cd_type, c.m, c.n, ldc, nb, sc);
    REQUIRE(api.pref_create(&pref));
    uint64_t ws = 32 << 20;
    REQUIRE(api.pref_set(pref, P_MAX_WORKSPACE, &ws, sizeof ws));
    for (int i = 0; i < 4; ++i) {
        uint32_t align = 256;
        REQUIRE(api.pref_set(pref, P_ALIGN_A + i, &align, sizeof align));
    }
    Heuristic res;
    int count = 0;
    REQUIRE(api.heuristic(h, desc, la, lb, lc, ld, pref, 1, &res, &count));
    if (count != 1 || res.state != OK || res.workspaceSize != 0 || res.wavesCount != 1.0f) {
        printf("API ERROR heuristic count %d state %d\n", count, res.state);
        exit(2);
    }
    if (c.bias) {
        const void* bp = bias.p;
        REQUIRE(api.desc_set(desc, D_BIAS_POINTER, &bp, sizeof bp));
        int64_t bstride = sbias;
        REQUIRE(api.desc_set(desc, D_BIAS_BATCH_STRIDE, &bstride, sizeof bstride));
    }
    char workspace[64];
    auto t0 = std::chrono::steady_clock::now();
    REQUIRE(api.matmul(h, desc, &c.alpha, A.p, la, B.p, lb, &c.beta, C.p, lc, D.p, ld, &res.algo,
                       workspace, sizeof workspace, g_stream));
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (void* l : {la, lb, ld}) REQUIRE(api.layout_destroy(l));
    if (!c.in_place) REQUIRE(api.layout_destroy(lc));
    REQUIRE(api.pref_destroy(pref));
    REQUIRE(api.desc_destroy(desc));
    REQUIRE(api.destroy(h));

    // float64 reference; tolerance: fp32 recursive summation over k (gamma_{k+4} of the sum of
    // magnitudes) plus, for a bf16 output, the final rounding (half an ulp = 2^-9 relative).
    const double u = std::ldexp(1.0, -24);
    std::vector<bool> written(D.bytes / (c.cd_type == R_32F ? 4 : 2), false);
    for (int b = 0; b < nb; ++b)
        for (int64_t j = 0; j < c.n; ++j)
            for (int64_t i = 0; i < c.m; ++i) {
                double s = 0, mag = 0;
                for (int64_t p = 0; p < c.k; ++p) {
                    double x = A.get(b * sa + (c.ta ? p + i * lda : i + p * lda));
                    double y = B.get(b * sb + (c.tb ? j + p * ldb : p + j * ldb));
                    s += x * y;
                    mag += std::fabs(x * y);
                }
                double cv = c_before[(size_t(b) * c.n + j) * c.m + i];
                double bv = c.bias ? bias.get(b * sbias + i) : 0.0;
                double ref = c.alpha * s + (c.beta != 0 ? c.beta * cv : 0.0) + bv;
                double scale = std::fabs(c.alpha) * mag + (c.beta != 0 ? std::fabs(c.beta * cv) : 0.0) +
                               std::fabs(bv);
                double tol = (c.k + 4) * u * scale + 1e-30;
                if (c.cd_type == R_16BF) tol += std::ldexp(std::fabs(ref) + tol, -8);
                size_t at = b * sd + i + j * ldd;
                written[at] = true;
                double got = D.get(at);
                if (!(std::fabs(got - ref) <= tol)) {
                    char s2[160];
                    snprintf(s2, sizeof s2, " at batch %d (%lld, %lld): got %.9g want %.9g tol %.3g",
                             b, (long long)i, (long long)j, got, ref, tol);
                    fail_check(describe(c) + s2);
                    return secs;
                }
            }
    for (size_t at = 0; at < written.size(); ++at)
        if (!written[at] && D.bits(at) != sentinel) {
            fail_check(describe(c) + " wrote outside D (padding element " + std::to_string(at) + ")");
            return secs;
        }
    return secs;
}

// Runs `call` with stderr captured; checks its status and the one-line diagnostic.
template <class F>
void expect_status(const char* what, int want, F call) {
    fflush(stderr);
    FILE* tmp = tmpfile();
    int saved = dup(2);
    dup2(fileno(tmp), 2);
    int got = call();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char line[600] = {0};
    rewind(tmp);
    size_t len = fread(line, 1, sizeof line - 1, tmp);
    fclose(tmp);
    line[len] = 0;
    const char* prefix = "swerve emulated cuBLASLt: ";
    if (got != want)
        fail_check(std::string(what) + ": status " + std::to_string(got) + ", expected " +
                   std::to_string(want));
    else if (want != OK && strncmp(line, prefix, strlen(prefix)) != 0)
        fail_check(std::string(what) + ": no diagnostic line on stderr");
    else if (want != OK)
        printf("  ok %-44s -> %d: %s", what, got, line + strlen(prefix));
}

// A valid bf16 problem (linear layer shape) whose pieces the error cases spoil one at a time.
struct Plan {
    void *h, *desc, *pref, *la, *lb, *ld;
    Heuristic res;
    Plan(int m = 8, int n = 4, int k = 16) {
        REQUIRE(api.create(&h));
        REQUIRE(api.desc_create(&desc, COMPUTE_32F, R_32F));
        int32_t t = 1;
        REQUIRE(api.desc_set(desc, D_TRANSA, &t, sizeof t));
        REQUIRE(api.layout_create(&la, R_16BF, k, m, k));
        REQUIRE(api.layout_create(&lb, R_16BF, k, n, k));
        REQUIRE(api.layout_create(&ld, R_16BF, m, n, m));
        REQUIRE(api.pref_create(&pref));
    }
    int heuristic() {
        int count = 0;
        return api.heuristic(h, desc, la, lb, ld, ld, pref, 1, &res, &count);
    }
    ~Plan() {
        api.layout_destroy(la), api.layout_destroy(lb), api.layout_destroy(ld);
        api.pref_destroy(pref), api.desc_destroy(desc), api.destroy(h);
    }
};

void error_cases() {
    Buf A(16 * 8, R_16BF), B(16 * 4, R_16BF), D(8 * 4, R_16BF), D32(8 * 4, R_32F);
    A.fill_bits(0x3f80), B.fill_bits(0x3f80);
    float one = 1.0f, zero = 0.0f;
    auto mm = [&](Plan& p, const void* alpha, const void* a, const void* algo, void* c_layout,
                  const void* c) {
        return api.matmul(p.h, p.desc, alpha, a, p.la, B.p, p.lb, &zero, c, c_layout, D.p, p.ld,
                          (const Algo*)algo, nullptr, 0, g_stream);
    };
    { Plan p; expect_status("valid plan", OK, [&] { return p.heuristic(); }); }
    { Plan p; api.layout_destroy(p.la); api.layout_create(&p.la, R_16F, 16, 8, 16);
      expect_status("fp16 A", NOT_SUPPORTED, [&] { return p.heuristic(); }); }
    { Plan p; api.layout_destroy(p.lb); api.layout_create(&p.lb, R_32F, 16, 4, 16);
      expect_status("bf16 A with fp32 B", NOT_SUPPORTED, [&] { return p.heuristic(); }); }
    { Plan p; void* lc; api.layout_create(&lc, R_32F, 8, 4, 8);
      int count;
      expect_status("C type != D type", NOT_SUPPORTED, [&] {
          return api.heuristic(p.h, p.desc, p.la, p.lb, lc, p.ld, p.pref, 1, &p.res, &count); });
      api.layout_destroy(lc); }
    { Plan p; api.desc_destroy(p.desc); api.desc_create(&p.desc, COMPUTE_32F_FAST_TF32, R_32F);
      expect_status("compute type FAST_TF32", NOT_SUPPORTED, [&] { return p.heuristic(); }); }
    { Plan p; int32_t s = R_16BF; api.desc_set(p.desc, D_SCALE, &s, sizeof s);
      expect_status("scale type bf16", NOT_SUPPORTED, [&] { return p.heuristic(); }); }
    { Plan p; uint32_t e = EPI_RELU; api.desc_set(p.desc, D_EPILOGUE, &e, sizeof e);
      expect_status("epilogue RELU", NOT_SUPPORTED, [&] { return p.heuristic(); }); }
    { Plan p; int32_t o = 1; api.layout_set(p.lb, L_ORDER, &o, sizeof o);
      expect_status("row-major B", NOT_SUPPORTED, [&] { return p.heuristic(); }); }
    { Plan p; int32_t pm = 1; api.desc_set(p.desc, D_POINTER_MODE, &pm, sizeof pm);
      expect_status("device pointer mode", NOT_SUPPORTED, [&] { return p.heuristic(); }); }
    { Plan p; uint32_t e = EPI_BIAS; int32_t bt = R_32F;
      api.desc_set(p.desc, D_EPILOGUE, &e, sizeof e), api.desc_set(p.desc, D_BIAS_TYPE, &bt, 4);
      expect_status("fp32 bias with a bf16 D", NOT_SUPPORTED, [&] { return p.heuristic(); }); }
    { Plan p; api.layout_destroy(p.lb); api.layout_create(&p.lb, R_16BF, 15, 4, 16);
      expect_status("op(B) rows != k", INVALID_VALUE, [&] { return p.heuristic(); }); }
    { Plan p(8, 4, 16); int32_t t = 0; api.desc_set(p.desc, D_TRANSA, &t, sizeof t);
      expect_status("TRANSA flipped (A is k x m)", INVALID_VALUE, [&] { return p.heuristic(); }); }
    { Plan p; api.layout_destroy(p.ld); api.layout_create(&p.ld, R_16BF, 8, 4, 7);
      expect_status("ld < rows", INVALID_VALUE, [&] { return p.heuristic(); }); }
    { Plan p; int32_t b = 2; api.layout_set(p.la, L_BATCH, &b, sizeof b);
      expect_status("batch counts differ", INVALID_VALUE, [&] { return p.heuristic(); }); }
    { Plan p; int count;
      expect_status("requestedAlgoCount 0", INVALID_VALUE, [&] {
          return api.heuristic(p.h, p.desc, p.la, p.lb, p.ld, p.ld, p.pref, 0, &p.res, &count); }); }
    { Plan p; uint32_t al = 1; api.pref_set(p.pref, P_ALIGN_A, &al, sizeof al);
      expect_status("A alignment 1 < bf16", NOT_SUPPORTED, [&] { return p.heuristic(); }); }
    { Plan p; int64_t t = 1;
      expect_status("attribute size mismatch", INVALID_VALUE,
                    [&] { return api.desc_set(p.desc, D_TRANSA, &t, sizeof t); }); }
    { Plan p; const void* sp = &one;
      expect_status("A scale pointer", NOT_SUPPORTED,
                    [&] { return api.desc_set(p.desc, D_A_SCALE, &sp, sizeof sp); }); }
    { Plan p; int count;
      expect_status("NULL handle", NOT_INITIALIZED, [&] {
          return api.heuristic(nullptr, p.desc, p.la, p.lb, p.ld, p.ld, p.pref, 1, &p.res, &count); }); }
    { Plan p; p.heuristic();
      expect_status("matmul valid", OK, [&] { return mm(p, &one, A.p, &p.res.algo, p.ld, D.p); });
      expect_status("matmul NULL alpha", INVALID_VALUE,
                    [&] { return mm(p, nullptr, A.p, &p.res.algo, p.ld, D.p); });
      expect_status("matmul NULL A", INVALID_VALUE,
                    [&] { return mm(p, &one, nullptr, &p.res.algo, p.ld, D.p); });
      Algo zeroed = {};
      expect_status("matmul with a foreign algo", INVALID_VALUE,
                    [&] { return mm(p, &one, A.p, &zeroed, p.ld, D.p); });
      expect_status("matmul A less aligned than promised", INVALID_VALUE,
                    [&] { return mm(p, &one, (char*)A.p + 2, &p.res.algo, p.ld, D.p); });
      void* lc; api.layout_create(&lc, R_16BF, 8, 4, 9);
      expect_status("in place C == D, ldc != ldd", INVALID_VALUE,
                    [&] { return mm(p, &one, A.p, &p.res.algo, lc, D.p); });
      api.layout_destroy(lc);
      uint32_t e = EPI_BIAS; api.desc_set(p.desc, D_EPILOGUE, &e, sizeof e);
      const void* bias = B.p;
      api.desc_set(p.desc, D_BIAS_POINTER, &bias, sizeof bias);
      expect_status("algo chosen without the bias epilogue", INVALID_VALUE,
                    [&] { return mm(p, &one, A.p, &p.res.algo, p.ld, D.p); });
      p.heuristic();
      expect_status("matmul with bias", OK, [&] { return mm(p, &one, A.p, &p.res.algo, p.ld, D.p); });
      bias = nullptr;
      api.desc_set(p.desc, D_BIAS_POINTER, &bias, sizeof bias);
      expect_status("bias epilogue, NULL bias pointer", INVALID_VALUE,
                    [&] { return mm(p, &one, A.p, &p.res.algo, p.ld, D.p); });
      e = EPI_DEFAULT; api.desc_set(p.desc, D_EPILOGUE, &e, sizeof e); p.heuristic();
      api.layout_destroy(p.ld); api.layout_create(&p.ld, R_32F, 8, 4, 8);
      expect_status("algo chosen for a bf16 D, fp32 D", INVALID_VALUE, [&] {
          return api.matmul(p.h, p.desc, &one, A.p, p.la, B.p, p.lb, &zero, D32.p, p.ld, D32.p,
                            p.ld, &p.res.algo, nullptr, 0, g_stream); });
      expect_status("implicit heuristic (algo NULL)", OK, [&] {
          return api.matmul(p.h, p.desc, &one, A.p, p.la, B.p, p.lb, &zero, D32.p, p.ld, D32.p,
                            p.ld, nullptr, nullptr, 0, g_stream); });
      for (int i = 0; i < 32; ++i)
          if (((float*)D32.p)[i] != 16.0f) fail_check("implicit-heuristic result");
    }
}

// bf16 rounding of the output: ties to even, overflow to infinity, NaN kept.
void rounding_cases() {
    Buf A(1, R_16BF), B(1, R_16BF), D(1, R_16BF);
    A.set(0, 1.0f), B.set(0, 1.0f);
    Plan p(1, 1, 1);
    int32_t t = 0;
    api.desc_set(p.desc, D_TRANSA, &t, sizeof t);
    REQUIRE(p.heuristic());
    struct { float alpha; uint16_t want; } cases[] = {
        {1.0f + 1.0f / 256, 0x3f80},      // tie between 1 and 1 + 2^-7: even is 1
        {1.0f + 3.0f / 256, 0x3f82},      // tie between 1 + 2^-7 and 1 + 2^-6: even is 0x3f82
        {1.0f + 1.5f / 256, 0x3f81},      // above the tie
        {-(1.0f + 1.0f / 256), 0xbf80},
        {3.4e38f, 0x7f80},                // beyond bf16's largest finite: +inf
    };
    float zero = 0.0f;
    for (auto& c : cases) {
        REQUIRE(api.matmul(p.h, p.desc, &c.alpha, A.p, p.la, B.p, p.lb, &zero, D.p, p.ld, D.p,
                           p.ld, &p.res.algo, nullptr, 0, g_stream));
        if (D.bits(0) != c.want) {
            char s[128];
            snprintf(s, sizeof s, "bf16 rounding of %.9g: got %#x want %#x", c.alpha, D.bits(0), c.want);
            fail_check(s);
        }
    }
    float nan = NAN;
    REQUIRE(api.matmul(p.h, p.desc, &nan, A.p, p.la, B.p, p.lb, &zero, D.p, p.ld, D.p, p.ld,
                       &p.res.algo, nullptr, 0, g_stream));
    if (!std::isnan(D.get(0))) fail_check("NaN alpha did not give a NaN bf16");
}

// Capture records the GEMM (nothing runs behind the stream's back) with its call-time values;
// replays run it on current memory; the item is dropped when the graph is; a refusing stream
// gives EXECUTION_FAILED and the item is dropped once (by the driver).
void stream_cases(FakeStream& s) {
    const int m = 7, n = 5, k = 33;
    Buf A(k * m, R_16BF), B(k * n, R_16BF), D(m * n, R_16BF), b1(m, R_16BF), b2(m, R_16BF);
    D.fill_bits(kSentinel16);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> U(-1, 1);
    for (int i = 0; i < k * m; ++i) A.set(i, U(rng));
    for (int i = 0; i < k * n; ++i) B.set(i, U(rng));
    for (int i = 0; i < m; ++i) b1.set(i, U(rng)), b2.set(i, 100 + U(rng));
    auto expect = [&](const char* what, float alpha, const Buf& bias) {
        for (int j = 0; j < n; ++j)
            for (int i = 0; i < m; ++i) {
                double r = 0, mag = 0;
                for (int p = 0; p < k; ++p) {
                    r += A.get(p + i * k) * B.get(p + j * k);
                    mag += std::fabs(A.get(p + i * k) * B.get(p + j * k));
                }
                r = alpha * r + bias.get(i);
                double tol = std::ldexp(std::fabs(r), -8) + 1e-5 * (mag + 1);
                if (!(std::fabs(D.get(i + j * m) - r) <= tol)) {
                    fail_check(std::string(what) + ": wrong result");
                    return;
                }
            }
        printf("  ok %s\n", what);
    };
    Plan* p = new Plan(m, n, k);
    uint32_t e = EPI_BIAS;
    api.desc_set(p->desc, D_EPILOGUE, &e, sizeof e);
    REQUIRE(p->heuristic());
    const void* bp = b1.p;
    api.desc_set(p->desc, D_BIAS_POINTER, &bp, sizeof bp);
    float alpha = 1.0f, beta = 0.0f;
    const int dropped_before = s.dropped;
    s.capturing = 1;
    REQUIRE(api.matmul(p->h, p->desc, &alpha, A.p, p->la, B.p, p->lb, &beta, D.p, p->ld, D.p,
                       p->ld, &p->res.algo, nullptr, 0, &s));
    s.capturing = 0;
    for (int i = 0; i < m * n; ++i)
        if (D.bits(i) != kSentinel16) { fail_check("the captured GEMM ran outside the stream"); break; }
    if (s.graph.size() != 1 || s.dropped != dropped_before)
        fail_check("capture did not record one live item");
    // Everything the call read may change or go away: the replay uses its recorded values.
    bp = b2.p;
    api.desc_set(p->desc, D_BIAS_POINTER, &bp, sizeof bp);
    alpha = 3.0f;
    delete p;
    A.set(0, 0.5f), A.set(k, -0.25f);  // memory contents are read at replay time
    for (auto& it : s.graph) it.run(it.ctx);
    expect("replay: recorded alpha, bias pointer; current memory", 1.0f, b1);
    D.fill_bits(0);
    for (auto& it : s.graph) it.run(it.ctx);
    expect("second replay", 1.0f, b1);
    for (auto& it : s.graph) it.drop(it.ctx);
    s.graph.clear();
    // Not capturing: dropped right after running.
    const int dropped = s.dropped;
    Plan q(m, n, k);
    REQUIRE(q.heuristic());
    REQUIRE(api.matmul(q.h, q.desc, &alpha, A.p, q.la, B.p, q.lb, &beta, D.p, q.ld, D.p, q.ld,
                       &q.res.algo, nullptr, 0, &s));
    if (s.dropped != dropped + 1) fail_check("a non-captured GEMM was not dropped");
    s.refuse = 1;
    expect_status("stream refuses the GEMM", EXECUTION_FAILED, [&] {
        return api.matmul(q.h, q.desc, &alpha, A.p, q.la, B.p, q.lb, &beta, D.p, q.ld, D.p, q.ld,
                          &q.res.algo, nullptr, 0, &s); });
    s.refuse = 0;
    if (s.dropped != dropped + 2) fail_check("a refused GEMM was not dropped exactly once");
}

// ---- split-K: the heuristic's size-dependent choice, the algo config, the summation order ----
// The linear-layer shape of issue 25 in cuBLAS terms: D[m = features, n = rows] = W^T x, fp32
// out, k = 256; the rows (columns of D) vary.
struct SplitProblem {
    int m, n, k;
    void *h, *desc, *la, *lb, *ld;
    SplitProblem(int m_, int n_, int k_) : m(m_), n(n_), k(k_) {
        REQUIRE(api.create(&h));
        REQUIRE(api.desc_create(&desc, COMPUTE_32F, R_32F));
        int32_t ta = 1;
        REQUIRE(api.desc_set(desc, D_TRANSA, &ta, sizeof ta));
        la = layout(R_16BF, k, m, k, 1, 0);
        lb = layout(R_16BF, k, n, k, 1, 0);
        ld = layout(R_32F, m, n, m, 1, 0);
    }
    ~SplitProblem() {
        for (void* l : {la, lb, ld}) REQUIRE(api.layout_destroy(l));
        REQUIRE(api.desc_destroy(desc));
        REQUIRE(api.destroy(h));
    }
    Algo heuristic(bool no_split) {
        void* pref;
        REQUIRE(api.pref_create(&pref));
        if (no_split) {
            uint32_t none = 0;  // CUBLASLT_REDUCTION_SCHEME_NONE only
            REQUIRE(api.pref_set(pref, P_REDUCTION_MASK, &none, sizeof none));
        }
        Heuristic res;
        int count = 0;
        REQUIRE(api.heuristic(h, desc, la, lb, ld, ld, pref, 1, &res, &count));
        REQUIRE(api.pref_destroy(pref));
        return res.algo;
    }
    // D's bits for A (k x m) and B (k x n) of the given values, run with `algo` (NULL: none).
    std::vector<uint32_t> run(const Algo* algo, const Buf& A, const Buf& B) {
        Buf D(size_t(m) * n, R_32F);
        float alpha = 1.0f, beta = 0.0f;
        REQUIRE(api.matmul(h, desc, &alpha, A.p, la, B.p, lb, &beta, D.p, ld, D.p, ld, algo,
                           nullptr, 0, g_stream));
        std::vector<uint32_t> bits(size_t(m) * n);
        for (size_t i = 0; i < bits.size(); ++i) bits[i] = D.bits(i);
        return bits;
    }
};

uint32_t splits_of(const Algo& a) {
    uint32_t v = 0;
    size_t written = 0;
    REQUIRE(api.algo_get(&a, A_SPLITK_NUM, &v, sizeof v, &written));
    if (written != sizeof v) fail_check("SPLITK_NUM sizeWritten");
    return v;
}

void split_k_cases() {
    const int m = 64, k = 256, rows[] = {1, 7, 1024};
    std::mt19937 rng(99);
    std::uniform_real_distribution<float> U(-1.0f, 1.0f);
    Buf W(size_t(k) * m, R_16BF), X(size_t(k) * 1024, R_16BF);
    for (size_t i = 0; i < size_t(k) * m; ++i) W.set(i, U(rng));
    for (size_t i = 0; i < size_t(k) * 1024; ++i) X.set(i, U(rng));
    // The heuristic's choice depends on the size: one 64 x 64 tile splits K 8 ways (k / 32 = 8),
    // 16 tiles (the emulated SMs) do not; the mask NONE rules split-K out.
    std::vector<std::vector<uint32_t>> per_problem, pinned;
    SplitProblem ref(m, 1024, k);
    const Algo fixed = ref.heuristic(true);
    if (splits_of(fixed) != 1) fail_check("REDUCTION_SCHEME_MASK NONE still split K");
    for (int n : rows) {
        SplitProblem p(m, n, k);
        const Algo a = p.heuristic(false);
        const uint32_t want = n == 1 ? 8 : n == 7 ? 8 : 1;
        if (splits_of(a) != want)
            fail_check("heuristic SPLITK_NUM " + std::to_string(splits_of(a)) + " for n = " +
                       std::to_string(n) + ", want " + std::to_string(want));
        if (splits_of(p.heuristic(true)) != 1)
            fail_check("REDUCTION_SCHEME_MASK NONE still split K at n = " + std::to_string(n));
        Heuristic checked;
        if (api.algo_check(p.h, p.desc, p.la, p.lb, p.ld, p.ld, &fixed, &checked) != OK)
            fail_check("AlgoCheck refused the pinned algo at n = " + std::to_string(n));
        per_problem.push_back(p.run(&a, W, X));
        pinned.push_back(p.run(&fixed, W, X));
        // The chunked order exactly: 8 chunks of 32 (or one of 256), each from zero, in order.
        for (int i = 0; i < m; ++i) {
            float total = 0.0f;
            for (uint32_t c = 0; c < want; ++c) {
                float part = 0.0f;
                for (int p2 = int(c) * k / int(want); p2 < int(c + 1) * k / int(want); ++p2)
                    part += float(W.get(size_t(i) * k + p2)) * float(X.get(p2));
                total = c == 0 ? part : total + part;
            }
            uint32_t bits;
            memcpy(&bits, &total, 4);
            if (per_problem.back()[i] != bits) {
                fail_check("split-K order at n = " + std::to_string(n) + ", row " +
                           std::to_string(i));
                break;
            }
        }
    }
    // Column 0 (the first token row): the pinned algo gives the same bits at every n, the
    // per-problem choice does not (the mutation the engine's GEMM pinning guards against).
    int pinned_diff = 0, heuristic_diff = 0;
    for (size_t r = 1; r < per_problem.size(); ++r)
        for (int i = 0; i < m; ++i) {
            pinned_diff += pinned[r][i] != pinned[0][i];
            heuristic_diff += per_problem[r][i] != per_problem[0][i];
        }
    if (pinned_diff) fail_check("the pinned algo changed row 0 with n");
    if (!heuristic_diff) fail_check("the per-problem heuristic never changed row 0's bits");
    printf("  row 0 over n in {1, 7, 1024}: pinned %d differing values, per-problem %d\n",
           pinned_diff, heuristic_diff);
    // The config attributes: SPLITK_NUM set by hand runs; AlgoCheck refuses more splits than k,
    // and split-K without a reduction scheme; unemulated attributes are refused.
    SplitProblem small(m, 1, 16);
    Algo a = small.heuristic(true);
    uint32_t two = 2, many = 17, inplace = 1, swz = 1;
    Heuristic out;
    REQUIRE(api.algo_set(&a, A_SPLITK_NUM, &two, sizeof two));
    expect_status("AlgoCheck: split-K without a reduction scheme", NOT_SUPPORTED,
                  [&] { return api.algo_check(small.h, small.desc, small.la, small.lb, small.ld,
                                              small.ld, &a, &out); });
    REQUIRE(api.algo_set(&a, A_REDUCTION_SCHEME, &inplace, sizeof inplace));
    REQUIRE(api.algo_check(small.h, small.desc, small.la, small.lb, small.ld, small.ld, &a, &out));
    if (splits_of(out.algo) != 2) fail_check("AlgoCheck's result lost SPLITK_NUM");
    REQUIRE(api.algo_set(&a, A_SPLITK_NUM, &many, sizeof many));
    expect_status("AlgoCheck: SPLITK_NUM 17 for k = 16", NOT_SUPPORTED,
                  [&] { return api.algo_check(small.h, small.desc, small.la, small.lb, small.ld,
                                              small.ld, &a, &out); });
    expect_status("AlgoConfigSetAttribute: CTA_SWIZZLING", NOT_SUPPORTED,
                  [&] { return api.algo_set(&a, A_CTA_SWIZZLING, &swz, sizeof swz); });
    expect_status("AlgoConfigGetAttribute: wrong size", INVALID_VALUE,
                  [&] { uint64_t v; return api.algo_get(&a, A_SPLITK_NUM, &v, sizeof v, nullptr); });
}

template <class T>
void resolve(void* lib, T& fn, const char* name) {
    fn = reinterpret_cast<T>(dlsym(lib, name));
    if (!fn) { printf("API ERROR: %s does not export %s\n", "the library", name); exit(2); }
}

int main(int argc, char** argv) {
    if (argc < 2) { fprintf(stderr, "usage: %s LIB.so [--driver DRIVER.so] [--flip-transpose]\n", argv[0]); return 2; }
    const char* driver = nullptr;
    bool flip = false;
    for (int i = 2; i < argc; ++i) {
        if (!strcmp(argv[i], "--driver") && i + 1 < argc) driver = argv[++i];
        else if (!strcmp(argv[i], "--flip-transpose")) flip = true;
        else { fprintf(stderr, "unknown argument %s\n", argv[i]); return 2; }
    }
    FakeStream stream;
    if (driver) {  // loaded first and privately, as cudarc loads libcuda before cuBLASLt
        if (!dlopen(driver, RTLD_LAZY | RTLD_LOCAL)) { printf("API ERROR: %s\n", dlerror()); return 2; }
        g_stream = &stream;
    }
    void* lib = dlopen(argv[1], RTLD_LAZY | RTLD_LOCAL);
    if (!lib) { printf("API ERROR: %s\n", dlerror()); return 2; }
    resolve(lib, api.create, "cublasLtCreate");
    resolve(lib, api.destroy, "cublasLtDestroy");
    resolve(lib, api.desc_create, "cublasLtMatmulDescCreate");
    resolve(lib, api.desc_destroy, "cublasLtMatmulDescDestroy");
    resolve(lib, api.desc_set, "cublasLtMatmulDescSetAttribute");
    resolve(lib, api.layout_create, "cublasLtMatrixLayoutCreate");
    resolve(lib, api.layout_destroy, "cublasLtMatrixLayoutDestroy");
    resolve(lib, api.layout_set, "cublasLtMatrixLayoutSetAttribute");
    resolve(lib, api.pref_create, "cublasLtMatmulPreferenceCreate");
    resolve(lib, api.pref_destroy, "cublasLtMatmulPreferenceDestroy");
    resolve(lib, api.pref_set, "cublasLtMatmulPreferenceSetAttribute");
    resolve(lib, api.heuristic, "cublasLtMatmulAlgoGetHeuristic");
    resolve(lib, api.matmul, "cublasLtMatmul");
    resolve(lib, api.algo_check, "cublasLtMatmulAlgoCheck");
    resolve(lib, api.algo_get, "cublasLtMatmulAlgoConfigGetAttribute");
    resolve(lib, api.algo_set, "cublasLtMatmulAlgoConfigSetAttribute");
    std::mt19937 rng(1234);

    if (flip) {  // the reference says op(A) = A, the descriptor says A^T: must be caught
        g_flip_transa = true;
        Case c{false, false, 33, 33, 33};
        run_case(c, rng);
        printf(g_failures ? "flipped TRANSA detected\n" : "flipped TRANSA NOT detected\n");
        return g_failures ? 1 : 0;
    }

    int cases = 0;
    const int dims[] = {1, 7, 33};
    for (int m : dims) for (int n : dims) for (int k : dims)
        for (int t = 0; t < 4; ++t) for (int out = 0; out < 2; ++out) for (int acc = 0; acc < 2; ++acc)
            for (int bias = 0; bias < 2; ++bias) {
                Case c{bool(t & 1), bool(t & 2), m, n, k};
                c.cd_type = out ? R_32F : R_16BF;
                c.beta = acc ? 1.0f : 0.0f;
                c.alpha = (cases % 2) ? 1.0f : 0.75f;
                c.bias = bias;
                c.in_place = (cases / 2) % 2 == 0;
                c.pad = cases % 3;
                run_case(c, rng);
                ++cases;
            }
    for (int t = 0; t < 4; ++t) for (int acc = 0; acc < 2; ++acc) {  // fp32 operands
        Case c{bool(t & 1), bool(t & 2), 33, 7, 33};
        c.ab_type = c.cd_type = R_32F;
        c.beta = acc ? 0.5f : 0.0f;
        c.bias = acc;
        c.in_place = !acc;
        c.pad = t % 3;
        run_case(c, rng), ++cases;
    }
    for (int t = 0; t < 4; ++t) for (int out = 0; out < 2; ++out) {  // strided batches
        Case c{bool(t & 1), bool(t & 2), 7, 33, 9};
        c.cd_type = out ? R_32F : R_16BF;
        c.batch = 3;
        c.beta = out ? 1.0f : 0.0f;
        c.bias = true;
        c.in_place = t % 2;
        c.pad = t % 3;
        c.broadcast_a = t == 2;
        run_case(c, rng), ++cases;
    }
    printf("numeric cases: %d run, %d mismatches\n", cases, g_failures);
    // Model-sized shapes: the linear forward (W^T x, bias) and a weight gradient (f32, beta 1).
    Case fwd{true, false, 512, 256, 1024};
    fwd.bias = true;
    Case dw{false, true, 1024, 512, 256};
    dw.cd_type = R_32F;
    dw.beta = 1.0f;
    for (Case* c : {&fwd, &dw}) {
        double secs = run_case(*c, rng);
        printf("large GEMM %s: %.1f ms\n", describe(*c).c_str(), secs * 1e3);
    }
    rounding_cases();
    printf("split-K cases:\n");
    split_k_cases();
    printf("error cases:\n");
    error_cases();
    if (driver) {
        printf("stream cases:\n");
        stream_cases(stream);
        if (stream.enqueued == 0) fail_check("no GEMM went through the driver's stream");
        printf("driver stream: %d GEMMs enqueued, %d dropped\n", stream.enqueued, stream.dropped);
    }
    printf(g_failures ? "FAILED: %d checks\n" : "all checks passed\n", g_failures);
    return g_failures ? 1 : 0;
}
#endif
