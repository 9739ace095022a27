// Unit tests of the emulated CUDA device's checks and execution (emu/include/emu_cuda.h,
// emu/runtime*.cpp), with small kernels written here: every diagnostic on a deliberately bad kernel
// (and none on its good twin), the schedule modes, launches on several OS threads at once, and the
// guard pages of shared memory and fiber stacks. The warp operations' and memory's semantics are
// tested in emu/tests/unit.cpp.
//
//   g++ -std=c++17 -O2 -fno-strict-aliasing -DSWERVE_EMU -I emu/include -I emu -I kernels
//       emu/runtime*.cpp emu/tests/unit_diagnostics.cpp -o emu_unit_diagnostics -lpthread
// (tests/emu_unit.rs does this.)
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "unit_check.h"

// =================================================================================================
// Diagnostics: each bad kernel reports its error (launch result > 0, message names the problem);
// good twins report nothing.
// =================================================================================================
static void test_diagnostics() {
    printf("diagnostics (each must fire on its bad kernel, none on the good ones)\n");
    std::vector<float> gbuf(1024, 1.0f);
    float* g = gbuf.data();
    int e;
    {
        Quiet q;
        emu::set_schedule("reverse");  // lanes 31..16 exit first, then lanes 15..0 reach the shuffle
        e = run("exited_lanes", dim3(1), dim3(32), 0, [&] {
            if (lane_id() >= 16) return;
            float v = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
            g[lane_id()] = v;
        });
        emu::set_schedule(nullptr);
    }
    expect_error("full-mask shfl after lanes exited", e, "have exited");
    e = run("exited_lanes_ok", dim3(1), dim3(32), 0, [&] {
        if (lane_id() >= 16) return;
        g[lane_id()] = __shfl_xor_sync(0x0000ffffu, 1.0f, 1);
    });
    expect_clean("half-mask shfl after lanes exited", e);
    {
        Quiet q;
        // forward: lanes 0-15 reach the shuffle and wait, then lane 16 exits.
        e = run("exit_while_waited_for", dim3(1), dim3(32), 0, [&] {
            if (lane_id() >= 16) return;
            g[lane_id()] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
        });
    }
    expect_error("lane exits while others wait for it", e, "exited while lane");
    {
        Quiet q;
        e = run("mixed_collectives", dim3(1), dim3(32), 0, [&] {
            float v;
            if (lane_id() < 16)
                v = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
            else
                v = __shfl_down_sync(0xffffffffu, 2.0f, 1);
            g[lane_id()] = v;
        });
    }
    expect_error("lanes at different collectives", e, "different warp collectives");
    {
        Quiet q;
        e = run("mixed_masks", dim3(1), dim3(32), 0, [&] {
            g[lane_id()] = __shfl_xor_sync(lane_id() < 16 ? 0xffffffffu : 0xfffffffeu | (1u << lane_id()), 1.0f, 1);
        });
    }
    expect_error("lanes with different masks", e, "different warp collectives");
    {
        Quiet q;
        e = run("ldmatrix_two_sites", dim3(1), dim3(32), 1024, [&] {
            uint32_t r[4];
            if (lane_id() < 16)
                emu::ldmatrix(r, 4, emu::dynamic_smem() + 16 * lane_id(), false, __FILE__, __LINE__);
            else
                emu::ldmatrix(r, 4, emu::dynamic_smem() + 16 * lane_id(), false, __FILE__, __LINE__);
        });
    }
    expect_error("ldmatrix (.aligned) from two call sites", e, "different warp collectives");
    // sm_70+: shfl.sync from different call sites (same mode and mask) exchange values.
    e = run("shfl_two_sites", dim3(1), dim3(32), 0, [&] {
        float v;
        if (lane_id() < 16)
            v = __shfl_xor_sync(0xffffffffu, 1.0f * lane_id(), 16);
        else
            v = __shfl_xor_sync(0xffffffffu, 1.0f * lane_id(), 16);
        g[lane_id()] = v;
    });
    expect_clean("shfl.sync from two call sites", e);
    bool paired = true;
    for (int l = 0; l < 32; ++l) paired &= g[l] == (float)(l ^ 16);
    CHECK(paired, "shfl.sync from two call sites exchanges across them");
    {
        Quiet q;
        e = run("divergent_barrier", dim3(1), dim3(64), 0, [&] {
            if (threadIdx.x % 2)
                __syncthreads();
            else
                __syncthreads();
            g[threadIdx.x] = 2.0f;
        });
    }
    expect_error("divergent __syncthreads", e, "divergent __syncthreads");
    CHECK(g[63] == 2.0f, "a divergent barrier is reported, and the block still completes");
    {
        Quiet q;
        e = run("deadlock", dim3(2), dim3(64), 0, [&] {
            if (threadIdx.x == 0)
                __syncthreads();
            else if (threadIdx.x < 32)
                g[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
            else
                __syncthreads();
        });
    }
    expect_error("deadlock (barrier vs warp collective)", e, "deadlock");
    CHECK(emu::last_launch_errors().find("wait at __syncthreads") != std::string::npos &&
              emu::last_launch_errors().find("remaining blocks did not run") != std::string::npos,
          "the deadlock report names the waits and stops the launch:\n%s", emu::last_launch_errors().c_str());
    {
        Quiet q;
        e = run("misaligned_ldmatrix", dim3(1), dim3(32), 1024, [&] {
            uint32_t r[4];
            unsigned char* s = emu::dynamic_smem();
            emu::ldmatrix(r, 4, s + lane_id() * 24 + 8, false, __FILE__, __LINE__);
        });
    }
    expect_error("ldmatrix row address not 16-byte aligned", e, "not 16-byte aligned");
    {
        Quiet q;
        e = run("ldmatrix_global", dim3(1), dim3(32), 1024, [&] {
            uint32_t r[4];
            emu::ldmatrix(r, 4, g + 4 * lane_id(), false, __FILE__, __LINE__);
        });
    }
    expect_error("ldmatrix from outside shared memory", e, "outside the block's shared memory");
    {
        Quiet q;
        e = run("ldmatrix_overrun", dim3(1), dim3(32), 512, [&] {
            uint32_t r[4];
            emu::ldmatrix(r, 4, emu::dynamic_smem() + 16 * lane_id(), false, __FILE__, __LINE__);  // rows 0..511 OK
            emu::ldmatrix(r, 4, emu::dynamic_smem() + 16 * lane_id() + 16, false, __FILE__,
                          __LINE__);  // last row past the end
        });
    }
    expect_error("ldmatrix row past the dynamic region", e, "outside the block's shared memory");
    e = run("ldmatrix_ok", dim3(1), dim3(32), 512, [&] {
        uint32_t r[4];
        emu::ldmatrix(r, 4, emu::dynamic_smem() + 16 * lane_id(), false, __FILE__, __LINE__);
    });
    expect_clean("ldmatrix over exactly the dynamic region", e);
    {
        Quiet q;
        e = run("misaligned_cp_async", dim3(1), dim3(32), 1024, [&] {
            emu::cp_async(emu::dynamic_smem() + 16 * lane_id() + 4, g + 4 * lane_id(), 16, 16, __FILE__, __LINE__);
            emu::cp_async_commit();
            emu::cp_async_wait(0);
        });
    }
    expect_error("cp.async 16 bytes to a 4-byte aligned address", e, "misaligned 16-byte copy");
    {
        Quiet q;
        e = run("misaligned_cp_async_src", dim3(1), dim3(32), 1024, [&] {
            emu::cp_async(emu::dynamic_smem() + 16 * lane_id(), g + 4 * lane_id() + 1, 16, 16, __FILE__, __LINE__);
            emu::cp_async_commit();
            emu::cp_async_wait(0);
        });
    }
    expect_error("cp.async 16 bytes from a 4-byte aligned source", e, "misaligned 16-byte copy");
    {
        Quiet q;
        std::vector<float> dst(128);
        e = run("cp_async_to_global", dim3(1), dim3(32), 1024, [&] {
            emu::cp_async(dst.data() + 4 * lane_id(), g + 4 * lane_id(), 16, 16, __FILE__, __LINE__);
            emu::cp_async_commit();
            emu::cp_async_wait(0);
        });
    }
    expect_error("cp.async destination outside shared memory", e, "outside the block's shared memory");
    std::vector<uint32_t> seen(32);
    {
        Quiet q;
        e = run("never_waited", dim3(1), dim3(32), 1024, [&] {
            float* s = reinterpret_cast<float*>(emu::dynamic_smem());
            emu::cp_async(s + 4 * lane_id(), g + 4 * lane_id(), 16, 16, __FILE__, __LINE__);
            emu::cp_async_commit();
            seen[lane_id()] = __float_as_uint(s[4 * lane_id()]);  // read without a wait: the NaN fill
        });
    }
    expect_error("cp.async never waited for", e, "never waited for");
    CHECK(std::all_of(seen.begin(), seen.end(), is_nan_bits), "a copy read before its wait_group reads NaN");
    {
        Quiet q;
        e = run("uncommitted", dim3(1), dim3(32), 1024, [&] {
            float* s = reinterpret_cast<float*>(emu::dynamic_smem());
            emu::cp_async(s + 4 * lane_id(), g + 4 * lane_id(), 16, 16, __FILE__, __LINE__);
            emu::cp_async_wait(0);  // waits for committed groups only
        });
    }
    expect_error("cp.async never committed", e, "never waited for");
    {
        Quiet q;
        e = run("mask_without_self", dim3(1), dim3(32), 0,
                [&] { g[lane_id()] = __shfl_xor_sync(0xfffffffeu, 1.0f, 1); });
    }
    expect_error("shfl mask without the calling lane", e, "does not name the calling lane");
    {
        Quiet q;
        e = run("read_outside_mask", dim3(1), dim3(32), 0, [&] {
            if (lane_id() < 16) g[lane_id()] = __shfl_sync(0x0000ffffu, 1.0f, 20, 32);
        });
    }
    expect_error("shfl reads a lane outside the mask", e, "not in the mask");
    {
        Quiet q;
        e = run("mma_partial_warp", dim3(1), dim3(16), 0, [&] {
            float d[4] = {};
            const uint32_t a[4] = {};
            emu::mma_bf16_m16n8k16(d, a, 0, 0, __FILE__, __LINE__);
        });
    }
    expect_error("mma.sync in a partial warp", e, "partial warp");
    {
        Quiet q;
        e = run("static_smem_limit", dim3(1), dim3(32), 0, [&] {
            auto& a = emu::block_shared<float[8192]>(1);  // 32 KiB
            auto& b = emu::block_shared<float[8192]>(2);  // 64 KiB in all
            a[lane_id()] = b[lane_id()];
        });
    }
    expect_error("static shared memory over 48 KiB", e, "does not fit");
    {
        Quiet q;
        e = run("bad_width", dim3(1), dim3(32), 0, [&] { g[lane_id()] = __shfl_xor_sync(0xffffffffu, 1.0f, 1, 12); });
    }
    expect_error("shfl width not a power of two", e, "power of two");
    {
        Quiet q;
        e = run("zero_grid", dim3(0), dim3(32), 0, [&] {});
    }
    expect_error("grid with a zero dimension", e, "zero dimension");
    {
        Quiet q;
        e = run("too_many_threads", dim3(1), dim3(1025), 0, [&] {});
    }
    expect_error("block above 1024 threads", e, "above the limit");
    {
        Quiet q;
        e = run("huge_dynamic_smem", dim3(1), dim3(32), 2 << 20, [&] {});
    }
    expect_error("2 MiB of dynamic shared memory", e, "above any device's");
    {
        Quiet q;
        e = run("nested_launch", dim3(1), dim3(1), 0, [&] { emu::launch(dim3(1), dim3(1), 0, [] {}); });
    }
    expect_error("launch from inside a kernel", e, "inside a running kernel");
    {
        Quiet q;
        setenv("SWERVE_EMU_SCHEDULE", "backwards", 1);
        e = run("bad_schedule", dim3(1), dim3(32), 0, [&] {});
        unsetenv("SWERVE_EMU_SCHEDULE");
    }
    expect_error("unknown SWERVE_EMU_SCHEDULE", e, "not a schedule");
    CHECK(!emu::set_schedule("random:") && !emu::set_schedule("random:x") && !emu::set_schedule("fwd") &&
              emu::set_schedule("random:42") && emu::set_schedule(nullptr),
          "set_schedule accepts exactly forward, reverse and random:SEED");
    // Many errors: counted in full, the first ones kept, the rest summarised; context in each line.
    {
        Quiet q;
        e = run("many_errors", dim3(2), dim3(128), 4096,
                [&] { emu::cp_async(emu::dynamic_smem() + 16 * threadIdx.x + 8, g, 16, 16, __FILE__, __LINE__); });
    }
    CHECK(e == 256, "every error is counted: %d", e);
    const std::string& text = emu::last_launch_errors();
    CHECK(text.find("... and 246 more errors (256 in all)") != std::string::npos, "summary line missing:\n%s",
          text.c_str());
    CHECK(text.find("kernel many_errors, block (0,0,0), thread (0,0,0) (warp 0 lane 0): cp.async at") !=
              std::string::npos,
          "errors name the kernel, block and thread:\n%s", text.c_str());
    // After all this, a clean launch is clean again.
    e = run("clean_after_errors", dim3(2), dim3(64), 0, [&] { __syncthreads(); });
    expect_clean("clean launch after failed ones", e);
    CHECK(emu::last_launch_errors().empty(), "errors of an earlier launch linger");
}

// =================================================================================================
// Schedules: the order in which threads and blocks step changes with SWERVE_EMU_SCHEDULE; a racy
// kernel's result changes with it, a correct kernel's does not.
// =================================================================================================
static std::vector<int> tickets(const char* sched, int blocks, int threads) {
    emu::set_schedule(sched);
    std::vector<int> t(blocks * threads, -1);
    int counter = 0;
    const int e = run("tickets", dim3(blocks), dim3(threads), 0,
                      [&] { t[blockIdx.x * threads + threadIdx.x] = atomicAdd(&counter, 1); });
    expect_clean("tickets", e);
    emu::set_schedule(nullptr);
    return t;
}

static void test_schedules() {
    printf("schedule modes\n");
    const std::vector<int> fwd = tickets("forward", 3, 64), rev = tickets("reverse", 3, 64);
    const std::vector<int> r1 = tickets("random:1", 3, 64), r1b = tickets("random:1", 3, 64),
                           r2 = tickets("random:2", 3, 64);
    bool fwd_ok = true, rev_ok = true;
    for (int i = 0; i < 192; ++i) {
        fwd_ok &= fwd[i] == i;
        rev_ok &= rev[i] == 191 - i;
    }
    CHECK(fwd_ok, "forward: blocks and threads in index order");
    CHECK(rev_ok, "reverse: blocks and threads in reverse index order");
    std::vector<int> sorted = r1;
    std::sort(sorted.begin(), sorted.end());
    bool is_perm = true;
    for (int i = 0; i < 192; ++i) is_perm &= sorted[i] == i;
    CHECK(is_perm && r1 != fwd && r1 != rev, "random:1 is another permutation");
    CHECK(r1 == r1b, "random:SEED is reproducible");
    CHECK(r1 != r2, "different seeds give different orders");
    // Block order alone (one ticket per block).
    {
        emu::set_schedule("random:3");
        std::vector<int> order(16, -1);
        int counter = 0;
        run("block_order", dim3(16), dim3(32), 0, [&] {
            if (threadIdx.x == 0) order[blockIdx.x] = atomicAdd(&counter, 1);
        });
        emu::set_schedule(nullptr);
        bool identity = true;
        for (int i = 0; i < 16; ++i) identity &= order[i] == i;
        std::vector<int> s = order;
        std::sort(s.begin(), s.end());
        bool perm = true;
        for (int i = 0; i < 16; ++i) perm &= s[i] == i;
        CHECK(perm && !identity, "random: blocks run in a shuffled order");
    }

    // Racy: each thread writes its slot and reads its neighbour's without a barrier.
    auto racy = [](const char* sched, bool with_barrier) {
        emu::set_schedule(sched);
        std::vector<float> out(128);
        const int e = run(with_barrier ? "neighbour_sync" : "neighbour_race", dim3(1), dim3(128), 0, [&] {
            auto& s = emu::block_shared<float[128]>(7);
            const int t = threadIdx.x;
            s[t] = (float)t;
            if (with_barrier) __syncthreads();
            out[t] = s[(t + 1) % 128];
        });
        expect_clean("neighbour", e);
        emu::set_schedule(nullptr);
        return out;
    };
    auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
        return memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    const auto race_f = racy("forward", false), race_r = racy("reverse", false), race_x = racy("random:5", false);
    CHECK(!same(race_f, race_r), "a racy kernel gives different results forward and reverse");
    CHECK(std::isnan(race_f[0]) && race_r[0] == 1.0f,
          "forward: thread 0 reads its neighbour's slot before it is written");
    const auto ok_f = racy("forward", true), ok_r = racy("reverse", true), ok_x = racy("random:5", true);
    CHECK(same(ok_f, ok_r) && same(ok_f, ok_x), "a correct kernel gives the same result in every schedule");
    bool correct = true;
    for (int t = 0; t < 128; ++t) correct &= ok_f[t] == (float)((t + 1) % 128);
    CHECK(correct, "the synchronised kernel is right");
    printf("  racy kernel, NaN reads: forward %d, reverse %d, random:5 %d (of 128)\n",
           (int)std::count_if(race_f.begin(), race_f.end(), [](float x) { return std::isnan(x); }),
           (int)std::count_if(race_r.begin(), race_r.end(), [](float x) { return std::isnan(x); }),
           (int)std::count_if(race_x.begin(), race_x.end(), [](float x) { return std::isnan(x); }));
}

// =================================================================================================
// Launches on several OS threads at once: each has its own state, errors stay with their launch.
// =================================================================================================
static void test_threads() {
    printf("concurrent launches on 4 OS threads\n");
    std::atomic<int> wrong{0}, bad_launches{0};
    auto worker = [&](int id) {
        for (int iter = 0; iter < 20; ++iter) {
            if (id == 3 && iter % 2) {  // a failing launch on one thread
                std::vector<float> g(64, 1.0f);
                const int e = run("worker_bad", dim3(1), dim3(32), 0, [&] {
                    if (lane_id() >= 8) return;
                    g[lane_id()] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
                });
                if (e == 0) ++bad_launches;
                continue;
            }
            std::vector<float> out(4 * 128);
            const int e = run("worker", dim3(4), dim3(128), 512, [&] {
                auto& red = emu::block_shared<float[4]>(1);
                float* dyn = reinterpret_cast<float*>(emu::dynamic_smem());
                const int t = threadIdx.x;
                dyn[t] = (float)(t + id);
                float v = (float)t;
                for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
                if (t % 32 == 0) red[t / 32] = v;
                __syncthreads();
                out[blockIdx.x * 128 + t] = red[0] + red[1] + red[2] + red[3] + dyn[(t + 1) % 128];
            });
            if (e != 0) ++bad_launches;
            for (int b = 0; b < 4; ++b)
                for (int t = 0; t < 128; ++t) wrong += out[b * 128 + t] != 8128.0f + (float)((t + 1) % 128 + id);
        }
    };
    {
        Quiet q;
        std::vector<std::thread> ts;
        for (int i = 0; i < 4; ++i) ts.emplace_back(worker, i);
        for (auto& t : ts) t.join();
    }
    CHECK(wrong == 0, "concurrent launches: %d wrong values", wrong.load());
    CHECK(bad_launches == 0, "concurrent launches: %d launches with the wrong error status", bad_launches.load());
}

// =================================================================================================
// Guard pages: an overrun of the dynamic shared memory, or of a fiber's stack, faults at once, and
// describe_fault (for the driver's SIGSEGV handler) names it. Each case runs in a child process.
// =================================================================================================
static int g_fault_pipe = -1;
static void on_fault(int, siginfo_t* info, void*) {
    char msg[512];
    if (emu::describe_fault(info->si_addr, msg, sizeof msg)) {
        if (write(g_fault_pipe, msg, strlen(msg)) < 0) {
        }
        _exit(42);
    }
    _exit(43);
}

template <class F>
static std::string in_child(F kernel, int& status) {
    int fds[2];
    if (pipe(fds) != 0) return "pipe failed";
    fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        g_fault_pipe = fds[1];
        static char altstack[64 * 1024];
        stack_t ss = {};
        ss.ss_sp = altstack;
        ss.ss_size = sizeof altstack;
        sigaltstack(&ss, nullptr);
        struct sigaction sa = {};
        sa.sa_sigaction = on_fault;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigaction(SIGSEGV, &sa, nullptr);
        kernel();
        _exit(0);
    }
    close(fds[1]);
    std::string out;
    char buf[256];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, n);
    close(fds[0]);
    waitpid(pid, &status, 0);
    return out;
}

static volatile int g_sink;
__attribute__((noinline)) static int deep_recursion(int depth) {  // ~1 KiB of stack per level
    volatile char frame[1000];
    frame[0] = (char)depth;
    frame[999] = frame[0];
    return depth == 0 ? frame[999] : deep_recursion(depth - 1) + frame[0];
}

static void test_guard_pages() {
    printf("guard pages (dynamic shared memory overrun, fiber stack overflow)\n");
    int status = 0;
    std::string msg = in_child(
        [] {
            run("smem_overrun", dim3(1), dim3(32), 1024, [] {
                float* s = reinterpret_cast<float*>(emu::dynamic_smem());
                s[256 + threadIdx.x] = 1.0f;  // one float past the 1024 bytes
            });
        },
        status);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 42 &&
              msg.find("past the end of the block's dynamic shared memory") != std::string::npos &&
              msg.find("kernel smem_overrun, block (0,0,0), thread (0,0,0)") != std::string::npos,
          "a write past the dynamic shared memory must fault and be described (status 0x%x): %s", status, msg.c_str());
    printf("  %-44s -> %s\n", "write past dynamic shared memory", msg.c_str());
    msg = in_child([] { run("stack_overflow", dim3(1), dim3(2), 0, [] { g_sink = deep_recursion(400); }); }, status);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 42 && msg.find("stack overflow") != std::string::npos,
          "a fiber stack overflow must fault in the guard page and be described (status 0x%x): %s", status,
          msg.c_str());
    printf("  %-44s -> %s\n", "400 KiB of recursion in one thread", msg.c_str());
}

int main() {
    test_diagnostics();
    test_schedules();
    test_threads();
    test_guard_pages();
    printf("%d checks, %d failures\n", g_checks.load(), g_failures.load());
    return g_failures ? 1 : 0;
}
