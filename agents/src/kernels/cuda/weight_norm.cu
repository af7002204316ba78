// Weight norm's per-unit scale in a population, `s = g / ||v||` per output unit of each
// agent (the layer's output is its product with `v`, scaled), and its backward: `dg =
// ds / ||v||` and `v`'s whole gradient in one pass, the product's share `dw` plus the
// norm's `-g ds v / ||v||^3`. The CPU's ops are `kernels::weight_norm::AgentWeightScale`
// and `nn::weight_norm::stacked_scale_gradients`, per agent.
#include "common.cuh"

// `Σ x_i²` of a row in f64, the CPU's `dot64` order: eight interleaved partial sums,
// then the remainder's own sum added last.
__device__ __forceinline__ double dot64(const float* x, int n) {
    double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    double rest = -0.0;
    int full = n / 8 * 8;
    for (int i = full; i < n; ++i) rest += (double)x[i] * (double)x[i];
    for (int i = 0; i < full; i += 8)
        for (int k = 0; k < 8; ++k) lanes[k] += (double)x[i + k] * (double)x[i + k];
    double total = -0.0;
    for (int k = 0; k < 8; ++k) total += lanes[k];
    return total + rest;
}

// `s [P, units] = g / ||v||`, `v` `[P, units, inputs]`. One thread per (agent, unit).
KERNEL void weight_norm_scale(const float* __restrict__ v, const float* __restrict__ g,
                              float* __restrict__ s, int agents, int units, int inputs) {
    for (long long k = first_index(); k < (long long)agents * units; k += grid_stride()) {
        double inv = 1.0 / sqrt(dot64(v + k * inputs, inputs));
        s[k] = (float)((double)g[k] * inv);
    }
}

// `dg = ds / ||v||` and `dv = dw + c v`, `c = -g ds / ||v||^3` (`dw` null: `c v`);
// `1 / ||v||` from the forward's scale `s` as `s / g` (`s` null, or a gain of 0: the
// norm itself). One thread per (agent, unit).
KERNEL void weight_norm_scale_backward(const float* __restrict__ v,
                                       const float* __restrict__ g,
                                       const float* __restrict__ s,
                                       const float* __restrict__ dw,
                                       const float* __restrict__ ds, float* __restrict__ dv,
                                       float* __restrict__ dg, int agents, int units,
                                       int inputs) {
    for (long long k = first_index(); k < (long long)agents * units; k += grid_stride()) {
        const float* row = v + k * inputs;
        double inv = (s && g[k] != 0.0f) ? (double)s[k] / (double)g[k]
                                         : 1.0 / sqrt(dot64(row, inputs));
        dg[k] = (float)((double)ds[k] * inv);
        float c = -(float)((double)g[k] * (double)ds[k] * inv * inv * inv);
        float* out = dv + k * inputs;
        for (int i = 0; i < inputs; ++i)
            out[i] = dw ? dw[k * inputs + i] + c * row[i] : c * row[i];
    }
}
