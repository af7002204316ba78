// The population's data convolution: each agent's batch of inputs `[B, c_in, h, w]`
// as columns `[c_in * k * k, B * positions]` (one row per kernel tap, so that each
// output row of a tap is one contiguous run), for one strided-batched product with the
// agents' weights. The CPU's op is `kernels::conv::im2col`, per agent
// (`kernels::agent_product::AgentConv`).
#include "common.cuh"

struct ConvDims {
    int batch, c_in, h, w, k, stride, oh, ow;
};

// One thread per column value: row `(c, ky, kx)`, column `(b, oy, ox)`.
KERNEL void population_im2col(const float* __restrict__ x, float* __restrict__ cols,
                              int agents, ConvDims d) {
    long long positions = (long long)d.oh * d.ow;
    long long columns = d.batch * positions;
    long long per_agent = (long long)d.c_in * d.k * d.k * columns;
    long long input = (long long)d.batch * d.c_in * d.h * d.w;
    for (long long i = first_index(); i < agents * per_agent; i += grid_stride()) {
        long long p = i / per_agent, r = i % per_agent;
        long long row = r / columns, col = r % columns;
        int kx = (int)(row % d.k), ky = (int)(row / d.k % d.k), c = (int)(row / d.k / d.k);
        long long b = col / positions;
        int pos = (int)(col % positions), oy = pos / d.ow, ox = pos % d.ow;
        long long at = ((b * d.c_in + c) * d.h + oy * d.stride + ky) * d.w + ox * d.stride + kx;
        cols[i] = x[p * input + at];
    }
}

// im2col's gradient (its adjoint): each input value's sum over the columns that read
// it, taps in order. One thread per input value; no atomics, so the sum's order is
// fixed.
KERNEL void population_col2im(const float* __restrict__ dcols, float* __restrict__ dx,
                              int agents, ConvDims d) {
    long long positions = (long long)d.oh * d.ow;
    long long columns = d.batch * positions;
    long long per_agent_cols = (long long)d.c_in * d.k * d.k * columns;
    long long input = (long long)d.batch * d.c_in * d.h * d.w;
    for (long long i = first_index(); i < agents * input; i += grid_stride()) {
        long long p = i / input, r = i % input;
        int xx = (int)(r % d.w), yy = (int)(r / d.w % d.h);
        long long c = r / d.w / d.h % d.c_in, b = r / d.w / d.h / d.c_in;
        float sum = 0.0f;
        for (int ky = 0; ky < d.k; ++ky) {
            int dy = yy - ky;
            if (dy < 0 || dy % d.stride || dy / d.stride >= d.oh) continue;
            for (int kx = 0; kx < d.k; ++kx) {
                int dxx = xx - kx;
                if (dxx < 0 || dxx % d.stride || dxx / d.stride >= d.ow) continue;
                long long row = (c * d.k + ky) * d.k + kx;
                long long col = b * positions + (long long)(dy / d.stride) * d.ow + dxx / d.stride;
                sum += dcols[p * per_agent_cols + row * columns + col];
            }
        }
        dx[i] = sum;
    }
}
