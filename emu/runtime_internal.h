// Internals of the emulated CUDA device's runtime, shared by its three files (kernels never see
// them: their interface is emu_cuda.h):
//   runtime.cpp         launches, blocks and the scheduler, fibers, barriers, error reports
//   runtime_warp.cpp    warp collectives: shuffles, votes, __syncwarp, ldmatrix, mma.sync
//   runtime_memory.cpp  shared memory (static and dynamic, guard pages), cp.async, fault reports
//   runtime_hopper.cpp  sm_90a: mbarrier, named barriers, warpgroup collectives (wgmma, setmaxnreg)
//   runtime_tma.cpp     sm_90a: shared-window addresses, tensor maps, TMA loads
// Everything here is hidden from the library's exports.
#pragma once

#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "emu_cuda.h"

#if defined(__x86_64__)
#define EMU_HAVE_ASM_SWITCH 1
// emu_fiber_switch(save, next) (runtime.cpp): pushes the callee-saved registers on the current
// stack, stores the stack pointer in *save, loads `next` as the stack pointer and pops the same
// frame from it. A new fiber's stack is prepared with such a frame whose return address is the
// fiber's entry function (see prepare_fiber).
extern "C" void emu_fiber_switch(void** save, void* next) __attribute__((visibility("hidden")));
#else
#define EMU_HAVE_ASM_SWITCH 0
#endif

namespace emu {
namespace rt {
#pragma GCC visibility push(hidden)

constexpr size_t kStackBytes = 256 * 1024;  // per fiber, reserved (only touched pages are used)
constexpr size_t kPage = 4096;
constexpr int kMaxShown = 10;                // errors kept in full per launch
constexpr size_t kMaxDynamicSmem = 1 << 20;  // a sanity bound; the driver enforces the device's real limits

// AT_MBAR: in mbarrier_wait; AT_NAMED: at bar.sync id > ...; AT_WG: at a warpgroup collective.
enum State : uint8_t { RUNNABLE, AT_BARRIER, AT_WARP, AT_MBAR, AT_NAMED, AT_WG, DONE };
enum WgOp : uint8_t { WG_NONE, WG_FENCE, WG_COMMIT, WG_WAIT, WG_MMA, WG_SETMAXNREG };
enum Op : uint8_t { OP_NONE, OP_SHFL, OP_VOTE, OP_SYNCWARP, OP_LDMATRIX, OP_MMA };

const char* op_name(Op op, int sub);

struct Copy {
    unsigned char* dst;
    const unsigned char* src;
    uint32_t bytes, src_bytes;
    uint64_t group;
};

struct Thread {
    ThreadRegs regs;
    State state;
    void* sp;        // saved stack pointer (asm switch)
    ucontext_t* uc;  // saved context (swapcontext fallback)
    // The pending warp collective.
    Op op;
    uint8_t sub;  // shfl / vote mode, ldmatrix trans
    uint8_t num;  // ldmatrix matrices
    uint32_t mask;
    const char* file;
    int line;
    int width, arg;
    uint64_t val, res;
    const void* addr;
    uint32_t* out;
    const uint32_t* a;
    uint32_t b0, b1;
    float* d;
    // cp.async: issued copies from `head` on, each tagged with its group (== next_group while the
    // group is still open).
    std::vector<Copy> copies;
    size_t head;
    uint64_t next_group;
    // sm_90a requests (runtime_hopper.cpp): the barrier waited on, or the warpgroup collective.
    int wait_bar, wait_parity, named_id;
    WgOp wg_op;
    bool wg_flag;  // trans_b, setmaxnreg inc
    int wg_arg;    // n, pending groups, registers
    uint64_t desc_a, desc_b;
    const uint32_t* wg_a;
    float* wg_d;
};

// ---- sm_90a state of the running block (runtime_hopper.cpp, runtime_tma.cpp) ----------------------

struct MBar {
    unsigned char* addr;
    uint32_t expected, pending;
    int64_t tx;        // bytes expected (expect_tx) in the current phase
    int64_t inflight;  // bytes of TMA copies issued in the current phase
    uint64_t phase;    // phases completed
    uint64_t init_epoch;
    const char* file;
    int line;
};
// A tensor map as cuTensorMapEncodeTiled stores it in the 128 opaque bytes.
struct TensorMapFields {
    uint32_t magic;
    uint8_t rank, dtype, esize, swizzle, interleave, oob_fill, l2, pad;
    uint64_t addr;
    uint64_t dims[5];
    uint64_t strides[5];  // bytes; strides[0] = the element size
    uint16_t box[5];
    uint8_t estrides[5];
};
constexpr uint32_t kTensorMapMagic = 0x54e3a9b1u;
struct TmaCopy {
    int bar;
    uint64_t phase;  // the barrier phase it completes on
    unsigned char* dst;
    TensorMapFields map;
    int64_t coords[5];
    uint32_t bytes;
    bool landed;
    const char* file;
    int line;
};
struct TmaRegion {  // what a TMA load wrote: [begin, end) with the map's swizzle span (0: none)
    unsigned char *begin, *end;
    uint32_t span, row_bytes;
    const char* file;
    int line;
};
struct WgmmaOp {
    int n;
    bool has_a, trans_b;
    uint64_t desc_a, desc_b;
    uint32_t a[128][4];
    float* d[128];
    const char* file;
    int line;
    bool proxy_reported;  // a fence.proxy.async error reported at its issue (not again at retire)
};
struct Warpgroup {
    int arrived;
    bool fenced, exit_reported;
    int regs;  // setmaxnreg's count, 0 = unknown
    std::vector<WgmmaOp> open;
    std::vector<std::vector<WgmmaOp>> committed;
};
struct NamedBar {
    int threads;  // 0: idle
    int counted;
    uint32_t lanes[kMaxThreadsPerBlock / 32];
    const char* file;
    int line;
};
struct Hopper {
    std::vector<MBar> bars;
    std::vector<TmaCopy> copies;
    std::vector<TmaRegion> regions;
    std::vector<Warpgroup> wgs;
    NamedBar named[16];
    uint64_t fence_epoch;
    size_t dyn_window;  // shared-window address of the dynamic region's start
    // Shared memory as the async proxy last saw it (runtime_hopper.cpp, "async proxy" there): the
    // static region (bytes past its size read as the 0xff fill) and the dynamic one.
    std::vector<unsigned char> seen_static, seen_dyn;
};

struct Warp {
    uint32_t members;  // lanes that exist (a partial last warp has fewer)
    uint32_t arrived;  // lanes waiting at a collective
    uint32_t exited;
};

struct StaticVar {
    int id;
    const void* type;
    size_t size, offset;
};

enum Mode { FORWARD, REVERSE, RANDOM };
struct Schedule {
    Mode mode = FORWARD;
    uint64_t seed = 0;
};

struct ErrorLog {
    int count = 0, shown = 0;
    std::string text;
};

// Per-OS-thread resources reused across launches.
struct Resources {
    std::vector<char*> stacks;  // each kStackBytes above a guard page
    unsigned char* smem = nullptr;
    size_t smem_bytes = 0, dyn_cap = 0;
    std::vector<Thread> threads;
    std::vector<Warp> warps;
    std::vector<int> order;
    ucontext_t uc_template;
    bool uc_ready = false;
    ~Resources() {
        for (char* s : stacks) munmap(s - kPage, kStackBytes + kPage);
        if (smem) munmap(smem, smem_bytes);
        for (Thread& t : threads) delete t.uc;
    }
};

struct Launch {
    BlockRegs block;
    const std::function<void()>* body;
    Resources* res;
    Thread* threads;
    Warp* warps;
    int nthreads, nwarps, live, at_barrier;
    const char* bar_file;
    int bar_line;
    bool bar_divergent;
    Thread* cur;
    void* sched_sp;
    ucontext_t sched_uc;
    bool use_uc;
    bool aborted;
    // Shared memory of the running block.
    unsigned char* static_base;
    size_t static_used;
    unsigned char* dyn_base;
    size_t dyn_bytes;
    std::vector<StaticVar> statics;
    Schedule sched;
    uint64_t rng;
    const char* kernel;
    LaunchStats stats;
    Hopper hop;
};

// Per-OS-thread state on the heap, so that this library's TLS segment stays a few pointers (its
// initial-exec TLS comes from glibc's small surplus when libcuda.so is dlopen'ed).
struct PerThread {
    Resources res;
    ErrorLog errors;
    LaunchStats stats{};
    const char* kernel = nullptr;
    bool schedule_set = false;
    Schedule schedule;
};
PerThread& state();
extern __thread PerThread* tl_state EMU_TLS_MODEL;
extern __thread Launch* tl_launch EMU_TLS_MODEL;

// ---- errors (runtime.cpp) ------------------------------------------------------------------------

enum Where { W_LAUNCH, W_BLOCK, W_THREAD, W_WARP };

__attribute__((format(printf, 3, 4))) void report(Where where, int warp, const char* fmt, ...);
std::string lanes_str(uint32_t m);

// ---- switching back to the scheduler, from inside a fiber ------------------------------------------

inline void switch_to_scheduler(Launch& L, Thread& t) {
    if (L.use_uc) {
        swapcontext(t.uc, &L.sched_uc);
    } else {
#if EMU_HAVE_ASM_SWITCH
        emu_fiber_switch(&t.sp, L.sched_sp);
#endif
    }
}

// Stops the launch from inside a fiber: this fiber is never resumed.
[[noreturn]] inline void abandon(Launch& L, Thread& t) {
    L.aborted = true;
    switch_to_scheduler(L, t);
    __builtin_trap();
}

inline Launch& launch_or_die(const char* what) {
    Launch* L = tl_launch;
    if (!L || !L->cur) {
        fprintf(stderr, "emulated CUDA: %s called outside a running kernel\n", what);
        abort();
    }
    return *L;
}

// ---- across the files ----------------------------------------------------------------------------

// The calling thread's request is filled in: arrive, resolve if last, go back to the scheduler
// (runtime_warp.cpp).
void warp_arrive(Launch& L, Thread& t);
// Whether [p, p + n) lies in the running block's static or dynamic shared memory
// (runtime_memory.cpp).
bool in_shared(const Launch& L, const void* p, size_t n);
// Maps (or reuses) the OS thread's shared memory with its guard pages and places the launch's
// static and dynamic regions in it (runtime_memory.cpp).
void prepare_smem(Launch& L, size_t dyn);
// sm_90a (runtime_hopper.cpp): the block's state reset; the checks at a thread's exit and at the
// block's end; the waits a deadlock report lists.
void hopper_block_start(Launch& L);
void hopper_thread_exit(Launch& L, Thread& t);
void hopper_block_end(Launch& L);
std::string hopper_waits(const Launch& L);
// runtime_tma.cpp: shared address <-> host pointer of the running block ([a, a + n) inside it, else
// nullptr); the TMA copies of barrier `bar` whose phase completed land; the deadlock and block-end
// descriptions of a barrier.
unsigned char* shared_ptr(const Launch& L, uint64_t addr, size_t n);
uint64_t swizzle_address(uint64_t a, uint32_t span);
// runtime_hopper.cpp: the index of the barrier at `bar` (an error and -1 when it was not
// initialised in this block); completes the barrier's phase when its arrivals and bytes are in.
int mbar_lookup(Launch& L, const void* bar, const char* what, const char* file, int line);
void mbar_try_complete(Launch& L, int bar);
// The async proxy wrote (a TMA load landing) [p, p + n) of the block's shared memory: its snapshot
// of those bytes becomes their contents.
void async_proxy_saw(Launch& L, const unsigned char* p, size_t n);
uint32_t shared_addr_of(const Launch& L, const void* p);
void tma_land_completed(Launch& L, int bar);
std::string mbar_str(const Launch& L, const MBar& b);
// cuTensorMapEncodeTiled's checks and encoding (the driver's export calls it): 0, or
// CUDA_ERROR_INVALID_VALUE (1) with the reason in `why`.
int tensor_map_encode_tiled(void* map, int dtype, unsigned rank, void* addr, const uint64_t* dims,
                            const uint64_t* strides, const uint32_t* box, const uint32_t* estrides, int interleave,
                            int swizzle, int l2, int oob_fill, std::string& why);

#pragma GCC visibility pop
}  // namespace rt
}  // namespace emu
