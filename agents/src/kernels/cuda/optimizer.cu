// A population's optimizer step over all its variables in two launches: the sums of
// squares of each agent's gradient in each variable, then every value's update with its
// agent's clipping factor and learning rate. The CPU's step is
// `Optimizer::step_agents`; the update of each value is its `Coefficients::update_values`
// in the same operations and order.
#include "common.cuh"

// One variable of a population, stacked on the agents' axis: `agents` runs of
// `per_agent` values in each of the parameter, its gradient and the two state vectors
// (Adam's moments, or RMSprop's mean square and mean gradient). The table of these is
// a kernel argument, by value: a captured step (a CUDA graph) keeps it with the
// addresses its own gradients have at every replay, and nothing is uploaded.
struct VarSlot {
    float* param;
    const float* grad;
    float* s0;
    float* s1;
    unsigned long long per_agent;
    double lr_scale;
};

// Up to this many variables a launch (a larger network's step launches once per table).
#define TABLE_SLOTS 64

// Variables `first` to `first + count - 1` of the step's `vars`.
struct VarTable {
    VarSlot slots[TABLE_SLOTS];
    int first, count, vars;
};

// The step's hyperparameters (Adam when `adam`, else RMSprop): the same at every step.
// Adam's bias corrections change each step and are read from the device (`bias`:
// `1 - b1^t` and `sqrt(1 - b2^t)`), written before the step's launch or replay.
struct Coefficients {
    double lr;
    double max_grad_norm;
    float b1, b2, eps, alpha;
    int adam, centered;
};

#define SUM_THREADS 256

// `sums[p * vars + v]`: Σ g² of agent p's gradient in variable v, in f64. One block per
// (variable of the table, agent) (the grid's x and y), its threads' partial sums added
// in a fixed tree; `blockDim.x` a power of two up to SUM_THREADS.
KERNEL void population_grad_square_sums(const VarTable table, double* __restrict__ sums) {
    __shared__ double partial[SUM_THREADS];
    int v = blockIdx.x, p = blockIdx.y;
    const VarSlot slot = table.slots[v];
    const float* g = slot.grad + (unsigned long long)p * slot.per_agent;
    double sum = 0.0;
    for (unsigned long long i = threadIdx.x; i < slot.per_agent; i += blockDim.x)
        sum += (double)g[i] * (double)g[i];
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (unsigned int half = blockDim.x / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) sums[p * table.vars + table.first + v] = partial[0];
}

// Below this a state value is set to 0 (the CPU's `STATE_FLUSH`: decaying state of a
// silent weight would otherwise crawl through the subnormals).
__device__ __forceinline__ float flushed(float x) { return fabsf(x) < 1e-36f ? 0.0f : x; }

// Agent p's gradient norm, from its sums over the variables in order.
__device__ __forceinline__ double agent_norm(const double* sums, int vars, int p) {
    double sum = 0.0;
    for (int v = 0; v < vars; ++v) sum += sums[p * vars + v];
    return sqrt(sum);
}

// The update of one value `i` of one agent's run (Adam or RMSprop), its gradient
// scaled by `grad_scale` and its learning rate `lr`.
__device__ __forceinline__ void update_value(const Coefficients& c, const VarSlot& s,
                                             unsigned long long i, float grad_scale,
                                             float lr, const float* bias) {
    float g = s.grad[i] * grad_scale;
    if (c.adam) {
        float step = lr / bias[0];
        float inv_bias2_sqrt = 1.0f / bias[1];
        float m = flushed(c.b1 * s.s0[i] + (1.0f - c.b1) * g);
        float v = flushed(c.b2 * s.s1[i] + (1.0f - c.b2) * g * g);
        s.s0[i] = m;
        s.s1[i] = v;
        s.param[i] -= step * m / (sqrtf(v) * inv_bias2_sqrt + c.eps);
        return;
    }
    float sq = flushed(c.alpha * s.s0[i] + (1.0f - c.alpha) * g * g);
    s.s0[i] = sq;
    float var = sq;
    if (c.centered) {
        float ga = flushed(c.alpha * s.s1[i] + (1.0f - c.alpha) * g);
        s.s1[i] = ga;
        var = sq - ga * ga;
    }
    s.param[i] -= lr * g / (sqrtf(fmaxf(var, 0.0f)) + c.eps);
}

// Every value's update: blocks over (values, variable of the table, agent) (the grid's
// x, y, z); every table's sums are written before any table's step runs. Each agent's
// gradients are clipped by its own global norm to `max_grad_norm` (PyTorch's rule, as
// `optim::clip::scale`), its learning rate is `lr * lr_scale * lr_ratios[p]`
// (`lr_ratios` null: 1) times this step's factor from the schedule (`bias[2]`), and
// its norm before clipping goes to `norms [P]`.
KERNEL void population_optimizer_step(const VarTable table,
                                      const double* __restrict__ sums,
                                      const double* __restrict__ lr_ratios,
                                      Coefficients c, const float* __restrict__ bias,
                                      float* __restrict__ norms) {
    int v = blockIdx.y, p = blockIdx.z;
    const VarSlot s = table.slots[v];
    double norm = agent_norm(sums, table.vars, p);
    double max = c.max_grad_norm;
    float grad_scale = (float)(max > 0.0 && norm > max ? max / (norm + 1e-6) : 1.0);
    // In double and in the CPU's order (`Optimizer::step_agents`): the same rounding.
    double scheduled = c.lr * (double)bias[2];
    float lr = (float)(scheduled * s.lr_scale * (lr_ratios ? lr_ratios[p] : 1.0));
    if (table.first + v == 0 && blockIdx.x == 0 && threadIdx.x == 0) norms[p] = (float)norm;
    VarSlot run = s;
    unsigned long long start = (unsigned long long)p * s.per_agent;
    run.param += start;
    run.grad += start;
    run.s0 += start;
    run.s1 += start;
    for (long long i = first_index(); i < (long long)s.per_agent; i += grid_stride())
        update_value(c, run, (unsigned long long)i, grad_scale, lr, bias);
}
