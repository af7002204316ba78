//! Batch normalization (Ioffe & Szegedy, 2015) after a layer's linear part:
//! `y = gamma * (t - mean) / sqrt(var + eps) + beta`, per unit (per channel for conv),
//! with running mean and variance for evaluation mode.
//!
//! With a single value per unit in training mode (batch size 1 on a Linear layer) the
//! batch variance is 0: the layer outputs `beta` and passes no gradient below, which
//! is what batch norm does with one sample. The running variance is then left as it
//! is (its unbiased update is undefined); the running mean is updated. No NaN arises.
//!
//! A population's agents each have their own statistics (its variables stacked); its
//! fused ops run per agent.
//!
//! Evaluation mode keeps its statistics' inverse deviations (and `gamma / std`, `beta`)
//! for one version of the store (see [`ParamStore::version`]): whatever changes the
//! running statistics or the parameters outside a training forward, a copy, a load or
//! an optimizer step must bump it.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use normrl_agents::nn::{BatchNorm, BnStats, ParamStore};
//!
//! let mut store = ParamStore::new(Device::Cpu);
//! let bn = BatchNorm::new(&mut store, "fc", 1, 0.1, 0.0).unwrap();
//! let t = Tensor::new(&[[1.0f32], [3.0]], &Device::Cpu).unwrap();
//! let y = bn.forward(&t, BnStats::Batch).unwrap().to_vec2::<f32>().unwrap();
//! assert_eq!(y, vec![vec![-1.0], vec![1.0]]);
//! ```

use std::sync::{Arc, Mutex};

use candle_core::{Result, Tensor, Var};

use crate::kernels::batch_norm::{self as batch_norm_op, AgentBatchNorm, BatchNormOp};
use crate::kernels::feature_pass::{affine_in_place, Affine};
#[cfg(feature = "cuda")]
use crate::kernels::per_agent::Applied;
use crate::kernels::per_agent::PerAgent;
use crate::kernels::units::Units;
use crate::kernels::with_values;
use crate::nn::batch_renorm::{BatchRenorm, RenormConfig};
use crate::nn::normalization::{
    blend, copy_var, mean_of, push, unit_moments, unit_view, Backward, Fused, GraphLayer,
    HostGradients, HostLayer, HostOutput, KernelGradient, NormTape, Normalization, Saved, Take,
};
use crate::nn::params::StoreVersion;
use crate::nn::{svb, BnStats, ParamStore, Role};

/// Batch norm of a layer, one network's (`lead` 0) or the agents' stacked (`lead` 1:
/// running statistics `[P, 1, units(, 1)]`).
pub struct BatchNorm {
    pub(crate) gamma: Var,
    pub(crate) beta: Var,
    pub(crate) running_mean: Var,
    pub(crate) running_var: Var,
    lead: usize,
    momentum: f64,
    eps: f64,
    version: StoreVersion,
    /// Evaluation mode for one version of the store: acting reads it on every call.
    evaluation: Mutex<Option<(u64, Arc<Evaluation>)>>,
    /// Batch renormalization's correction of training forwards, for `batch_renorm`.
    renorm: Option<BatchRenorm>,
}

/// Evaluation mode for one version of the store: the op (the running statistics'
/// inverse deviations computed), and `gamma / std` and `beta` per unit for the host path.
pub(crate) struct Evaluation {
    pub op: Arc<BatchNormOp>,
    scale: Vec<f32>,
    beta: Vec<f32>,
}

impl Evaluation {
    /// The layer as `relu((t - mean) * gamma / std + beta)` over features.
    pub(crate) fn affine(&self, relu: bool) -> Affine<'_> {
        Affine {
            center: Some(&self.op.mean),
            scale: Some(&self.scale),
            bias: Some(&self.beta),
            relu,
        }
    }
}

impl BatchNorm {
    pub fn new(
        store: &mut ParamStore,
        prefix: &str,
        units: usize,
        momentum: f64,
        eps: f64,
    ) -> Result<Self> {
        Ok(Self {
            gamma: store.ones(&format!("{prefix}.bn.gamma"), units, Role::Weight)?,
            beta: store.zeros(&format!("{prefix}.bn.beta"), units, Role::Weight)?,
            running_mean: store.zeros(&format!("{prefix}.bn.running_mean"), units, Role::Buffer)?,
            running_var: store.ones(&format!("{prefix}.bn.running_var"), units, Role::Buffer)?,
            lead: 0,
            momentum,
            eps,
            version: store.version_handle(),
            evaluation: Mutex::new(None),
            renorm: None,
        })
    }

    /// Batch renormalization: batch norm whose training forwards are corrected as
    /// `config` says (see `batch_renorm.rs`).
    pub fn renormalized(
        store: &mut ParamStore,
        prefix: &str,
        units: usize,
        (momentum, eps): (f64, f64),
        config: RenormConfig,
    ) -> Result<Self> {
        let bn = Self::new(store, prefix, units, momentum, eps)?;
        let renorm = BatchRenorm::new(store, prefix, config, eps)?;
        Ok(Self {
            renorm: Some(renorm),
            ..bn
        })
    }

    /// A population's, from the agents' stacked variables; `(momentum, eps)` as
    /// [`Self::new`]'s, `renorm` for batch renormalization.
    pub(crate) fn stack(
        take: &mut Take,
        (momentum, eps): (f64, f64),
        renorm: Option<RenormConfig>,
    ) -> Result<Self> {
        Ok(Self {
            gamma: take("bn.gamma", Role::Weight)?,
            beta: take("bn.beta", Role::Weight)?,
            running_mean: take("bn.running_mean", Role::Buffer)?,
            running_var: take("bn.running_var", Role::Buffer)?,
            lead: 1,
            momentum,
            eps,
            version: StoreVersion::detached(),
            evaluation: Mutex::new(None),
            renorm: renorm
                .map(|r| BatchRenorm::stack(take, r, eps))
                .transpose()?,
        })
    }

    pub fn eps(&self) -> f64 {
        self.eps
    }

    pub fn gamma_values(&self) -> Result<Vec<f32>> {
        self.gamma.as_tensor().to_vec1()
    }

    pub fn running_mean(&self) -> &Tensor {
        self.running_mean.as_tensor()
    }

    pub fn running_var(&self) -> &Tensor {
        self.running_var.as_tensor()
    }

    pub fn forward(&self, t: &Tensor, stats: BnStats) -> Result<Tensor> {
        self.forward_then(t, stats, false)
    }

    /// `relu(forward(t))`, in one op on the CPU.
    pub fn forward_relu(&self, t: &Tensor, stats: BnStats) -> Result<Tensor> {
        self.forward_then(t, stats, true)
    }

    fn forward_then(&self, t: &Tensor, stats: BnStats, relu: bool) -> Result<Tensor> {
        if !t.device().is_cpu() {
            let y = self.forward_reference(t, stats)?;
            return if relu { y.relu() } else { Ok(y) };
        }
        self.forward_fused(t, stats, relu)
    }

    /// One fused CPU op: with this batch's statistics with batch statistics (running statistics
    /// updated on the host), with the running statistics with running ones.
    fn forward_fused(&self, t: &Tensor, stats: BnStats, relu: bool) -> Result<Tensor> {
        let t = t.contiguous()?;
        let units = Units::of(t.shape())?;
        let op = with_values(&t, |values| self.host_op(&units, values, stats))?;
        t.apply_op3(
            &self.gamma.as_tensor().contiguous()?,
            &self.beta.as_tensor().contiguous()?,
            Arc::unwrap_or_clone(op).with_relu(relu),
        )
    }

    /// The op normalizing host values `t` (laid out as `units` says): with their
    /// statistics with batch statistics, which also updates the running ones, else with those.
    pub(crate) fn host_op(
        &self,
        units: &Units,
        t: &[f32],
        stats: BnStats,
    ) -> Result<Arc<BatchNormOp>> {
        match stats {
            BnStats::Batch => {
                let (mean, var) = batch_norm_op::moments_of(units, t);
                let renorm = match &self.renorm {
                    Some(brn) => {
                        brn.correction((&mean, &var), (&self.running_mean, &self.running_var))?
                    }
                    None => None,
                };
                let running = (&self.running_mean, &self.running_var);
                blend_running_values(running, (&mean, &var), units.per_unit(), self.momentum)?;
                self.version.bump();
                let op = BatchNormOp::training(mean, &var, self.eps);
                Ok(Arc::new(match renorm {
                    Some(renorm) => op.with_renorm(renorm),
                    None => op,
                }))
            }
            BnStats::Running => Ok(self.evaluation()?.op.clone()),
        }
    }

    /// Evaluation mode, rebuilt only when the store's version changed.
    pub(crate) fn evaluation(&self) -> Result<Arc<Evaluation>> {
        let version = self.version.get();
        let mut cache = self.evaluation.lock().expect("batch-norm cache poisoned");
        if let Some((v, evaluation)) = cache.as_ref() {
            if *v == version {
                return Ok(evaluation.clone());
            }
        }
        let mean = self.running_mean.as_tensor().to_vec1::<f32>()?;
        let var = self.running_var.as_tensor().to_vec1::<f32>()?;
        let op = BatchNormOp::evaluation(mean, &var, self.eps);
        let scale = op.scale(&self.gamma.as_tensor().to_vec1::<f32>()?);
        let evaluation = Arc::new(Evaluation {
            op: Arc::new(op),
            scale,
            beta: self.beta.as_tensor().to_vec1::<f32>()?,
        });
        *cache = Some((version, evaluation.clone()));
        Ok(evaluation)
    }

    /// The layer through candle's tensor ops, for any leading axes: other devices, a
    /// population's tensor form, and the tested reference of the fused paths. In the
    /// fused op's order, `(t - mean) * (gamma / std) + beta`; batch renormalization's
    /// gain `gamma r` and shift `beta + gamma d`.
    pub fn forward_reference(&self, t: &Tensor, stats: BnStats) -> Result<Tensor> {
        let (mean, var, correction) = match stats {
            BnStats::Batch => self.batch_moments(t)?,
            BnStats::Running => (
                unit_view(self.running_mean.as_tensor(), t, self.lead)?,
                unit_view(self.running_var.as_tensor(), t, self.lead)?,
                None,
            ),
        };
        let inv_std = (var + self.eps)?.sqrt()?.recip()?;
        let gamma = unit_view(self.gamma.as_tensor(), t, self.lead)?;
        let beta = unit_view(self.beta.as_tensor(), t, self.lead)?;
        let (gain, shift) = match correction {
            None => (gamma, beta),
            Some((r, d)) => (
                r.broadcast_mul(&gamma)?,
                d.broadcast_mul(&gamma)?.broadcast_add(&beta)?,
            ),
        };
        t.broadcast_sub(&mean)?
            .broadcast_mul(&inv_std.broadcast_mul(&gain)?)?
            .broadcast_add(&shift)
    }

    /// A training forward's moments of `t` (shaped to broadcast against it), batch
    /// renormalization's `r` and `d` against the running statistics as they were, and
    /// the running statistics updated from the moments.
    fn batch_moments(&self, t: &Tensor) -> Result<BatchMoments> {
        let (mean, var) = unit_moments(t, self.lead)?;
        let correction = match &self.renorm {
            Some(brn) if brn.count_update()? => {
                let running_mean = unit_view(self.running_mean.as_tensor(), t, self.lead)?;
                let running_var = unit_view(self.running_var.as_tensor(), t, self.lead)?;
                Some(brn.factors((&mean, &var), (&running_mean, &running_var))?)
            }
            _ => None,
        };
        let shape = self.running_mean.shape();
        let moments = (&mean.reshape(shape)?, &var.reshape(shape)?);
        self.update_running(t, moments)?;
        Ok((mean, var, correction))
    }

    /// The running statistics from a batch's `moments` (shaped as they are), `t`'s
    /// values per unit: the batch's rows, times the positions of a feature map.
    fn update_running(&self, t: &Tensor, moments: (&Tensor, &Tensor)) -> Result<()> {
        let leading: usize = t.dims()[..self.lead].iter().product();
        let n = t.elem_count() / (leading * t.dim(self.lead + 1)?).max(1);
        let running = (&self.running_mean, &self.running_var);
        blend_running(running, moments, n, self.momentum)?;
        self.version.bump();
        Ok(())
    }
}

/// A training forward's mean and variance, and batch renormalization's `r` and `d`.
type BatchMoments = (Tensor, Tensor, Option<(Tensor, Tensor)>);

/// Batch norm's running statistics after a batch of `n` values per unit with moments
/// `(mean, var)` (its population variance), by tensor ops, for a single network and a
/// population alike (the moments shaped as the running statistics): the mean always,
/// the unbiased variance where `n > 1`.
pub(crate) fn blend_running(
    (running_mean, running_var): (&Var, &Var),
    (mean, var): (&Tensor, &Tensor),
    n: usize,
    momentum: f64,
) -> Result<()> {
    blend(running_mean, mean, momentum)?;
    if n > 1 {
        blend(
            running_var,
            &(var * (n as f64 / (n as f64 - 1.0)))?,
            momentum,
        )?;
    }
    Ok(())
}

/// [`blend_running`] on host values, in place: the fused paths' update.
pub(crate) fn blend_running_values(
    (running_mean, running_var): (&Var, &Var),
    (mean, var): (&[f32], &[f32]),
    n: usize,
    momentum: f64,
) -> Result<()> {
    batch_norm_op::update_running(running_mean, mean, momentum, 1.0)?;
    if n > 1 {
        let unbiased = (n as f64 / (n as f64 - 1.0)) as f32;
        batch_norm_op::update_running(running_var, var, momentum, unbiased)?;
    }
    Ok(())
}

/// BBN's bound of the gains `gamma` `[P, ...]` (`svb::bound_bn_gains`) from the running
/// variance, each agent's on its own, on the host: a population's, and a single
/// network's as one agent's.
fn bounded_gains(gamma: &Tensor, running_var: &Tensor, eps: f64, bbn_eps: f64) -> Result<Tensor> {
    let sigma = (running_var + eps)?.sqrt()?;
    let mut bounded = vec![];
    for i in 0..gamma.dim(0)? {
        let g: Vec<f32> = gamma.get(i)?.flatten_all()?.to_vec1()?;
        let s: Vec<f32> = sigma.get(i)?.flatten_all()?.to_vec1()?;
        bounded.extend(svb::bound_bn_gains(&g, &s, bbn_eps));
    }
    Tensor::from_vec(bounded, gamma.shape(), gamma.device())
}

impl Normalization for BatchNorm {
    fn vars(&self) -> (Vec<&Var>, Vec<&Var>) {
        let mut buffers = vec![&self.running_mean, &self.running_var];
        buffers.extend(self.renorm.as_ref().map(|r| r.buffer()));
        (vec![&self.gamma, &self.beta], buffers)
    }

    fn copied(&self) -> Result<Box<dyn Normalization>> {
        Ok(Box::new(Self {
            gamma: copy_var(&self.gamma)?,
            beta: copy_var(&self.beta)?,
            running_mean: copy_var(&self.running_mean)?,
            running_var: copy_var(&self.running_var)?,
            lead: self.lead,
            momentum: self.momentum,
            eps: self.eps,
            version: StoreVersion::detached(),
            evaluation: Mutex::new(None),
            renorm: self.renorm.as_ref().map(|r| r.copied()).transpose()?,
        }))
    }

    fn normalize(&self, h: Tensor, stats: BnStats) -> Result<Tensor> {
        self.forward_reference(&h, stats)
    }

    fn graph_forward(&self, t: &Tensor, layer: &GraphLayer) -> Result<Tensor> {
        self.forward_then(t, layer.stats, layer.relu)
    }

    #[inline]
    fn host_forward(&self, layer: &HostLayer, mut t: Vec<f32>, keep: bool) -> Result<HostOutput> {
        if layer.stats == BnStats::Running && !keep {
            // Acting and TD targets: the cached statistics and parameters, in place.
            affine_in_place(&mut t, layer.units, self.evaluation()?.affine(layer.relu));
            return Ok(HostOutput::kept_or_in_place(None, t, NormTape::None));
        }
        let units = Units {
            outer: layer.rows,
            units: layer.units,
            inner: 1,
        };
        let op = self.host_op(&units, &t, layer.stats)?;
        let out = with_values(self.gamma.as_tensor(), |gamma| {
            with_values(self.beta.as_tensor(), |beta| {
                if keep {
                    // The backward reads the input.
                    op.normalize(&units, &t, gamma, beta, layer.relu).map(Some)
                } else {
                    op.normalize_features_in_place(&mut t, gamma, beta, layer.relu)?;
                    Ok(None)
                }
            })
        })?;
        Ok(HostOutput::kept_or_in_place(out, t, NormTape::Batch(op)))
    }

    fn host_backward(&self, saved: &Saved, dy: Vec<f32>, grads: &mut HostGradients) -> Backward {
        let NormTape::Batch(op) = saved.tape else {
            candle_core::bail!("host backward: the forward kept no batch-norm statistics");
        };
        let mut dt = dy;
        let relu = saved.layer.relu;
        let (dgamma, dbeta) = with_values(self.gamma.as_tensor(), |gamma| {
            Ok(op.feature_gradients(gamma, saved.t, saved.out, &mut dt, relu))
        })?;
        push(grads, &self.gamma, dgamma);
        push(grads, &self.beta, dbeta);
        Ok(KernelGradient::plain(dt))
    }

    fn has_cuda_kernel(&self) -> bool {
        true
    }

    fn step_invariant(&self) -> bool {
        self.renorm.as_ref().is_none_or(|r| r.is_open())
    }

    /// BBN's bound of each agent's gains (`svb::bound_bn_gains`), from its running
    /// variance, agent by agent on the host (a single network's as one agent's).
    fn bound_gains(&self, bbn_eps: f64) -> Result<()> {
        let (gamma, running_var) = (self.gamma.as_tensor(), self.running_var.as_tensor());
        let agents = |t: &Tensor| match self.lead {
            0 => t.unsqueeze(0),
            _ => Ok(t.clone()),
        };
        let bounded = bounded_gains(&agents(gamma)?, &agents(running_var)?, self.eps, bbn_eps)?;
        self.version
            .set(&self.gamma, &bounded.reshape(gamma.shape())?)
    }

    fn fused_forward(&self, h: &Tensor, stats: BnStats, bias: Option<&Var>) -> Fused {
        #[cfg(feature = "cuda")]
        if h.device().is_cuda() && bias.is_none() {
            return self.forward_relu_cuda(h, stats).map(Some);
        }
        if !h.device().is_cpu() || bias.is_some() {
            return Ok(None);
        }
        let h = h.contiguous()?;
        let agents = h.dim(0)?;
        let units = Units::of(&candle_core::Shape::from(&h.dims()[1..]))?;
        let ops = match stats {
            BnStats::Batch => self.batch_ops(&h, agents, &units)?,
            BnStats::Running => {
                let (means, vars) = self.running_per_agent(agents)?;
                let ops = means.into_iter().zip(&vars);
                ops.map(|(m, v)| BatchNormOp::evaluation(m, v, self.eps).with_relu(true))
                    .collect()
            }
        };
        let op = PerAgent {
            kernel: AgentBatchNorm { ops, units },
            agents,
        };
        op.apply2(&h, self.gamma.as_tensor(), self.beta.as_tensor())
            .map(Some)
    }

    fn log_stats(&self, values: &mut Vec<(&'static str, f64)>) -> Result<()> {
        values.push((
            "bn_running_mean_avg",
            mean_of(&self.running_mean().to_vec1()?),
        ));
        values.push((
            "bn_running_var_avg",
            mean_of(&self.running_var().to_vec1()?),
        ));
        values.push(("bn_gamma_avg", mean_of(&self.gamma.as_tensor().to_vec1()?)));
        Ok(())
    }

    // Its host loops (`host_forward`, `host_backward`) take no weight norm's scale.
    fn runs_on_host(&self, weight_normed: bool) -> bool {
        !weight_normed
    }
}

/// Each agent's running means and variances, on the host.
type PerAgentStatistics = (Vec<Vec<f32>>, Vec<Vec<f32>>);

/// A population's fused ops.
impl BatchNorm {
    /// Each agent's running mean and variance, on the host.
    fn running_per_agent(&self, agents: usize) -> Result<PerAgentStatistics> {
        let per_agent = |v: &Var| {
            with_values(v.as_tensor(), |x| {
                Ok(x.chunks(x.len() / agents.max(1))
                    .map(<[f32]>::to_vec)
                    .collect())
            })
        };
        Ok((
            per_agent(&self.running_mean)?,
            per_agent(&self.running_var)?,
        ))
    }

    /// A training forward's ops, one per agent from its batch's moments (with batch
    /// renormalization's correction against the running statistics as they were), and
    /// the running statistics updated in place, as a single network's fused op does.
    fn batch_ops(&self, h: &Tensor, agents: usize, units: &Units) -> Result<Vec<BatchNormOp>> {
        let moments: Vec<(Vec<f32>, Vec<f32>)> = with_values(h, |x| {
            Ok(x.chunks(x.len() / agents.max(1))
                .map(|a| batch_norm_op::moments_of(units, a))
                .collect())
        })?;
        let bounds = match &self.renorm {
            Some(brn) if brn.count_update()? => Some(brn.bounds()),
            _ => None,
        };
        let running = match bounds {
            Some(_) => Some(self.running_per_agent(agents)?),
            None => None,
        };
        let mut ops = Vec::with_capacity(agents);
        for (i, (mean, var)) in moments.iter().enumerate() {
            let mut op = BatchNormOp::training(mean.clone(), var, self.eps).with_relu(true);
            if let (Some(b), Some((rm, rv))) = (bounds, &running) {
                op = op.with_renorm(batch_norm_op::Renorm::of((mean, var), (&rm[i], &rv[i]), b));
            }
            ops.push(op);
        }
        let means: Vec<f32> = moments.iter().flat_map(|m| m.0.iter().copied()).collect();
        let vars: Vec<f32> = moments.iter().flat_map(|m| m.1.iter().copied()).collect();
        let running = (&self.running_mean, &self.running_var);
        blend_running_values(running, (&means, &vars), units.per_unit(), self.momentum)?;
        Ok(ops)
    }

    /// [`Normalization::fused_forward`] on a CUDA device: the batch's moments by one
    /// kernel (and batch renormalization's correction against the running statistics as
    /// they were, and the running statistics' update, in tensor ops), then the op.
    #[cfg(feature = "cuda")]
    fn forward_relu_cuda(&self, h: &Tensor, stats: BnStats) -> Result<Applied> {
        use crate::kernels::batch_norm::DeviceBatchNorm;
        let h = h.contiguous()?;
        let agents = h.dim(0)?;
        let units = Units::of(&candle_core::Shape::from(&h.dims()[1..]))?;
        let shape = self.running_mean.shape().clone();
        let batch_statistics = matches!(stats, BnStats::Batch);
        let (mean, var, renorm) = match stats {
            BnStats::Batch => {
                let kind = (true, true, self.eps);
                let s = crate::kernels::cuda::args::BatchNorm::of(agents, &units, kind);
                let (mean, var) = crate::kernels::cuda::device::batch_norm_moments(&h, s)?;
                let (mean, var) = (mean.reshape(&shape)?, var.reshape(&shape)?);
                let running = (self.running_mean.as_tensor(), self.running_var.as_tensor());
                let renorm = match &self.renorm {
                    Some(brn) if brn.count_update()? => Some(brn.factors((&mean, &var), running)?),
                    _ => None,
                };
                self.update_running(&h, (&mean, &var))?;
                (mean, var, renorm)
            }
            BnStats::Running => (
                self.running_mean.as_tensor().copy()?,
                self.running_var.as_tensor().copy()?,
                None,
            ),
        };
        let kernel = DeviceBatchNorm {
            mean,
            var,
            renorm,
            units,
            batch_statistics,
            eps: self.eps,
        };
        let op = PerAgent::new(kernel, agents);
        op.apply2(&h, self.gamma.as_tensor(), self.beta.as_tensor())
    }
}
