// The per-sample normalizations of a population, forward and backward: layer norm (one
// group per row), group norm (`groups` per row, parameters per channel repeated over
// `spatial` positions) and RMSNorm (`rms`: no mean, no shift). Each agent's rows are
// `[rows, n]` with `n = features = parameters * spatial`. The CPU's ops are
// `kernels::layer_norm::FusedLayerNorm` and `kernels::rms_norm::FusedRmsNorm`, per agent.
#include "common.cuh"

struct RowNorm {
    int agents, rows, n, groups, spatial, relu, rms;
    double eps;
};

// The parameter index of feature `f` of agent `p`.
__device__ __forceinline__ long long param_of(const RowNorm& s, long long p, int f) {
    return p * (s.n / s.spatial) + f / s.spatial;
}

// Part `k`'s (a group of a row: `m` values) mean (0 for RMSNorm) and `1 / sqrt(var +
// eps)`, as the CPU's `row_statistics` and `inverse_rms` take them.
__device__ __forceinline__ void part_statistics(const RowNorm& s, const float* x, int m,
                                                float* mean, float* inv) {
    float mu = 0.0f;
    if (!s.rms) {
        float sum = lane_sum(m, [&](long long i) { return x[i]; });
        mu = (float)((double)sum / (double)m);
    }
    float sq = s.rms ? lane_sum(m, [&](long long i) { return x[i] * x[i]; })
                     : lane_sum(m, [&](long long i) { return (x[i] - mu) * (x[i] - mu); });
    *mean = mu;
    *inv = (float)(1.0 / sqrt((double)sq / (double)m + s.eps));
}

// The normalized output, and each part's statistics `[P * rows * groups, 2]` (mean,
// inverse deviation) for the backward. One thread per part.
KERNEL void row_norm_forward(const float* __restrict__ t, const float* __restrict__ gamma,
                             const float* __restrict__ beta, float* __restrict__ out,
                             float* __restrict__ stats, RowNorm s) {
    int m = s.n / s.groups;
    long long parts = (long long)s.agents * s.rows * s.groups;
    for (long long k = first_index(); k < parts; k += grid_stride()) {
        long long p = k / ((long long)s.rows * s.groups);
        int at = (int)(k % s.groups) * m;
        const float* x = t + k * m;
        float mean, inv;
        part_statistics(s, x, m, &mean, &inv);
        stats[2 * k] = mean;
        stats[2 * k + 1] = inv;
        for (int i = 0; i < m; ++i) {
            long long j = param_of(s, p, at + i);
            float v = s.rms ? x[i] * inv * gamma[j] : (x[i] - mean) * inv * gamma[j] + beta[j];
            out[k * m + i] = s.relu ? fmaxf(v, 0.0f) : v;
        }
    }
}

// The output's gradient at value `i`, through the ReLU.
__device__ __forceinline__ float masked(const RowNorm& s, const float* out, const float* dy,
                                        long long i) {
    return s.relu ? (out[i] > 0.0f ? dy[i] : 0.0f) : dy[i];
}

// The input's gradient: per part, `inv (d - mean d - x̂ mean(d x̂))` (RMSNorm without
// `mean d`), `d = dy gamma`. One thread per part.
KERNEL void row_norm_backward_input(const float* __restrict__ t,
                                    const float* __restrict__ gamma,
                                    const float* __restrict__ out,
                                    const float* __restrict__ dy,
                                    const float* __restrict__ stats, float* __restrict__ dt,
                                    RowNorm s) {
    int m = s.n / s.groups;
    long long parts = (long long)s.agents * s.rows * s.groups;
    for (long long k = first_index(); k < parts; k += grid_stride()) {
        long long p = k / ((long long)s.rows * s.groups), base = k * m;
        int at = (int)(k % s.groups) * m;
        float mean = stats[2 * k], inv = stats[2 * k + 1];
        auto xhat = [&](long long i) {
            return s.rms ? t[base + i] * inv : (t[base + i] - mean) * inv;
        };
        auto d = [&](long long i) {
            return masked(s, out, dy, base + i) * gamma[param_of(s, p, at + (int)i)];
        };
        float mean_d = s.rms ? 0.0f : lane_sum(m, d) / (float)m;
        float mean_dx = lane_sum(m, [&](long long i) { return d(i) * xhat(i); }) / (float)m;
        for (int i = 0; i < m; ++i)
            dt[base + i] = s.rms ? inv * (d(i) - xhat(i) * mean_dx)
                                 : inv * (d(i) - mean_d - xhat(i) * mean_dx);
    }
}

// The parameters' gradients `[P, n / spatial]`: `Σ dy x̂` and (`dbeta` not null) `Σ dy`
// over the rows, then over each channel's positions, in the CPU's order. One thread per
// parameter of each agent.
KERNEL void row_norm_backward_params(const float* __restrict__ t,
                                     const float* __restrict__ out,
                                     const float* __restrict__ dy,
                                     const float* __restrict__ stats,
                                     float* __restrict__ dgamma, float* __restrict__ dbeta,
                                     RowNorm s) {
    int m = s.n / s.groups, params = s.n / s.spatial;
    for (long long q = first_index(); q < (long long)s.agents * params; q += grid_stride()) {
        long long p = q / params;
        int c = (int)(q % params);
        float g_total = -0.0f, b_total = -0.0f, g_one = 0.0f, b_one = 0.0f;
        for (int pos = 0; pos < s.spatial; ++pos) {
            int f = c * s.spatial + pos, group = f / m;
            float g_sum = 0.0f, b_sum = 0.0f;
            for (int r = 0; r < s.rows; ++r) {
                long long k = (p * s.rows + r) * s.groups + group;
                long long i = p * (long long)s.rows * s.n + (long long)r * s.n + f;
                float mean = stats[2 * k], inv = stats[2 * k + 1];
                float g = masked(s, out, dy, i);
                float xhat = s.rms ? t[i] * inv : (t[i] - mean) * inv;
                g_sum += g * xhat;
                b_sum += g;
            }
            g_total += g_sum;
            b_total += b_sum;
            g_one = g_sum;
            b_one = b_sum;
        }
        dgamma[q] = s.spatial == 1 ? g_one : g_total;
        if (dbeta) dbeta[q] = s.spatial == 1 ? b_one : b_total;
    }
}
