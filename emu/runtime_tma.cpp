// The emulated device's sm_90a memory side (interface: emu_cuda.h; internals: runtime_internal.h):
// the shared-window addresses mbarrier, TMA and wgmma descriptors name; tensor maps
// (cuTensorMapEncodeTiled's checks and encoding, called by the stand-in driver's export); TMA tile
// loads, held until a thread waits on the phase they complete on, then landed (global memory read
// then) into shared memory, swizzled.
//
// References: [PTX] "cp.async.bulk.tensor", "Tensor Map" (tensor-map fields, bounding box,
// traversal stride, out-of-bound fill, swizzle modes); CUDA Driver API "Tensor Map Object
// Management": cuTensorMapEncodeTiled (the argument requirements checked below, one by one).
#include <stdio.h>
#include <string.h>

#include <algorithm>
#include <string>

#include "runtime_internal.h"

namespace emu {
namespace rt {

namespace {

constexpr size_t kWindow = size_t(1) << 18;  // what a wgmma descriptor's 14 bits of (addr >> 4) reach

// CUtensorMapDataType (cuda.h) -> element bytes; 0 for the types not emulated.
int dtype_bytes(int dtype) {
    static const int bytes[] = {1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4};
    return dtype >= 0 && dtype < 13 ? bytes[dtype] : 0;
}
// CUtensorMapSwizzle: NONE 0, 32B 1, 64B 2, 128B 3 -> the span in bytes (0: none).
uint32_t swizzle_span(int swizzle) { return swizzle == 0 ? 0 : 16u << swizzle; }

}  // namespace

// Swizzle<B,4,3> on a shared address with span = 16 << B bytes: the 16-byte chunk index (bits 4..)
// XORed with the 128-byte row index bits (bits 7..), B bits of each ([PTX] "Tensor Map": swizzle
// modes; the same function on both sides, the TMA store into and wgmma's reads from shared memory).
uint64_t swizzle_address(uint64_t a, uint32_t span) {
    if (!span) return a;
    const uint64_t mask = (uint64_t)(span / 16 - 1) << 4;
    return a ^ ((a >> 3) & mask);
}

unsigned char* shared_ptr(const Launch& L, uint64_t addr, size_t n) {
    const Hopper& H = L.hop;
    if (addr < H.dyn_window) {
        if (addr + n <= L.static_used) return L.static_base + addr;
        return nullptr;
    }
    const uint64_t off = addr - H.dyn_window;
    if (off + n <= L.dyn_bytes) return L.dyn_base + off;
    return nullptr;
}

// UINT32_MAX when p is not in the window.
uint32_t shared_addr_of(const Launch& L, const void* p) {
    const unsigned char* c = (const unsigned char*)p;
    if (c >= L.static_base && c < L.static_base + L.static_used) {
        const size_t off = c - L.static_base;
        return off < L.hop.dyn_window ? (uint32_t)off : UINT32_MAX;
    }
    if (c >= L.dyn_base && c < L.dyn_base + L.dyn_bytes) {
        const size_t a = L.hop.dyn_window + (c - L.dyn_base);
        return a < kWindow ? (uint32_t)a : UINT32_MAX;
    }
    return UINT32_MAX;
}

std::string mbar_str(const Launch& L, const MBar& b) {
    char buf[320];
    snprintf(buf, sizeof buf,
             "mbarrier at shared 0x%x (initialised at %s:%d, count %u): current phase %llu (parity %llu), %u of %u "
             "arrivals pending, tx-count %lld bytes expected, %lld bytes of TMA copies issued",
             shared_addr_of(L, b.addr), b.file, b.line, b.expected, (unsigned long long)b.phase,
             (unsigned long long)(b.phase & 1), b.pending, b.expected, (long long)b.tx, (long long)b.inflight);
    return buf;
}

// Reads the box from global memory and writes it, swizzled, at its destination.
static void land(TmaCopy& c) {
    const TensorMapFields& m = c.map;
    uint64_t count[5] = {1, 1, 1, 1, 1};
    for (int d = 0; d < m.rank; ++d) count[d] = (m.box[d] + m.estrides[d] - 1) / m.estrides[d];
    const uint32_t span = swizzle_span(m.swizzle);
    uint64_t idx = 0;
    uint64_t i[5];
    for (i[4] = 0; i[4] < count[4]; ++i[4])
        for (i[3] = 0; i[3] < count[3]; ++i[3])
            for (i[2] = 0; i[2] < count[2]; ++i[2])
                for (i[1] = 0; i[1] < count[1]; ++i[1])
                    for (i[0] = 0; i[0] < count[0]; ++i[0], ++idx) {
                        bool inside = true;
                        uint64_t src = m.addr;
                        for (int d = 0; d < m.rank; ++d) {
                            const int64_t g = c.coords[d] + (int64_t)i[d] * m.estrides[d];
                            inside &= g >= 0 && (uint64_t)g < m.dims[d];
                            src += (uint64_t)g * m.strides[d];
                        }
                        // The destination is aligned to the swizzle's repeat: offsets swizzle as addresses.
                        unsigned char* dst = c.dst + swizzle_address(idx * m.esize, span);
                        if (inside)
                            memcpy(dst, (const void*)(uintptr_t)src, m.esize);
                        else
                            memset(dst, m.oob_fill ? 0xff : 0, m.esize);
                    }
    c.landed = true;
}

void tma_land_completed(Launch& L, int bar) {
    const MBar& b = L.hop.bars[bar];
    std::vector<TmaCopy>& copies = L.hop.copies;
    for (TmaCopy& c : copies)
        if (c.bar == bar && !c.landed && c.phase < b.phase) {
            land(c);
            // The box fills [dst, dst + bytes), swizzled within its 128-byte lines.
            async_proxy_saw(L, c.dst, c.map.swizzle ? (c.bytes + 127) / 128 * 128 : c.bytes);
        }
    copies.erase(std::remove_if(copies.begin(), copies.end(), [](const TmaCopy& c) { return c.landed; }),
                 copies.end());
}

int tensor_map_encode_tiled(void* map, int dtype, unsigned rank, void* addr, const uint64_t* dims,
                            const uint64_t* strides, const uint32_t* box, const uint32_t* estrides, int interleave,
                            int swizzle, int l2, int oob_fill, std::string& why) {
    char buf[256];
    auto bad = [&](const char* fmt, auto... args) {
        snprintf(buf, sizeof buf, fmt, args...);
        why = std::string("cuTensorMapEncodeTiled: ") + buf;
        return 1;  // CUDA_ERROR_INVALID_VALUE
    };
    if (!map || (uintptr_t)map % 64) return bad("tensorMap %p must be a 64-byte aligned CUtensorMap", map);
    const int esize = dtype_bytes(dtype);
    if (!esize) return bad("tensorDataType %d is not one the emulator supports (CU_TENSOR_MAP_DATA_TYPE_UINT8..TFLOAT32_FTZ)", dtype);
    if (rank < 1 || rank > 5) return bad("tensorRank %u must be in 1..5", rank);
    if (interleave != 0)
        return bad("interleave %d: only CU_TENSOR_MAP_INTERLEAVE_NONE is emulated", interleave);
    if (swizzle < 0 || swizzle > 3) return bad("swizzle %d: NONE, 32B, 64B or 128B (the ATOM variants are not emulated)", swizzle);
    if (l2 < 0 || l2 > 3) return bad("l2Promotion %d must be NONE, 64B, 128B or 256B", l2);
    if (oob_fill < 0 || oob_fill > 1) return bad("oobFill %d must be NONE or NAN_REQUEST_ZERO_FMA", oob_fill);
    if (!addr || (uintptr_t)addr % 16) return bad("globalAddress %p must be 16-byte aligned", addr);
    if (!dims || !box || !estrides || (rank > 1 && !strides)) return bad("a null globalDim, globalStrides, boxDim or elementStrides");
    for (unsigned d = 0; d < rank; ++d) {
        if (dims[d] == 0 || dims[d] > (uint64_t(1) << 32))
            return bad("globalDim[%u] = %llu must be in 1..2^32", d, (unsigned long long)dims[d]);
        if (box[d] == 0 || box[d] > 256) return bad("boxDim[%u] = %u must be in 1..256", d, box[d]);
        if (estrides[d] == 0 || estrides[d] > 8)
            return bad("elementStrides[%u] = %u must be in 1..8", d, estrides[d]);
    }
    for (unsigned d = 0; d + 1 < rank; ++d)
        if (strides[d] % 16 || strides[d] >= (uint64_t(1) << 40))
            return bad("globalStrides[%u] = %llu must be a multiple of 16 below 2^40", d, (unsigned long long)strides[d]);
    const uint32_t inner = box[0] * esize;
    if (inner % 16) return bad("boxDim[0] * element size = %u bytes must be a multiple of 16", inner);
    const uint32_t span = swizzle_span(swizzle);
    if (span && inner > span)
        return bad("boxDim[0] * element size = %u bytes exceeds the swizzle span of %u bytes", inner, span);
    TensorMapFields f{};
    f.magic = kTensorMapMagic;
    f.rank = (uint8_t)rank;
    f.dtype = (uint8_t)dtype;
    f.esize = (uint8_t)esize;
    f.swizzle = (uint8_t)swizzle;
    f.interleave = (uint8_t)interleave;
    f.oob_fill = (uint8_t)oob_fill;
    f.l2 = (uint8_t)l2;
    f.addr = (uint64_t)(uintptr_t)addr;
    for (unsigned d = 0; d < 5; ++d) {
        f.dims[d] = d < rank ? dims[d] : 1;
        f.strides[d] = d == 0 ? (uint64_t)esize : (d < rank ? strides[d - 1] : 0);
        f.box[d] = (uint16_t)(d < rank ? box[d] : 1);
        f.estrides[d] = (uint8_t)(d < rank ? estrides[d] : 1);
    }
    static_assert(sizeof(TensorMapFields) <= 128, "a CUtensorMap is 128 bytes");
    memset(map, 0, 128);
    memcpy(map, &f, sizeof f);
    return 0;
}

}  // namespace rt

using namespace rt;

uint32_t shared_address(const void* p, const char* file, int line) {
    Launch& L = launch_or_die("shared_address (cvta.to.shared)");
    const uint32_t a = shared_addr_of(L, p);
    if (a == UINT32_MAX) {
        report(W_THREAD, -1,
               "shared address of %p at %s:%d: not in the block's shared memory (static %p +%zu, dynamic %p +%zu) or "
               "beyond the 18-bit window a descriptor addresses",
               p, file, line, (void*)L.static_base, L.static_used, (void*)L.dyn_base, L.dyn_bytes);
        return 0;
    }
    return a;
}

void tma_load(void* smem, const void* tensor_map, uint64_t* bar, int rank, const int* coords, const char* file,
              int line) {
    Launch& L = launch_or_die("cp.async.bulk.tensor");
    TensorMapFields m;
    memcpy(&m, tensor_map, sizeof m);
    if (m.magic != kTensorMapMagic) {
        report(W_THREAD, -1, "cp.async.bulk.tensor at %s:%d: the tensor map at %p was never encoded by cuTensorMapEncodeTiled",
               file, line, tensor_map);
        return;
    }
    if (rank != m.rank) {
        report(W_THREAD, -1, "cp.async.bulk.tensor.%dd at %s:%d with a rank-%d tensor map", rank, file, line, m.rank);
        return;
    }
    const int b = mbar_lookup(L, bar, "cp.async.bulk.tensor", file, line);
    if (b < 0) return;
    Hopper& H = L.hop;
    if (H.bars[b].init_epoch == H.fence_epoch)
        report(W_THREAD, -1,
               "cp.async.bulk.tensor at %s:%d: mbarrier initialised at %s:%d not fenced before TMA use (no "
               "fence_barrier_init() or __syncthreads() between mbarrier_init and the TMA load completing on it)",
               file, line, H.bars[b].file, H.bars[b].line);
    uint32_t bytes = m.esize;
    for (int d = 0; d < m.rank; ++d) bytes *= (m.box[d] + m.estrides[d] - 1) / m.estrides[d];
    const uint32_t span = swizzle_span(m.swizzle);
    const uint32_t sa = shared_addr_of(L, smem);
    if (sa == UINT32_MAX || !in_shared(L, smem, bytes)) {
        report(W_THREAD, -1,
               "cp.async.bulk.tensor at %s:%d: destination [%p, +%u) is outside the block's shared memory (static %p "
               "+%zu, dynamic %p +%zu)",
               file, line, smem, bytes, (void*)L.static_base, L.static_used, (void*)L.dyn_base, L.dyn_bytes);
        return;
    }
    const uint32_t align = span ? span * 8 : 128;
    if (sa % align) {
        report(W_THREAD, -1,
               "cp.async.bulk.tensor at %s:%d: destination shared 0x%x is not %u-byte aligned (%s: the 128-byte "
               "alignment%s)",
               file, line, sa, align, span ? "swizzled" : "unswizzled", span ? " and the swizzle pattern's repeat" : "");
        return;
    }
    TmaCopy c{};
    c.bar = b;
    c.phase = H.bars[b].phase;
    c.dst = (unsigned char*)smem;
    c.map = m;
    for (int d = 0; d < 5; ++d) c.coords[d] = d < rank ? coords[d] : 0;
    c.bytes = bytes;
    c.file = file;
    c.line = line;
    H.copies.push_back(c);
    unsigned char* end = c.dst + bytes;
    H.regions.erase(std::remove_if(H.regions.begin(), H.regions.end(),
                                   [&](const TmaRegion& r) { return r.begin < end && c.dst < r.end; }),
                    H.regions.end());
    H.regions.push_back(TmaRegion{c.dst, end, span, (uint32_t)m.box[0] * m.esize, file, line});
    H.bars[b].inflight += bytes;
    mbar_try_complete(L, b);
}

}  // namespace emu
