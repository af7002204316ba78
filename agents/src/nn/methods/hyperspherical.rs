//! Hyperspherical layers (`hyperspherical`), SimbaV2's (Lee et al., "Hyperspherical
//! Normalization for Scalable Deep Reinforcement Learning", ICML 2025; code:
//! DAVIAN-Robotics/SimbaV2, `simbaV2_layer.py`, `simbaV2_update.py`) adapted to a
//! Q-network. A hidden layer is
//!
//! ```text
//! y = l2normalize(relu(s * (W x)))      (no bias)
//! ```
//!
//! with each output unit's row of `W` on the unit sphere (orthogonal init, then
//! projected after init and after every optimizer step, `wn_projected::unit_rows`), a
//! learnable per-unit scaler `s` (SimbaV2's `Scaler`: stored at `scale = sqrt(2/h)`,
//! used times `init / scale` with `init = scale`, so the forward multiplier is 1 and the
//! stored value is the scaler) and the features put on the unit sphere per sample,
//! `x / max(||x||, 1e-8)` (over the units; over the channels at each position of a
//! feature map). The head is `s * (W h) + b`: unit rows too, a scaler per action (init
//! and scale 1, as SimbaV2's head scalers) and a bias, where SimbaV2's critic has a
//! categorical head over a fixed support (`docs/methods.md`).
//!
//! One type serves a single network and a population (its scalers stacked), and one
//! tensor form ([`sphere`]) both, for any leading axes; the fused op, the host path's
//! loops and the population's per-agent kernel are `kernels/sphere.rs`'s.

use candle_core::{Result, Tensor, Var};

use crate::kernels::per_agent::PerAgent;
use crate::kernels::sphere::{sphere_backward, sphere_forward, AgentSphere, FusedSphere, EPS};
use crate::kernels::with_values;
use crate::nn::normalization::{copy_var, mean_of, push, Backward, GraphLayer, Normalization};
use crate::nn::normalization::{Fused, Identity};
use crate::nn::normalization::{
    HostGradients, HostLayer, HostOutput, KernelGradient, NormTape, Saved, Take,
};
use crate::nn::{BnStats, ParamStore, Role};

/// The scaler's start on a hidden layer of `units` units: `sqrt(2 / h)`.
pub(crate) fn hidden_scaler_init(units: usize) -> f64 {
    (2.0 / units as f64).sqrt()
}

/// The layer's output from the kernel's `t`: `relu(s t)` on the unit sphere (a hidden
/// layer), or `s t` (the head, whose bias the caller adds). `lead`: the leading axes
/// before the batch axis (0 for one network, 1 for a population); the features are
/// the axis after the batch's (`[.., B, units]` or `[.., B, channels, positions...]`).
pub(crate) fn sphere(t: &Tensor, scaler: &Tensor, lead: usize, head: bool) -> Result<Tensor> {
    let scaled = t.broadcast_mul(scaler)?;
    if head {
        return Ok(scaled);
    }
    // ReLU with no gradient at 0, as every other layer's (an empty patch gives 0).
    let r = (&scaled * scaled.gt(0.0)?.to_dtype(scaled.dtype())?)?;
    // `sqrt(max(sum, eps^2))` is `max(norm, eps)`, with a finite gradient where the
    // features are all 0 (the root's is infinite at 0).
    let floor = f64::from(EPS * EPS);
    let norm = r.sqr()?.sum_keepdim(lead + 1)?.maximum(floor)?.sqrt()?;
    r.broadcast_div(&norm)
}

/// A hyperspherical layer: its scaler (`<layer>.scaler`), one network's (`lead` 0) or
/// the agents' stacked, `[P, 1, units]` (`[P, 1, channels, 1]` over feature maps;
/// `lead` 1).
pub struct Hyperspherical {
    scaler: Var,
    head: bool,
    lead: usize,
}

impl Hyperspherical {
    /// A hidden layer of `units` units whose one sample's output is `out_shape` (a
    /// feature map's scaler is per channel, `[C, 1, 1]`).
    pub(crate) fn hidden(
        store: &mut ParamStore,
        prefix: &str,
        out_shape: &[usize],
    ) -> Result<Self> {
        let mut shape = out_shape.to_vec();
        shape[1..].iter_mut().for_each(|d| *d = 1);
        let init = hidden_scaler_init(out_shape[0]);
        let value = Tensor::full(init as f32, shape, store.device())?;
        let scaler = store.add(&format!("{prefix}.scaler"), value, Role::Weight)?;
        Ok(Self {
            scaler,
            head: false,
            lead: 0,
        })
    }

    /// The head's scaler, one per action, at 1.
    pub(crate) fn head(store: &mut ParamStore, prefix: &str, actions: usize) -> Result<Self> {
        let scaler = store.ones(&format!("{prefix}.scaler"), actions, Role::Weight)?;
        Ok(Self {
            scaler,
            head: true,
            lead: 0,
        })
    }

    /// A population's hidden layer or head, from the agents' stacked scalers.
    pub(crate) fn stack(take: &mut Take, head: bool) -> Result<Self> {
        Ok(Self {
            scaler: take("scaler", Role::Weight)?,
            head,
            lead: 1,
        })
    }
}

impl Normalization for Hyperspherical {
    fn vars(&self) -> (Vec<&Var>, Vec<&Var>) {
        (vec![&self.scaler], vec![])
    }

    fn copied(&self) -> Result<Box<dyn Normalization>> {
        Ok(Box::new(Self {
            scaler: copy_var(&self.scaler)?,
            head: self.head,
            lead: self.lead,
        }))
    }

    fn normalize(&self, h: Tensor, _stats: BnStats) -> Result<Tensor> {
        sphere(&h, self.scaler.as_tensor(), self.lead, self.head)
    }

    /// A population's hidden layer: the loops per agent on the CPU (no CUDA kernel: a
    /// device takes the tensor form); the head's scaled output takes the tensor form.
    fn fused_forward(&self, h: &Tensor, _stats: BnStats, bias: Option<&Var>) -> Fused {
        if self.head || bias.is_some() || !h.device().is_cpu() {
            return Ok(None);
        }
        let inner = if h.rank() == 4 { h.dim(3)? } else { 1 };
        let kernel = AgentSphere { inner };
        let op = PerAgent {
            kernel,
            agents: h.dim(0)?,
        };
        op.apply1(h, self.scaler.as_tensor()).map(Some)
    }

    fn graph_forward(&self, t: &Tensor, layer: &GraphLayer) -> Result<Tensor> {
        let y = match (self.head, t.device().is_cpu()) {
            (false, true) => {
                let s = self.scaler.as_tensor().flatten_all()?;
                t.contiguous()?.apply_op2(&s, FusedSphere)?
            }
            _ => sphere(t, self.scaler.as_tensor(), self.lead, self.head)?,
        };
        match layer.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }

    fn host_forward(&self, layer: &HostLayer, t: Vec<f32>, keep: bool) -> Result<HostOutput> {
        with_values(self.scaler.as_tensor(), |s| {
            if self.head {
                // `s t + b`: the plain layer's pass with the scaler as its per-unit scale.
                return Identity.host_forward(&scaled(layer, s), t, keep);
            }
            let (out, inv) = sphere_forward(&t, s, (layer.rows, s.len(), 1));
            Ok(HostOutput::keeping(out, t, keep, NormTape::Sphere(inv)))
        })
    }

    fn host_backward(&self, saved: &Saved, dy: Vec<f32>, grads: &mut HostGradients) -> Backward {
        let (dt, ds) = with_values(self.scaler.as_tensor(), |s| match saved.tape {
            NormTape::Sphere(inv) => {
                let dims = (saved.layer.rows, saved.layer.units, 1);
                Ok(sphere_backward(saved.t, s, saved.out, inv, &dy, dims))
            }
            // The head: the plain layer's pass pushes the bias's gradient and gives the
            // scale's sums, `Σ dy t`, the scaler's gradient.
            _ => {
                let head = Saved {
                    layer: scaled(&saved.layer, s),
                    ..*saved
                };
                let d = Identity.host_backward(&head, dy, grads)?;
                Ok((d.dt, d.gain_sums))
            }
        })?;
        push(grads, &self.scaler, ds);
        Ok(KernelGradient::plain(dt))
    }

    fn log_stats(&self, values: &mut Vec<(&'static str, f64)>) -> Result<()> {
        let s = self.scaler.as_tensor().flatten_all()?.to_vec1::<f32>()?;
        values.push(("scaler_mean", mean_of(&s)));
        Ok(())
    }

    // Its host loops (`host_forward`, `host_backward`) take no weight norm's scale.
    fn runs_on_host(&self, weight_normed: bool) -> bool {
        !weight_normed
    }
}

/// The head's layer with the scaler `s` as its per-unit scale (weight norm's slot).
fn scaled<'a>(layer: &HostLayer<'a>, s: &'a [f32]) -> HostLayer<'a> {
    HostLayer {
        scale: Some(s),
        ..*layer
    }
}
