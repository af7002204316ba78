// CUDA's built-ins on the host, for the kernels' tests (see common.cuh). Blocks run one
// after another, so a kernel's `__shared__` arrays become statics shared by the block's
// threads; `__syncthreads` is a barrier across them.
#pragma once
#include <cmath>
#include <cstdint>

struct normrl_dim3 {
    unsigned int x, y, z;
};
extern thread_local normrl_dim3 threadIdx, blockIdx, blockDim, gridDim;
extern "C" void normrl_emu_sync();

#define __global__
#define __device__ static
#define __shared__ static
#define __forceinline__ inline
#define __restrict__ __restrict
inline void __syncthreads() { normrl_emu_sync(); }
