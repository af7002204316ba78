//! Mean-only batch normalization (Salimans & Kingma, 2016, with weight norm): subtract
//! each unit's minibatch mean, no division by the standard deviation, no gain:
//! `y = t - mean_batch(t) + b`. Training mode uses the batch mean and updates a running
//! mean; evaluation mode uses the running mean.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use normrl_agents::nn::{MeanOnlyBn, Mode, ParamStore};
//!
//! let mut store = ParamStore::new(Device::Cpu);
//! let bn = MeanOnlyBn::new(&mut store, "fc", 2, 0.5).unwrap();
//! let t = Tensor::new(&[[1.0f32, 10.0], [3.0, 20.0]], &Device::Cpu).unwrap();
//! let y = bn.forward(&t, Mode::Train).unwrap().to_vec2::<f32>().unwrap();
//! assert_eq!(y, vec![vec![-1.0, -5.0], vec![1.0, 5.0]]);
//! assert_eq!(bn.running_mean().to_vec1::<f32>().unwrap(), vec![1.0, 7.5]);
//! ```

use candle_core::{Result, Tensor, Var};

use super::fused::{with_values, Units};
use super::kernel::unit_mean;
use super::{batch_norm_op, mean_only_bn_op};
use super::{Group, Mode, ParamStore};

pub struct MeanOnlyBn {
    running_mean: Var,
    momentum: f64,
}

impl MeanOnlyBn {
    /// `momentum` is the weight of the new batch in the running mean (PyTorch's
    /// convention).
    pub fn new(store: &mut ParamStore, prefix: &str, units: usize, momentum: f64) -> Result<Self> {
        Ok(Self {
            running_mean: store.zeros(&format!("{prefix}.running_mean"), units, Group::Buffer)?,
            momentum,
        })
    }

    pub fn running_mean(&self) -> &Tensor {
        self.running_mean.as_tensor()
    }

    /// Sets the running mean (data-dependent initialization).
    pub fn set_running_mean(&self, mean: &Tensor) -> Result<()> {
        self.running_mean.set(&mean.flatten_all()?)
    }

    pub fn forward(&self, t: &Tensor, mode: Mode) -> Result<Tensor> {
        if !t.device().is_cpu() {
            return self.forward_reference(t, mode);
        }
        let t = t.contiguous()?;
        let (mean, batch_statistics) = self.mean_for(&t, mode)?;
        t.apply_op1(mean_only_bn_op::SubtractUnitMean {
            mean,
            batch_statistics,
        })
    }

    /// The mean a fused forward subtracts, and whether it is the batch's: in `Train`
    /// the batch mean (which also updates the running mean), in `Eval` the running mean.
    fn mean_for(&self, t: &Tensor, mode: Mode) -> Result<(Vec<f32>, bool)> {
        let units = Units::of(t.shape())?;
        with_values(t, |t| self.host_mean(&units, t, mode))
    }

    /// [`Self::mean_for`] host values `t` laid out as `units` says.
    pub(crate) fn host_mean(
        &self,
        units: &Units,
        t: &[f32],
        mode: Mode,
    ) -> Result<(Vec<f32>, bool)> {
        match mode {
            Mode::Train => {
                let (mean, _) = batch_norm_op::moments_of(units, t);
                batch_norm_op::update_running(&self.running_mean, &mean, self.momentum, 1.0)?;
                Ok((mean, true))
            }
            Mode::Eval => {
                let mean = with_values(self.running_mean.as_tensor(), |m| Ok(m.to_vec()))?;
                Ok((mean, false))
            }
        }
    }

    /// `relu(forward(t) + bias)` with `bias` one value per unit, in one op on the CPU.
    pub fn forward_bias_relu(&self, t: &Tensor, bias: &Tensor, mode: Mode) -> Result<Tensor> {
        if !t.device().is_cpu() {
            return super::fused::add_unit_bias_reference(&self.forward_reference(t, mode)?, bias)?
                .relu();
        }
        let t = t.contiguous()?;
        let (mean, batch_statistics) = self.mean_for(&t, mode)?;
        t.apply_op2(
            &bias.contiguous()?,
            mean_only_bn_op::CenteredBiasRelu {
                mean,
                batch_statistics,
            },
        )
    }

    /// The layer through candle's tensor ops: other devices, and the tested reference
    /// of the fused paths.
    pub fn forward_reference(&self, t: &Tensor, mode: Mode) -> Result<Tensor> {
        match mode {
            Mode::Train => {
                let mean = unit_mean(t)?;
                let batch = mean.detach().flatten_all()?;
                let running = ((self.running_mean.as_tensor() * (1.0 - self.momentum))?
                    + (batch * self.momentum)?)?;
                self.running_mean.set(&running)?;
                t.broadcast_sub(&mean)
            }
            Mode::Eval => {
                let mut shape = vec![1; t.rank()];
                shape[1] = t.dim(1)?;
                t.broadcast_sub(&self.running_mean.as_tensor().reshape(shape)?)
            }
        }
    }
}
