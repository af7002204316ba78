//! A number an update produces (loss, mean Q, gradient norm). On the CPU it is read at
//! once; on a GPU it stays on the device until someone asks, so that an update never
//! waits for the GPU to finish just to report a loss.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use normrl_agents::Metric;
//!
//! let loss = Tensor::new(2.5f32, &Device::Cpu).unwrap();
//! let sum = Metric::of(&loss).unwrap().add(&Metric::Host(0.5)).unwrap();
//! assert_eq!(sum.value().unwrap(), 3.0);
//! ```

use candle_core::{Result, Tensor};

#[derive(Debug, Clone)]
pub enum Metric {
    Host(f64),
    /// A scalar tensor on an accelerator.
    Device(Tensor),
}

impl Metric {
    /// Reads a scalar tensor on the CPU; keeps it as it is elsewhere.
    pub fn of(scalar: &Tensor) -> Result<Self> {
        if scalar.device().is_cpu() {
            Ok(Self::Host(f64::from(scalar.to_scalar::<f32>()?)))
        } else {
            Ok(Self::Device(scalar.clone()))
        }
    }

    /// The value (on a GPU this waits for the work that computes it).
    pub fn value(&self) -> Result<f64> {
        match self {
            Self::Host(v) => Ok(*v),
            Self::Device(t) => Ok(f64::from(
                t.to_dtype(candle_core::DType::F32)?.to_scalar::<f32>()?,
            )),
        }
    }

    /// The sum, without leaving the device where either side is on one.
    pub fn add(&self, other: &Metric) -> Result<Metric> {
        match (self, other) {
            (Self::Host(a), Self::Host(b)) => Ok(Self::Host(a + b)),
            (Self::Device(a), Self::Device(b)) => Ok(Self::Device((a + b)?)),
            (Self::Device(t), Self::Host(v)) | (Self::Host(v), Self::Device(t)) => {
                Ok(Self::Device(t.affine(1.0, *v)?))
            }
        }
    }
}
