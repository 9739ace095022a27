// The emulated CUDA device's memory (interface: emu_cuda.h; internals shared with the scheduler in
// runtime_internal.h): each OS thread's shared memory, mapped once with guard pages and reused,
// NaN-filled at every block ([guard][static: kMaxStaticSmem][guard][dynamic, used from its
// end][guard]); static __shared__ variables placed in the static region on first use; cp.async
// copies held per thread until their group is waited for; and the description of a fault in a
// guard page (shared memory or a fiber's stack) for the driver's SIGSEGV handler.
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include <algorithm>

#include "runtime_internal.h"

namespace emu {
namespace rt {

bool in_shared(const Launch& L, const void* p, size_t n) {
    const unsigned char* c = (const unsigned char*)p;
    if (c >= L.static_base && c + n <= L.static_base + L.static_used) return true;
    if (c >= L.dyn_base && c + n <= L.dyn_base + L.dyn_bytes) return true;
    return false;
}

void prepare_smem(Launch& L, size_t dyn) {
    // [guard][static: kMaxStaticSmem][guard][dynamic capacity, used from its end][guard]
    Resources& R = *L.res;
    const size_t dyn_cap = std::max<size_t>((dyn + kPage - 1) / kPage * kPage, 16 * kPage);
    if (!R.smem || R.dyn_cap < dyn_cap) {
        if (R.smem) munmap(R.smem, R.smem_bytes);
        R.smem_bytes = kPage + kMaxStaticSmem + kPage + dyn_cap + kPage;
        void* p =
            mmap(nullptr, R.smem_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            perror("emulated CUDA: mmap of shared memory");
            abort();
        }
        R.smem = (unsigned char*)p;
        R.dyn_cap = dyn_cap;
        mprotect(R.smem, kPage, PROT_NONE);
        mprotect(R.smem + kPage + kMaxStaticSmem, kPage, PROT_NONE);
        mprotect(R.smem + R.smem_bytes - kPage, kPage, PROT_NONE);
    }
    L.static_base = R.smem + kPage;
    L.static_used = 0;
    unsigned char* dyn_end = R.smem + R.smem_bytes - kPage;
    L.dyn_bytes = dyn;
    L.dyn_base = dyn_end - ((dyn + 15) & ~(size_t)15);
}

}  // namespace rt

using namespace rt;

bool describe_fault(const void* addr, char* buf, size_t size) {
    const Launch* L = tl_launch;
    if (!L || !tl_state || !tl_state->res.smem) return false;
    const Resources& R = tl_state->res;
    const unsigned char* a = (const unsigned char*)addr;
    const char* what = nullptr;
    if (a >= R.smem + R.smem_bytes - kPage && a < R.smem + R.smem_bytes)
        what = "past the end of the block's dynamic shared memory";
    else if (a >= R.smem + kPage + kMaxStaticSmem && a < R.smem + 2 * kPage + kMaxStaticSmem)
        what = "past the end of the block's static shared memory region (48 KiB)";
    else if (a >= R.smem && a < R.smem + kPage)
        what = "before the start of the block's static shared memory";
    else
        for (const char* s : R.stacks)
            if ((const char*)a >= s - kPage && (const char*)a < s)
                what = "in a fiber's stack guard page (stack overflow: a thread's locals above 256 KiB)";
    if (!what) return false;
    const uint3 b = L->block.bid;
    int n =
        snprintf(buf, size, "emulated CUDA: kernel %s, block (%u,%u,%u)", L->kernel ? L->kernel : "?", b.x, b.y, b.z);
    if (L->cur && n >= 0 && (size_t)n < size) {
        const uint3 t = L->cur->regs.tid;
        n += snprintf(buf + n, size - n, ", thread (%u,%u,%u)", t.x, t.y, t.z);
    }
    if (n >= 0 && (size_t)n < size)
        snprintf(buf + n, size - n, ": memory fault at %p, %s (dynamic shared memory: %zu bytes)", addr, what,
                 L->dyn_bytes);
    return true;
}

void cp_async(void* dst, const void* src, int bytes, int src_bytes, const char* file, int line) {
    Launch& L = launch_or_die("cp.async");
    Thread& t = *L.cur;
    if (bytes != 4 && bytes != 8 && bytes != 16) {
        report(W_THREAD, -1, "cp.async at %s:%d of %d bytes: cp-size must be 4, 8 or 16", file, line, bytes);
        return;
    }
    if (src_bytes < 0 || src_bytes > bytes) {
        report(W_THREAD, -1, "cp.async at %s:%d: src-size %d outside [0, %d]", file, line, src_bytes, bytes);
        return;
    }
    if ((uintptr_t)dst % bytes || (src_bytes && (uintptr_t)src % bytes)) {
        report(W_THREAD, -1,
               "cp.async at %s:%d: misaligned %d-byte copy (dst %p, src %p): both must be %d-byte aligned", file, line,
               bytes, dst, src, bytes);
        return;
    }
    if (!in_shared(L, dst, bytes)) {
        report(W_THREAD, -1,
               "cp.async at %s:%d: destination [%p, +%d) is outside the block's shared memory (static %p +%zu, dynamic "
               "%p +%zu)",
               file, line, dst, bytes, (void*)L.static_base, L.static_used, (void*)L.dyn_base, L.dyn_bytes);
        return;
    }
    t.copies.push_back(
        Copy{(unsigned char*)dst, (const unsigned char*)src, (uint32_t)bytes, (uint32_t)src_bytes, t.next_group});
}

void cp_async_commit() {
    Launch& L = launch_or_die("cp.async.commit_group");
    ++L.cur->next_group;
}

void cp_async_wait(int pending) {
    Launch& L = launch_or_die("cp.async.wait_group");
    Thread& t = *L.cur;
    if (pending < 0) pending = 0;
    // Committed groups are 0 .. next_group - 1; all but the `pending` most recent land.
    const uint64_t limit = t.next_group > (uint64_t)pending ? t.next_group - pending : 0;
    while (t.head < t.copies.size() && t.copies[t.head].group < limit) {
        const Copy& c = t.copies[t.head++];
        if (c.src_bytes) memcpy(c.dst, c.src, c.src_bytes);
        if (c.bytes > c.src_bytes) memset(c.dst + c.src_bytes, 0, c.bytes - c.src_bytes);
    }
    if (t.head == t.copies.size()) {
        t.copies.clear();
        t.head = 0;
    }
}

unsigned char* dynamic_smem() {
    Launch* L = tl_launch;
    if (!L) {
        fprintf(stderr, "emulated CUDA: dynamic shared memory used outside a running kernel\n");
        abort();
    }
    return L->dyn_base;
}

void* block_shared_alloc(int id, const void* type_key, size_t size, size_t align) {
    Launch& L = launch_or_die("a __shared__ variable");
    for (const StaticVar& v : L.statics)
        if (v.id == id && v.type == type_key) return L.static_base + v.offset;
    const size_t offset = (L.static_used + align - 1) / align * align;
    if (align > kPage || offset + size > kMaxStaticSmem) {
        report(
            W_THREAD, -1,
            "static __shared__ variable #%d of %zu bytes (align %zu) does not fit: %zu bytes in use, the limit is %zu",
            id, size, align, L.static_used, kMaxStaticSmem);
        abandon(L, *L.cur);
    }
    memset(L.static_base + L.static_used, 0xff, offset + size - L.static_used);
    L.static_used = offset + size;
    L.statics.push_back(StaticVar{id, type_key, size, offset});
    return L.static_base + offset;
}

}  // namespace emu
