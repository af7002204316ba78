// Batch norm in a population (and batch renormalization, whose correction `r`, `d` per
// unit the caller gives), forward and backward, on values `[P, outer, units, inner]`:
// a batch of rows, or of feature maps. The CPU's ops are `kernels::batch_norm::{
// moments_of, BatchNormOp}`, per agent (`AgentBatchNorm`).
#include "common.cuh"

struct BatchNorm {
    int agents, outer, units, inner, relu, batch_statistics;
    double eps;
};

// Agent p's unit u's values start here; then `inner` values every `units * inner`.
__device__ __forceinline__ long long unit_start(const BatchNorm& s, long long p, int u) {
    return p * s.outer * s.units * s.inner + (long long)u * s.inner;
}

// Each agent's batch moments `mean, var [P, units]` (var the biased variance, 0 at
// worst), in f64 as the CPU sums them: down the rows for features, four partial sums per
// run of positions for feature maps. One thread per (agent, unit).
KERNEL void batch_norm_moments(const float* __restrict__ t, float* __restrict__ mean,
                               float* __restrict__ var, BatchNorm s) {
    for (long long k = first_index(); k < (long long)s.agents * s.units; k += grid_stride()) {
        long long start = unit_start(s, k / s.units, (int)(k % s.units));
        double sum = 0.0, sq = 0.0;
        for (int o = 0; o < s.outer; ++o) {
            const float* run = t + start + (long long)o * s.units * s.inner;
            if (s.inner == 1) {
                sum += (double)run[0];
                sq += (double)run[0] * (double)run[0];
                continue;
            }
            int full = s.inner / 4 * 4;
            for (int i = full; i < s.inner; ++i) {
                sum += (double)run[i];
                sq += (double)run[i] * (double)run[i];
            }
            double s4[4] = {0, 0, 0, 0}, q4[4] = {0, 0, 0, 0};
            for (int i = 0; i < full; i += 4)
                for (int j = 0; j < 4; ++j) {
                    s4[j] += (double)run[i + j];
                    q4[j] += (double)run[i + j] * (double)run[i + j];
                }
            sum += ((((-0.0 + s4[0]) + s4[1]) + s4[2]) + s4[3]);
            sq += ((((-0.0 + q4[0]) + q4[1]) + q4[2]) + q4[3]);
        }
        double n = (double)s.outer * s.inner;
        double m = sum / n;
        mean[k] = (float)m;
        var[k] = (float)fmax(sq / n - m * m, 0.0);
    }
}

// `1 / sqrt(var + eps)`, or 0 where that is infinite.
__device__ __forceinline__ float inverse_std(float var, double eps) {
    double sd = sqrt((double)var + eps);
    return sd > 0.0 ? (float)(1.0 / sd) : 0.0f;
}

// The gain batch norm applies: `gamma`, or `gamma r` with a renormalization.
__device__ __forceinline__ float gain_of(const float* gamma, const float* r, long long k) {
    return r ? gamma[k] * r[k] : gamma[k];
}

// `relu?((t - mean) gain / sqrt(var + eps) + shift)`, `shift = beta` or, renormalized,
// `beta + gamma d`; `mean`, `var` the batch's or the running ones. One thread per value.
KERNEL void batch_norm_forward(const float* __restrict__ t, const float* __restrict__ mean,
                               const float* __restrict__ var, const float* __restrict__ gamma,
                               const float* __restrict__ beta, const float* __restrict__ r,
                               const float* __restrict__ d, float* __restrict__ out,
                               BatchNorm s) {
    long long per_agent = (long long)s.outer * s.units * s.inner;
    for (long long i = first_index(); i < s.agents * per_agent; i += grid_stride()) {
        long long k = (i / per_agent) * s.units + (i % per_agent) / s.inner % s.units;
        float scale = gain_of(gamma, r, k) * inverse_std(var[k], s.eps);
        float shift = d ? beta[k] + gamma[k] * d[k] : beta[k];
        float v = (t[i] - mean[k]) * scale + shift;
        out[i] = s.relu ? fmaxf(v, 0.0f) : v;
    }
}

// The output's gradient at value `i`, through the ReLU.
__device__ __forceinline__ float bn_masked(const BatchNorm& s, const float* out, const float* dy,
                                           long long i) {
    return s.relu ? (out[i] > 0.0f ? dy[i] : 0.0f) : dy[i];
}

// Per (agent, unit): `sums [P, units, 2]` = (Σ dy, Σ dy x̂), the shift's gradient `Σ dy`
// and the gain's, `Σ dy x̂` or renormalized `r Σ dy x̂ + d Σ dy`. One thread per (agent,
// unit), in the CPU's order.
KERNEL void batch_norm_backward_params(const float* __restrict__ t,
                                       const float* __restrict__ out,
                                       const float* __restrict__ dy,
                                       const float* __restrict__ mean,
                                       const float* __restrict__ var,
                                       const float* __restrict__ r, const float* __restrict__ d,
                                       float* __restrict__ sums, float* __restrict__ dgamma,
                                       float* __restrict__ dbeta, BatchNorm s) {
    for (long long k = first_index(); k < (long long)s.agents * s.units; k += grid_stride()) {
        long long base = unit_start(s, k / s.units, 0);
        int u = (int)(k % s.units);
        float m = mean[k], inv = inverse_std(var[k], s.eps);
        float sum_dy = unit_sum(s.outer, s.units, s.inner, u,
                                [&](long long i) { return bn_masked(s, out, dy, base + i); });
        float sum_dy_xhat = unit_sum(s.outer, s.units, s.inner, u, [&](long long i) {
            return bn_masked(s, out, dy, base + i) * (t[base + i] - m) * inv;
        });
        sums[2 * k] = sum_dy;
        sums[2 * k + 1] = sum_dy_xhat;
        dbeta[k] = sum_dy;
        dgamma[k] = r ? r[k] * sum_dy_xhat + d[k] * sum_dy : sum_dy_xhat;
    }
}

// The input's gradient: with batch statistics `k (dy - mean dy - x̂ mean(dy x̂))`, with
// running ones `k dy`, `k = gain / sqrt(var + eps)`. One thread per value.
KERNEL void batch_norm_backward_input(const float* __restrict__ t,
                                      const float* __restrict__ out,
                                      const float* __restrict__ dy,
                                      const float* __restrict__ mean,
                                      const float* __restrict__ var,
                                      const float* __restrict__ gamma,
                                      const float* __restrict__ r,
                                      const float* __restrict__ sums, float* __restrict__ dt,
                                      BatchNorm s) {
    long long per_agent = (long long)s.outer * s.units * s.inner;
    float n = (float)((long long)s.outer * s.inner);
    for (long long i = first_index(); i < s.agents * per_agent; i += grid_stride()) {
        long long k = (i / per_agent) * s.units + (i % per_agent) / s.inner % s.units;
        float inv = inverse_std(var[k], s.eps);
        float scale = gain_of(gamma, r, k) * inv;
        float g = bn_masked(s, out, dy, i);
        if (!s.batch_statistics) {
            dt[i] = scale * g;
            continue;
        }
        float mean_dy = sums[2 * k] / n, mean_dy_xhat = sums[2 * k + 1] / n;
        dt[i] = scale * (g - mean_dy - (t[i] - mean[k]) * inv * mean_dy_xhat);
    }
}
