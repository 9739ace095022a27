// The emulated CUDA device's warp collectives (interface: emu_cuda.h; internals shared with the
// scheduler in runtime_internal.h): __shfl_*_sync, votes, __syncwarp, __activemask, ldmatrix and
// mma.sync m16n8k16. A thread's request is recorded, and the collective is executed by the last
// lane of its mask to arrive (resolve), with every check the PTX ISA and the CUDA Programming Guide
// ask for: lanes that agree on the mask and the operation, no exited lanes, .aligned instructions
// in full warps.
#include <string.h>

#include <algorithm>
#include <string>

#include "runtime_internal.h"

namespace emu {
namespace rt {

const char* op_name(Op op, int sub) {
    switch (op) {
        case OP_SHFL: {
            static const char* n[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync"};
            return n[sub];
        }
        case OP_VOTE: {
            static const char* n[] = {"__ballot_sync", "__any_sync", "__all_sync"};
            return n[sub];
        }
        case OP_SYNCWARP:
            return "__syncwarp";
        case OP_LDMATRIX:
            return sub ? "ldmatrix .trans" : "ldmatrix";
        case OP_MMA:
            return "mma.sync m16n8k16";
        default:
            return "?";
    }
}

namespace {

inline uint16_t ld16(const void* row, int col) {
    uint16_t v;
    memcpy(&v, (const char*)row + 2 * col, 2);
    return v;
}

inline float bf_half(uint32_t reg, int half) { return __uint_as_float((reg >> (16 * half)) << 16); }

// Executes the collective of the lanes in `lanes` (all arrived). Returns false after a fatal error.
bool resolve(Launch& L, int warp, uint32_t lanes) {
    Thread* T = L.threads + warp * 32;
    const int first = __builtin_ctz(lanes);
    const Thread& t0 = T[first];
    ++L.stats.collectives;
    for (uint32_t m = lanes; m; m &= m - 1) {
        const Thread& t = T[__builtin_ctz(m)];
        // The same operation, mask and width everywhere. The same call site only for the .aligned
        // instructions (ldmatrix, mma): shfl.sync, vote.sync and bar.warp.sync need the same
        // instruction in convergence only on sm_6x and below ([PTX] "shfl.sync", "vote.sync",
        // "bar.warp.sync"), so on sm_70+ lanes may meet from different call sites.
        const bool aligned = t0.op == OP_LDMATRIX || t0.op == OP_MMA;
        if (t.op != t0.op || t.sub != t0.sub || t.mask != t0.mask ||
            (aligned && (t.line != t0.line || (t.file != t0.file && strcmp(t.file, t0.file) != 0))) ||
            (t.op == OP_SHFL && t.width != t0.width) || (t.op == OP_LDMATRIX && t.num != t0.num)) {
            report(W_WARP, warp,
                   "lanes at different warp collectives: lane %u at %s (%s:%d, mask 0x%08x) and lane %u at %s (%s:%d, "
                   "mask 0x%08x); all lanes named in a mask must execute the same collective",
                   t0.regs.lane, op_name(t0.op, t0.sub), t0.file, t0.line, t0.mask, t.regs.lane, op_name(t.op, t.sub),
                   t.file, t.line, t.mask);
            return false;
        }
    }
    switch (t0.op) {
        case OP_SHFL: {
            const int w = t0.width;
            for (uint32_t m = lanes; m; m &= m - 1) {
                const int i = __builtin_ctz(m);
                Thread& t = T[i];
                const int base = i & ~(w - 1);
                int src = i;
                switch ((ShflMode)t.sub) {
                    case SHFL_IDX:
                        src = base + (t.arg & (w - 1));
                        break;
                    case SHFL_UP:
                        src = i - t.arg >= base ? i - t.arg : i;
                        break;
                    case SHFL_DOWN:
                        src = i + t.arg < base + w ? i + t.arg : i;
                        break;
                    case SHFL_XOR:
                        src = i ^ (t.arg & 31);
                        src = src < base + w ? src : i;
                        break;
                }
                if (!(lanes >> src & 1)) {
                    report(W_WARP, warp, "%s at %s:%d: lane %d reads lane %d, which %s (an undefined value)",
                           op_name(t.op, t.sub), t.file, t.line, i, src,
                           !(t.mask >> src & 1) ? "is not in the mask"
                                                : "does not exist (the block's last warp is partial)");
                    t.res = t.val;
                } else {
                    t.res = T[src].val;
                }
            }
            break;
        }
        case OP_VOTE: {
            uint32_t ballot = 0;
            for (uint32_t m = lanes; m; m &= m - 1)
                if (T[__builtin_ctz(m)].val) ballot |= 1u << __builtin_ctz(m);
            uint32_t r = ballot;
            if (t0.sub == VOTE_ANY) r = ballot != 0;
            if (t0.sub == VOTE_ALL) r = ballot == lanes;
            for (uint32_t m = lanes; m; m &= m - 1) T[__builtin_ctz(m)].res = r;
            break;
        }
        case OP_SYNCWARP:
            break;
        case OP_LDMATRIX: {
            const int num = t0.num;
            const bool trans = t0.sub;
            bool ok = true;
            for (int i = 0; i < 8 * num; ++i) {
                const void* a = T[i].addr;
                if ((uintptr_t)a % 16) {
                    report(W_WARP, warp, "%s at %s:%d: lane %d's row address %p is not 16-byte aligned",
                           op_name(t0.op, trans), t0.file, t0.line, i, a);
                    ok = false;
                } else if (!in_shared(L, a, 16)) {
                    report(W_WARP, warp,
                           "%s at %s:%d: lane %d's row [%p, +16) is outside the block's shared memory (static %p +%zu, "
                           "dynamic %p +%zu)",
                           op_name(t0.op, trans), t0.file, t0.line, i, a, (void*)L.static_base, L.static_used,
                           (void*)L.dyn_base, L.dyn_bytes);
                    ok = false;
                }
                if (!ok) break;
            }
            uint32_t out[32][4];
            for (int l = 0; l < 32; ++l) {
                for (int m = 0; m < num; ++m) {
                    uint16_t lo = 0xffff, hi = 0xffff;  // NaN when the access was refused
                    if (ok) {
                        if (!trans) {
                            const void* row = T[8 * m + l / 4].addr;
                            lo = ld16(row, 2 * (l % 4));
                            hi = ld16(row, 2 * (l % 4) + 1);
                        } else {
                            lo = ld16(T[8 * m + 2 * (l % 4)].addr, l / 4);
                            hi = ld16(T[8 * m + 2 * (l % 4) + 1].addr, l / 4);
                        }
                    }
                    out[l][m] = (uint32_t)lo | ((uint32_t)hi << 16);
                }
            }
            for (int l = 0; l < 32; ++l) memcpy(T[l].out, out[l], 4 * num);
            break;
        }
        case OP_MMA: {
            // Gather the fragments into A (16x16), B (16x8) and C (16x8), multiply in double: the
            // bf16 products are exact, each D element sums them in k order (8 independent chains
            // per row, so the loop is not latency-bound) and adds C, then rounds to f32 once.
            double A[16][16], C[16][8];
            alignas(16) double Bk[16][8];
            for (int l = 0; l < 32; ++l) {
                const int g = l / 4, t = l % 4;
                const Thread& th = T[l];
                for (int h = 0; h < 2; ++h) {
                    A[g][2 * t + h] = bf_half(th.a[0], h);
                    A[g + 8][2 * t + h] = bf_half(th.a[1], h);
                    A[g][2 * t + 8 + h] = bf_half(th.a[2], h);
                    A[g + 8][2 * t + 8 + h] = bf_half(th.a[3], h);
                    Bk[2 * t + h][g] = bf_half(th.b0, h);
                    Bk[2 * t + 8 + h][g] = bf_half(th.b1, h);
                    C[g][2 * t + h] = th.d[h];
                    C[g + 8][2 * t + h] = th.d[2 + h];
                }
            }
            typedef double v2d __attribute__((vector_size(16)));
            for (int row = 0; row < 16; ++row) {
                v2d acc0 = {0, 0}, acc1 = {0, 0}, acc2 = {0, 0}, acc3 = {0, 0};
                for (int k = 0; k < 16; ++k) {
                    const v2d a = {A[row][k], A[row][k]};
                    const v2d* b = reinterpret_cast<const v2d*>(Bk[k]);
                    acc0 += a * b[0];
                    acc1 += a * b[1];
                    acc2 += a * b[2];
                    acc3 += a * b[3];
                }
                const v2d acc[4] = {acc0, acc1, acc2, acc3};
                for (int col = 0; col < 8; ++col) C[row][col] += acc[col / 2][col % 2];
            }
            for (int l = 0; l < 32; ++l) {
                const int g = l / 4, t = l % 4;
                for (int e = 0; e < 4; ++e) T[l].d[e] = (float)C[g + (e / 2) * 8][2 * t + (e % 2)];
            }
            break;
        }
        default:
            break;
    }
    for (uint32_t m = lanes; m; m &= m - 1) T[__builtin_ctz(m)].state = RUNNABLE;
    return true;
}

}  // namespace


// The calling thread's request is filled in: arrive, resolve if last, go back to the scheduler.
void warp_arrive(Launch& L, Thread& t) {
    const int wi = t.regs.warp;
    Warp& w = L.warps[wi];
    const uint32_t bit = 1u << t.regs.lane;
    const bool aligned = t.op == OP_LDMATRIX || t.op == OP_MMA;
    if (aligned && w.members != 0xffffffffu) {
        report(W_THREAD, -1,
               "%s at %s:%d in a partial warp (lanes %s exist): .aligned warp instructions need all 32 lanes",
               op_name(t.op, t.sub), t.file, t.line, lanes_str(w.members).c_str());
        abandon(L, t);
    }
    if (!(t.mask & bit)) {
        report(W_THREAD, -1, "%s at %s:%d with mask 0x%08x, which does not name the calling lane", op_name(t.op, t.sub),
               t.file, t.line, t.mask);
        abandon(L, t);
    }
    const uint32_t need = t.mask & w.members;
    if (need & w.exited) {
        report(W_THREAD, -1, "%s at %s:%d with mask 0x%08x: lanes %s of the mask have exited", op_name(t.op, t.sub),
               t.file, t.line, t.mask, lanes_str(need & w.exited).c_str());
        abandon(L, t);
    }
    w.arrived |= bit;
    t.state = AT_WARP;
    if ((w.arrived & need) == need) {
        w.arrived &= ~need;
        if (!resolve(L, wi, need)) abandon(L, t);
    }
    switch_to_scheduler(L, t);
}

}  // namespace rt

using namespace rt;

uint64_t shfl(ShflMode mode, unsigned mask, uint64_t bits, int lane_arg, int width, const char* file, int line) {
    Launch& L = launch_or_die("__shfl_*_sync");
    Thread& t = *L.cur;
    if (width < 1 || width > 32 || (width & (width - 1))) {
        report(W_THREAD, -1, "%s at %s:%d with width %d: must be a power of two in [1, 32]", op_name(OP_SHFL, mode),
               file, line, width);
        width = 32;
    }
    t.op = OP_SHFL;
    t.sub = (uint8_t)mode;
    t.mask = mask;
    t.val = bits;
    t.arg = lane_arg;
    t.width = width;
    t.file = file;
    t.line = line;
    warp_arrive(L, t);
    return t.res;
}

unsigned vote(VoteMode mode, unsigned mask, int predicate, const char* file, int line) {
    Launch& L = launch_or_die("__ballot/any/all_sync");
    Thread& t = *L.cur;
    t.op = OP_VOTE;
    t.sub = (uint8_t)mode;
    t.mask = mask;
    t.val = predicate != 0;
    t.file = file;
    t.line = line;
    warp_arrive(L, t);
    return (unsigned)t.res;
}

void syncwarp(unsigned mask, const char* file, int line) {
    Launch& L = launch_or_die("__syncwarp");
    Thread& t = *L.cur;
    t.op = OP_SYNCWARP;
    t.sub = 0;
    t.mask = mask;
    t.file = file;
    t.line = line;
    warp_arrive(L, t);
}

unsigned activemask() {
    Launch& L = launch_or_die("__activemask");
    const Warp& w = L.warps[L.cur->regs.warp];
    return w.members & ~w.exited;
}

void ldmatrix(uint32_t* r, int num, const void* row_addr, bool trans, const char* file, int line) {
    Launch& L = launch_or_die("ldmatrix");
    Thread& t = *L.cur;
    if (num != 1 && num != 2 && num != 4) {
        report(W_THREAD, -1, "ldmatrix at %s:%d with .x%d: must be .x1, .x2 or .x4", file, line, num);
        abandon(L, t);
    }
    t.op = OP_LDMATRIX;
    t.sub = trans;
    t.num = (uint8_t)num;
    t.mask = 0xffffffffu;
    t.addr = row_addr;
    t.out = r;
    t.file = file;
    t.line = line;
    warp_arrive(L, t);
}

void mma_bf16_m16n8k16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1, const char* file, int line) {
    Launch& L = launch_or_die("mma.sync");
    Thread& t = *L.cur;
    t.op = OP_MMA;
    t.sub = 0;
    t.mask = 0xffffffffu;
    t.a = a;
    t.b0 = b0;
    t.b1 = b1;
    t.d = d;
    t.file = file;
    t.line = line;
    warp_arrive(L, t);
}

}  // namespace emu
