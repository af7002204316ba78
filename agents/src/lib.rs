//! Learning for normrl: Q-networks with pluggable normalization layers on candle,
//! optimizers, replay and DQN.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use normrl_agents::nn::{NormConfig, Pass, NormKind, QNetwork, QNetworkConfig};
//!
//! let norm = NormConfig::from(NormKind::WeightNorm);
//! let config = QNetworkConfig::mlp(vec![64, 64]);
//! let net = QNetwork::new(&config, &norm, &[4], 2, 0, &Device::Cpu).unwrap();
//! let x = Tensor::zeros((3, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
//! assert_eq!(net.forward(&x, Pass::EVAL).unwrap().dims(), &[3, 2]);
//! ```

mod check;
pub mod count;
pub mod diagnostics;
pub mod dqn;
pub mod kernels;
mod metric;
pub mod nn;
pub mod optim;
pub mod population;
pub mod replay;
#[cfg(test)]
mod test_support;

pub use kernels::dense::product_kernels;
pub use metric::Metric;

pub use candle_core;
