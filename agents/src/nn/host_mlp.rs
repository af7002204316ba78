//! An MLP Q-network's forward and backward on host values, without a candle graph.
//!
//! For the small networks of CartPole-like tasks the graph's fixed costs were most of an
//! update, and they grew with every variable a method adds: per node a tensor and an
//! op, per variable a zero-filled gradient, an add and a hash entry (about 0.6 us each).
//! Here the layers run one after another on plain buffers, keep what their backward
//! needs on a [`HostTape`], and the backward hands back each variable's gradient.
//!
//! Each layer's output (weight norm's scale, the bias, the ReLU) is one pass forward and
//! one back ([`crate::kernels::feature_pass`]); weight norm never forms `w` but scales the
//! kernel's output, as its graph op does. Batch norm, the kernels and the norms are the
//! fused ops' own functions. The values are the graph path's to rounding (tested to
//! 1e-5 relative).
//!
//! CPU only, for networks of Linear layers, with any of the methods
//! ([`QNetwork::runs_on_host`]); CNNs use the graph.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use normrl_agents::nn::{BnStats, HostTape, NormConfig, NormKind, Pass, QNetwork, QNetworkConfig};
//!
//! let norm = NormConfig::from(NormKind::WeightNorm);
//! let net = QNetwork::new(&QNetworkConfig::mlp(vec![8]), &norm, &[3], 2, 0, &Device::Cpu).unwrap();
//! assert!(net.runs_on_host());
//! let x = [0.5f32, -1.0, 2.0, 0.0, 1.0, -0.5];
//! let mut tape = HostTape::default();
//! let q = net.host_forward(&x, 2, BnStats::Batch, Some(&mut tape)).unwrap();
//! let graph = net.forward(&Tensor::from_slice(&x, (2, 3), &Device::Cpu).unwrap(), Pass::TRAIN).unwrap();
//! assert_eq!(q, graph.flatten_all().unwrap().to_vec1::<f32>().unwrap());
//! // One gradient per trainable variable: v, g and bias of both layers.
//! assert_eq!(net.host_backward(tape, &[1.0; 4]).unwrap().len(), 6);
//! ```

use std::sync::Arc;

use candle_core::Result;

use super::norm::{with_method, Norm};
use super::normalization::{push, HostGradients, HostLayer, NormTape, Saved};
use super::normalization::{Identity, Normalization};
use super::weight::WeightParam;
use super::weight_norm::UnitNorms;
use super::{BnStats, Layer, LinearMap, QNetwork};
use crate::kernels::linear::LinearCore;
use crate::kernels::product::Product;
use crate::kernels::with_values;

/// What a training forward keeps for the backward, layer by layer.
#[derive(Default)]
pub struct HostTape {
    layers: Vec<LayerTape>,
}

struct LayerTape {
    input: Vec<f32>,
    /// The kernel's output before the activation normalization, the scale and the bias,
    /// where the backward reads it (weight norm, batch norm); else empty.
    kernel_output: Vec<f32>,
    weight_norm: Option<Arc<UnitNorms>>,
    norm: NormTape,
}

impl QNetwork {
    /// True when [`Self::host_forward`] and [`Self::host_backward`] can run this network:
    /// on the CPU, Linear layers only (mean-only batch norm with weight norm, as
    /// [`super::NormKind::WnMeanOnlyBn`] builds it).
    pub fn runs_on_host(&self) -> bool {
        self.store().device().is_cpu()
            && self.convs.is_empty()
            && self.dense.iter().all(Layer::runs_on_host)
    }

    /// Q-values `[rows, n_actions]` (row-major) of observations `x` (`rows` of them,
    /// row-major), as [`Self::forward`] computes them (a distributional head's: each
    /// action's expectation of its values). With a `tape`, it keeps what
    /// [`Self::host_backward`] needs.
    pub fn host_forward(
        &self,
        x: &[f32],
        rows: usize,
        stats: BnStats,
        tape: Option<&mut HostTape>,
    ) -> Result<Vec<f32>> {
        let out = self.host_head(x, rows, stats, tape)?;
        Ok(match self.support_values() {
            [] => out,
            values => expectations(&out, values),
        })
    }

    /// The head's output `[rows, n_actions x K]` (a distributional head's logits; `K` = 1
    /// for a scalar head), with a `tape` for [`Self::host_backward`].
    pub fn host_head(
        &self,
        x: &[f32],
        rows: usize,
        stats: BnStats,
        mut tape: Option<&mut HostTape>,
    ) -> Result<Vec<f32>> {
        if !self.runs_on_host() {
            candle_core::bail!("this network does not run on host values");
        }
        if let Some(tape) = tape.as_deref_mut() {
            tape.layers.clear();
        }
        let mut h = x.to_vec();
        for layer in &self.dense {
            let (out, mut saved) = layer.host_forward(&h, rows, stats, tape.is_some())?;
            if let Some(tape) = tape.as_deref_mut() {
                saved.input = h;
                tape.layers.push(saved);
            }
            h = out;
        }
        Ok(h)
    }

    /// The gradient of `Σ dq · Q` with respect to every trainable variable, from the
    /// tape of a training [`Self::host_forward`] (`dq` is the loss's gradient with
    /// respect to its Q-values).
    pub fn host_backward(&self, tape: HostTape, dq: &[f32]) -> Result<HostGradients> {
        if tape.layers.len() != self.dense.len() {
            candle_core::bail!("host backward: the tape is not of this network's forward");
        }
        let mut grads = HostGradients::new();
        let mut dy = dq.to_vec();
        for (i, (layer, saved)) in self.dense.iter().zip(&tape.layers).enumerate().rev() {
            // A layer's output is the next one's input; the head's is not needed (no
            // ReLU there).
            let out = tape.layers.get(i + 1).map_or(&[][..], |next| &next.input);
            match layer.host_backward(saved, out, dy, i > 0, &mut grads)? {
                Some(dx) => dy = dx,
                None => break,
            }
        }
        Ok(grads)
    }
}

/// Each run of `values.len()` logits' expectation of `values` under its softmax.
pub fn expectations(logits: &[f32], values: &[f32]) -> Vec<f32> {
    let k = values.len();
    let p = softmax_runs(logits, k);
    p.chunks_exact(k)
        .map(|p| p.iter().zip(values).map(|(p, z)| p * z).sum())
        .collect()
}

/// The softmax of each run of `k` logits (shifted by the run's largest, so that no
/// exponential overflows).
pub fn softmax_runs(logits: &[f32], k: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(logits.len());
    for run in logits.chunks_exact(k) {
        let top = run.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let start = out.len();
        out.extend(run.iter().map(|&l| (l - top).exp()));
        let total: f32 = out[start..].iter().sum();
        out[start..].iter_mut().for_each(|p| *p /= total);
    }
    out
}

impl Layer {
    fn runs_on_host(&self) -> bool {
        let linear = matches!(self.kernel, LinearMap::Linear { .. });
        let normed = matches!(self.weight.param, WeightParam::Normed(_));
        linear && with_method!(&self.norm, |m| m.runs_on_host(normed))
    }

    /// The layer as its normalization sees it, with weight norm's scales if any.
    #[inline]
    fn host_layer<'a>(
        &'a self,
        rows: usize,
        norms: Option<&'a UnitNorms>,
        stats: BnStats,
    ) -> HostLayer<'a> {
        HostLayer {
            units: self.kernel.units(),
            rows,
            bias: self.bias.as_ref(),
            scale: norms.map(|n| &n.scales[..]),
            relu: self.relu,
            stats,
        }
    }

    // Inlined into the network's forward, as the compiler chose until the trait grew:
    // acting a small MLP at batch 1 (0.7 us) took 2-3% longer through a call.
    #[inline]
    fn host_forward(
        &self,
        x: &[f32],
        rows: usize,
        stats: BnStats,
        keep: bool,
    ) -> Result<(Vec<f32>, LayerTape)> {
        let LinearMap::Linear { n_in, n_out } = self.kernel else {
            candle_core::bail!("host forward: not a Linear layer");
        };
        if x.len() != rows * n_in {
            candle_core::bail!(
                "host forward: {} values for {rows} rows of {n_in} inputs",
                x.len()
            );
        }
        let core = LinearCore::new(rows, n_in, n_out);
        // Whatever batch norm's statistics, a taped forward is differentiated through
        // weight norm's `v` and `g`: the kernel runs with `v`, its output is scaled.
        let (t, weight_norm) = match &self.weight.param {
            WeightParam::Plain(w) => (
                with_values(w.as_tensor(), |w| Ok(core.forward(x, w)))?,
                None,
            ),
            WeightParam::Normed(wn) => {
                let (t, norms) = wn.host_kernel(&core, x)?;
                (t, Some(norms))
            }
        };
        let layer = self.host_layer(rows, weight_norm.as_deref(), stats);
        let output = with_method!(&self.norm, |m| m.host_forward(&layer, t, keep))?;
        let saved = LayerTape {
            input: vec![],
            kernel_output: output.kernel_output,
            weight_norm,
            norm: output.tape,
        };
        Ok((output.out, saved))
    }

    /// Pushes this layer's variables' gradients from `dy`, the gradient of its output
    /// `out`; returns its input's gradient when `input_gradient` is set.
    fn host_backward(
        &self,
        saved: &LayerTape,
        out: &[f32],
        dy: Vec<f32>,
        input_gradient: bool,
        grads: &mut HostGradients,
    ) -> Result<Option<Vec<f32>>> {
        let LinearMap::Linear { n_in, n_out } = self.kernel else {
            candle_core::bail!("host backward: not a Linear layer");
        };
        let rows = saved.input.len() / n_in.max(1);
        // The statistics are the tape's; the layer's mode is not read again.
        let layer = self.host_layer(rows, saved.weight_norm.as_deref(), BnStats::Batch);
        let tape = Saved {
            layer,
            tape: &saved.norm,
            t: &saved.kernel_output,
            out,
        };
        let d = with_method!(&self.norm, |m| m.host_backward(&tape, dy, grads))?;
        let core = LinearCore::new(rows, n_in, n_out);
        match (&self.weight.param, &saved.weight_norm) {
            (WeightParam::Plain(w), _) => {
                let (dw, dx) = with_values(w.as_tensor(), |w| {
                    Ok(core.backward(&saved.input, w, &d.dt, input_gradient))
                })?;
                push(grads, w, dw);
                Ok(dx)
            }
            (WeightParam::Normed(wn), Some(norms)) => wn.host_backward(
                &core,
                &saved.input,
                &d.dt,
                &d.gain_sums,
                norms,
                input_gradient,
                grads,
            ),
            (WeightParam::Normed(_), None) => {
                candle_core::bail!("host backward: the forward kept no weight norms")
            }
        }
    }
}
