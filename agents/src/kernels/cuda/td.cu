// The TD rule of a population: each agent's targets, and its loss with the loss's
// gradient. The CPU's ops are `dqn::td::population_targets` and
// `dqn::td_loss::PopulationTdLoss`; these compute the same values in the same order.
#include "common.cuh"

// The index of the first largest of `n` values.
__device__ __forceinline__ int first_argmax(const float* v, int n) {
    int best = 0;
    for (int i = 1; i < n; ++i)
        if (v[i] > v[best]) best = i;
    return best;
}

// `r + Q(s', a*) ((1 - terminated) gamma)` for each agent's rows `[P, B]`, from the
// target network's next Q-values `[P, B, A]`, `a*` each row's first best action, and
// each agent's discount `gammas [P]`. One thread per row.
KERNEL void population_td_targets(const float* __restrict__ next_q,
                                  const float* __restrict__ rewards,
                                  const float* __restrict__ terminated,
                                  const float* __restrict__ gammas, float* __restrict__ out,
                                  int agents, int rows, int actions) {
    long long n = (long long)agents * rows;
    for (long long i = first_index(); i < n; i += grid_stride()) {
        const float* q = next_q + i * actions;
        float gamma = gammas[i / rows];
        out[i] = rewards[i] + q[first_argmax(q, actions)] * ((1.0f - terminated[i]) * gamma);
    }
}

// One row's loss of TD error `d`: `d^2`, or Huber's `0.5 d^2` within 1, `|d| - 0.5`
// beyond. `huber` selects.
__device__ __forceinline__ float loss_of(float d, int huber) {
    if (!huber) return d * d;
    float a = fabsf(d);
    float quadratic = fminf(a, 1.0f);
    return quadratic * quadratic * 0.5f + (a - quadratic);
}

// The loss's slope at error `d`.
__device__ __forceinline__ float slope_of(float d, int huber) {
    return huber ? fminf(fmaxf(d, -1.0f), 1.0f) : 2.0f * d;
}

// Each agent's mean loss and mean Q-value of its taken actions, `stats [2, P]`, from
// Q-values `[P, B, A]`, taken actions `[P, B]` and targets `[P, B]`. One block per agent;
// its first thread sums the rows in order (a batch is tens of rows), as the CPU does.
KERNEL void population_td_stats(const float* __restrict__ q,
                                const unsigned int* __restrict__ taken,
                                const float* __restrict__ targets, float* __restrict__ stats,
                                int agents, int rows, int actions, int huber) {
    for (int p = blockIdx.x; p < agents; p += gridDim.x) {
        if (threadIdx.x != 0) continue;
        float loss = -0.0f;
        double q_sum = 0.0;
        for (int r = 0; r < rows; ++r) {
            long long row = (long long)p * rows + r;
            float q_taken = q[row * actions + taken[row]];
            loss += loss_of(q_taken - targets[row], huber);
            q_sum += (double)q_taken;
        }
        stats[p] = loss / (float)rows;
        stats[agents + p] = (float)(q_sum / (double)rows);
    }
}

// The gradient `[P, B, A]` of `Σ_p upstream_p loss_p` with respect to the Q-values
// (`upstream` null: every agent's is 1): the loss's slope over the batch size at each
// taken action, 0 elsewhere. One thread per Q-value.
KERNEL void population_td_gradient(const float* __restrict__ q,
                                   const unsigned int* __restrict__ taken,
                                   const float* __restrict__ targets,
                                   const float* __restrict__ upstream, float* __restrict__ dq,
                                   int agents, int rows, int actions, int huber) {
    long long n = (long long)agents * rows * actions;
    for (long long i = first_index(); i < n; i += grid_stride()) {
        long long row = i / actions;
        int a = (int)(i % actions);
        float g = 0.0f;
        if ((unsigned int)a == taken[row]) {
            long long p = row / rows;
            float scale = (upstream ? upstream[p] : 1.0f) / (float)rows;
            g = scale * slope_of(q[i] - targets[row], huber);
        }
        dq[i] = g;
    }
}
