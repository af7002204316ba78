//! A Q-network built from config: an MLP, the MinAtar CNN or the Nature DQN CNN, each
//! hidden layer normalized by the chosen method, ReLU, and a linear head.
//!
//! ```
//! use candle_core::{Device, Tensor, DType};
//! use normrl_agents::nn::{NormConfig, Pass, NormKind, QNetwork, QNetworkConfig};
//!
//! let norm = NormConfig::from(NormKind::BatchNorm);
//! let net = QNetwork::new(&QNetworkConfig::minatar_cnn(), &norm, &[4, 10, 10], 6, 1, &Device::Cpu).unwrap();
//! let x = Tensor::zeros((32, 4, 10, 10), DType::F32, &Device::Cpu).unwrap();
//! assert_eq!(net.forward(&x, Pass::TRAIN).unwrap().dims(), &[32, 6]);
//! ```

use candle_core::{Device, Result, Tensor, D};

use super::init::InitRng;
use super::{Layer, LayerStats, LinearMap, NormConfig, ParamStore, Pass, QNetworkConfig};

pub struct QNetwork {
    store: ParamStore,
    /// Convolutional layers, then (after flattening) fully connected ones; the last
    /// layer is the head.
    pub(crate) convs: Vec<Layer>,
    pub(crate) dense: Vec<Layer>,
    norm: NormConfig,
    obs_shape: Vec<usize>,
    n_actions: usize,
    /// A distributional head's values `[K]` (C51's atoms, HL-Gauss's bin centres): the
    /// head gives `n_actions x K` logits, and Q is each action's expectation of them.
    support: Option<Tensor>,
    /// The same values on the host (empty for a scalar head), for the host path.
    support_values: Vec<f32>,
}

impl QNetwork {
    /// Builds and initializes a network for observations of `obs_shape` and
    /// `n_actions` actions; `seed` fixes the initial weights.
    pub fn new(
        config: &QNetworkConfig,
        norm: &NormConfig,
        obs_shape: &[usize],
        n_actions: usize,
        seed: u64,
        device: &Device,
    ) -> Result<Self> {
        Self::build(config, norm, (obs_shape, n_actions, &[]), seed, device)
    }

    /// A network whose head gives, for each action, logits over the fixed `values`
    /// (`[K]`): [`Self::forward`] returns each action's expected value under their
    /// softmax, and [`Self::forward_logits`] the logits for a distributional loss.
    pub fn distributional(
        config: &QNetworkConfig,
        norm: &NormConfig,
        (obs_shape, n_actions): (&[usize], usize),
        values: &[f32],
        seed: u64,
        device: &Device,
    ) -> Result<Self> {
        if values.len() < 2 {
            candle_core::bail!("a distributional head needs at least 2 values");
        }
        Self::build(config, norm, (obs_shape, n_actions, values), seed, device)
    }

    /// The network, with a distributional head where `values` is not empty.
    fn build(
        config: &QNetworkConfig,
        norm: &NormConfig,
        (obs_shape, n_actions, values): (&[usize], usize, &[f32]),
        seed: u64,
        device: &Device,
    ) -> Result<Self> {
        let mut store = ParamStore::new(device.clone());
        let mut rng = InitRng::new(seed);
        let mut convs = vec![];
        let mut dense = vec![];
        let mut shape = obs_shape.to_vec();
        let conv_specs = config.architecture.convolutions();
        let hidden = config.architecture.dense_widths();
        if !conv_specs.is_empty() && shape.len() != 3 {
            candle_core::bail!(
                "a convolutional network needs [channels, height, width] observations, got {shape:?}"
            );
        }
        for (i, &(c_out, k, stride)) in conv_specs.iter().enumerate() {
            if shape[1] < k || shape[2] < k {
                candle_core::bail!(
                    "observation {obs_shape:?} is too small for a {k}x{k} convolution"
                );
            }
            let kernel = LinearMap::Conv2d {
                c_in: shape[0],
                c_out,
                k,
                stride,
                padding: 0,
            };
            let out = kernel.output_shape(&shape);
            convs.push(Layer::hidden(
                &mut store,
                &format!("conv{i}"),
                kernel,
                &out,
                norm,
                &mut rng,
            )?);
            shape = out;
        }
        let mut width: usize = shape.iter().product();
        for (i, &n_out) in hidden.iter().enumerate() {
            let kernel = LinearMap::Linear { n_in: width, n_out };
            dense.push(Layer::hidden(
                &mut store,
                &format!("fc{i}"),
                kernel,
                &[n_out],
                norm,
                &mut rng,
            )?);
            width = n_out;
        }
        let head = LinearMap::Linear {
            n_in: width,
            n_out: n_actions * values.len().max(1),
        };
        dense.push(Layer::output(&mut store, "head", head, norm, &mut rng)?);
        Ok(Self {
            store,
            convs,
            dense,
            norm: norm.clone(),
            obs_shape: obs_shape.to_vec(),
            n_actions,
            support: match values.is_empty() {
                true => None,
                false => Some(Tensor::from_slice(values, values.len(), device)?),
            },
            support_values: values.to_vec(),
        })
    }

    pub fn store(&self) -> &ParamStore {
        &self.store
    }

    pub fn norm(&self) -> &NormConfig {
        &self.norm
    }

    pub fn n_actions(&self) -> usize {
        self.n_actions
    }

    pub fn obs_shape(&self) -> &[usize] {
        &self.obs_shape
    }

    /// Every layer from input to output.
    pub fn layers(&self) -> impl Iterator<Item = &Layer> {
        self.convs.iter().chain(&self.dense)
    }

    /// Q-values `[B, n_actions]` for observations `[B, obs_shape...]` through candle's
    /// graph, with the batch-norm statistics and the gradients that `pass` says; with a
    /// distributional head, each action's expected value.
    pub fn forward(&self, x: &Tensor, pass: Pass) -> Result<Tensor> {
        let out = self.head_output(x, pass)?;
        match &self.support {
            None => Ok(out),
            Some(values) => expected_q(&self.as_logits(out)?, values),
        }
    }

    /// A distributional head's logits `[B, n_actions, K]`.
    pub fn forward_logits(&self, x: &Tensor, pass: Pass) -> Result<Tensor> {
        if self.support.is_none() {
            candle_core::bail!("forward_logits needs a distributional head");
        }
        self.as_logits(self.head_output(x, pass)?)
    }

    /// A distributional head's values `[K]`, if it has one.
    pub fn support(&self) -> Option<&Tensor> {
        self.support.as_ref()
    }

    /// A distributional head's values on the host (empty for a scalar head).
    pub fn support_values(&self) -> &[f32] {
        &self.support_values
    }

    fn as_logits(&self, out: Tensor) -> Result<Tensor> {
        let b = out.dim(0)?;
        out.reshape((b, self.n_actions, ()))
    }

    /// The head's output `[B, n_actions x K]` (`K` = 1 for a scalar head).
    fn head_output(&self, x: &Tensor, pass: Pass) -> Result<Tensor> {
        let mut h = x.clone();
        for layer in &self.convs {
            h = layer.forward(&h, pass)?;
        }
        if !h.device().is_cpu() {
            // The CPU's linear op reads `[B, C, H, W]` as `[B, C*H*W]` itself.
            h = h.flatten_from(1)?;
        }
        for layer in &self.dense {
            h = layer.forward(&h, pass)?;
        }
        Ok(h)
    }

    /// Each hidden layer's output (after its ReLU) on `x`, by layer name: what the
    /// diagnostics read.
    pub fn hidden_outputs(&self, x: &Tensor, pass: Pass) -> Result<Vec<(String, Tensor)>> {
        let mut outputs = vec![];
        let mut h = x.clone();
        for layer in &self.convs {
            h = layer.forward(&h, pass)?;
            outputs.push((layer.name().to_string(), h.clone()));
        }
        h = h.flatten_from(1)?;
        let hidden = self.dense.len().saturating_sub(1);
        for layer in &self.dense[..hidden] {
            h = layer.forward(&h, pass)?;
            outputs.push((layer.name().to_string(), h.clone()));
        }
        Ok(outputs)
    }

    /// True when weight norm's data-dependent init is due (before the first update).
    pub fn wants_data_dependent_init(&self) -> bool {
        self.norm.weight.is_weight_norm() && self.norm.data_dependent_init
    }

    /// Data-dependent init, layer by layer from input to output, on batch `x`.
    pub fn data_dependent_init(&self, x: &Tensor) -> Result<()> {
        let mut h = x.clone();
        for layer in &self.convs {
            h = layer.data_dependent_init(&h)?;
        }
        h = h.flatten_from(1)?;
        for layer in &self.dense {
            h = layer.data_dependent_init(&h)?;
        }
        self.store.bump_version();
        Ok(())
    }

    /// The trainer calls this after optimizer step number `step` (counting from 1):
    /// SVB/BBN project every `svb_interval` steps.
    pub fn after_optimizer_step(&self, step: u64) -> Result<bool> {
        let mut ran = false;
        for layer in self.layers() {
            ran |= layer.after_step(step, &self.norm)?;
        }
        if ran {
            self.store.bump_version();
        }
        Ok(ran)
    }

    /// Copies all variables, running statistics included, from `other`.
    pub fn copy_from(&self, other: &QNetwork) -> Result<()> {
        self.store.copy_from(&other.store)
    }

    /// Per-layer statistics for logging (singular values only when asked: an SVD each).
    pub fn stats(&self, singular_values: bool) -> Result<Vec<LayerStats>> {
        self.layers().map(|l| l.stats(singular_values)).collect()
    }
}

/// Q-values `[.., A]` from a distributional head's logits `[.., A, K]`: each action's
/// expectation of `values` `[K]` (C51's atoms, HL-Gauss's bin centres) under the
/// softmax of its logits. Differentiable, in tensor ops (any device).
pub fn expected_q(logits: &Tensor, values: &Tensor) -> Result<Tensor> {
    let p = candle_nn::ops::softmax_last_dim(logits)?;
    p.broadcast_mul(values)?.sum(D::Minus1)
}
