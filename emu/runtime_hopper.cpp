// The emulated device's sm_90a synchronisation and tensor cores (interface: emu_cuda.h; internals:
// runtime_internal.h; the TMA side in runtime_tma.cpp): mbarriers, named barriers, and the
// warpgroup collectives (wgmma.fence / mma_async / commit_group / wait_group, setmaxnreg).
//
// mbarrier ([PTX] "mbarrier"): the runtime keeps each barrier's state per block, keyed by its
// address; a phase completes when its pending arrivals are 0 and the bytes of the TMA copies issued
// on it equal its tx-count; waiters block (state AT_MBAR) and are woken by the completion.
//
// Warpgroup collectives ([PTX] "Asynchronous Warpgroup Level Matrix Multiply-Accumulate
// Instructions", .sync.aligned): a rendezvous of the 128 threads of 4 consecutive warps, resolved by
// the last to arrive, which checks that all came from the same call site with the same operands.
// wgmma_mma only records; wait_group retires groups and computes their products then.
//
// The async proxy ([PTX] "Memory Consistency Model: Proxies"; "membar / fence": fence.proxy.async;
// the wgmma section: shared memory written by the generic proxy must be made visible to the async
// proxy with fence.proxy.async before wgmma.mma_async reads it). Ordinary C++ stores are not
// instrumented; instead the block keeps shared memory as the async proxy last saw it (Hopper's
// seen_static / seen_dyn): the 0xff fill at the block's start, the bytes a TMA load writes when it
// lands (async-proxy writes), and all of it (static and dynamic) at every fence_proxy_async. A
// wgmma's descriptor operands (A, B) are compared with it at the issue (a later fence is too late)
// and again at the retirement (the operand written while the wgmma was in flight): a differing
// byte was written by the generic proxy since the last fence, one error per wgmma. Coarse: one
// thread's fence covers every thread's writes before it (the ISA wants each writing thread's own
// fence), so a fence by one thread only is caught only when it runs before the others' writes;
// a store of the byte the snapshot already holds goes unseen; cp.async (non-bulk) writes count as
// generic; async-proxy reads other than wgmma's (TMA stores) are not emulated.
//
// Shared-memory matrix layouts for 16-bit types ([PTX] "Shared Memory Matrix Layout", table
// "Canonical Layouts" in CuTe notation, T = 8 elements = 16 bytes; the same table is in CUTLASS's
// cute/atom/mma_traits_sm90_gmma.hpp above make_gmma_desc). With `row` the M (A) or N (B) index, k in
// 0..15, S the swizzle span (128/64/32 bytes) and the byte offset before the swizzle:
//   K-major, swizzled  ((8,m),(T,2k)):((S/16 T,SBO),(1,T)):  (row%8)*S + (row/8)*SBO + 2k  (LBO unused)
//   K-major, none      ((8,m),(T,2k)):((1T,SBO),(1,LBO)):    (row%8)*16 + (row/8)*SBO + (k/8)*LBO + 2(k%8)
//   MN-major, swizzled ((T,S/16,m),(8,k)):((1,T,LBO),(S/16 T,SBO)):
//                      2(row % (S/2)) + (row/(S/2))*LBO + (k%8)*S + (k/8)*SBO
//   MN-major, none     ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)):  2(row%8) + (row/8)*SBO + (k%8)*16 + (k/8)*LBO
// (note LBO and SBO trade roles between the unswizzled and the swizzled MN-major layouts). The
// swizzle is applied to the absolute shared address (start + offset), so atoms are aligned to their
// repeat and the descriptor's base offset is 0.
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "runtime_internal.h"

namespace emu {
namespace rt {

namespace {

constexpr size_t kWindow = size_t(1) << 18;

const char* wg_name(WgOp op) {
    switch (op) {
        case WG_FENCE: return "wgmma.fence";
        case WG_COMMIT: return "wgmma.commit_group";
        case WG_WAIT: return "wgmma.wait_group";
        case WG_MMA: return "wgmma.mma_async";
        case WG_SETMAXNREG: return "setmaxnreg";
        default: return "?";
    }
}

std::string span_name(uint32_t span) { return span ? std::to_string(span) + "B" : std::string("none"); }

inline float bf_half(uint32_t reg, int half) { return __uint_as_float((reg >> (16 * half)) << 16); }

// Byte offset of (row, k) in a descriptor's canonical layout, before the swizzle (see the top).
uint64_t layout_offset(bool kmajor, uint32_t span, uint32_t lbo, uint32_t sbo, int row, int k) {
    if (kmajor && span) return (row % 8) * span + (row / 8) * (uint64_t)sbo + 2 * k;
    if (kmajor) return (row % 8) * 16 + (row / 8) * (uint64_t)sbo + (k / 8) * (uint64_t)lbo + 2 * (k % 8);
    if (span) {
        const int per_row = span / 2;
        return 2 * (row % per_row) + (row / per_row) * (uint64_t)lbo + (k % 8) * span + (k / 8) * (uint64_t)sbo;
    }
    return 2 * (row % 8) + (row / 8) * (uint64_t)sbo + (k % 8) * 16 + (k / 8) * (uint64_t)lbo;
}

// A shared-memory matrix descriptor's fields ([PTX] "Matrix Descriptor Format").
struct Desc {
    uint32_t start, lbo, sbo, base, span;
    explicit Desc(uint64_t desc) {
        static const uint32_t spans[4] = {0, 128, 64, 32};
        start = (uint32_t)(desc & 0x3fff) << 4, lbo = (uint32_t)((desc >> 16) & 0x3fff) << 4;
        sbo = (uint32_t)((desc >> 32) & 0x3fff) << 4, base = (uint32_t)((desc >> 49) & 7), span = spans[desc >> 62];
    }
    // Whether gather accepts it (else it reports why).
    bool valid(bool kmajor) const { return !base && !(kmajor && span && start % span + 32 > span); }
    // The shared address of element (row, k).
    uint64_t at(bool kmajor, int row, int k) const {
        return swizzle_address(start + layout_offset(kmajor, span, lbo, sbo, row, k), span);
    }
};

// Reads the rows x 16 operand a descriptor names into out[row * 16 + k]; false after an error.
bool gather(Launch& L, const WgmmaOp& op, uint64_t desc, int rows, bool kmajor, const char* which, float* out) {
    const Desc D(desc);
    const uint32_t start = D.start, base = D.base, span = D.span;
    if (base) {
        report(W_BLOCK, -1, "wgmma at %s:%d: %s descriptor 0x%016llx has base offset %u: only 0 is emulated (swizzle "
               "atoms aligned to their repeat)", op.file, op.line, which, (unsigned long long)desc, base);
        return false;
    }
    if (kmajor && span && start % span + 32 > span) {
        report(W_BLOCK, -1, "wgmma at %s:%d: %s descriptor start 0x%x: the 16 K elements (32 bytes) cross its %uB "
               "swizzle row", op.file, op.line, which, start, span);
        return false;
    }
    if (const unsigned char* p = shared_ptr(L, start, 1)) {
        for (const TmaRegion& r : L.hop.regions) {
            if (p < r.begin || p >= r.end || r.span == span) continue;
            report(W_BLOCK, -1, "wgmma at %s:%d: %s descriptor swizzle %s disagrees with the tensor map's swizzle %s "
                   "that wrote this tile (TMA load at %s:%d)", op.file, op.line, which, span_name(span).c_str(),
                   span_name(r.span).c_str(), r.file, r.line);
            return false;
        }
    }
    for (int row = 0; row < rows; ++row) {
        for (int k = 0; k < 16; ++k) {
            const uint64_t a = D.at(kmajor, row, k);
            const unsigned char* p = shared_ptr(L, a, 2);
            if (!p) {
                report(W_BLOCK, -1, "wgmma at %s:%d: %s descriptor 0x%016llx: element (%d, k %d) at shared address "
                       "0x%llx is outside the block's shared memory", op.file, op.line, which,
                       (unsigned long long)desc, row, k, (unsigned long long)a);
                return false;
            }
            uint16_t v;
            memcpy(&v, p, 2);
            out[row * 16 + k] = __uint_as_float((uint32_t)v << 16);
        }
    }
    return true;
}

// The async proxy's view of the shared byte at p (the block's, static or dynamic).
unsigned char seen_byte(const Launch& L, const unsigned char* p) {
    const Hopper& H = L.hop;
    if (p >= L.dyn_base && p < L.dyn_base + H.seen_dyn.size()) return H.seen_dyn[p - L.dyn_base];
    const size_t i = p - L.static_base;
    return p >= L.static_base && i < H.seen_static.size() ? H.seen_static[i] : 0xff;
}

// Whether an operand byte differs from the async proxy's snapshot (see "async proxy" at the top):
// then reports it, once, and returns true. At issue, or at the retirement (the operand changed
// while the wgmma was in flight).
bool proxy_check(Launch& L, const WgmmaOp& op, uint64_t desc, int rows, bool kmajor, const char* which, bool issue) {
    const Desc D(desc);
    if (!D.valid(kmajor)) return false;  // gather reports the descriptor at the retirement
    uint64_t lo = UINT64_MAX, hi = 0, first = UINT64_MAX;
    for (int row = 0; row < rows; ++row) {
        for (int k = 0; k < 16; ++k) {
            const uint64_t a = D.at(kmajor, row, k);
            const unsigned char* p = shared_ptr(L, a, 2);
            if (!p) continue;  // gather reports it
            lo = std::min(lo, a), hi = std::max(hi, a + 2);
            if (first == UINT64_MAX && (p[0] != seen_byte(L, p) || p[1] != seen_byte(L, p + 1)))
                first = a + (p[0] == seen_byte(L, p));
        }
    }
    if (first == UINT64_MAX) return false;
    const char* late = "; written after the wgmma's issue (seen when wgmma_wait retired it): its operands must not "
                       "change while it is in flight";
    report(W_BLOCK, -1, "wgmma at %s:%d: operand %s (shared [0x%llx, 0x%llx)): the byte at shared 0x%llx was "
           "written by ordinary stores since the last fence.proxy.async: add fence_proxy_async() after the writes "
           "(and a barrier before the wgmma)%s", op.file, op.line, which, (unsigned long long)lo,
           (unsigned long long)hi, (unsigned long long)first, issue ? "" : late);
    return true;
}

// D += A B for one recorded wgmma, as OP_MMA (runtime_warp.cpp) sums: exact products in k order
// in double, plus C, rounded to f32 once.
void retire(Launch& L, const WgmmaOp& op) {
    std::vector<float> A(64 * 16), B((size_t)op.n * 16);
    bool ok = true;
    if (!op.proxy_reported && !(!op.has_a && proxy_check(L, op, op.desc_a, 64, true, "A", false)))
        proxy_check(L, op, op.desc_b, op.n, !op.trans_b, "B", false);
    if (op.has_a) {
        for (int i = 0; i < 128; ++i) {
            const int w = i / 32, g = (i % 32) / 4, t = i % 4;
            for (int h = 0; h < 2; ++h) {
                A[(16 * w + g) * 16 + 2 * t + h] = bf_half(op.a[i][0], h);
                A[(16 * w + g + 8) * 16 + 2 * t + h] = bf_half(op.a[i][1], h);
                A[(16 * w + g) * 16 + 2 * t + 8 + h] = bf_half(op.a[i][2], h);
                A[(16 * w + g + 8) * 16 + 2 * t + 8 + h] = bf_half(op.a[i][3], h);
            }
        }
    } else {
        ok = gather(L, op, op.desc_a, 64, true, "A", A.data());
    }
    ok = ok && gather(L, op, op.desc_b, op.n, !op.trans_b, "B", B.data());
    for (int i = 0; i < 128; ++i) {
        const int w = i / 32, g = (i % 32) / 4, t = i % 4;
        for (int n8 = 0; n8 < op.n / 8; ++n8) {
            for (int e = 0; e < 4; ++e) {
                const int row = 16 * w + g + 8 * (e / 2), col = 8 * n8 + 2 * t + e % 2;
                float* dp = op.d[i] + n8 * 4 + e;
                if (!ok) {
                    *dp = NAN;
                    continue;
                }
                double acc = 0;
                for (int k = 0; k < 16; ++k) acc += (double)A[row * 16 + k] * (double)B[col * 16 + k];
                *dp = (float)((double)*dp + acc);
            }
        }
    }
}

bool same_request(const Thread& a, const Thread& b) {
    if (a.wg_op != b.wg_op || a.line != b.line || (a.file != b.file && strcmp(a.file, b.file) != 0)) return false;
    if (a.wg_arg != b.wg_arg || a.wg_flag != b.wg_flag) return false;
    if (a.wg_op == WG_MMA && (a.desc_a != b.desc_a || a.desc_b != b.desc_b || (a.wg_a == nullptr) != (b.wg_a == nullptr)))
        return false;
    return true;
}

void resolve_mma(Launch& L, Warpgroup& W, Thread* T) {
    const Thread& t0 = T[0];
    if (!W.fenced)
        report(W_BLOCK, -1, "wgmma.mma_async at %s:%d (warpgroup %u): wgmma.fence required before the first wgmma "
               "since the kernel's start or the warpgroup's last wgmma.wait_group", t0.file, t0.line,
               t0.regs.warp / 4);
    W.open.emplace_back();
    WgmmaOp& op = W.open.back();
    op.n = t0.wg_arg;
    op.has_a = t0.wg_a != nullptr;
    op.trans_b = t0.wg_flag;
    op.desc_a = t0.desc_a;
    op.desc_b = t0.desc_b;
    op.file = t0.file;
    op.line = t0.line;
    for (int i = 0; i < 128; ++i) {
        if (op.has_a) memcpy(op.a[i], T[i].wg_a, sizeof op.a[i]);  // registers are read at issue
        op.d[i] = T[i].wg_d;
    }
    // The async proxy reads the operands from the issue on: what it may see is checked now (and
    // again when it retires).
    op.proxy_reported = (!op.has_a && proxy_check(L, op, op.desc_a, 64, true, "A", true)) ||
                        proxy_check(L, op, op.desc_b, op.n, !op.trans_b, "B", true);
}

void resolve_setmaxnreg(Warpgroup& W, const Thread& t0) {
    const int regs = t0.wg_arg;
    const bool inc = t0.wg_flag;
    if (W.regs && (inc ? regs < W.regs : regs > W.regs))
        report(W_BLOCK, -1, "setmaxnreg.%s %d at %s:%d (warpgroup %u) would %s the warpgroup's count of %d: .inc "
               "must not lower it, .dec must not raise it", inc ? "inc" : "dec", regs, t0.file, t0.line,
               t0.regs.warp / 4, inc ? "lower" : "raise", W.regs);
    W.regs = regs;
}

// Executes warpgroup g's collective (all 128 arrived); false after a fatal error.
bool wg_resolve(Launch& L, int g) {
    Thread* T = L.threads + 128 * g;
    const Thread& t0 = T[0];
    for (int i = 1; i < 128; ++i) {
        if (same_request(t0, T[i])) continue;
        report(W_BLOCK, -1, "warpgroup %d: threads at different warpgroup collectives: thread %d at %s (%s:%d) and "
               "thread %d at %s (%s:%d); the 128 threads of a warpgroup must execute the same .sync.aligned "
               "instruction with the same operands", g, 128 * g, wg_name(t0.wg_op), t0.file, t0.line, 128 * g + i,
               wg_name(T[i].wg_op), T[i].file, T[i].line);
        return false;
    }
    Warpgroup& W = L.hop.wgs[g];
    ++L.stats.collectives;
    switch (t0.wg_op) {
        case WG_FENCE: W.fenced = true; break;
        case WG_COMMIT:
            W.committed.push_back(std::move(W.open));
            W.open.clear();
            break;
        case WG_WAIT: {
            const size_t keep = (size_t)std::max(0, t0.wg_arg);
            size_t n = W.committed.size() > keep ? W.committed.size() - keep : 0;
            for (size_t i = 0; i < n; ++i)
                for (const WgmmaOp& op : W.committed[i]) retire(L, op);
            W.committed.erase(W.committed.begin(), W.committed.begin() + n);
            W.fenced = false;
            break;
        }
        case WG_MMA: resolve_mma(L, W, T); break;
        case WG_SETMAXNREG: resolve_setmaxnreg(W, t0); break;
        default: break;
    }
    for (int i = 0; i < 128; ++i) T[i].state = RUNNABLE;
    return true;
}

void wg_arrive(Launch& L, Thread& t, WgOp op, const char* file, int line) {
    const int g = t.regs.warp / 4;
    t.wg_op = op;
    t.file = file;
    t.line = line;
    if (128 * (g + 1) > L.nthreads) {
        report(W_THREAD, -1, "%s at %s:%d in warpgroup %d, which is partial (the block has %d threads): .sync.aligned "
               "warpgroup instructions need 4 whole warps", wg_name(op), file, line, g, L.nthreads);
        abandon(L, t);
    }
    for (int i = 128 * g; i < 128 * (g + 1); ++i) {
        if (L.threads[i].state != DONE) continue;
        report(W_THREAD, -1, "%s at %s:%d: thread %d of warpgroup %d has exited; all 128 must execute it", wg_name(op),
               file, line, i, g);
        abandon(L, t);
    }
    t.state = AT_WG;
    Warpgroup& W = L.hop.wgs[g];
    if (++W.arrived == 128) {
        W.arrived = 0;
        if (!wg_resolve(L, g)) abandon(L, t);
    }
    switch_to_scheduler(L, t);
}

void release_named(Launch& L, int id) {
    for (int i = 0; i < L.nthreads; ++i) {
        Thread& o = L.threads[i];
        if (o.state == AT_NAMED && o.named_id == id) {
            o.state = RUNNABLE;
            o.named_id = -1;
        }
    }
    L.hop.named[id].threads = 0;
    ++L.stats.barriers;
}

}  // namespace

void async_proxy_saw(Launch& L, const unsigned char* p, size_t n) {
    Hopper& H = L.hop;
    if (p >= L.dyn_base && p + n <= L.dyn_base + H.seen_dyn.size()) {
        memcpy(&H.seen_dyn[p - L.dyn_base], p, n);
        return;
    }
    for (size_t i = 0; i < n; ++i) {
        const unsigned char* q = p + i;
        if (q >= L.dyn_base && q < L.dyn_base + H.seen_dyn.size()) {
            H.seen_dyn[q - L.dyn_base] = *q;
        } else if (q >= L.static_base && q < L.static_base + L.static_used) {
            if (H.seen_static.size() <= (size_t)(q - L.static_base)) H.seen_static.resize(L.static_used, 0xff);
            H.seen_static[q - L.static_base] = *q;
        }
    }
}

int mbar_lookup(Launch& L, const void* bar, const char* what, const char* file, int line) {
    for (size_t i = 0; i < L.hop.bars.size(); ++i)
        if (L.hop.bars[i].addr == bar) return (int)i;
    report(W_THREAD, -1, "%s at %s:%d on an mbarrier at %p (shared 0x%x) that was not initialised (mbarrier_init) in "
           "this block", what, file, line, bar, shared_addr_of(L, bar));
    return -1;
}

void mbar_try_complete(Launch& L, int bar) {
    MBar& b = L.hop.bars[bar];
    if (b.pending) return;
    if (b.inflight < b.tx) return;
    if (b.inflight > b.tx)
        report(W_BLOCK, -1, "transaction count underflow on %s: the TMA copies complete more bytes than the phase "
               "expects (expect_tx too small for the boxes loaded)", mbar_str(L, b).c_str());
    ++b.phase;
    b.pending = b.expected;
    b.tx = b.inflight = 0;
    for (int i = 0; i < L.nthreads; ++i)
        if (L.threads[i].state == AT_MBAR && L.threads[i].wait_bar == bar) L.threads[i].state = RUNNABLE;
}

void hopper_block_start(Launch& L) {
    Hopper& H = L.hop;
    H.bars.clear();
    H.copies.clear();
    H.regions.clear();
    H.wgs.assign((L.nwarps + 3) / 4, Warpgroup{});
    for (NamedBar& nb : H.named) nb.threads = 0;
    H.fence_epoch = 0;
    H.seen_static.assign(L.static_used, 0xff);  // the block's 0xff fill (runtime.cpp)
    H.seen_dyn.assign(L.dyn_bytes, 0xff);
    // The dynamic region sits above the static one in the window, congruent to its host address
    // modulo 1024, as low as 48 KiB when the window would not hold it above the static limit.
    const size_t dyn = (L.dyn_bytes + 15) & ~(size_t)15;
    const size_t room = kWindow > dyn + 1024 ? kWindow - dyn - 1024 : 0;
    H.dyn_window = (std::min(kMaxStaticSmem, room) & ~(size_t)1023) + ((uintptr_t)L.dyn_base & 1023);
}

void hopper_thread_exit(Launch& L, Thread& t) {
    const int g = t.regs.warp / 4;
    Warpgroup& W = L.hop.wgs[g];
    if (W.arrived) {
        for (int i = 128 * g; i < std::min(L.nthreads, 128 * (g + 1)); ++i) {
            const Thread& o = L.threads[i];
            if (o.state != AT_WG) continue;
            report(W_THREAD, -1, "exited while %d threads of its warpgroup %d wait for it at %s (%s:%d)", W.arrived, g,
                   wg_name(o.wg_op), o.file, o.line);
            abandon(L, t);
        }
    }
    if ((!W.open.empty() || !W.committed.empty()) && !W.exit_reported) {
        W.exit_reported = true;
        const WgmmaOp& first = W.open.empty() ? W.committed.front().front() : W.open.front();
        report(W_THREAD, -1, "exited with wgmma of warpgroup %d not retired (%zu issued and not committed, %zu "
               "committed groups not waited for; the first issued at %s:%d): a missing wgmma_commit / "
               "wgmma_wait<0>", g, W.open.size(), W.committed.size(), first.file, first.line);
    }
}

void hopper_block_end(Launch& L) {
    for (const MBar& b : L.hop.bars)
        if (b.tx || b.inflight)
            report(W_BLOCK, -1, "the block ended with transactions outstanding on %s: its current phase never "
                   "completed (a transaction count that never completes)", mbar_str(L, b).c_str());
}

std::string hopper_waits(const Launch& L) {
    std::string out;
    int shown = 0;
    for (size_t b = 0; b < L.hop.bars.size(); ++b) {
        for (int parity = 0; parity < 2; ++parity) {
            int n = 0;
            const Thread* first = nullptr;
            for (int i = 0; i < L.nthreads; ++i) {
                const Thread& t = L.threads[i];
                if (t.state != AT_MBAR || t.wait_bar != (int)b || t.wait_parity != parity) continue;
                if (!first) first = &t;
                ++n;
            }
            if (!first || shown++ >= 4) continue;
            char buf[640];
            snprintf(buf, sizeof buf, "; %d threads (first: thread %u at %s:%d) wait for parity %d on %s", n,
                     first->regs.tid.x, first->file, first->line, parity, mbar_str(L, L.hop.bars[b]).c_str());
            out += buf;
        }
    }
    for (int id = 0; id < 16; ++id) {
        const NamedBar& nb = L.hop.named[id];
        if (!nb.threads) continue;
        char buf[256];
        snprintf(buf, sizeof buf, "; named barrier %d: %d of %d threads counted (first arrival at %s:%d)", id,
                 nb.counted, nb.threads, nb.file, nb.line);
        out += buf;
    }
    for (size_t g = 0; g < L.hop.wgs.size(); ++g) {
        if (!L.hop.wgs[g].arrived) continue;
        const Thread* t = nullptr;
        for (int i = 128 * (int)g; i < L.nthreads && !t; ++i)
            if (L.threads[i].state == AT_WG) t = &L.threads[i];
        char buf[256];
        snprintf(buf, sizeof buf, "; warpgroup %zu: %d of 128 threads wait at %s (%s:%d)", g, L.hop.wgs[g].arrived,
                 t ? wg_name(t->wg_op) : "?", t ? t->file : "?", t ? t->line : 0);
        out += buf;
    }
    return out;
}

}  // namespace rt

using namespace rt;

void mbarrier_init(uint64_t* bar, unsigned count, const char* file, int line) {
    Launch& L = launch_or_die("mbarrier.init");
    if ((uintptr_t)bar % 8 || !in_shared(L, bar, 8)) {
        report(W_THREAD, -1, "mbarrier.init at %s:%d: %p is not an 8-byte aligned object in the block's shared memory",
               file, line, (void*)bar);
        return;
    }
    if (count < 1 || count >= (1u << 20)) {
        report(W_THREAD, -1, "mbarrier.init at %s:%d with count %u: must be in 1 .. 2^20-1", file, line, count);
        return;
    }
    Hopper& H = L.hop;
    MBar b{(unsigned char*)bar, count, count, 0, 0, 0, H.fence_epoch, file, line};
    *bar = count;  // the object's bits are opaque; the runtime keeps the state
    for (MBar& o : H.bars)
        if (o.addr == (unsigned char*)bar) {
            o = b;
            return;
        }
    H.bars.push_back(b);
}

void fence_barrier_init(const char*, int) {
    Launch& L = launch_or_die("fence.mbarrier_init");
    ++L.hop.fence_epoch;
}

void fence_proxy_async(const char*, int) {
    Launch& L = launch_or_die("fence.proxy.async");
    Hopper& H = L.hop;
    H.seen_static.assign(L.static_base, L.static_base + L.static_used);
    H.seen_dyn.assign(L.dyn_base, L.dyn_base + L.dyn_bytes);
}

static void arrive(Launch& L, int b, const char* what, const char* file, int line) {
    MBar& m = L.hop.bars[b];
    if (!m.pending) {
        report(W_THREAD, -1, "%s at %s:%d: more arrivals than the expected count in the current phase of %s", what, file,
               line, mbar_str(L, m).c_str());
        return;
    }
    --m.pending;
    mbar_try_complete(L, b);
}

void mbarrier_arrive(uint64_t* bar, const char* file, int line) {
    Launch& L = launch_or_die("mbarrier.arrive");
    const int b = mbar_lookup(L, bar, "mbarrier.arrive", file, line);
    if (b >= 0) arrive(L, b, "mbarrier.arrive", file, line);
}

void mbarrier_arrive_expect_tx(uint64_t* bar, unsigned bytes, const char* file, int line) {
    Launch& L = launch_or_die("mbarrier.arrive.expect_tx");
    const int b = mbar_lookup(L, bar, "mbarrier.arrive.expect_tx", file, line);
    if (b < 0) return;
    MBar& m = L.hop.bars[b];
    if (m.tx + bytes >= (1 << 20)) {
        report(W_THREAD, -1, "mbarrier.arrive.expect_tx at %s:%d of %u bytes: the tx-count would leave its range "
               "(2^20-1) on %s", file, line, bytes, mbar_str(L, m).c_str());
        return;
    }
    m.tx += bytes;
    arrive(L, b, "mbarrier.arrive.expect_tx", file, line);
}

void mbarrier_wait(uint64_t* bar, unsigned parity, const char* file, int line) {
    Launch& L = launch_or_die("mbarrier.try_wait.parity");
    Thread& t = *L.cur;
    const int b = mbar_lookup(L, bar, "mbarrier.try_wait.parity", file, line);
    if (b < 0) return;
    parity &= 1;
    // The phase of this parity has completed once the current phase's parity differs.
    while ((L.hop.bars[b].phase & 1) == parity) {
        t.state = AT_MBAR;
        t.wait_bar = b;
        t.wait_parity = (int)parity;
        t.file = file;
        t.line = line;
        switch_to_scheduler(L, t);
    }
    t.wait_bar = -1;
    tma_land_completed(L, b);
}

void named_barrier(int id, int threads, bool wait, const char* file, int line) {
    Launch& L = launch_or_die(wait ? "bar.sync" : "bar.arrive");
    Thread& t = *L.cur;
    const char* what = wait ? "bar.sync" : "bar.arrive";
    if (id < 0 || id > 15 || threads <= 0 || threads % 32 || threads > 32 * L.nwarps) {
        report(W_THREAD, -1, "%s %d, %d at %s:%d: the id must be in 0..15 and the thread count a positive multiple of "
               "32 no larger than the block (%d warps)", what, id, threads, file, line, L.nwarps);
        abandon(L, t);
    }
    NamedBar& nb = L.hop.named[id];
    if (!nb.threads) {
        nb.threads = threads;
        nb.counted = 0;
        memset(nb.lanes, 0, sizeof nb.lanes);
        nb.file = file;
        nb.line = line;
    } else if (nb.threads != threads) {
        report(W_THREAD, -1, "%s %d at %s:%d with %d threads, while the barrier counts to %d (first arrival at %s:%d): "
               "all warps must name the same thread count", what, id, file, line, threads, nb.threads, nb.file,
               nb.line);
        abandon(L, t);
    }
    const int w = t.regs.warp;
    const uint32_t bit = 1u << t.regs.lane, live = L.warps[w].members & ~L.warps[w].exited;
    if (nb.lanes[w] & bit) {
        report(W_THREAD, -1, "%s %d at %s:%d: this thread already arrived in the barrier's current round (at %s:%d)",
               what, id, file, line, nb.file, nb.line);
        abandon(L, t);
    }
    nb.lanes[w] |= bit;
    if ((nb.lanes[w] & live) == live) nb.counted += 32;  // a warp counts 32 threads
    if (wait) {
        t.state = AT_NAMED;
        t.named_id = id;
        t.file = file;
        t.line = line;
    }
    if (nb.counted >= nb.threads) release_named(L, id);
    if (wait) switch_to_scheduler(L, t);
}

void setmaxnreg(bool inc, int regs, const char* file, int line) {
    Launch& L = launch_or_die("setmaxnreg");
    Thread& t = *L.cur;
    if (regs < 24 || regs > 256 || regs % 8) {
        report(W_THREAD, -1, "setmaxnreg at %s:%d with %d registers: must be in 24..256, a multiple of 8", file, line,
               regs);
        abandon(L, t);
    }
    t.wg_arg = regs;
    t.wg_flag = inc;
    wg_arrive(L, t, WG_SETMAXNREG, file, line);
}

void wgmma_fence(const char* file, int line) {
    Launch& L = launch_or_die("wgmma.fence");
    L.cur->wg_arg = 0;
    L.cur->wg_flag = false;
    wg_arrive(L, *L.cur, WG_FENCE, file, line);
}

void wgmma_commit(const char* file, int line) {
    Launch& L = launch_or_die("wgmma.commit_group");
    L.cur->wg_arg = 0;
    L.cur->wg_flag = false;
    wg_arrive(L, *L.cur, WG_COMMIT, file, line);
}

void wgmma_wait(int pending, const char* file, int line) {
    Launch& L = launch_or_die("wgmma.wait_group");
    L.cur->wg_arg = pending;
    L.cur->wg_flag = false;
    wg_arrive(L, *L.cur, WG_WAIT, file, line);
}

void wgmma_mma(int n, float* d, const uint32_t* a_regs, uint64_t desc_a, uint64_t desc_b, bool trans_b,
               const char* file, int line) {
    Launch& L = launch_or_die("wgmma.mma_async");
    Thread& t = *L.cur;
    if (n < 8 || n > 256 || n % 8 || !d) {
        report(W_THREAD, -1, "wgmma.mma_async at %s:%d: m64n%dk16 needs N a multiple of 8 in 8..256 and accumulators",
               file, line, n);
        abandon(L, t);
    }
    t.wg_arg = n;
    t.wg_flag = trans_b;
    t.wg_a = a_regs;
    t.wg_d = d;
    t.desc_a = a_regs ? 0 : desc_a;
    t.desc_b = desc_b;
    wg_arrive(L, t, WG_MMA, file, line);
}

}  // namespace emu
