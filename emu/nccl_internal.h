// The stand-in libnccl's shared pieces (emu/nccl.cpp: the C API, communicators, the rendezvous;
// emu/nccl_rounds.cpp: what a round computes): NCCL's values, a rank's call, and a
// communicator's group with the round every rank has posted.

#pragma once

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

namespace swerve_nccl {

// ---- NCCL's values (nccl.h; cudarc's nccl::sys, nccl-02030) -------------------------------------
typedef int ncclResult_t;
enum : int {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
};
enum : int {
    ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5,
    ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9, ncclFloat8e4m3 = 10,
    ncclFloat8e5m2 = 11,
};
enum : int { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 };

const int kVersion = 22800;  // reported as NCCL 2.28.0
const char kMagic[16] = "SWERVE-EMU-NCCL";

struct UniqueId {  // ncclUniqueId: 128 opaque bytes, passed by value
    char internal[128];
};
struct IdFields {
    char magic[16];
    uint64_t serial;
    int64_t pid;
};
static_assert(sizeof(IdFields) <= sizeof(UniqueId), "the id's fields fit in ncclUniqueId");

inline const char* result_name(ncclResult_t r) {
    switch (r) {
        case ncclSuccess: return "ncclSuccess";
        case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
        case ncclSystemError: return "ncclSystemError";
        case ncclInternalError: return "ncclInternalError";
        case ncclInvalidArgument: return "ncclInvalidArgument";
        case ncclInvalidUsage: return "ncclInvalidUsage";
        case ncclRemoteError: return "ncclRemoteError";
        case ncclInProgress: return "ncclInProgress";
        default: return "ncclUnknownResult";
    }
}

inline const char* type_name(int t) {
    switch (t) {
        case ncclInt8: return "ncclInt8";
        case ncclUint8: return "ncclUint8";
        case ncclInt32: return "ncclInt32";
        case ncclUint32: return "ncclUint32";
        case ncclInt64: return "ncclInt64";
        case ncclUint64: return "ncclUint64";
        case ncclFloat16: return "ncclFloat16";
        case ncclFloat32: return "ncclFloat32";
        case ncclFloat64: return "ncclFloat64";
        case ncclBfloat16: return "ncclBfloat16";
        case ncclFloat8e4m3: return "ncclFloat8e4m3";
        case ncclFloat8e5m2: return "ncclFloat8e5m2";
        default: return "an unknown datatype";
    }
}

// Bytes per element; 0 for an unknown datatype.
inline size_t type_size(int t) {
    switch (t) {
        case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
        case ncclFloat16: case ncclBfloat16: return 2;
        case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
        case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
        default: return 0;
    }
}

inline double timeout_seconds() {
    static const double seconds = [] {
        const char* s = getenv("SWERVE_EMU_NCCL_TIMEOUT_S");
        if (!s) return 300.0;
        char* end = nullptr;
        const double v = strtod(s, &end);
        if (!*s || *end || !(v > 0)) {
            fprintf(stderr, "swerve emulated NCCL: SWERVE_EMU_NCCL_TIMEOUT_S=%s is not a positive number of seconds\n", s);
            exit(2);
        }
        return v;
    }();
    return seconds;
}

// ---- communicators and their shared rendezvous ------------------------------------------------

enum Kind { ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, P2P };
inline const char* kind_name(Kind k) {
    switch (k) {
        case ALL_REDUCE: return "ncclAllReduce";
        case ALL_GATHER: return "ncclAllGather";
        case REDUCE_SCATTER: return "ncclReduceScatter";
        case BROADCAST: return "ncclBroadcast";
        case P2P: return "ncclSend/ncclRecv";
    }
    return "?";
}

// One ncclSend or ncclRecv of a point-to-point round.
struct P2pOp {
    bool send = false;
    void* buf = nullptr;  // read for a send, written for a receive
    size_t count = 0;
    int type = 0, peer = 0;
};

// One rank's call of a collective, or its group of point-to-point calls (kind P2P, `ops`).
struct Call {
    Kind kind = ALL_REDUCE;
    const void* send = nullptr;
    void* recv = nullptr;
    size_t count = 0;  // per rank: NCCL's count / sendcount / recvcount
    int type = 0, op = 0, root = 0;
    std::vector<P2pOp> ops;  // P2P only, in the order the rank called them
};

struct Group {
    uint64_t serial = 0;
    int nranks = 0;
    std::mutex mu;
    std::condition_variable changed;
    // ncclCommInitRank
    std::vector<bool> joined;
    int joined_count = 0;
    bool formed = false;
    // collectives: one round at a time
    std::vector<Call> slots;
    std::vector<bool> posted;
    std::vector<uint64_t> calls;  // collectives each rank has started
    int arrived = 0;
    uint64_t generation = 0;  // completed rounds
    std::vector<bool> departed;
    ncclResult_t broken_code = ncclSuccess;
    std::string broken;  // why no collective can run any more; empty while healthy
};

// Runs the round every rank has posted (g.mu held): reads every input, then writes every output
// (emu/nccl_rounds.cpp).
void execute(Group& g);
// Why the posted calls disagree, or empty.
std::string mismatch(const Group& g);

}  // namespace swerve_nccl
