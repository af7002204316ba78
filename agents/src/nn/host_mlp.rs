//! An MLP Q-network's forward and backward on host values, without a candle graph.
//!
//! For the small networks of CartPole-like tasks the graph's fixed costs were most of an
//! update, and they grew with every variable a method adds: per node a tensor and an
//! op, per variable a zero-filled gradient, an add and a hash entry (about 0.6 us each).
//! Here the layers run one after another on plain buffers, keep what their backward
//! needs on a [`HostTape`], and the backward hands back each variable's gradient.
//!
//! Each layer's output (weight norm's scale, the bias, the ReLU) is one pass forward and
//! one back ([`super::feature_pass`]); weight norm never forms `w` but scales the
//! kernel's output, as its graph op does. Batch norm, the kernels and the norms are the
//! fused ops' own functions. The values are the graph path's to rounding (tested to
//! 1e-5 relative).
//!
//! CPU only, for networks of Linear layers, with any of the seven methods
//! ([`QNetwork::runs_on_host`]); CNNs use the graph.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use normrl_agents::nn::{HostTape, Mode, NormConfig, NormKind, QNetwork, QNetworkConfig};
//!
//! let norm = NormConfig { kind: NormKind::WeightNorm, ..Default::default() };
//! let net = QNetwork::new(&QNetworkConfig::mlp(vec![8]), &norm, &[3], 2, 0, &Device::Cpu).unwrap();
//! assert!(net.runs_on_host());
//! let x = [0.5f32, -1.0, 2.0, 0.0, 1.0, -0.5];
//! let mut tape = HostTape::default();
//! let q = net.host_forward(&x, 2, Mode::Train, Some(&mut tape)).unwrap();
//! let graph = net.forward(&Tensor::from_slice(&x, (2, 3), &Device::Cpu).unwrap(), Mode::Train).unwrap();
//! assert_eq!(q, graph.flatten_all().unwrap().to_vec1::<f32>().unwrap());
//! // One gradient per trainable variable: v, g and bias of both layers.
//! assert_eq!(net.host_backward(tape, &[1.0; 4]).unwrap().len(), 6);
//! ```

use std::sync::Arc;

use candle_core::{Result, TensorId, Var};

use super::batch_norm_op::BatchNormOp;
use super::feature_pass::{affine_features, affine_in_place, output_gradient, Affine, SavedOutput};
use super::fused::{with_values, Units};
use super::kernel_core::KernelCore;
use super::layer::{Norm, WeightParam};
use super::layer_norm::RowStatistics;
use super::linear_op::LinearCore;
use super::mean_only_bn_op::{batch_means, mean_shift};
use super::unit_norms::UnitNorms;
use super::weight_norm_op::{add_norm_gradient, gain_gradient_from_sums};
use super::{Kernel, Mode, NormLayer, QNetwork};

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

/// What the activation normalization's backward reads.
enum NormTape {
    None,
    Batch(Arc<BatchNormOp>),
    Layer(RowStatistics),
    /// Mean-only batch norm: whether it subtracted the batch's mean (else the running
    /// mean, a constant).
    MeanOnly {
        batch_statistics: bool,
    },
}

impl LayerTape {
    /// The layer's output: `out`, keeping the kernel's output `t` for the backward, or
    /// (no `out`) `t` itself, transformed in place.
    fn output(&mut self, t: Vec<f32>, out: Option<Vec<f32>>) -> Vec<f32> {
        match out {
            Some(out) => {
                self.kernel_output = t;
                out
            }
            None => t,
        }
    }

    /// Weight norm's kernel output and scales, where the layer has weight norm.
    fn scaled(&self) -> Option<(&[f32], &[f32])> {
        let norms = self.weight_norm.as_ref()?;
        Some((&self.kernel_output, &norms.scales))
    }
}

/// Each trainable variable's gradient, by the variable's id.
pub type HostGradients = Vec<(TensorId, Vec<f32>)>;

impl QNetwork {
    /// True when [`Self::host_forward`] and [`Self::host_backward`] can run this network:
    /// on the CPU, Linear layers only (mean-only batch norm with weight norm, as
    /// [`super::NormKind::WnMeanOnlyBn`] builds it).
    pub fn runs_on_host(&self) -> bool {
        self.store().device().is_cpu()
            && self.convs.is_empty()
            && self.dense.iter().all(NormLayer::runs_on_host)
    }

    /// Q-values `[rows, n_actions]` (row-major) of observations `x` (`rows` of them,
    /// row-major), as [`Self::forward`] computes them. With a `tape`, it keeps what
    /// [`Self::host_backward`] needs.
    pub fn host_forward(
        &self,
        x: &[f32],
        rows: usize,
        mode: Mode,
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
            let (out, mut saved) = layer.host_forward(&h, rows, mode, tape.is_some())?;
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

impl NormLayer {
    fn runs_on_host(&self) -> bool {
        let linear = matches!(self.kernel, Kernel::Linear { .. });
        let norm = match self.norm {
            Norm::None => true,
            Norm::Batch(_) | Norm::Layer(_) => matches!(self.weight, WeightParam::Plain(_)),
            Norm::MeanOnly(_) => matches!(self.weight, WeightParam::Normed(_)),
        };
        linear && norm
    }

    fn host_forward(
        &self,
        x: &[f32],
        rows: usize,
        mode: Mode,
        keep: bool,
    ) -> Result<(Vec<f32>, LayerTape)> {
        let Kernel::Linear { n_in, n_out } = self.kernel else {
            candle_core::bail!("host forward: not a Linear layer");
        };
        if x.len() != rows * n_in {
            candle_core::bail!(
                "host forward: {} values for {rows} rows of {n_in} inputs",
                x.len()
            );
        }
        let core = LinearCore::new(rows, n_in, n_out);
        let mut saved = LayerTape {
            input: vec![],
            kernel_output: vec![],
            weight_norm: None,
            norm: NormTape::None,
        };
        let t = match (&self.weight, mode) {
            (WeightParam::Plain(w), _) => with_values(w.as_tensor(), |w| Ok(core.forward(x, w)))?,
            // Every mode: the kernel with `v`, its output scaled by the norms kept for
            // this version of the variables (a taped forward is then differentiated
            // through `v` and `g`, whatever batch norm's mode).
            (WeightParam::Normed(wn), _) => {
                saved.weight_norm = Some(wn.unit_norms()?);
                with_values(wn.v.as_tensor(), |v| Ok(core.forward(x, v)))?
            }
        };
        let out = match &self.norm {
            Norm::Batch(bn) if mode == Mode::Eval && !keep => {
                // Acting and TD targets: the cached statistics and parameters, in place.
                let mut t = t;
                affine_in_place(&mut t, n_out, bn.evaluation()?.affine(self.relu));
                t
            }
            Norm::Batch(bn) => {
                let units = Units {
                    outer: rows,
                    units: n_out,
                    inner: 1,
                };
                let op = bn.host_op(&units, &t, mode)?;
                let mut t = t;
                let out = with_values(bn.gamma.as_tensor(), |gamma| {
                    with_values(bn.beta.as_tensor(), |beta| {
                        if keep {
                            // The backward reads the input.
                            op.normalize(&units, &t, gamma, beta, self.relu).map(Some)
                        } else {
                            op.normalize_features_in_place(&mut t, gamma, beta, self.relu)?;
                            Ok(None)
                        }
                    })
                })?;
                saved.norm = NormTape::Batch(op);
                saved.output(t, out)
            }
            Norm::MeanOnly(bn) => {
                let units = Units {
                    outer: rows,
                    units: n_out,
                    inner: 1,
                };
                // The kernel's output as the graph's ops leave it: scaled by weight norm.
                let (mut y, t) = match &saved.weight_norm {
                    Some(norms) => {
                        let scale = Affine {
                            scale: Some(&norms.scales),
                            ..Default::default()
                        };
                        (affine_features(&t, n_out, scale), Some(t))
                    }
                    None => (t, None),
                };
                let (mean, batch_statistics) = bn.host_mean(&units, &y, mode)?;
                let shift = match &self.bias {
                    Some(b) => with_values(b.as_tensor(), |b| Ok(mean_shift(Some(b), &mean)))?,
                    None => mean_shift(None, &mean),
                };
                let affine = Affine {
                    bias: Some(&shift),
                    relu: self.relu,
                    ..Default::default()
                };
                affine_in_place(&mut y, n_out, affine);
                if keep {
                    saved.kernel_output = t.unwrap_or_default();
                    saved.norm = NormTape::MeanOnly { batch_statistics };
                }
                y
            }
            Norm::Layer(ln) => {
                let (out, statistics) = ln.host_forward(&t, self.relu)?;
                if keep {
                    // The backward reads the input and its statistics.
                    saved.kernel_output = t;
                    saved.norm = NormTape::Layer(statistics);
                }
                out
            }
            _ => {
                let scale = saved.weight_norm.as_ref().map(|n| &n.scales[..]);
                // Weight norm's backward reads the kernel's output; else it is not kept
                // and becomes the layer's output in place.
                let kept = keep && scale.is_some();
                let mut t = t;
                let mut apply = |bias: Option<&[f32]>| {
                    let affine = Affine {
                        scale,
                        bias,
                        relu: self.relu,
                        ..Default::default()
                    };
                    if kept {
                        Some(affine_features(&t, n_out, affine))
                    } else {
                        affine_in_place(&mut t, n_out, affine);
                        None
                    }
                };
                let out = match &self.bias {
                    Some(b) => with_values(b.as_tensor(), |b| Ok(apply(Some(b))))?,
                    None => apply(None),
                };
                saved.output(t, out)
            }
        };
        Ok((out, saved))
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
        let Kernel::Linear { n_in, n_out } = self.kernel else {
            candle_core::bail!("host backward: not a Linear layer");
        };
        let rows = saved.input.len() / n_in.max(1);
        let (dt, gain_sums) = match (&self.norm, &saved.norm) {
            (Norm::Batch(bn), NormTape::Batch(op)) => {
                let mut dt = dy;
                let (dgamma, dbeta) = with_values(bn.gamma.as_tensor(), |gamma| {
                    let x = &saved.kernel_output;
                    Ok(op.feature_gradients(gamma, x, out, &mut dt, self.relu))
                })?;
                push(grads, &bn.gamma, dgamma);
                push(grads, &bn.beta, dbeta);
                (dt, vec![])
            }
            (Norm::Layer(ln), NormTape::Layer(statistics)) => {
                let t = &saved.kernel_output;
                let (dt, dgamma, dbeta) = ln.host_backward(t, statistics, out, dy, self.relu)?;
                push(grads, ln.gamma(), dgamma);
                push(grads, ln.beta(), dbeta);
                (dt, vec![])
            }
            (Norm::MeanOnly(_), &NormTape::MeanOnly { batch_statistics }) => {
                // Through the ReLU and the bias, then the batch mean, then weight norm's
                // scale (dL/dg's sums from the kernel's output).
                let mut d = dy;
                let relu = SavedOutput {
                    y: self.relu.then_some(out),
                    scaled: None,
                };
                let d_sums = output_gradient(&mut d, n_out, relu).d;
                if batch_statistics {
                    let means = batch_means(&d_sums, rows);
                    let center = Affine {
                        center: Some(&means),
                        ..Default::default()
                    };
                    affine_in_place(&mut d, n_out, center);
                }
                if let Some(b) = &self.bias {
                    push(grads, b, d_sums);
                }
                let scale = SavedOutput {
                    y: None,
                    scaled: saved.scaled(),
                };
                let sums = output_gradient(&mut d, n_out, scale);
                (d, sums.d_t)
            }
            (Norm::None, _) => {
                let saved_output = SavedOutput {
                    y: self.relu.then_some(out),
                    scaled: saved.scaled(),
                };
                let mut dt = dy;
                let sums = output_gradient(&mut dt, n_out, saved_output);
                if let Some(b) = &self.bias {
                    push(grads, b, sums.d);
                }
                (dt, sums.d_t)
            }
            _ => candle_core::bail!("host backward: the forward kept no normalization statistics"),
        };
        let core = LinearCore::new(rows, n_in, n_out);
        match (&self.weight, &saved.weight_norm) {
            (WeightParam::Plain(w), _) => {
                let (dw, dx) = with_values(w.as_tensor(), |w| {
                    Ok(core.backward(&saved.input, w, &dt, input_gradient))
                })?;
                push(grads, w, dw);
                Ok(dx)
            }
            (WeightParam::Normed(wn), Some(norms)) => {
                // dL/dg_u = Σ dL/dy t / ||v_u||; dL/dv = (dL/dt)^T x minus the part
                // along v_u (the gradient through the norm).
                let inv = &norms.inv_norms;
                let dg = gain_gradient_from_sums(&gain_sums, inv);
                let (dv, dx) = with_values(wn.v.as_tensor(), |v| {
                    let (mut dv, dx) = core.backward(&saved.input, v, &dt, input_gradient);
                    with_values(wn.g.as_tensor(), |g| {
                        add_norm_gradient(&mut dv, v, g, &dg, inv);
                        Ok(())
                    })?;
                    Ok((dv, dx))
                })?;
                push(grads, &wn.v, dv);
                push(grads, &wn.g, dg);
                Ok(dx)
            }
            (WeightParam::Normed(_), None) => {
                candle_core::bail!("host backward: weight norm ran in evaluation mode")
            }
        }
    }
}

fn push(grads: &mut HostGradients, var: &Var, grad: Vec<f32>) {
    grads.push((var.id(), grad));
}
