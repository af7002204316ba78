//! Mean-only batch normalization (Salimans & Kingma, 2016, with weight norm): subtract
//! each unit's minibatch mean, no division by the standard deviation, no gain:
//! `y = t - mean_batch(t) + b`. Training mode uses the batch mean and updates a running
//! mean; evaluation mode uses the running mean. A population's agents each have their
//! own (its running means stacked); the layer's bias and ReLU join the fused ops.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use normrl_agents::nn::{BnStats, MeanOnlyBn, ParamStore};
//!
//! let mut store = ParamStore::new(Device::Cpu);
//! let bn = MeanOnlyBn::new(&mut store, "fc", 2, 0.5).unwrap();
//! let t = Tensor::new(&[[1.0f32, 10.0], [3.0, 20.0]], &Device::Cpu).unwrap();
//! let y = bn.forward(&t, BnStats::Batch).unwrap().to_vec2::<f32>().unwrap();
//! assert_eq!(y, vec![vec![-1.0, -5.0], vec![1.0, 5.0]]);
//! assert_eq!(bn.running_mean().to_vec1::<f32>().unwrap(), vec![1.0, 7.5]);
//! ```

use candle_core::{Result, Tensor, Var};

use crate::kernels::batch_norm as batch_norm_op;
use crate::kernels::bias_relu;
use crate::kernels::feature_pass::{
    affine_features, affine_in_place, output_gradient, Affine, SavedOutput,
};
use crate::kernels::mean_only_bn::{self as mean_only_bn_op, batch_means, mean_shift};
use crate::kernels::per_agent::{Applied, PerAgent};
use crate::kernels::units::Units;
use crate::kernels::with_values;
use crate::nn::normalization::{
    blend, copy_var, mean_of, push, unit_moments, unit_view, with_bias, Backward, Fused,
    GraphLayer, HostGradients, HostLayer, HostOutput, KernelGradient, NormTape, Normalization,
    Saved, Take,
};
use crate::nn::params::StoreVersion;
use crate::nn::{BnStats, ParamStore, Role};

/// Mean-only batch norm of a layer: its running mean per unit, one network's (`lead`
/// 0) or the agents' stacked (`lead` 1).
pub struct MeanOnlyBn {
    running_mean: Var,
    momentum: f64,
    version: StoreVersion,
    lead: usize,
}

impl MeanOnlyBn {
    /// `momentum` is the weight of the new batch in the running mean (PyTorch's
    /// convention).
    pub fn new(store: &mut ParamStore, prefix: &str, units: usize, momentum: f64) -> Result<Self> {
        Ok(Self {
            running_mean: store.zeros(&format!("{prefix}.running_mean"), units, Role::Buffer)?,
            momentum,
            version: store.version_handle(),
            lead: 0,
        })
    }

    /// A population's, from the agents' stacked running means.
    pub(crate) fn stack(take: &mut Take, momentum: f64) -> Result<Self> {
        Ok(Self {
            running_mean: take("running_mean", Role::Buffer)?,
            momentum,
            version: StoreVersion::detached(),
            lead: 1,
        })
    }

    pub fn running_mean(&self) -> &Tensor {
        self.running_mean.as_tensor()
    }

    /// Sets the running mean (data-dependent initialization).
    pub fn set_running_mean(&self, mean: &Tensor) -> Result<()> {
        let mean = mean.reshape(self.running_mean.shape())?;
        self.version.set(&self.running_mean, &mean)
    }

    pub fn forward(&self, t: &Tensor, stats: BnStats) -> Result<Tensor> {
        if !t.device().is_cpu() {
            return self.forward_reference(t, stats);
        }
        let t = t.contiguous()?;
        let (mean, batch_statistics) = self.mean_for(&t, stats)?;
        t.apply_op1(mean_only_bn_op::SubtractUnitMean {
            mean,
            batch_statistics,
        })
    }

    /// The mean a fused forward subtracts, and whether it is the batch's: with batch
    /// statistics the batch mean (which also updates the running mean), else the running mean.
    fn mean_for(&self, t: &Tensor, stats: BnStats) -> Result<(Vec<f32>, bool)> {
        let units = Units::of(t.shape())?;
        with_values(t, |t| self.host_mean(&units, t, stats))
    }

    /// [`Self::mean_for`] host values `t` laid out as `units` says.
    pub(crate) fn host_mean(
        &self,
        units: &Units,
        t: &[f32],
        stats: BnStats,
    ) -> Result<(Vec<f32>, bool)> {
        match stats {
            BnStats::Batch => {
                let (mean, _) = batch_norm_op::moments_of(units, t);
                batch_norm_op::update_running(&self.running_mean, &mean, self.momentum, 1.0)?;
                self.version.bump();
                Ok((mean, true))
            }
            BnStats::Running => {
                let mean = with_values(self.running_mean.as_tensor(), |m| Ok(m.to_vec()))?;
                Ok((mean, false))
            }
        }
    }

    /// `relu(forward(t) + bias)` with `bias` one value per unit, in one op on the CPU.
    pub fn forward_bias_relu(&self, t: &Tensor, bias: &Tensor, stats: BnStats) -> Result<Tensor> {
        if !t.device().is_cpu() {
            return crate::kernels::bias_relu::add_unit_bias_reference(
                &self.forward_reference(t, stats)?,
                bias,
            )?
            .relu();
        }
        let t = t.contiguous()?;
        let (mean, batch_statistics) = self.mean_for(&t, stats)?;
        t.apply_op2(
            &bias.contiguous()?,
            mean_only_bn_op::CenteredBiasRelu {
                mean,
                batch_statistics,
            },
        )
    }

    /// The layer through candle's tensor ops, for any leading axes: other devices, and
    /// the tested reference of the fused paths.
    pub fn forward_reference(&self, t: &Tensor, stats: BnStats) -> Result<Tensor> {
        let mean = match stats {
            BnStats::Batch => {
                let mean = unit_moments(t, self.lead)?.0;
                let running = mean.reshape(self.running_mean.shape())?;
                blend(&self.running_mean, &running, self.momentum)?;
                self.version.bump();
                mean
            }
            BnStats::Running => unit_view(self.running_mean.as_tensor(), t, self.lead)?,
        };
        t.broadcast_sub(&mean)
    }
}

impl Normalization for MeanOnlyBn {
    fn vars(&self) -> (Vec<&Var>, Vec<&Var>) {
        (vec![], vec![&self.running_mean])
    }

    fn copied(&self) -> Result<Box<dyn Normalization>> {
        Ok(Box::new(Self {
            running_mean: copy_var(&self.running_mean)?,
            momentum: self.momentum,
            version: StoreVersion::detached(),
            lead: self.lead,
        }))
    }

    fn normalize(&self, h: Tensor, stats: BnStats) -> Result<Tensor> {
        self.forward_reference(&h, stats)
    }

    fn runs_on_host(&self, weight_normed: bool) -> bool {
        // As `wn_mean_only_bn` builds it.
        weight_normed
    }

    fn graph_forward(&self, t: &Tensor, layer: &GraphLayer) -> Result<Tensor> {
        if let (Some(b), true) = (layer.bias, layer.relu) {
            return self.forward_bias_relu(t, b, layer.stats);
        }
        let y = self.forward(t, layer.stats)?;
        let y = match layer.bias {
            Some(b) => bias_relu::add_unit_bias(&y, b)?,
            None => y,
        };
        if layer.relu {
            bias_relu::relu(&y)
        } else {
            Ok(y)
        }
    }

    #[inline]
    fn host_forward(&self, layer: &HostLayer, t: Vec<f32>, keep: bool) -> Result<HostOutput> {
        let units = Units {
            outer: layer.rows,
            units: layer.units,
            inner: 1,
        };
        // The kernel's output as the graph's ops leave it: scaled by weight norm.
        let (mut y, t) = match layer.scale {
            Some(scale) => {
                let affine = Affine {
                    scale: Some(scale),
                    ..Default::default()
                };
                (affine_features(&t, layer.units, affine), t)
            }
            None => (t, vec![]),
        };
        let (mean, batch_statistics) = self.host_mean(&units, &y, layer.stats)?;
        let shift = with_bias(layer.bias, |b| Ok(mean_shift(b, &mean)))?;
        let affine = Affine {
            bias: Some(&shift),
            relu: layer.relu,
            ..Default::default()
        };
        affine_in_place(&mut y, layer.units, affine);
        Ok(HostOutput::keeping(
            y,
            t,
            keep,
            NormTape::MeanOnly { batch_statistics },
        ))
    }

    fn host_backward(&self, saved: &Saved, dy: Vec<f32>, grads: &mut HostGradients) -> Backward {
        let &NormTape::MeanOnly { batch_statistics } = saved.tape else {
            candle_core::bail!("host backward: the forward kept no mean-only BN statistics");
        };
        let layer = &saved.layer;
        // Through the ReLU and the bias, then the batch mean, then weight norm's scale
        // (dL/dg's sums from the kernel's output).
        let mut d = dy;
        let relu = SavedOutput {
            y: layer.relu.then_some(saved.out),
            scaled: None,
        };
        let d_sums = output_gradient(&mut d, layer.units, relu).d;
        if batch_statistics {
            let means = batch_means(&d_sums, layer.rows);
            let center = Affine {
                center: Some(&means),
                ..Default::default()
            };
            affine_in_place(&mut d, layer.units, center);
        }
        if let Some(b) = layer.bias {
            push(grads, b, d_sums);
        }
        let scale = SavedOutput {
            y: None,
            scaled: layer.scale.map(|s| (saved.t, s)),
        };
        let sums = output_gradient(&mut d, layer.units, scale);
        Ok(KernelGradient {
            dt: d,
            gain_sums: sums.d_t,
        })
    }

    /// The batch mean is subtracted anyway: the bias starts at 0 and the running mean
    /// at this batch's (scaled) mean.
    fn initial_bias(&self, mean_scaled: &Tensor) -> Result<Tensor> {
        self.set_running_mean(mean_scaled)?;
        mean_scaled.zeros_like()
    }

    fn has_cuda_kernel(&self) -> bool {
        true
    }

    fn fused_forward(&self, h: &Tensor, stats: BnStats, bias: Option<&Var>) -> Fused {
        #[cfg(feature = "cuda")]
        if let (true, Some(bias)) = (h.device().is_cuda(), bias) {
            return self.forward_relu_cuda(h, stats, bias).map(Some);
        }
        match bias.filter(|_| h.device().is_cpu()) {
            Some(bias) => self.forward_relu_agents(h, stats, bias).map(Some),
            None => Ok(None),
        }
    }

    fn log_stats(&self, values: &mut Vec<(&'static str, f64)>) -> Result<()> {
        values.push((
            "bn_running_mean_avg",
            mean_of(&self.running_mean().to_vec1()?),
        ));
        Ok(())
    }
}

impl MeanOnlyBn {
    /// A population's fused op on the CPU: each agent's batch means (and the running
    /// means' update) or running means, then the centered bias and ReLU, per agent.
    fn forward_relu_agents(&self, h: &Tensor, stats: BnStats, bias: &Var) -> Result<Applied> {
        let h = h.contiguous()?;
        let agents = h.dim(0)?;
        let units = Units::of(&candle_core::Shape::from(&h.dims()[1..]))?;
        let per_agent = |x: &[f32]| {
            x.chunks(x.len() / agents.max(1))
                .map(<[f32]>::to_vec)
                .collect()
        };
        let means: Vec<Vec<f32>> = match stats {
            BnStats::Batch => {
                let means: Vec<Vec<f32>> = with_values(&h, |x| {
                    Ok(x.chunks(x.len() / agents.max(1))
                        .map(|a| batch_norm_op::moments_of(&units, a).0)
                        .collect())
                })?;
                let all: Vec<f32> = means.iter().flatten().copied().collect();
                batch_norm_op::update_running(&self.running_mean, &all, self.momentum, 1.0)?;
                means
            }
            BnStats::Running => with_values(self.running_mean.as_tensor(), |x| Ok(per_agent(x)))?,
        };
        let kernel = mean_only_bn_op::AgentCenteredBiasRelu {
            means,
            batch_statistics: stats == BnStats::Batch,
            units,
        };
        let op = PerAgent { kernel, agents };
        op.apply1(&h, bias.as_tensor())
    }

    /// [`Normalization::fused_forward`] on a CUDA device: the batch's means
    /// by the moments kernel (and the running mean's update in tensor ops), then the
    /// centered bias and ReLU by the bias kernel.
    #[cfg(feature = "cuda")]
    fn forward_relu_cuda(&self, h: &Tensor, stats: BnStats, bias: &Var) -> Result<Applied> {
        use crate::kernels::cuda::{args, device};
        let h = h.contiguous()?;
        let agents = h.dim(0)?;
        let units = Units::of(&candle_core::Shape::from(&h.dims()[1..]))?;
        let shape = self.running_mean.shape().clone();
        let mean = match stats {
            BnStats::Batch => {
                let s = args::BatchNorm::of(agents, &units, (true, true, 0.0));
                let mean = device::batch_norm_moments(&h, s)?.0.reshape(&shape)?;
                blend(&self.running_mean, &mean, self.momentum)?;
                mean
            }
            BnStats::Running => self.running_mean.as_tensor().copy()?,
        };
        let kernel = mean_only_bn_op::DeviceCenteredBiasRelu {
            mean,
            batch_statistics: stats == BnStats::Batch,
            units,
        };
        PerAgent::new(kernel, agents).apply1(&h, bias.as_tensor())
    }
}
