// What a round of the stand-in libnccl computes, once every rank has posted its call
// (emu/nccl.cpp says what and why; emu/nccl_internal.h has the types): the ring-order sums of
// ncclAllReduce / ncclReduceScatter, the gathers and broadcasts, the matching and copies of a
// round of ncclSend / ncclRecv, and the checks that the ranks' calls agree.

#include "nccl_internal.h"

#include <string.h>

#include <algorithm>
#include <utility>

namespace swerve_nccl {
namespace {


uint16_t f32_to_bf16(float f) {  // round to nearest even; NaN -> 0x7fff as the emulated cvt
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
float bf16_to_f32(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// The ring's sum of n elements of every rank's send buffer into `out`: element i, in chunk
// c = i / chunk, is x_{c+1}[i] + x_{c+2}[i] + ... + x_c[i] (ranks mod R), each partial sum in the
// element's type (bf16: rounded to bf16 after every addition). See the header.
void reduce_ring(const Group& g, int type, size_t n, size_t chunk, unsigned char* out) {
    const int R = g.nranks;
    for (size_t i = 0; i < n; ++i) {
        const int first = (int)((i / chunk + 1) % (size_t)R);
        if (type == ncclFloat32) {
            float acc = ((const float*)g.slots[first].send)[i];
            for (int k = 1; k < R; ++k) acc += ((const float*)g.slots[(first + k) % R].send)[i];
            ((float*)out)[i] = acc;
        } else if (type == ncclBfloat16) {
            uint16_t acc = ((const uint16_t*)g.slots[first].send)[i];
            for (int k = 1; k < R; ++k)
                acc = f32_to_bf16(bf16_to_f32(acc) + bf16_to_f32(((const uint16_t*)g.slots[(first + k) % R].send)[i]));
            ((uint16_t*)out)[i] = acc;
        } else {  // ncclFloat64
            double acc = ((const double*)g.slots[first].send)[i];
            for (int k = 1; k < R; ++k) acc += ((const double*)g.slots[(first + k) % R].send)[i];
            ((double*)out)[i] = acc;
        }
    }
}

// Rank `from`'s sends to rank `to`, or rank `to`'s receives from rank `from`, in call order.
std::vector<const P2pOp*> p2p_ops(const Group& g, int rank, int peer, bool send) {
    std::vector<const P2pOp*> ops;
    for (const P2pOp& op : g.slots[rank].ops)
        if (op.send == send && op.peer == peer) ops.push_back(&op);
    return ops;
}

// Why the ranks' point-to-point calls do not match, or empty.
std::string p2p_mismatch(const Group& g) {
    const int R = g.nranks;
    for (int from = 0; from < R; ++from) {
        for (int to = 0; to < R; ++to) {
            const auto sends = p2p_ops(g, from, to, true), recvs = p2p_ops(g, to, from, false);
            char why[512];
            if (sends.size() != recvs.size()) {
                snprintf(why, sizeof why, "ncclSend/ncclRecv: rank %d sends %zu time(s) to rank %d, which receives %zu time(s) from it",
                         from, sends.size(), to, recvs.size());
                return why;
            }
            for (size_t k = 0; k < sends.size(); ++k) {
                if (sends[k]->count != recvs[k]->count || sends[k]->type != recvs[k]->type) {
                    snprintf(why, sizeof why,
                             "ncclSend/ncclRecv: rank %d's send #%zu to rank %d is %zu x %s, rank %d's receive #%zu from rank %d "
                             "is %zu x %s",
                             from, k + 1, to, sends[k]->count, type_name(sends[k]->type), to, k + 1, from, recvs[k]->count,
                             type_name(recvs[k]->type));
                    return why;
                }
            }
        }
    }
    return std::string();
}

// Copies every matched send into its receive (all sends read before any receive is written).
void execute_p2p(const Group& g) {
    const int R = g.nranks;
    std::vector<std::pair<void*, std::vector<unsigned char>>> writes;
    for (int from = 0; from < R; ++from) {
        for (int to = 0; to < R; ++to) {
            const auto sends = p2p_ops(g, from, to, true), recvs = p2p_ops(g, to, from, false);
            for (size_t k = 0; k < sends.size(); ++k) {
                const unsigned char* src = (const unsigned char*)sends[k]->buf;
                writes.emplace_back(recvs[k]->buf, std::vector<unsigned char>(src, src + sends[k]->count * type_size(sends[k]->type)));
            }
        }
    }
    for (const auto& w : writes)
        if (!w.second.empty()) memcpy(w.first, w.second.data(), w.second.size());
}

}  // namespace

void execute(Group& g) {
    const Call& c0 = g.slots[0];
    const int R = g.nranks;
    const size_t es = type_size(c0.type), n = c0.count, bytes = n * es;
    std::vector<unsigned char> staged;
    switch (c0.kind) {
        case ALL_REDUCE:
            staged.resize(bytes);
            reduce_ring(g, c0.type, n, std::max<size_t>(1, (n + R - 1) / R), staged.data());
            for (int r = 0; r < R; ++r) memcpy(g.slots[r].recv, staged.data(), bytes);
            break;
        case REDUCE_SCATTER:
            staged.resize(bytes * R);
            reduce_ring(g, c0.type, n * R, std::max<size_t>(1, n), staged.data());
            for (int r = 0; r < R; ++r) memcpy(g.slots[r].recv, staged.data() + r * bytes, bytes);
            break;
        case ALL_GATHER:
            staged.resize(bytes * R);
            for (int r = 0; r < R; ++r) memcpy(staged.data() + r * bytes, g.slots[r].send, bytes);
            for (int r = 0; r < R; ++r) memcpy(g.slots[r].recv, staged.data(), bytes * R);
            break;
        case BROADCAST:
            staged.assign((const unsigned char*)g.slots[c0.root].send, (const unsigned char*)g.slots[c0.root].send + bytes);
            for (int r = 0; r < R; ++r) memcpy(g.slots[r].recv, staged.data(), bytes);
            break;
        case P2P:
            execute_p2p(g);
            break;
    }
}

std::string mismatch(const Group& g) {
    const int R = g.nranks;
    auto describe = [&](const char* what, auto value) {
        std::string s = std::string(kind_name(g.slots[0].kind)) + ": the ranks disagree on " + what + ":";
        for (int r = 0; r < R; ++r) s += " rank " + std::to_string(r) + " " + value(g.slots[r]) + (r + 1 < R ? "," : "");
        return s;
    };
    for (int r = 1; r < R; ++r)
        if (g.slots[r].kind != g.slots[0].kind)
            return describe("the collective", [](const Call& c) { return std::string(kind_name(c.kind)); });
    if (g.slots[0].kind == P2P) return p2p_mismatch(g);
    for (int r = 1; r < R; ++r)
        if (g.slots[r].count != g.slots[0].count)
            return describe("the count", [](const Call& c) { return std::to_string(c.count); });
    for (int r = 1; r < R; ++r)
        if (g.slots[r].type != g.slots[0].type)
            return describe("the datatype", [](const Call& c) { return std::string(type_name(c.type)); });
    for (int r = 1; r < R; ++r)
        if (g.slots[r].op != g.slots[0].op)
            return describe("the reduction", [](const Call& c) { return std::to_string(c.op); });
    for (int r = 1; r < R; ++r)
        if (g.slots[r].root != g.slots[0].root)
            return describe("the root", [](const Call& c) { return std::to_string(c.root); });
    return std::string();
}

}  // namespace swerve_nccl
