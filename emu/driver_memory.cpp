// The stand-in libcuda's memory (see driver.cpp for what the driver enforces; internals shared with
// it in driver_internal.h): device memory where every allocation ends next to an inaccessible
// guard page, its slack up to the page NaN-filled and checked after every launch, freed memory
// made inaccessible and kept out of reuse for a while (a SIGSEGV handler names the kernel and the
// allocation of an out-of-bounds or use-after-free access); new allocations filled with 0xff
// bytes (NaN in f32 and bf16); pinned host buffers (cuMemHostAlloc); copies and memsets, in stream
// order or recorded while their stream captures.

#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "driver_internal.h"

namespace emu_driver {

thread_local const char* t_kernel = nullptr;

namespace {

struct Allocation {
    uintptr_t map_base = 0;
    size_t map_bytes = 0;
    uintptr_t ptr = 0;
    size_t bytes = 0;       // what was asked for
    size_t slack = 0;       // NaN-filled bytes between ptr + bytes and the guard page
    bool freed = false;
};

const size_t kAlign = 256;          // cuMemAlloc's documented alignment
const size_t kQuarantine = 4096;    // freed allocations kept inaccessible before unmapping
std::map<uintptr_t, Allocation> g_allocations;  // by ptr; live and quarantined
std::vector<uintptr_t> g_quarantine;            // freed, oldest first
size_t g_used = 0;
std::map<uintptr_t, size_t> g_pinned_bytes;     // cuMemHostAlloc'd host buffers: start -> bytes

size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

// The allocation holding [p, p + n), live or freed; null if none.
const Allocation* find_allocation(uintptr_t p) {
    auto it = g_allocations.upper_bound(p);
    if (it == g_allocations.begin()) return nullptr;
    --it;
    const Allocation& a = it->second;
    if (p >= a.map_base && p < a.map_base + a.map_bytes) return &a;
    return nullptr;
}

}  // namespace

CUresult check_device_range(CUdeviceptr p, size_t n, const char* what) {
    if (n == 0) return CUDA_SUCCESS;
    std::lock_guard<std::mutex> lock(g_mu);
    const Allocation* a = find_allocation((uintptr_t)p);
    if (!a) return refuse(CUDA_ERROR_INVALID_VALUE, "%s: 0x%llx is not device memory", what, p);
    if (a->freed)
        return refuse(CUDA_ERROR_INVALID_VALUE, "%s: 0x%llx lies in a freed allocation of %zu bytes", what, p, a->bytes);
    if ((uintptr_t)p < a->ptr || (uintptr_t)p + n > a->ptr + a->bytes)
        return refuse(CUDA_ERROR_INVALID_VALUE, "%s: %zu bytes at 0x%llx overrun the allocation [0x%lx, +%zu)", what, n, p,
                      (unsigned long)a->ptr, a->bytes);
    return CUDA_SUCCESS;
}

namespace {

struct sigaction g_previous_segv;

void on_segv(int sig, siginfo_t* info, void* uctx) {
    const uintptr_t addr = (uintptr_t)info->si_addr;
    char msg[512];
    // Shared memory overruns and fiber stack overflows: the runtime knows this thread's regions.
    if (emu::describe_fault(info->si_addr, msg, sizeof msg)) {
        const char prefix[] = "swerve emulated device: ";
        if (write(2, prefix, sizeof prefix - 1) < 0 || write(2, msg, strlen(msg)) < 0 || write(2, "\n", 1) < 0) {
        }
        _exit(134);
    }
    const Allocation* a = find_allocation(addr);  // no lock: the process ends here if it is ours
    if (!a) {
        // Not device memory: hand the fault to whoever handled it before (Rust's stack-overflow
        // handler, or the default action), by restoring it and returning to the faulting access.
        sigaction(SIGSEGV, &g_previous_segv, nullptr);
        return;
    }
    int n;
    if (a->freed)
        n = snprintf(msg, sizeof msg,
                     "swerve emulated device: %s accessed 0x%lx in device memory already freed (an allocation of %zu bytes)\n",
                     t_kernel ? t_kernel : "the host", (unsigned long)addr, a->bytes);
    else
        n = snprintf(msg, sizeof msg,
                     "swerve emulated device: out-of-bounds global memory access by %s at 0x%lx: %ld bytes past the end of "
                     "an allocation of %zu bytes\n",
                     t_kernel ? t_kernel : "the host", (unsigned long)addr, (long)(addr - (a->ptr + a->bytes)), a->bytes);
    if (write(2, msg, n) < 0) {
    }
    (void)sig;
    (void)uctx;
    _exit(134);
}

}  // namespace

void install_segv_handler() {
    static std::once_flag once;
    std::call_once(once, [] {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_segv;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, &g_previous_segv);
    });
}

namespace {

CUresult device_alloc(CUdeviceptr* out, size_t bytes) {
    if (!out) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc: null result pointer");
    if (bytes == 0) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc of 0 bytes");
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_used + bytes > device().total_memory)
        return refuse(CUDA_ERROR_OUT_OF_MEMORY, "allocating %zu bytes with %zu of %zu in use (SWERVE_EMU_MEMORY_MIB sets the size)",
                      bytes, g_used, device().total_memory);
    const size_t data = round_up(bytes, kAlign);
    const size_t data_pages = round_up(data, kPage);
    const size_t map_bytes = data_pages + kPage;
    void* base = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) return refuse(CUDA_ERROR_OUT_OF_MEMORY, "mmap of %zu bytes failed", map_bytes);
    mprotect((char*)base + data_pages, kPage, PROT_NONE);
    Allocation a;
    a.map_base = (uintptr_t)base;
    a.map_bytes = map_bytes;
    a.ptr = (uintptr_t)base + data_pages - data;
    a.bytes = bytes;
    a.slack = data - bytes;
    memset((void*)a.ptr, 0xff, data);
    g_allocations[a.ptr] = a;
    g_used += bytes;
    *out = a.ptr;
    return CUDA_SUCCESS;
}

CUresult device_free(CUdeviceptr p) {
    if (p == 0) return CUDA_SUCCESS;
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_allocations.find((uintptr_t)p);
    if (it == g_allocations.end()) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemFree(0x%llx): not an allocation", p);
    Allocation& a = it->second;
    if (a.freed) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemFree(0x%llx): freed twice", p);
    a.freed = true;
    g_used -= a.bytes;
    madvise((void*)a.map_base, a.map_bytes, MADV_DONTNEED);
    mprotect((void*)a.map_base, a.map_bytes, PROT_NONE);
    g_quarantine.push_back(a.ptr);
    if (g_quarantine.size() > kQuarantine) {
        auto old = g_allocations.find(g_quarantine.front());
        munmap((void*)old->second.map_base, old->second.map_bytes);
        g_allocations.erase(old);
        g_quarantine.erase(g_quarantine.begin());
    }
    return CUDA_SUCCESS;
}

}  // namespace

// After a launch: the NaN-filled slack behind every live allocation must be untouched.
CUresult check_slack(const char* kernel) {
    std::lock_guard<std::mutex> lock(g_mu);
    for (const auto& [ptr, a] : g_allocations) {
        if (a.freed || a.slack == 0) continue;
        const unsigned char* s = (const unsigned char*)(a.ptr + a.bytes);
        for (size_t i = 0; i < a.slack; ++i)
            if (s[i] != 0xff)
                return refuse(CUDA_ERROR_LAUNCH_FAILED,
                              "kernel %s wrote out of bounds: byte %zu past the end of an allocation of %zu bytes at 0x%lx "
                              "changed",
                              kernel, i, a.bytes, (unsigned long)a.ptr);
    }
    return CUDA_SUCCESS;
}

namespace {

bool is_pinned(const void* host, size_t n) {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_pinned_bytes.upper_bound((uintptr_t)host);
    if (it == g_pinned_bytes.begin()) return false;
    --it;
    return (uintptr_t)host + n <= it->first + it->second;
}

}  // namespace

}  // namespace emu_driver

using namespace emu_driver;

extern "C" {

CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
    std::lock_guard<std::mutex> lock(g_mu);
    if (free_bytes) *free_bytes = device().total_memory - g_used;
    if (total_bytes) *total_bytes = device().total_memory;
    return CUDA_SUCCESS;
}

// ---- memory

CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t bytes) {
    REQUIRE_INIT();
    if (CUresult r = unsafe_call_during_capture("cuMemAlloc")) return r;
    return device_alloc(p, bytes);
}
CUresult cuMemFree_v2(CUdeviceptr p) {
    if (CUresult r = unsafe_call_during_capture("cuMemFree")) return r;
    return device_free(p);
}
CUresult cuMemAllocAsync(CUdeviceptr* p, size_t bytes, void* stream) {
    REQUIRE_INIT();
    if (CUresult r = refuse_in_capture(stream, "cuMemAllocAsync (graph memory nodes are not emulated)")) return r;
    return device_alloc(p, bytes);
}
CUresult cuMemFreeAsync(CUdeviceptr p, void* stream) {
    if (CUresult r = refuse_in_capture(stream, "cuMemFreeAsync (graph memory nodes are not emulated)")) return r;
    return device_free(p);
}

CUresult cuMemHostAlloc(void** p, size_t bytes, unsigned flags) {
    (void)flags;
    if (!p || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = unsafe_call_during_capture("cuMemHostAlloc")) return r;
    void* host = nullptr;
    if (posix_memalign(&host, kPage, bytes)) return refuse(CUDA_ERROR_OUT_OF_MEMORY, "host allocation of %zu bytes", bytes);
    std::lock_guard<std::mutex> lock(g_mu);
    g_pinned_bytes[(uintptr_t)host] = bytes;
    *p = host;
    return CUDA_SUCCESS;
}
CUresult cuMemFreeHost(void* p) {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_pinned_bytes.erase((uintptr_t)p)) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemFreeHost: not a pinned buffer");
    free(p);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, void* stream) {
    if (CUresult r = check_device_range(dst, n, "cuMemcpyHtoDAsync destination")) return r;
    if (stream_of(stream)->capturing && !is_pinned(src, n))
        return refuse_in_capture(stream, "a copy from pageable host memory (cuMemcpyHtoDAsync)");
    return enqueue(stream, [dst, src, n] {
        memcpy((void*)dst, src, n);
        return CUDA_SUCCESS;
    });
}
CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, void* stream) {
    if (CUresult r = check_device_range(src, n, "cuMemcpyDtoHAsync source")) return r;
    if (stream_of(stream)->capturing && !is_pinned(dst, n))
        return refuse_in_capture(stream, "a copy to pageable host memory (cuMemcpyDtoHAsync)");
    return enqueue(stream, [dst, src, n] {
        memcpy(dst, (const void*)src, n);
        return CUDA_SUCCESS;
    });
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void* stream) {
    if (CUresult r = check_device_range(dst, n, "cuMemcpyDtoDAsync destination")) return r;
    if (CUresult r = check_device_range(src, n, "cuMemcpyDtoDAsync source")) return r;
    return enqueue(stream, [dst, src, n] {
        memmove((void*)dst, (const void*)src, n);
        return CUDA_SUCCESS;
    });
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
    if (CUresult r = unsafe_call_during_capture("cuMemcpyHtoD")) return r;
    if (CUresult r = check_device_range(dst, n, "cuMemcpyHtoD destination")) return r;
    memcpy((void*)dst, src, n);
    return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
    if (CUresult r = unsafe_call_during_capture("cuMemcpyDtoH")) return r;
    if (CUresult r = check_device_range(src, n, "cuMemcpyDtoH source")) return r;
    memcpy(dst, (const void*)src, n);
    return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    if (CUresult r = unsafe_call_during_capture("cuMemcpyDtoD")) return r;
    if (CUresult r = check_device_range(dst, n, "cuMemcpyDtoD destination")) return r;
    if (CUresult r = check_device_range(src, n, "cuMemcpyDtoD source")) return r;
    memmove((void*)dst, (const void*)src, n);
    return CUDA_SUCCESS;
}
// CUDA_MEMCPY2D, as cuda.h (and cudarc's driver::sys) lays it out.
struct Memcpy2D {
    size_t srcXInBytes, srcY;
    int srcMemoryType;
    const void* srcHost;
    CUdeviceptr srcDevice;
    void* srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    int dstMemoryType;
    void* dstHost;
    CUdeviceptr dstDevice;
    void* dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
};
enum { MEMORYTYPE_HOST = 1, MEMORYTYPE_DEVICE = 2 };

// Host and device memory only (no arrays, no unified addressing); each row's bytes must lie in
// one allocation, and a pitch may not be below the width (Driver API, cuMemcpy2D).
CUresult cuMemcpy2DAsync_v2(const Memcpy2D* c, void* stream) {
    if (!c) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemcpy2DAsync: null descriptor");
    if (c->WidthInBytes == 0 || c->Height == 0) return CUDA_SUCCESS;
    for (int side = 0; side < 2; ++side) {
        const int type = side ? c->dstMemoryType : c->srcMemoryType;
        const size_t pitch = side ? c->dstPitch : c->srcPitch;
        const char* what = side ? "cuMemcpy2DAsync destination" : "cuMemcpy2DAsync source";
        if (type != MEMORYTYPE_HOST && type != MEMORYTYPE_DEVICE)
            return refuse(CUDA_ERROR_NOT_SUPPORTED, "%s: memory type %d (only host and device memory are emulated)", what, type);
        if (pitch < c->WidthInBytes)
            return refuse(CUDA_ERROR_INVALID_VALUE, "%s: pitch %zu below the width of %zu bytes", what, pitch, c->WidthInBytes);
        if (type == MEMORYTYPE_DEVICE) {
            const CUdeviceptr base = side ? c->dstDevice : c->srcDevice;
            const size_t x = side ? c->dstXInBytes : c->srcXInBytes, y = side ? c->dstY : c->srcY;
            const CUdeviceptr first = base + y * pitch + x;
            if (CUresult r = check_device_range(first, (c->Height - 1) * pitch + c->WidthInBytes, what)) return r;
        } else if (stream_of(stream)->capturing) {
            const void* host = side ? (const void*)c->dstHost : c->srcHost;
            const size_t x = side ? c->dstXInBytes : c->srcXInBytes, y = side ? c->dstY : c->srcY;
            if (!is_pinned((const char*)host + y * pitch + x, (c->Height - 1) * pitch + c->WidthInBytes))
                return refuse_in_capture(stream, "a 2-D copy with pageable host memory (cuMemcpy2DAsync)");
        }
    }
    const Memcpy2D d = *c;
    return enqueue(stream, [d] {
        const char* src = d.srcMemoryType == MEMORYTYPE_DEVICE ? (const char*)d.srcDevice : (const char*)d.srcHost;
        char* dst = d.dstMemoryType == MEMORYTYPE_DEVICE ? (char*)d.dstDevice : (char*)d.dstHost;
        src += d.srcY * d.srcPitch + d.srcXInBytes;
        dst += d.dstY * d.dstPitch + d.dstXInBytes;
        for (size_t row = 0; row < d.Height; ++row) memmove(dst + row * d.dstPitch, src + row * d.srcPitch, d.WidthInBytes);
        return CUDA_SUCCESS;
    });
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, void* stream) {
    if (CUresult r = check_device_range(dst, n, "cuMemsetD8Async")) return r;
    return enqueue(stream, [dst, value, n] {
        memset((void*)dst, value, n);
        return CUDA_SUCCESS;
    });
}
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n) {
    if (CUresult r = unsafe_call_during_capture("cuMemsetD8")) return r;
    if (CUresult r = check_device_range(dst, n, "cuMemsetD8")) return r;
    memset((void*)dst, value, n);
    return CUDA_SUCCESS;
}

}  // extern "C"
