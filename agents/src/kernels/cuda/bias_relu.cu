// A population layer's bias (and weight norm's per-unit scale) with its ReLU, forward
// and backward, on values laid out `[P, outer, units, inner]`: a batch of rows
// (`inner` = 1) or of feature maps (`inner` positions per channel). The CPU's ops are
// `kernels::bias_relu::{AgentBias, AgentScaledBias}`.
#include "common.cuh"

// Unit of value `i` within its agent's run of `outer * units * inner` values.
__device__ __forceinline__ int unit_of(long long i, int units, int inner) {
    return (int)((i / inner) % units);
}

// `out = relu?(t * scale_u + bias_u)` (`scale` null: `t + bias_u`), per agent.
KERNEL void agent_bias_forward(const float* __restrict__ t, const float* __restrict__ scale,
                               const float* __restrict__ bias, float* __restrict__ out,
                               int agents, int outer, int units, int inner, int relu) {
    long long per_agent = (long long)outer * units * inner;
    for (long long i = first_index(); i < agents * per_agent; i += grid_stride()) {
        long long unit = (i / per_agent) * units + unit_of(i % per_agent, units, inner);
        float v = scale ? t[i] * scale[unit] + bias[unit] : t[i] + bias[unit];
        out[i] = relu ? fmaxf(v, 0.0f) : v;
    }
}

// The output's gradient through the ReLU: `dy` where `out > 0`.
__device__ __forceinline__ float through_relu(const float* out, const float* dy, long long i,
                                              int relu) {
    return relu ? (out[i] > 0.0f ? dy[i] : 0.0f) : dy[i];
}

// The input's gradient, `d * scale_u` (`scale` null: `d`), `d` through the ReLU. One
// thread per value.
KERNEL void agent_bias_backward_input(const float* __restrict__ scale,
                                      const float* __restrict__ out,
                                      const float* __restrict__ dy, float* __restrict__ dt,
                                      int agents, int outer, int units, int inner, int relu) {
    long long per_agent = (long long)outer * units * inner;
    for (long long i = first_index(); i < agents * per_agent; i += grid_stride()) {
        float d = through_relu(out, dy, i, relu);
        long long unit = (i / per_agent) * units + unit_of(i % per_agent, units, inner);
        dt[i] = scale ? d * scale[unit] : d;
    }
}

// The bias's gradient `Σ d` and (`dscale` not null) the scale's `Σ d t` per unit of
// each agent, `[P, units]`, summed in the CPU's order. One thread per (agent, unit).
KERNEL void agent_bias_backward_params(const float* __restrict__ t,
                                       const float* __restrict__ out,
                                       const float* __restrict__ dy, float* __restrict__ dscale,
                                       float* __restrict__ dbias, int agents, int outer,
                                       int units, int inner, int relu) {
    long long per_agent = (long long)outer * units * inner;
    for (long long k = first_index(); k < (long long)agents * units; k += grid_stride()) {
        long long base = (k / units) * per_agent;
        int u = (int)(k % units);
        dbias[k] = unit_sum(outer, units, inner, u, [&](long long i) {
            return through_relu(out, dy, base + i, relu);
        });
        if (dscale)
            dscale[k] = unit_sum(outer, units, inner, u, [&](long long i) {
                return through_relu(out, dy, base + i, relu) * t[base + i];
            });
    }
}
