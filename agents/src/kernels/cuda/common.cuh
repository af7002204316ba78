// What every population kernel here shares.
//
// Each file is compiled twice: by nvcc to PTX for the GPU (the `cuda` feature, with
// `-fmad=false` so that products and sums round as the CPU ops' do), and by the host's
// C++ compiler for the tests (NORMRL_HOST_EMULATION), which run a launch's blocks one
// after another and a block's threads as OS threads, so that each kernel's indexing
// and arithmetic is checked against the CPU op on any machine.
//
// The kernels keep to what that emulation runs faithfully: 1-D blocks, shared memory
// and __syncthreads, no warp shuffles, no atomics. No atomics is also what keeps a
// step deterministic: every sum is taken in a fixed order.
#pragma once

#ifdef NORMRL_HOST_EMULATION
#include "emulate.h"
#endif

#define KERNEL extern "C" __global__

// This thread's first index of a grid-stride loop over x, and the stride.
__device__ __forceinline__ long long first_index() {
    return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ long long grid_stride() {
    return (long long)gridDim.x * blockDim.x;
}

// Σ f(i) for i in [0, n): the CPU's `lane_sum` order (eight interleaved partial sums,
// the remainder first into its own sum, then the lanes added in turn, then the
// remainder), so that a sum over a run equals the CPU's bit for bit.
template <class F>
__device__ __forceinline__ float lane_sum(long long n, F f) {
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float tail = 0.0f;
    long long full = n / 8 * 8;
    for (long long i = full; i < n; ++i) tail += f(i);
    for (long long i = 0; i < full; i += 8)
        for (int j = 0; j < 8; ++j) lanes[j] += f(i + j);
    float total = -0.0f;
    for (int j = 0; j < 8; ++j) total += lanes[j];
    return total + tail;
}

// Σ f(index) over one unit's values in a `[outer, units, inner]` run, as the CPU's
// `Units::sums2` takes it: row after row for features (`inner == 1`), a `lane_sum`
// per block of positions for channels.
template <class F>
__device__ __forceinline__ float unit_sum(int outer, int units, int inner, int u, F f) {
    float sum = 0.0f;
    for (int o = 0; o < outer; ++o) {
        long long start = ((long long)o * units + u) * inner;
        if (inner == 1) {
            sum += f(start);
        } else {
            sum += lane_sum(inner, [&](long long i) { return f(start + i); });
        }
    }
    return sum;
}
