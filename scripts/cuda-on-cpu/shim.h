// Just enough of CUDA to run the workbook's fused kernels on the CPU: each
// CUDA thread of a block a coroutine of its own (ucontext), run in turn on one
// OS thread until it waits at a barrier, the blocks of a grid one after
// another; __syncthreads and the warp shuffles wait at barriers that let no
// thread on until every thread of its block or warp has arrived. Switching
// coroutines costs far less than switching OS threads (hundreds of threads
// meeting at every barrier), and the order is the same on every run: a
// missing barrier shows up every time. It runs the unchanged kernel source, so
// a mistake in a reduction, an index or a mask shows up without a GPU.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <ucontext.h>
#include <vector>

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace shim {
// The coroutine of each thread of the block that runs, and the scheduler's context.
struct Thread {
    ucontext_t context;
    std::vector<char> stack;
    bool done = false;
};
inline std::vector<Thread> threads;
inline ucontext_t scheduler;
inline unsigned running;
// Set when a thread arrives at a barrier or ends: a round without it is a deadlock.
inline bool progress;

// Back to the scheduler, which runs the other threads; returns when it is this thread's turn again.
inline void yield() { swapcontext(&threads[running].context, &scheduler); }

// Lets no thread on until `count` threads have arrived in the current phase.
struct Barrier {
    unsigned count, arrived = 0, phase = 0;
    void arrive_and_wait() {
        progress = true;
        unsigned mine = phase;
        if (++arrived == count) {
            arrived = 0;
            phase++;
            return;
        }
        while (phase == mine) yield();
    }
};
inline Barrier block_barrier;
inline std::vector<Barrier> warp_barriers;
inline float warp_lanes[1024];

template <class Kernel>
void run_thread(Kernel* kernel) {
    (*kernel)();
    threads[running].done = true;
    progress = true;
}  // uc_link returns to the scheduler
}  // namespace shim

#define __global__
#define __device__
// Blocks run one at a time, so one static array per function is the block's shared memory.
#define __shared__ static

inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, sizeof f);
    return f;
}

inline void __syncthreads() { shim::block_barrier.arrive_and_wait(); }

inline float __shfl_xor_sync(unsigned, float value, int lane_mask) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    shim::warp_lanes[threadIdx.x] = value;
    shim::warp_barriers[warp].arrive_and_wait();
    float other = shim::warp_lanes[warp * 32 + (lane ^ lane_mask)];
    shim::warp_barriers[warp].arrive_and_wait();
    return other;
}

// kernel<<<grid, block>>>(...), as launch(grid, block, [&] { kernel(...); }).
template <class Kernel>
void launch(unsigned grid, unsigned block, Kernel kernel) {
    using namespace shim;
    gridDim.x = grid;
    blockDim.x = block;
    threads = std::vector<Thread>(block);
    for (auto& thread : threads) thread.stack.resize(64 * 1024);
    for (unsigned b = 0; b < grid; b++) {
        blockIdx.x = b;
        block_barrier = Barrier{block};
        warp_barriers.assign(block / 32, Barrier{32});
        for (auto& thread : threads) {
            thread.done = false;
            getcontext(&thread.context);
            thread.context.uc_stack = {thread.stack.data(), 0, thread.stack.size()};
            thread.context.uc_link = &scheduler;
            // makecontext passes ints: the kernel's address goes through a global.
            static Kernel* current;
            current = &kernel;
            makecontext(&thread.context, reinterpret_cast<void (*)()>(+[] { run_thread(current); }), 0);
        }
        for (unsigned left = block; left > 0;) {
            progress = false;
            left = 0;
            for (running = 0; running < block; running++) {
                if (threads[running].done) continue;
                threadIdx.x = running;
                swapcontext(&scheduler, &threads[running].context);
                left += !threads[running].done;
            }
            if (left > 0 && !progress) {
                std::fprintf(stderr, "block %u of %u threads: every thread left waits at a barrier no other reaches\n", b, block);
                std::exit(1);
            }
        }
    }
}
