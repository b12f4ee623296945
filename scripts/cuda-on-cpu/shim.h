// Just enough of CUDA to run the workbook's fused kernels on the CPU: one OS
// thread per CUDA thread, the blocks of a grid one after another, real
// barriers for __syncthreads, and warp shuffles through a buffer the warp's
// threads share. Slow, but it runs the unchanged kernel source, so a mistake
// in a reduction, an index or a mask shows up without a GPU.
#include <barrier>
#include <cstring>
#include <math.h>
#include <memory>
#include <thread>
#include <vector>

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
thread_local dim3 threadIdx;
dim3 blockIdx, blockDim, gridDim;

static std::unique_ptr<std::barrier<>> block_barrier;
static std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
static float warp_lanes[1024];

#define __global__
#define __device__
// Blocks run one at a time, so one static array per function is the block's shared memory.
#define __shared__ static

inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, sizeof f);
    return f;
}

inline void __syncthreads() { block_barrier->arrive_and_wait(); }

inline float __shfl_xor_sync(unsigned, float value, int lane_mask) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    warp_lanes[threadIdx.x] = value;
    warp_barriers[warp]->arrive_and_wait();
    float other = warp_lanes[warp * 32 + (lane ^ lane_mask)];
    warp_barriers[warp]->arrive_and_wait();
    return other;
}

// kernel<<<grid, block>>>(...), as launch(grid, block, [&] { kernel(...); }).
template <class Kernel>
void launch(unsigned grid, unsigned block, Kernel kernel) {
    gridDim.x = grid;
    blockDim.x = block;
    for (unsigned b = 0; b < grid; b++) {
        blockIdx.x = b;
        block_barrier = std::make_unique<std::barrier<>>(block);
        warp_barriers.clear();
        for (unsigned w = 0; w < block / 32; w++) warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
        std::vector<std::thread> threads;
        for (unsigned t = 0; t < block; t++) threads.emplace_back([t, &kernel] { threadIdx.x = t; kernel(); });
        for (auto& thread : threads) thread.join();
    }
}
