// Internals of the stand-in libcuda shared by its two files (hidden from the library's exports):
//   driver.cpp         the device, contexts, modules and launches, streams, capture, graphs, events
//   driver_memory.cpp  device memory (guard pages, poison, quarantine, the SIGSEGV report), pinned
//                      host memory, copies and memsets
#pragma once

#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "emu_cuda.h"

namespace emu_driver {
#pragma GCC visibility push(hidden)

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum : int {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
};

// Every refusal says why on stderr (the CUresult alone would not), prefixed so logs show its source.
CUresult refuse(CUresult code, const char* fmt, ...);

// ---- the emulated device (driver.cpp) ---------------------------------------------------------------

struct Arch {
    const char* name;
    int major, minor, sms;
    int optin_smem;  // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    int smem_per_sm;
};

const Arch kArchs[] = {
    {"sm_90", 9, 0, 132, 232448, 233472},
    {"sm_80", 8, 0, 108, 166912, 167936},
    {"sm_89", 8, 9, 128, 101376, 102400},
};
const int kDefaultDynamicSmem = 48 * 1024;

struct Device {
    Arch arch;
    size_t total_memory;
    std::string name;
};

const Device& device();

extern std::mutex g_mu;  // guards everything shared between host threads
extern bool g_initialised;

#define REQUIRE_INIT()                                                                   \
    do {                                                                                 \
        if (!g_initialised) return refuse(CUDA_ERROR_NOT_INITIALIZED, "cuInit was not called"); \
    } while (0)

// ---- device memory (driver_memory.cpp) --------------------------------------------------------------

const size_t kPage = 4096;
extern thread_local const char* t_kernel;  // the kernel this host thread is running, for the SIGSEGV report
void install_segv_handler();
// [p, p + n) inside one live allocation; else a refusal naming `what`.
CUresult check_device_range(CUdeviceptr p, size_t n, const char* what);
// After a launch: the NaN-filled slack behind every live allocation must be untouched.
CUresult check_slack(const char* kernel);

// ---- streams and capture (driver.cpp) ---------------------------------------------------------------

// One recorded operation: runs at each replay; `keep` holds what it needs alive.
struct Node {
    std::function<CUresult()> run;
};

enum CaptureMode { MODE_GLOBAL = 0, MODE_THREAD_LOCAL = 1, MODE_RELAXED = 2 };

struct Stream {
    bool capturing = false;
    int mode = MODE_GLOBAL;
    std::thread::id capture_thread;
    std::string invalidated;  // why the capture is invalid; empty while it is valid
    std::shared_ptr<std::vector<Node>> nodes;
};

Stream* stream_of(void* s);
// A potentially unsafe call (cuMemAlloc, a synchronous copy) while a capture forbids it.
CUresult unsafe_call_during_capture(const char* what);
// Runs `op` now, or records it when the stream captures.
CUresult enqueue(void* s, std::function<CUresult()> op);
// An operation a capturing stream cannot record: the capture is invalid from here on.
CUresult refuse_in_capture(void* s, const char* what);

#pragma GCC visibility pop
}  // namespace emu_driver
