// A stand-in libnccl for the emulated CUDA device: the subset of the NCCL C API that
// src/dist/nccl/ calls, for ranks that are threads of one process, all on the emulated device
// (whose memory is host memory). This file: the C API, communicators, groups and the rendezvous;
// nccl_rounds.cpp: what a round computes; nccl_internal.h: what the two share. Built by build.rs
// (SWERVE_EMU=1) with nccl_rounds.cpp as $OUT_DIR/emu/libnccl.so with
// soname libnccl.so.2, linked against the stand-in libcuda, and loaded after it by absolute path.
//
// What it computes. The unique id names an in-process rendezvous (a serial number and this
// process's id, behind a magic string). ncclCommInitRank waits until every rank of the id has
// joined. Each collective waits until every rank of the communicator has called it, checks that
// the calls agree (the same collective, count, datatype, operation, root), then the last rank to
// arrive computes every rank's result into a staging buffer and writes each rank's receive buffer:
//  - ncclAllReduce / ncclReduceScatter (ncclSum only) model real NCCL's ring, NOT rank order:
//    the message is cut into one chunk per rank (ncclReduceScatter: chunk c is rank c's part;
//    ncclAllReduce: chunks of ceil(count / nranks) elements, the last one short), and element i
//    of chunk c is accumulated around the ring starting from rank (c + 1) % n:
//    acc = x_{c+1}[i]; acc += x_{c+2}[i]; ...; acc += x_c[i] (ranks mod n), as a ring
//    reduce-scatter passes chunk c along. f32 and f64 accumulate in their own type; bf16 rounds
//    every partial sum to bf16 (round-to-nearest-even), as NCCL's bf16 reduction kernels do.
//    The same bits on every rank, but not the rank-order f32 sum rounded once that swerve's
//    tensor-parallel sums compute (src/dist/nccl/ordered.rs over ncclSend/ncclRecv, the CPU
//    backend's host path): from 3 ranks on the two differ (at 2, x_1 + x_0 == x_0 + x_1 and the
//    single bf16 rounding is the same), so a test sees a tensor-parallel sum that went through
//    ncclAllReduce. Real NCCL's order also changes with the message size and algorithm (tree,
//    NVLS, chunking); the model is one fixed ring, enough to show that the order is not rank order.
//  - ncclSend / ncclRecv: point-to-point, between ncclGroupStart and ncclGroupEnd (or alone). A
//    rank's sends and receives of one group (on one communicator) form ONE round of the
//    rendezvous below, like a collective: every rank of the communicator must make a group of
//    point-to-point calls at the same point of its sequence of calls (an all-to-all, as swerve's
//    ordered sums do; a rank with nothing to send or receive that skips the group makes the others
//    time out, naming it). In the round, rank r's sends to rank p match rank p's receives from
//    rank r one by one, in the order each rank called them; their counts and datatypes must agree.
//    Sends to and receives from oneself are allowed (NCCL allows them too).
//  - ncclAllGather: every rank's send buffer in rank order; ncclBroadcast: the root's buffer.
//  In-place calls (send == recv, or an all-gather's send inside its receive buffer) are fine: all
//  inputs are read before any output is written.
//
// Misuse is an error return, never a hang or a silent wrong answer, with one stderr line
// "swerve emulated NCCL: <result>: <why>" naming the call and the ranks (ncclGetLastError returns
// the same text): calls that disagree across ranks (ncclInvalidUsage); a rank that does not arrive
// within SWERVE_EMU_NCCL_TIMEOUT_S seconds (default 300) or that destroyed its communicator while
// the others wait (ncclRemoteError); sends and receives that do not match, by number, count or
// datatype (ncclInvalidUsage, naming both ranks); an unknown or destroyed communicator, a foreign
// id, a rank joining twice, a peer out of range, buffers that are not device memory or too small
// (ncclInvalidArgument). After a
// failed collective the communicator is broken: every later collective of every rank fails with
// the first cause (real NCCL would hang or leave the communicator in an asynchronous error).
// Unlike real NCCL, several ranks may share the one emulated device (NCCL refuses that: "Duplicate
// GPU detected"), and nothing crosses process boundaries.
//
// Streams: a collective is handed to the stand-in driver's stream
// (swerve_emu_stream_enqueue_checked, emu/driver.cpp), which runs it at once, as the emulated
// device runs all work, or records it while the stream captures a graph, and each replay then
// runs the rendezvous (every rank must replay its graph on its own thread). A failure of a
// recorded collective fails cuGraphLaunch. The calling thread blocks in the call until every rank
// has arrived: drive each rank from its own thread (the protocol real NCCL needs too, where each
// rank's ncclCommInitRank must run concurrently with the others'), or group the calls:
// between ncclGroupStart and ncclGroupEnd calls are deferred, and ncclGroupEnd runs each
// communicator's deferred calls in order, the communicators concurrently on helper threads
// (so one thread may initialise, or reduce over, several ranks, as ncclCommInitAll does).

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "nccl_internal.h"

// The stand-in driver's entry points (emu/driver.cpp).
extern "C" int swerve_emu_stream_enqueue_checked(void* stream, int (*run)(void*), void* ctx, void (*drop)(void*));
extern "C" int swerve_emu_check_device_range(unsigned long long ptr, size_t bytes, const char* what);

namespace swerve_nccl {

struct Comm {
    static constexpr uint64_t kLive = 0x4e43434c'636f6d6dull;
    uint64_t magic = kLive;
    std::shared_ptr<Group> group;
    int rank = 0, nranks = 0;
    bool ready = false;  // ncclCommInitRank completed (deferred inside a group)
    std::mutex error_mu;
    std::string last_error;
};

std::mutex g_mu;  // guards the two tables below
std::map<uint64_t, std::shared_ptr<Group>> g_groups;  // by the id's serial
std::set<Comm*> g_comms;                              // live communicators
std::atomic<uint64_t> g_next_serial{1};
thread_local std::string t_last_error;

// Records and prints why a call failed; returns `code`.
ncclResult_t fail(Comm* comm, ncclResult_t code, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
ncclResult_t fail(Comm* comm, ncclResult_t code, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char msg[2048];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "swerve emulated NCCL: %s: %s\n", result_name(code), msg);
    t_last_error = msg;
    if (comm) {
        std::lock_guard<std::mutex> lock(comm->error_mu);
        comm->last_error = msg;
    }
    return code;
}

// The live communicator behind a handle, or null.
Comm* live(void* handle) {
    std::lock_guard<std::mutex> lock(g_mu);
    Comm* c = static_cast<Comm*>(handle);
    return g_comms.count(c) ? c : nullptr;
}

std::string rank_list(const std::vector<int>& ranks) {
    std::string s;
    for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
    return s;
}

// ---- groups (ncclGroupStart / ncclGroupEnd) ----------------------------------------------------

struct Deferred {
    Comm* comm;
    bool init;  // ncclCommInitRank, else a collective
    Call call;
    void* stream;
};
thread_local int t_group_depth = 0;
thread_local std::vector<Deferred> t_deferred;

// ---- ncclCommInitRank -------------------------------------------------------------------------

ncclResult_t join(Comm* c) {
    std::shared_ptr<Group> g = c->group;
    std::unique_lock<std::mutex> lock(g->mu);
    if (!g->broken.empty())
        return fail(c, g->broken_code, "ncclCommInitRank (rank %d of %d): %s", c->rank, g->nranks, g->broken.c_str());
    if (g->formed)
        return fail(c, ncclInvalidUsage, "ncclCommInitRank (rank %d): this id's %d ranks have all joined already; an id makes one communicator",
                    c->rank, g->nranks);
    if (g->joined[c->rank])
        return fail(c, ncclInvalidUsage, "ncclCommInitRank: rank %d of %d joined twice with one id", c->rank, g->nranks);
    g->joined[c->rank] = true;
    if (++g->joined_count == g->nranks) {
        g->formed = true;
        g->changed.notify_all();
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds());
    while (!g->formed && g->broken.empty()) {
        if (g->changed.wait_until(lock, deadline) == std::cv_status::timeout && !g->formed && g->broken.empty()) {
            std::vector<int> missing, present;
            for (int r = 0; r < g->nranks; ++r) (g->joined[r] ? present : missing).push_back(r);
            char why[1024];
            snprintf(why, sizeof why,
                     "rank(s) %s of %d never called ncclCommInitRank within %.0f s (SWERVE_EMU_NCCL_TIMEOUT_S); "
                     "rank(s) %s did",
                     rank_list(missing).c_str(), g->nranks, timeout_seconds(), rank_list(present).c_str());
            g->broken = why;
            g->broken_code = ncclRemoteError;
            g->changed.notify_all();
        }
    }
    if (!g->formed)
        return fail(c, g->broken_code, "ncclCommInitRank (rank %d of %d): %s", c->rank, g->nranks, g->broken.c_str());
    c->ready = true;
    return ncclSuccess;
}

// ---- collectives --------------------------------------------------------------------------------

// What a round computes: emu/nccl_rounds.cpp.

// One rank's part of a collective: post, wait for the others, the last one runs the round.
ncclResult_t rendezvous(Comm* c, const Call& call) {
    std::shared_ptr<Group> g = c->group;
    std::unique_lock<std::mutex> lock(g->mu);
    const char* name = kind_name(call.kind);
    const uint64_t nth = ++g->calls[c->rank];
    if (!g->broken.empty())
        return fail(c, g->broken_code, "%s (rank %d of %d, its collective #%llu): the communicator is broken: %s", name,
                    c->rank, g->nranks, (unsigned long long)nth, g->broken.c_str());
    g->slots[c->rank] = call;
    g->posted[c->rank] = true;
    const uint64_t round = g->generation;
    if (++g->arrived == g->nranks) {
        const std::string why = mismatch(*g);
        if (!why.empty()) {
            g->broken = why;
            g->broken_code = ncclInvalidUsage;
            g->changed.notify_all();
            return fail(c, ncclInvalidUsage, "%s (rank %d of %d): %s", name, c->rank, g->nranks, why.c_str());
        }
        execute(*g);
        g->arrived = 0;
        g->posted.assign(g->nranks, false);
        ++g->generation;
        g->changed.notify_all();
        return ncclSuccess;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds());
    while (g->generation == round && g->broken.empty()) {
        std::vector<int> gone;
        for (int r = 0; r < g->nranks; ++r)
            if (g->departed[r] && !g->posted[r]) gone.push_back(r);
        if (!gone.empty()) {
            g->broken = "rank(s) " + rank_list(gone) + " of " + std::to_string(g->nranks) +
                        " destroyed their communicator while rank " + std::to_string(c->rank) + " waited in " + name;
            g->broken_code = ncclRemoteError;
            g->changed.notify_all();
            break;
        }
        if (g->changed.wait_until(lock, deadline) == std::cv_status::timeout && g->generation == round &&
            g->broken.empty()) {
            std::vector<int> missing, present;
            for (int r = 0; r < g->nranks; ++r) (g->posted[r] ? present : missing).push_back(r);
            char why[1024];
            snprintf(why, sizeof why,
                     "%s: rank(s) %s of %d did not call it within %.0f s (SWERVE_EMU_NCCL_TIMEOUT_S) while rank(s) %s "
                     "waited (rank %d's collective #%llu)",
                     name, rank_list(missing).c_str(), g->nranks, timeout_seconds(), rank_list(present).c_str(), c->rank,
                     (unsigned long long)nth);
            g->broken = why;
            g->broken_code = ncclRemoteError;
            g->changed.notify_all();
        }
    }
    if (g->generation != round) return ncclSuccess;
    return fail(c, g->broken_code, "%s (rank %d of %d): %s", name, c->rank, g->nranks, g->broken.c_str());
}

// A collective handed to the driver's stream.
struct Work {
    Comm* comm;
    Call call;
};
thread_local ncclResult_t t_work_result = ncclSuccess;
thread_local bool t_work_ran = false;

int run_work(void* ctx) {
    Work* w = static_cast<Work*>(ctx);
    t_work_ran = true;
    t_work_result = rendezvous(w->comm, w->call);
    return t_work_result;
}
void drop_work(void* ctx) { delete static_cast<Work*>(ctx); }

ncclResult_t launch(Comm* c, const Call& call, void* stream) {
    t_work_ran = false;
    t_work_result = ncclSuccess;
    const int cu = swerve_emu_stream_enqueue_checked(stream, run_work, new Work{c, call}, drop_work);
    if (t_work_ran) return t_work_result;  // ran at once on this thread (its failure is reported)
    if (cu != 0)
        return fail(c, ncclUnhandledCudaError, "%s (rank %d): the emulated driver refused the stream operation (CUresult %d)",
                    kind_name(call.kind), c->rank, cu);
    return ncclSuccess;  // recorded into a graph: runs at each replay
}

// A checked call: deferred inside a group, else run (or recorded, on a capturing stream).
ncclResult_t dispatch(Comm* c, const Call& call, const char* name, void* stream) {
    if (t_group_depth > 0) {
        t_deferred.push_back({c, false, call, stream});
        return ncclSuccess;
    }
    if (!c->ready)
        return fail(c, ncclInvalidUsage, "%s (rank %d): the communicator's ncclCommInitRank has not completed", name, c->rank);
    return launch(c, call, stream);
}

// Checks a collective's arguments on the calling thread, then runs it, defers it (inside a group)
// or records it (a capturing stream).
ncclResult_t collective(Call call, void* handle, void* stream) {
    const char* name = kind_name(call.kind);
    Comm* c = live(handle);
    if (!c) return fail(nullptr, ncclInvalidArgument, "%s: %p is not a live communicator (never made, or destroyed)", name, handle);
    const size_t es = type_size(call.type);
    if (!es) return fail(c, ncclInvalidArgument, "%s (rank %d): datatype %d is not an NCCL datatype", name, c->rank, call.type);
    const bool reduces = call.kind == ALL_REDUCE || call.kind == REDUCE_SCATTER;
    if (reduces && call.op != ncclSum)
        return fail(c, ncclInvalidArgument, "%s (rank %d): reduction %d: the emulator implements ncclSum only", name, c->rank,
                    call.op);
    if (reduces && call.type != ncclFloat32 && call.type != ncclBfloat16 && call.type != ncclFloat64)
        return fail(c, ncclInvalidArgument, "%s (rank %d): sums of %s are not emulated (ncclFloat32, ncclBfloat16, ncclFloat64 are)",
                    name, c->rank, type_name(call.type));
    if (call.kind == BROADCAST && (call.root < 0 || call.root >= c->nranks))
        return fail(c, ncclInvalidArgument, "%s (rank %d): root %d of %d ranks", name, c->rank, call.root, c->nranks);
    const size_t R = (size_t)c->nranks, bytes = call.count * es;
    size_t send_bytes = bytes, recv_bytes = bytes;
    if (call.kind == ALL_GATHER) recv_bytes = bytes * R;
    if (call.kind == REDUCE_SCATTER) send_bytes = bytes * R;
    if (call.kind == BROADCAST && c->rank != call.root) send_bytes = 0;  // only the root's is read
    char what[160];
    snprintf(what, sizeof what, "%s (rank %d) send buffer", name, c->rank);
    if (swerve_emu_check_device_range((unsigned long long)(uintptr_t)call.send, send_bytes, what))
        return fail(c, ncclInvalidArgument, "%s (rank %d): the send buffer %p does not hold %zu bytes of device memory", name,
                    c->rank, call.send, send_bytes);
    snprintf(what, sizeof what, "%s (rank %d) receive buffer", name, c->rank);
    if (swerve_emu_check_device_range((unsigned long long)(uintptr_t)call.recv, recv_bytes, what))
        return fail(c, ncclInvalidArgument, "%s (rank %d): the receive buffer %p does not hold %zu bytes of device memory", name,
                    c->rank, call.recv, recv_bytes);
    return dispatch(c, call, name, stream);
}

// Checks an ncclSend / ncclRecv on the calling thread, then defers it (inside a group: the
// group's point-to-point calls on a communicator become one round at ncclGroupEnd), or runs it
// alone as a round of its own.
ncclResult_t point_to_point(const P2pOp& op, void* handle, void* stream) {
    const char* name = op.send ? "ncclSend" : "ncclRecv";
    Comm* c = live(handle);
    if (!c) return fail(nullptr, ncclInvalidArgument, "%s: %p is not a live communicator (never made, or destroyed)", name, handle);
    const size_t es = type_size(op.type);
    if (!es) return fail(c, ncclInvalidArgument, "%s (rank %d): datatype %d is not an NCCL datatype", name, c->rank, op.type);
    if (op.peer < 0 || op.peer >= c->nranks)
        return fail(c, ncclInvalidArgument, "%s (rank %d): peer %d of %d ranks", name, c->rank, op.peer, c->nranks);
    char what[160];
    snprintf(what, sizeof what, "%s (rank %d, peer %d) buffer", name, c->rank, op.peer);
    if (swerve_emu_check_device_range((unsigned long long)(uintptr_t)op.buf, op.count * es, what))
        return fail(c, ncclInvalidArgument, "%s (rank %d, peer %d): the buffer %p does not hold %zu bytes of device memory", name,
                    c->rank, op.peer, op.buf, op.count * es);
    Call call;
    call.kind = P2P;
    call.ops.push_back(op);
    return dispatch(c, call, name, stream);
}

// A group's deferred calls with each communicator's point-to-point calls merged into one round,
// at the place of its first.
std::vector<Deferred> merge_point_to_point(std::vector<Deferred> work) {
    std::vector<Deferred> merged;
    for (Deferred& d : work) {
        if (!d.init && d.call.kind == P2P) {
            auto first = std::find_if(merged.begin(), merged.end(),
                                      [&](const Deferred& m) { return m.comm == d.comm && !m.init && m.call.kind == P2P; });
            if (first != merged.end()) {
                first->call.ops.insert(first->call.ops.end(), d.call.ops.begin(), d.call.ops.end());
                continue;
            }
        }
        merged.push_back(std::move(d));
    }
    return merged;
}

ncclResult_t destroy(void* handle, const char* name) {
    Comm* c;
    {
        std::lock_guard<std::mutex> lock(g_mu);
        c = static_cast<Comm*>(handle);
        if (!g_comms.erase(c)) return fail(nullptr, ncclInvalidArgument, "%s: %p is not a live communicator", name, handle);
    }
    {
        std::lock_guard<std::mutex> lock(c->group->mu);
        c->group->departed[c->rank] = true;
        c->group->changed.notify_all();
    }
    c->magic = 0;
    delete c;
    return ncclSuccess;
}

}  // namespace swerve_nccl

using namespace swerve_nccl;

// ---- the C API ----------------------------------------------------------------------------------
#define API extern "C" __attribute__((visibility("default")))

API ncclResult_t ncclGetVersion(int* version) {
    if (!version) return fail(nullptr, ncclInvalidArgument, "ncclGetVersion: null pointer");
    *version = kVersion;
    return ncclSuccess;
}

API ncclResult_t ncclGetUniqueId(UniqueId* id) {
    if (!id) return fail(nullptr, ncclInvalidArgument, "ncclGetUniqueId: null pointer");
    memset(id, 0, sizeof *id);
    IdFields f;
    memcpy(f.magic, kMagic, sizeof f.magic);
    f.serial = g_next_serial.fetch_add(1);
    f.pid = (int64_t)getpid();
    memcpy(id->internal, &f, sizeof f);
    return ncclSuccess;
}

API ncclResult_t ncclCommInitRank(void** comm, int nranks, UniqueId id, int rank) {
    if (!comm) return fail(nullptr, ncclInvalidArgument, "ncclCommInitRank: null communicator pointer");
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return fail(nullptr, ncclInvalidArgument, "ncclCommInitRank: rank %d of %d ranks", rank, nranks);
    IdFields f;
    memcpy(&f, id.internal, sizeof f);
    if (memcmp(f.magic, kMagic, sizeof f.magic) != 0)
        return fail(nullptr, ncclInvalidArgument,
                    "ncclCommInitRank (rank %d): the id was not made by this emulated NCCL's ncclGetUniqueId", rank);
    if (f.pid != (int64_t)getpid())
        return fail(nullptr, ncclInvalidArgument,
                    "ncclCommInitRank (rank %d): the id comes from process %lld; the emulated NCCL joins the threads of one "
                    "process only",
                    rank, (long long)f.pid);
    std::shared_ptr<Group> g;
    {
        std::lock_guard<std::mutex> lock(g_mu);
        std::shared_ptr<Group>& slot = g_groups[f.serial];
        if (!slot) {
            slot = std::make_shared<Group>();
            slot->serial = f.serial;
            slot->nranks = nranks;
            slot->joined.assign(nranks, false);
            slot->slots.resize(nranks);
            slot->posted.assign(nranks, false);
            slot->calls.assign(nranks, 0);
            slot->departed.assign(nranks, false);
        }
        g = slot;
    }
    if (g->nranks != nranks)
        return fail(nullptr, ncclInvalidUsage, "ncclCommInitRank: rank %d says %d ranks, the id's first rank said %d", rank,
                    nranks, g->nranks);
    Comm* c = new Comm;
    c->group = g;
    c->rank = rank;
    c->nranks = nranks;
    {
        std::lock_guard<std::mutex> lock(g_mu);
        g_comms.insert(c);
    }
    *comm = c;
    if (t_group_depth > 0) {
        t_deferred.push_back({c, true, Call{}, nullptr});
        return ncclSuccess;
    }
    const ncclResult_t r = join(c);
    if (r != ncclSuccess) {  // no communicator: forgotten without touching the group's ranks
        {
            std::lock_guard<std::mutex> lock(g_mu);
            g_comms.erase(c);
        }
        delete c;
        *comm = nullptr;
    }
    return r;
}

API ncclResult_t ncclCommDestroy(void* comm) { return destroy(comm, "ncclCommDestroy"); }
API ncclResult_t ncclCommAbort(void* comm) { return destroy(comm, "ncclCommAbort"); }

API ncclResult_t ncclCommCount(void* comm, int* count) {
    Comm* c = live(comm);
    if (!c || !count) return fail(c, ncclInvalidArgument, "ncclCommCount: %p is not a live communicator, or a null result", comm);
    *count = c->nranks;
    return ncclSuccess;
}
API ncclResult_t ncclCommUserRank(void* comm, int* rank) {
    Comm* c = live(comm);
    if (!c || !rank) return fail(c, ncclInvalidArgument, "ncclCommUserRank: %p is not a live communicator, or a null result", comm);
    *rank = c->rank;
    return ncclSuccess;
}

API ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, int type, int op, void* comm, void* stream) {
    Call call;
    call.kind = ALL_REDUCE, call.send = send, call.recv = recv, call.count = count, call.type = type, call.op = op;
    return collective(call, comm, stream);
}
API ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, int type, void* comm, void* stream) {
    Call call;
    call.kind = ALL_GATHER, call.send = send, call.recv = recv, call.count = sendcount, call.type = type;
    return collective(call, comm, stream);
}
API ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, int type, int op, void* comm, void* stream) {
    Call call;
    call.kind = REDUCE_SCATTER, call.send = send, call.recv = recv, call.count = recvcount, call.type = type, call.op = op;
    return collective(call, comm, stream);
}
API ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, int type, int root, void* comm, void* stream) {
    Call call;
    call.kind = BROADCAST, call.send = send, call.recv = recv, call.count = count, call.type = type, call.root = root;
    return collective(call, comm, stream);
}

API ncclResult_t ncclSend(const void* send, size_t count, int type, int peer, void* comm, void* stream) {
    P2pOp op;
    op.send = true, op.buf = const_cast<void*>(send), op.count = count, op.type = type, op.peer = peer;
    return point_to_point(op, comm, stream);
}
API ncclResult_t ncclRecv(void* recv, size_t count, int type, int peer, void* comm, void* stream) {
    P2pOp op;
    op.send = false, op.buf = recv, op.count = count, op.type = type, op.peer = peer;
    return point_to_point(op, comm, stream);
}

API ncclResult_t ncclGroupStart() {
    ++t_group_depth;
    return ncclSuccess;
}

// Runs the deferred calls: each communicator's in order, the communicators concurrently.
API ncclResult_t ncclGroupEnd() {
    if (t_group_depth == 0) return fail(nullptr, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--t_group_depth > 0) return ncclSuccess;
    std::vector<Deferred> work = merge_point_to_point(std::move(t_deferred));
    t_deferred.clear();
    std::vector<Comm*> comms;
    for (const Deferred& d : work)
        if (std::find(comms.begin(), comms.end(), d.comm) == comms.end()) comms.push_back(d.comm);
    std::vector<ncclResult_t> results(comms.size(), ncclSuccess);
    auto run_comm = [&](size_t i) {
        for (const Deferred& d : work) {
            if (d.comm != comms[i] || results[i] != ncclSuccess) continue;
            if (d.init) {
                results[i] = join(d.comm);
            } else if (!d.comm->ready) {
                results[i] = fail(d.comm, ncclInvalidUsage, "%s (rank %d): the communicator's ncclCommInitRank failed",
                                  kind_name(d.call.kind), d.comm->rank);
            } else {
                results[i] = launch(d.comm, d.call, d.stream);
            }
        }
    };
    if (comms.size() == 1) {
        run_comm(0);
    } else {
        std::vector<std::thread> threads;
        for (size_t i = 0; i < comms.size(); ++i) threads.emplace_back(run_comm, i);
        for (std::thread& t : threads) t.join();
    }
    for (ncclResult_t r : results)
        if (r != ncclSuccess) return r;
    return ncclSuccess;
}

API const char* ncclGetErrorString(ncclResult_t result) {
    switch (result) {
        case ncclSuccess: return "no error";
        case ncclUnhandledCudaError: return "unhandled cuda error (the emulated driver printed why)";
        case ncclSystemError: return "unhandled system error";
        case ncclInternalError: return "internal error";
        case ncclInvalidArgument: return "invalid argument (ncclGetLastError says which)";
        case ncclInvalidUsage: return "invalid usage (ncclGetLastError says how)";
        case ncclRemoteError: return "remote process exited or there was a network error (emulated: a rank left or never came)";
        case ncclInProgress: return "NCCL operation in progress";
        default: return "unknown result code";
    }
}

API const char* ncclGetLastError(void* comm) {
    thread_local std::string copy;
    if (Comm* c = live(comm)) {
        std::lock_guard<std::mutex> lock(c->error_mu);
        if (!c->last_error.empty()) {
            copy = c->last_error;
            return copy.c_str();
        }
    }
    return t_last_error.c_str();
}
