// The host side of the kernels' emulation (see emulate.h): the built-in indices, set
// per thread by the Rust harness (kernels/cuda/emulate.rs), and the block's barrier.
#include <barrier>
#include <memory>

#include "emulate.h"

thread_local normrl_dim3 threadIdx, blockIdx, blockDim, gridDim;

static std::unique_ptr<std::barrier<>> block_barrier;

extern "C" void normrl_emu_block_begin(unsigned int threads) {
    block_barrier = std::make_unique<std::barrier<>>(threads);
}

extern "C" void normrl_emu_set(unsigned int thread, const unsigned int block[3],
                               unsigned int block_dim, const unsigned int grid[3]) {
    threadIdx = {thread, 0, 0};
    blockIdx = {block[0], block[1], block[2]};
    blockDim = {block_dim, 1, 1};
    gridDim = {grid[0], grid[1], grid[2]};
}

extern "C" void normrl_emu_sync() { block_barrier->arrive_and_wait(); }
