//! A population's training forward and its backward taken by hand, on the fused CPU
//! ops: each layer keeps its input, its weight and its ops ([`Applied`]), and the
//! backward runs each op's own gradient once, layer by layer. Through candle's backward
//! the same update created every gradient twice more (a zero tensor and a sum per
//! input of every node) and went through every view: 59 of the 102 tensors of an MLP
//! population's step without normalization.
//!
//! Where a layer has no fused form (a device, a convolution after the first layer, a
//! method without one), [`PopulationNet::forward_with_tape`] says so and the update
//! takes candle's graph.

use std::sync::Arc;

use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, TensorId};

use super::net::{After, PopulationLayer};
use super::PopulationNet;
use crate::kernels::agent_product::{self, Columns};
use crate::kernels::per_agent::{accumulate, Applied};
use crate::nn::weight_norm::stacked_scale_gradients;
use crate::nn::BnStats;

/// What a training forward keeps for [`PopulationNet::backward`].
pub(crate) struct Tape {
    layers: Vec<LayerTape>,
}

struct LayerTape {
    input: Tensor,
    /// The product's weight: the variable's (weight norm's `v` where the layer scales
    /// its output), or weight norm's `g v / ||v||`.
    weight: Tensor,
    /// Where the weight's gradient goes: the weight variable, or weight norm's op
    /// (whose backward hands it to `v` and `g`).
    weight_source: WeightSource,
    /// The op after the product (the normalization, weight norm's scale, the bias and
    /// the ReLU, those the layer has); `None` for a layer with none of them.
    after: Option<Applied>,
    /// The first layer's data convolution, unfolded: its weight's gradient reads these
    /// columns rather than unfolding the input again.
    columns: Option<Columns>,
}

enum WeightSource {
    Var(TensorId),
    /// Weight norm's formed weight (before mean-only batch norm), `op`'s output.
    WeightNorm {
        v: TensorId,
        op: Arc<Applied>,
    },
    /// Weight norm's scale of the layer's output (`WeightNorm::scaled`, `op`'s
    /// output): `v`'s gradient is the product's plus the scale's share, whose
    /// gradient the op after the product left under the scale.
    Scaled {
        op: Arc<Applied>,
    },
}

impl PopulationNet {
    /// Q-values `[P, B, actions]` of `x` as [`Self::forward`] computes them, with what
    /// [`Self::backward`] needs; `None` where a layer has no fused form here.
    pub(crate) fn forward_with_tape(
        &self,
        x: &Tensor,
        stats: BnStats,
    ) -> Result<Option<(Tensor, Tape)>> {
        if self.path(false) == super::net::Path::TensorForms {
            return Ok(None);
        }
        let mut layers = Vec::with_capacity(self.layers().len());
        let mut h = x.clone();
        for (i, layer) in self.layers().iter().enumerate() {
            let Some((saved, out)) = self.layer_with_tape(layer, &h, stats, i == 0)? else {
                return Ok(None);
            };
            h = out;
            layers.push(saved);
        }
        Ok(Some((h, Tape { layers })))
    }

    /// One layer's forward, kept, and its output; `None` where it has no fused form.
    fn layer_with_tape(
        &self,
        layer: &PopulationLayer,
        x: &Tensor,
        stats: BnStats,
        first: bool,
    ) -> Result<Option<(LayerTape, Tensor)>> {
        if layer.conv_needs_input_gradient(first) {
            return Ok(None);
        }
        let v = layer.weight.var().as_tensor();
        let (weight, weight_source) = match layer.fused_weight_norm(self.version())? {
            Some((wn, op)) if wn.scaled() => (v.clone(), WeightSource::Scaled { op }),
            Some((_, op)) => {
                let v = v.id();
                (op.out.clone(), WeightSource::WeightNorm { v, op })
            }
            None => (v.clone(), WeightSource::Var(v.id())),
        };
        let (h, columns) = match (&layer.data_conv, first) {
            (Some(conv), true) => {
                let columns = conv.columns(x, &weight)?;
                (columns.apply(&weight)?, Some(columns))
            }
            _ => (layer.product(x, &weight, true)?, None),
        };
        let after = match self.after_product(layer, &h, stats)? {
            After::Op(applied) => Some(applied),
            After::Identity => None,
            After::Unfused => return Ok(None),
        };
        let out = after.as_ref().map_or(h, |a| a.out.clone());
        let saved = LayerTape {
            input: x.clone(),
            weight,
            weight_source,
            after,
            columns,
        };
        Ok(Some((saved, out)))
    }

    /// The gradient of `Σ dq · Q` with respect to every trainable variable, from the
    /// tape of [`Self::forward_with_tape`] (`dq` is the loss's gradient with respect to
    /// the Q-values it returned).
    pub(crate) fn backward(&self, tape: Tape, dq: &Tensor) -> Result<GradStore> {
        let mut grads = GradStore::default();
        let mut dy = dq.clone();
        for (i, (layer, saved)) in self.layers().iter().zip(&tape.layers).enumerate().rev() {
            let dh = match &saved.after {
                Some(after) => after.backward(&dy, &mut grads)?,
                None => dy,
            };
            let (dw, dx) = match &saved.columns {
                Some(columns) => (columns.weight_gradient(&saved.weight, &dh)?, None),
                None => agent_product::linear_gradients(&saved.input, &saved.weight, &dh, i > 0)?,
            };
            match &saved.weight_source {
                WeightSource::Var(id) => accumulate(&mut grads, *id, dw)?,
                WeightSource::WeightNorm { v, op } => {
                    let dv = op.backward(&dw, &mut grads)?;
                    accumulate(&mut grads, *v, dv)?;
                }
                WeightSource::Scaled { op } => {
                    let Some(ds) = grads.remove(&op.out) else {
                        candle_core::bail!("weight norm's scale received no gradient");
                    };
                    let Some(wn) = layer.weight.weight_norm() else {
                        candle_core::bail!("a scaled layer without gains");
                    };
                    let (v, g) = (&wn.v, &wn.g);
                    let (dv, dg) = stacked_scale_gradients((v, g, &op.out), dw, &ds)?;
                    accumulate(&mut grads, v.id(), dv)?;
                    accumulate(&mut grads, g.id(), dg)?;
                }
            }
            match dx {
                Some(dx) => dy = dx,
                None => break,
            }
        }
        Ok(grads)
    }
}
