// What the emulated device's C++ unit tests share (emu/tests/unit.cpp, emu/tests/unit_diagnostics.cpp):
// the CHECK counter, launching a lambda as a named kernel, silencing stderr around deliberately bad
// kernels, the expected-error checks, and bf16 helpers.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <string>

#include "emu_cuda.h"

static std::atomic<int> g_checks{0}, g_failures{0};
#define CHECK(cond, ...)                                              \
    do {                                                              \
        ++g_checks;                                                   \
        if (!(cond)) {                                                \
            ++g_failures;                                             \
            printf("  FAIL %s:%d: (%s) ", __FILE__, __LINE__, #cond); \
            printf(__VA_ARGS__);                                      \
            printf("\n");                                             \
        }                                                             \
    } while (0)

// Launches `body` as kernel `name`; returns the launch's error count.
template <class F>
inline int run(const char* name, dim3 grid, dim3 block, size_t smem, F body) {
    emu::set_current_kernel(name);
    return emu::launch(grid, block, smem, std::function<void()>(body));
}

// Silences stderr (the emulator prints every error there) around deliberately bad kernels.
struct Quiet {
    int saved;
    Quiet() {
        fflush(stderr);
        saved = dup(2);
        const int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 2);
        close(fd);
    }
    ~Quiet() {
        fflush(stderr);
        dup2(saved, 2);
        close(saved);
    }
};

// A bad kernel: the launch must report an error whose text contains `needle`.
inline void expect_error(const char* what, int errors, const char* needle) {
    const std::string& text = emu::last_launch_errors();
    CHECK(errors > 0, "%s: no error reported", what);
    CHECK(text.find(needle) != std::string::npos, "%s: expected \"%s\" in the errors, got:\n%s", what, needle,
          text.c_str());
    const std::string first = text.substr(0, text.find('\n'));
    printf("  %-44s -> %s\n", what, first.c_str());
}
inline void expect_clean(const char* what, int errors) {
    CHECK(errors == 0, "%s: %d unexpected errors:\n%s", what, errors, emu::last_launch_errors().c_str());
}

inline uint16_t f2bf(float f) { return __float2bfloat16_rn(f).__x; }
inline float bf2f(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }
inline bool is_nan_bits(uint32_t u) { return std::isnan(__uint_as_float(u)); }
inline unsigned lane_id() { return threadIdx.x % 32; }
