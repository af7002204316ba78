//! The TD loss, `mean_i loss(Q(s_i, a_i) - y_i)`, and its gradient with respect to the
//! Q-values. On the CPU it is one op with a closed-form backward: through candle's
//! tensor ops (gather, subtract, abs, clamp, square, ...) it was about ten graph nodes
//! on 32 values, and their backward several times as many small tensors, a large share
//! of a small network's update.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use normrl_agents::dqn::{td_loss, Loss};
//!
//! let q = Tensor::new(&[[1.0f32, 5.0], [0.0, 2.0]], &Device::Cpu).unwrap();
//! // Taken actions 1 and 0, targets 2 and 0.5: errors 3 (linear part) and -0.5.
//! let loss = td_loss(&q, &[1, 0], &[2.0, 0.5], Loss::Huber).unwrap();
//! let expected = ((3.0 - 0.5) + 0.5 * 0.25) / 2.0;
//! assert!((loss.to_scalar::<f32>().unwrap() - expected).abs() < 1e-6);
//! ```

use candle_core::{CustomOp1, Result, Shape, Tensor};

use super::Loss;
use crate::kernels::with_values;
use crate::kernels::{cpu_forward, gradient_like};
use crate::Metric;

/// An update's loss, as logged: the mean TD loss and the mean Q of the taken actions.
pub(crate) struct LossInfo {
    pub value: Metric,
    pub q_mean: Metric,
    /// A distributional head's mean entropy (nats) of the taken actions' distributions.
    pub entropy: Option<f64>,
}

/// The loss of host Q-values `q [B, n_actions]` and its gradient with respect to them
/// (the host path).
pub(crate) fn host_loss(
    q: &[f32],
    n_actions: usize,
    actions: &[u32],
    targets: &[f32],
    loss: Loss,
) -> Result<(LossInfo, Vec<f32>)> {
    let (value, dq) = td_loss_host(q, n_actions, actions, targets, loss)?;
    let info = LossInfo {
        value: Metric::Host(f64::from(value)),
        q_mean: Metric::Host(mean_taken_values(q, n_actions, actions)?),
        entropy: None,
    };
    Ok((info, dq))
}

/// The loss of graph Q-values against host targets (the graph on the CPU), and the
/// loss tensor to differentiate.
pub(crate) fn graph_loss(
    q: &Tensor,
    actions: &[u32],
    targets: &[f32],
    loss: Loss,
) -> Result<(LossInfo, Tensor)> {
    let value = td_loss(q, actions, targets, loss)?;
    let info = LossInfo {
        value: Metric::of(&value)?,
        q_mean: Metric::Host(mean_taken(q, actions)?),
        entropy: None,
    };
    Ok((info, value))
}

/// The loss against targets on an accelerator, as tensor ops that never wait for the
/// device.
pub(crate) fn device_loss(
    q: &Tensor,
    actions: &[u32],
    targets: &Tensor,
    loss: Loss,
) -> Result<(LossInfo, Tensor)> {
    let actions = Tensor::from_slice(actions, (actions.len(), 1), q.device())?;
    let value = td_loss_tensor_ops(q, &actions, targets, loss)?;
    let q_mean = q.gather(&actions, 1)?.mean_all()?;
    let info = LossInfo {
        value: Metric::of(&value)?,
        q_mean: Metric::of(&q_mean)?,
        entropy: None,
    };
    Ok((info, value))
}

/// The mean TD loss of Q-values `q [B, A]` at the taken `actions` against `targets`
/// (constants), differentiable with respect to `q`.
pub fn td_loss(q: &Tensor, actions: &[u32], targets: &[f32], loss: Loss) -> Result<Tensor> {
    let op = TdLoss {
        actions: actions.iter().map(|&a| a as usize).collect(),
        targets: targets.to_vec(),
        loss,
    };
    if q.device().is_cpu() {
        q.contiguous()?.apply_op1(op)
    } else {
        let actions = Tensor::from_slice(actions, (actions.len(), 1), q.device())?;
        let targets = Tensor::from_slice(targets, targets.len(), q.device())?;
        td_loss_tensor_ops(q, &actions, &targets, loss)
    }
}

/// The same loss through candle's tensor ops, differentiable on any device (the path on
/// accelerators); `actions` is `[B, 1]` of `u32`.
pub fn td_loss_tensor_ops(
    q: &Tensor,
    actions: &Tensor,
    targets: &Tensor,
    loss: Loss,
) -> Result<Tensor> {
    let diff = (q.gather(actions, 1)?.squeeze(1)? - targets)?;
    loss_of_errors(&diff, loss)?.mean_all()
}

/// The loss of each TD error in `diff` (any shape), before any mean: `d^2`, or Huber's
/// `0.5 d^2` within 1 and `|d| - 0.5` beyond.
pub(crate) fn loss_of_errors(diff: &Tensor, loss: Loss) -> Result<Tensor> {
    match loss {
        Loss::Mse => diff.sqr(),
        Loss::Huber => {
            let abs = diff.abs()?;
            let quadratic = abs.clamp(0.0, 1.0)?;
            (quadratic.sqr()? * 0.5)? + (abs - &quadratic)?
        }
    }
}

/// Mean of `q [B, A]` at the taken actions, read on the host.
pub fn mean_taken(q: &Tensor, actions: &[u32]) -> Result<f64> {
    let (_, a) = q.dims2()?;
    mean_taken_values(&q.flatten_all()?.to_vec1::<f32>()?, a, actions)
}

/// [`mean_taken`] of host Q-values `q [B, n_actions]` (row-major).
pub(crate) fn mean_taken_values(q: &[f32], a: usize, actions: &[u32]) -> Result<f64> {
    let b = q.len() / a.max(1);
    if actions.len() != b {
        candle_core::bail!("mean Q: {} actions for a batch of {b}", actions.len());
    }
    let mut sum = 0f64;
    for (row, &act) in q.chunks_exact(a.max(1)).zip(actions) {
        match row.get(act as usize) {
            Some(&v) => sum += f64::from(v),
            None => candle_core::bail!("mean Q: action {act} out of range for {a} actions"),
        }
    }
    Ok(sum / b.max(1) as f64)
}

struct TdLoss {
    actions: Vec<usize>,
    targets: Vec<f32>,
    loss: Loss,
}

impl TdLoss {
    /// Batch size and actions of `q`, checked against the actions and targets.
    fn dims(&self, q: &Shape) -> Result<(usize, usize)> {
        let (b, a) = q.dims2()?;
        if self.actions.len() != b || self.targets.len() != b {
            candle_core::bail!(
                "TD loss: {} actions and {} targets for a batch of {b}",
                self.actions.len(),
                self.targets.len()
            );
        }
        if let Some(bad) = self.actions.iter().find(|&&act| act >= a) {
            candle_core::bail!("TD loss: action {bad} out of range for {a} actions");
        }
        Ok((b, a))
    }

    /// The TD errors `Q(s_i, a_i) - y_i`.
    fn errors<'a>(&'a self, q: &'a [f32], a: usize) -> impl Iterator<Item = f32> + 'a {
        self.actions
            .iter()
            .zip(&self.targets)
            .enumerate()
            .map(move |(i, (&act, &y))| q[i * a + act] - y)
    }
}

impl CustomOp1 for TdLoss {
    cpu_forward!("td-loss", |op, q @ l| {
        let (b, a) = op.dims(l.shape())?;
        let mean = op.value(q, b, a);
        Ok((vec![mean], Shape::from(())))
    });

    fn bwd(&self, q: &Tensor, _loss: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let (b, a) = self.dims(q.shape())?;
        let upstream = grad.to_scalar::<f32>()?;
        let dq = with_values(q, |values| Ok(self.gradient(values, b, a, upstream)))?;
        gradient_like(dq, q)
    }
}

/// The mean TD loss of host Q-values `q [B, n_actions]` and its gradient with respect
/// to them: [`td_loss`] and its backward, without a graph.
fn td_loss_host(
    q: &[f32],
    n_actions: usize,
    actions: &[u32],
    targets: &[f32],
    loss: Loss,
) -> Result<(f32, Vec<f32>)> {
    let op = TdLoss {
        actions: actions.iter().map(|&a| a as usize).collect(),
        targets: targets.to_vec(),
        loss,
    };
    let (b, a) = op.dims(&Shape::from((q.len() / n_actions.max(1), n_actions)))?;
    Ok((op.value(q, b, a), op.gradient(q, b, a, 1.0)))
}

impl TdLoss {
    /// The mean loss over the batch.
    fn value(&self, q: &[f32], b: usize, a: usize) -> f32 {
        let total: f32 = self
            .errors(q, a)
            .map(|d| match self.loss {
                Loss::Mse => d * d,
                Loss::Huber => {
                    let abs = d.abs();
                    let quadratic = abs.min(1.0);
                    quadratic * quadratic * 0.5 + (abs - quadratic)
                }
            })
            .sum();
        total / b.max(1) as f32
    }

    /// The gradient of `upstream` times the mean loss with respect to `q`.
    fn gradient(&self, q: &[f32], b: usize, a: usize, upstream: f32) -> Vec<f32> {
        let scale = upstream / b.max(1) as f32;
        let mut dq = vec![0f32; b * a];
        for (i, d) in self.errors(q, a).enumerate() {
            let slope = match self.loss {
                Loss::Mse => 2.0 * d,
                Loss::Huber => d.clamp(-1.0, 1.0),
            };
            dq[i * a + self.actions[i]] = scale * slope;
        }
        dq
    }
}

/// Each agent's mean TD loss, `[P]`, of a population's Q-values `q [P, B, A]` at the
/// taken `actions [P, B, 1]` (`u32`) against `targets [P, B]` (constants); on the CPU
/// one op with the single agent's closed-form backward per agent, elsewhere tensor ops.
pub fn population_td_loss(
    q: &Tensor,
    actions: &Tensor,
    targets: &Tensor,
    loss: Loss,
) -> Result<Tensor> {
    if !q.device().is_cpu() {
        return population_td_loss_tensor_ops(q, actions, targets, loss);
    }
    let targets = targets.detach().contiguous()?;
    q.contiguous()?.apply_op3(
        &actions.contiguous()?,
        &targets,
        PopulationTdLoss::new(loss, TdOutput::Losses),
    )
}

/// [`population_td_loss`] as tensor ops, on any device (the fused op's reference).
pub fn population_td_loss_tensor_ops(
    q: &Tensor,
    actions: &Tensor,
    targets: &Tensor,
    loss: Loss,
) -> Result<Tensor> {
    let diff = (q.gather(actions, 2)?.squeeze(2)? - targets)?;
    loss_of_errors(&diff, loss)?.mean(1)
}

/// Each agent's mean Q-value at its taken actions, `[P]`, detached.
pub fn population_mean_taken(q: &Tensor, actions: &Tensor) -> Result<Tensor> {
    if !q.device().is_cpu() {
        return q.detach().gather(actions, 2)?.squeeze(2)?.mean(1);
    }
    q.detach().contiguous()?.apply_op2_no_bwd(
        &actions.contiguous()?,
        &PopulationTdLoss::new(Loss::Mse, TdOutput::Losses),
    )
}

/// One of a population's TD outputs from its Q-values `q` `[P, B, A]`, taken actions
/// and targets, as one op outside candle's graph (a population's explicit backward
/// starts here): with [`TdOutput::Gradient`] the gradient `[P, B, A]` of the sum of
/// [`population_td_loss`]'s losses with respect to `q`, with [`TdOutput::Stats`] each
/// agent's mean TD loss and mean Q-value at its taken actions `[2, P]`. On the CPU and
/// a CUDA device.
pub fn population_td(
    q: &Tensor,
    actions: &Tensor,
    targets: &Tensor,
    loss: Loss,
    output: TdOutput,
) -> Result<Tensor> {
    td_op(q, actions, targets, PopulationTdLoss::new(loss, output))
}

/// `op` on the Q-values, actions and targets, outside candle's graph.
fn td_op(q: &Tensor, actions: &Tensor, targets: &Tensor, op: PopulationTdLoss) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if q.device().is_cuda() {
        let huber = matches!(op.loss, Loss::Huber);
        let gradient = matches!(op.output, TdOutput::Gradient).then_some(None);
        let q = q.contiguous()?;
        return crate::kernels::cuda::device::td(&q, actions, targets, huber, gradient);
    }
    let (actions, targets) = (actions.contiguous()?, targets.contiguous()?);
    q.contiguous()?.apply_op3_no_bwd(&actions, &targets, &op)
}

/// [`TdLoss`] of each agent of a population.
struct PopulationTdLoss {
    loss: Loss,
    output: TdOutput,
}

/// What [`PopulationTdLoss`] computes from the Q-values, actions and targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TdOutput {
    /// Each agent's mean loss `[P]` (with its gradient backward).
    Losses,
    /// Each agent's mean loss and mean taken Q-value `[2, P]`.
    Stats,
    /// The gradient `[P, B, A]` of the losses' sum with respect to the Q-values.
    Gradient,
}

/// A population's `(P, B, A)`: agents, batch rows, actions.
type Dims3 = (usize, usize, usize);

/// A population's Q-values `[P, B, A]` and taken actions on the host, with `(P, B, A)`
/// checked against the actions: what both population ops read first.
fn q_and_actions<'a>(
    q: &'a candle_core::CpuStorage,
    lq: &candle_core::Layout,
    actions: &'a candle_core::CpuStorage,
    la: &candle_core::Layout,
) -> Result<(&'a [f32], &'a [u32], Dims3)> {
    let q = crate::kernels::dense::f32_slice(q, lq)?;
    let actions = match (actions, la.contiguous_offsets()) {
        (candle_core::CpuStorage::U32(v), Some((a, b))) => &v[a..b],
        _ => candle_core::bail!("population TD loss: actions must be contiguous u32"),
    };
    let dims = population_dims(lq.shape(), actions.len())?;
    Ok((q, actions, dims))
}

impl PopulationTdLoss {
    fn new(loss: Loss, output: TdOutput) -> Self {
        Self { loss, output }
    }

    /// Each agent's mean loss.
    fn losses(&self, q: &[f32], actions: &[u32], targets: &[f32], dims: Dims3) -> Result<Vec<f32>> {
        let (p, b, a) = dims;
        let mut losses = Vec::with_capacity(p);
        for i in 0..p {
            let op = self.agent(actions, targets, i, b);
            op.dims(&Shape::from((b, a)))?;
            losses.push(op.value(&q[i * b * a..(i + 1) * b * a], b, a));
        }
        Ok(losses)
    }

    /// Each agent's mean Q-value at its taken actions.
    fn means_taken(q: &[f32], actions: &[u32], (p, b, a): Dims3) -> Result<Vec<f32>> {
        (0..p)
            .map(|i| {
                let rows = &q[i * b * a..(i + 1) * b * a];
                mean_taken_values(rows, a, &actions[i * b..(i + 1) * b]).map(|m| m as f32)
            })
            .collect()
    }

    /// The gradient of `Σ_i upstream_i loss_i` with respect to `q` `[P, B, A]`: each
    /// agent's single-agent gradient.
    fn gradient(
        &self,
        q: &[f32],
        actions: &[u32],
        targets: &[f32],
        (p, b, a): Dims3,
        upstream: &[f32],
    ) -> Result<Vec<f32>> {
        let mut dq = Vec::with_capacity(q.len());
        for i in 0..p {
            let op = self.agent(actions, targets, i, b);
            op.dims(&Shape::from((b, a)))?;
            dq.extend(op.gradient(&q[i * b * a..(i + 1) * b * a], b, a, upstream[i]));
        }
        Ok(dq)
    }

    /// Agent `i`'s single-agent loss: its actions and targets, and its Q-values' rows.
    fn agent(&self, actions: &[u32], targets: &[f32], i: usize, b: usize) -> TdLoss {
        TdLoss {
            actions: actions[i * b..(i + 1) * b]
                .iter()
                .map(|&a| a as usize)
                .collect(),
            targets: targets[i * b..(i + 1) * b].to_vec(),
            loss: self.loss,
        }
    }
}

/// `[P, B, A]`, checked against `n` actions (or targets).
fn population_dims(q: &Shape, n: usize) -> Result<(usize, usize, usize)> {
    let (p, b, a) = q.dims3()?;
    if n != p * b {
        candle_core::bail!(
            "population TD loss: {n} actions or targets for {p} agents' batches of {b}"
        );
    }
    Ok((p, b, a))
}

impl candle_core::CustomOp3 for PopulationTdLoss {
    fn name(&self) -> &'static str {
        match self.output {
            TdOutput::Losses => "population-td-loss",
            TdOutput::Stats => "population-td-stats",
            TdOutput::Gradient => "population-td-gradient",
        }
    }

    fn cpu_fwd(
        &self,
        q: &candle_core::CpuStorage,
        lq: &candle_core::Layout,
        actions: &candle_core::CpuStorage,
        la: &candle_core::Layout,
        targets: &candle_core::CpuStorage,
        lt: &candle_core::Layout,
    ) -> Result<(candle_core::CpuStorage, Shape)> {
        let (q, actions, dims) = q_and_actions(q, lq, actions, la)?;
        let targets = crate::kernels::dense::f32_slice(targets, lt)?;
        population_dims(lq.shape(), targets.len())?;
        let (values, shape) = match self.output {
            TdOutput::Losses => (self.losses(q, actions, targets, dims)?, Shape::from(dims.0)),
            TdOutput::Stats => {
                let mut stats = self.losses(q, actions, targets, dims)?;
                stats.extend(Self::means_taken(q, actions, dims)?);
                (stats, Shape::from((2, dims.0)))
            }
            TdOutput::Gradient => {
                let agents = vec![1f32; dims.0];
                let dq = self.gradient(q, actions, targets, dims, &agents)?;
                (dq, lq.shape().clone())
            }
        };
        Ok((candle_core::CpuStorage::F32(values), shape))
    }

    fn bwd(
        &self,
        q: &Tensor,
        actions: &Tensor,
        targets: &Tensor,
        _out: &Tensor,
        grad: &Tensor,
    ) -> crate::kernels::Grads3 {
        if !matches!(self.output, TdOutput::Losses) {
            candle_core::bail!("population TD op: only the losses have a gradient");
        }
        let (p, b, a) = q.dims3()?;
        let actions: Vec<u32> = actions.flatten_all()?.to_vec1()?;
        let targets: Vec<f32> = targets.flatten_all()?.to_vec1()?;
        let upstream: Vec<f32> = grad.to_vec1()?;
        let dq = with_values(q, |q| {
            self.gradient(q, &actions, &targets, (p, b, a), &upstream)
        })?;
        Ok((gradient_like(dq, q)?, None, None))
    }
}

/// The mean Q-value at the taken actions, per agent (no gradient).
impl candle_core::CustomOp2 for PopulationTdLoss {
    fn name(&self) -> &'static str {
        "population-mean-taken"
    }

    fn cpu_fwd(
        &self,
        q: &candle_core::CpuStorage,
        lq: &candle_core::Layout,
        actions: &candle_core::CpuStorage,
        la: &candle_core::Layout,
    ) -> Result<(candle_core::CpuStorage, Shape)> {
        let (q, actions, dims) = q_and_actions(q, lq, actions, la)?;
        let means = Self::means_taken(q, actions, dims)?;
        Ok((candle_core::CpuStorage::F32(means), Shape::from(dims.0)))
    }
}

#[cfg(test)]
mod population_tests {
    use candle_core::{Device, Tensor, Var};

    use super::*;
    use crate::nn::init::InitRng;

    /// The largest absolute value of `t`.
    fn max_abs(t: &Tensor) -> f32 {
        let flat = t.abs().unwrap().flatten_all().unwrap();
        flat.max(0).unwrap().to_scalar().unwrap()
    }

    /// Each agent's Q-values at its taken actions, `[P, B]`, by gather.
    fn taken(q: &Var, actions: &Tensor) -> Tensor {
        let taken = q.as_tensor().gather(actions, 2).unwrap();
        taken.squeeze(2).unwrap()
    }

    /// `(P, B, A)` of [`problem`].
    const DIMS: (usize, usize, usize) = (3, 6, 4);

    /// Q-values `[P, B, A]`, actions `[P, B, 1]` and targets `[P, B]` of [`DIMS`]:
    /// normal Q-values, then targets (std 2), from `seed`, and action `i * stride % A`
    /// for sample `i`.
    fn problem(seed: u64, stride: usize) -> (Var, Tensor, Tensor) {
        let (p, b, a) = DIMS;
        let mut rng = InitRng::new(seed);
        let mut normal = |dims: &[usize]| {
            let t = rng
                .normal(dims.iter().product::<usize>(), 2.0, &Device::Cpu)
                .unwrap();
            t.reshape(dims).unwrap()
        };
        let q = Var::from_tensor(&normal(&[p, b, a])).unwrap();
        let targets = normal(&[p, b]);
        let actions: Vec<u32> = (0..p * b).map(|i| (i * stride % a) as u32).collect();
        let actions = Tensor::from_vec(actions, (p, b, 1), &Device::Cpu).unwrap();
        (q, actions, targets)
    }

    /// Asserts that `x` and `y` hold the same number of values, each within a relative
    /// 1e-6 (absolute below 1).
    fn assert_close(x: &Tensor, y: &Tensor, what: &str) {
        let (x, y) = (x.flatten_all().unwrap(), y.flatten_all().unwrap());
        let (x, y): (Vec<f32>, Vec<f32>) = (x.to_vec1().unwrap(), y.to_vec1().unwrap());
        assert_eq!(x.len(), y.len(), "{what}");
        for (x, y) in x.iter().zip(&y) {
            assert!(
                (x - y).abs() <= 1e-6 * y.abs().max(1.0),
                "{what}: {x} against {y}"
            );
        }
    }

    /// The population's fused TD loss equals the tensor-op form per agent, value and
    /// gradient, for both losses, with errors inside and beyond Huber's kink; and the
    /// mean taken Q-value equals gather and mean.
    #[test]
    fn the_population_td_loss_equals_the_tensor_form() {
        let (q, actions, targets) = problem(11, 7);
        let upstream = Tensor::new(&[1.0f32, -2.0, 0.5], &Device::Cpu).unwrap();
        for loss in [Loss::Huber, Loss::Mse] {
            let fused = population_td_loss(q.as_tensor(), &actions, &targets, loss).unwrap();
            let taken = taken(&q, &actions);
            let reference = loss_of_errors(&(taken - &targets).unwrap(), loss)
                .unwrap()
                .mean(1)
                .unwrap();
            assert_close(&fused, &reference, &format!("{loss:?}"));
            let grad = |l: &Tensor| {
                (l * &upstream)
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .backward()
                    .unwrap()
            };
            let (gf, gr) = (grad(&fused), grad(&reference));
            let (gf, gr) = (
                gf.get(q.as_tensor()).unwrap(),
                gr.get(q.as_tensor()).unwrap(),
            );
            let diff = max_abs(&(gf - gr).unwrap());
            assert!(diff <= 1e-6, "{loss:?}: gradients differ by {diff}");
        }
        let mean = population_mean_taken(q.as_tensor(), &actions).unwrap();
        let expected = taken(&q, &actions).mean(1).unwrap();
        assert_close(&mean, &expected, "mean taken");
    }

    /// The explicit backward's ops equal the tensor forms: each agent's loss and mean
    /// taken Q-value in one op, and the loss's gradient with every agent's weight 1.
    #[test]
    fn the_population_td_stats_and_gradient_equal_the_tensor_form() {
        let (q, actions, targets) = problem(12, 5);
        for loss in [Loss::Huber, Loss::Mse] {
            let reference = population_td_loss_tensor_ops(q.as_tensor(), &actions, &targets, loss);
            let reference = reference.unwrap();
            let taken = taken(&q, &actions);
            let means = taken.mean(1).unwrap();
            let expected = Tensor::stack(&[&reference, &means], 0).unwrap();
            let stats = population_td(q.as_tensor(), &actions, &targets, loss, TdOutput::Stats);
            let stats = stats.unwrap();
            assert_close(&stats, &expected, "stats");
            let dq = population_td(q.as_tensor(), &actions, &targets, loss, TdOutput::Gradient);
            let dq = dq.unwrap();
            let grads = reference.sum_all().unwrap().backward().unwrap();
            assert_close(&dq, grads.get(q.as_tensor()).unwrap(), "gradient");
        }
        let (p, b, a) = DIMS;
        let bad = Tensor::from_vec(vec![a as u32; p * b], (p, b, 1), &Device::Cpu).unwrap();
        let wrong = population_td(q.as_tensor(), &bad, &targets, Loss::Mse, TdOutput::Gradient);
        assert!(wrong.is_err());
    }

    /// The fused TD targets equal `bootstrap(best_next)`, with one discount and with
    /// each agent's own, terminations included.
    #[test]
    fn the_population_targets_equal_the_tensor_form() {
        use crate::dqn::td::{best_next, bootstrap, population_targets, Discount};
        let (p, b, a) = (3, 5, 4);
        let mut rng = InitRng::new(13);
        let next_q = rng.normal(p * b * a, 2.0, &Device::Cpu).unwrap();
        let next_q = next_q.reshape((p, b, a)).unwrap();
        let rewards = rng.normal(p * b, 1.0, &Device::Cpu).unwrap();
        let rewards = rewards.reshape((p, b)).unwrap();
        let ended: Vec<f32> = (0..p * b).map(|i| (i % 3 == 0) as u8 as f32).collect();
        let terminated = Tensor::from_vec(ended, (p, b), &Device::Cpu).unwrap();
        let gammas = Tensor::new(&[[0.99f32], [0.9], [0.5]], &Device::Cpu).unwrap();
        for gamma in [Discount::All(0.97), Discount::PerAgent(&gammas)] {
            let fused = population_targets(&next_q, &rewards, &terminated, gamma).unwrap();
            let best = best_next(&next_q, None).unwrap();
            let reference = bootstrap(&rewards, &terminated, &best, gamma).unwrap();
            let diff = max_abs(&(fused - reference).unwrap());
            assert!(diff <= 1e-6, "targets differ by {diff}");
        }
    }
}
