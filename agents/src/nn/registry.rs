//! The registry of normalization methods: each kind's config name, its hidden layers'
//! kernel and bias, and its normalization (one type per method, implementing
//! `Normalization`) built for a single network (`new`) and for a population (`stack`),
//! written once, in [`registry!`]'s one list below; and their settings, [`NormConfig`].
//! The methods' files take plain settings, not this file's types: the registry imports
//! them, never the other way. [`NormKind`], its config names
//! (serde's), [`NormKind::ALL`] and every question about a kind are generated from that
//! list; tests and benches iterate [`NormKind::ALL`]. Adding a method: its file in
//! `nn/`, its kernels if any, one entry here, its section in `docs/methods.md`
//! (`docs/design.md`, "Adding a method").

use candle_core::Result;
use serde::{Deserialize, Serialize};

use super::norm::Norm;
use super::normalization::{Normalization, Take};
use super::svb::Svb;
use super::{BatchNorm, GroupNorm, Hyperspherical, LayerNorm, MeanOnlyBn, ParamStore};
use super::{RenormConfig, RmsNorm};
use crate::check::{non_negative, positive};

/// A hidden layer's kernel weight, as a method starts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// `w`, uniform in `±1/sqrt(fan_in)` (PyTorch's default).
    Plain,
    /// Weight norm's `w = g v / ||v||`.
    Normed,
    /// An orthogonal `w` (SVB's start: every singular value 1).
    Orthogonal,
}

/// The method's work on a layer after an optimizer step, inside the update, for a
/// single network (`Layer::after_step`) and a population (`PopulationNet`) alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterStep {
    Nothing,
    /// Every `svb_interval` steps, SVB's bound of the singular values (BBN bounds its
    /// gains then too): `svb.rs`, on the host.
    Svb,
    /// Every step, each unit's incoming weights (weight norm's `v`) to norm 1
    /// (`wn_projected.rs`); also once at init.
    UnitRows,
    /// Every step, the weight to its norm at init and the layer norm's gain and offset
    /// jointly to theirs (`nap.rs`).
    InitialNorm,
}

/// The output layer's form where a method has its own (hyperspherical layers' scaler):
/// a single network's and a population's.
/// Each returns `None` where the config keeps a plain head.
pub(crate) struct HeadForm {
    pub single: fn(&mut ParamStore, &str, usize, &NormConfig) -> Result<Option<Norm>>,
    pub stacked: StackedForm,
}

/// What a method is, for the code that builds and steps networks of it.
pub(crate) struct Method {
    pub kernel: Kernel,
    /// The hidden layers keep a bias after the normalization: not where the method has a
    /// shift of its own (batch and layer norm's `beta`) or, as RMSNorm, none at all.
    pub keeps_bias: bool,
    /// The method's step after the optimizer's.
    pub after_step: AfterStep,
    /// The output layer's own form, where the method has one (else a plain head, or
    /// weight norm's with `wn_output_layer`).
    pub head: Option<HeadForm>,
    /// A single network's normalization of a hidden layer of `units` units whose one
    /// sample's output has shape `out_shape` (its variables named `prefix.*`).
    pub single: SingleForm,
    /// The population's form of a hidden layer's normalization, its variables taken from
    /// the agents' stacked ones; `None` for a layer without one.
    pub stacked: StackedForm,
}

pub(crate) type SingleForm = fn(&mut ParamStore, &str, &[usize], &NormConfig) -> Result<Norm>;
pub(crate) type StackedForm = fn(&mut Take, &NormConfig) -> Result<Option<Box<dyn Normalization>>>;

/// Generates [`NormKind`] (each variant's serde name the entry's), `ALL`, `name()` and
/// `method()` from one list of `Kind = "config_name" => METHOD` entries.
macro_rules! registry {
    ($($(#[$doc:meta])* $kind:ident = $name:literal => $method:expr,)*) => {
        /// The normalization methods, as configs name them.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum NormKind {
            $($(#[$doc])* #[serde(rename = $name)] $kind,)*
        }

        impl NormKind {
            /// Every method, in the registry's order.
            pub const ALL: [NormKind; [$($name),*].len()] = [$(NormKind::$kind),*];

            /// The method's name in configs (serde's).
            pub fn name(self) -> &'static str {
                match self {
                    $(NormKind::$kind => $name,)*
                }
            }

            /// The method's entry.
            pub(crate) fn method(self) -> &'static Method {
                match self {
                    $(NormKind::$kind => &$method,)*
                }
            }
        }
    };
}

registry! {
    /// No normalization: a plain kernel, its bias and a ReLU.
    None = "none" => NONE,
    /// Weight norm (Salimans & Kingma 2016), with its data-dependent init.
    WeightNorm = "weight_norm" => WEIGHT_NORM,
    /// Weight norm with mean-only batch norm (ibid.).
    WnMeanOnlyBn = "wn_mean_only_bn" => WN_MEAN_ONLY_BN,
    BatchNorm = "batch_norm" => BATCH_NORM,
    LayerNorm = "layer_norm" => LAYER_NORM,
    /// Singular value bounding (Jia et al. 2017).
    Svb = "svb" => SVB,
    /// SVB with bounded batch norm.
    Bbn = "bbn" => BBN,
    RmsNorm = "rms_norm" => RMS_NORM,
    GroupNorm = "group_norm" => GROUP_NORM,
    /// Batch renormalization (Ioffe 2017).
    BatchRenorm = "batch_renorm" => BATCH_RENORM,
    /// Weight norm with its direction projected to unit norm after every step.
    WnProjected = "wn_projected" => WN_PROJECTED,
    /// Normalize-and-Project (Lyle et al. 2024): layer norm, weights held at their
    /// initial norm.
    Nap = "nap" => NAP,
    /// SimbaV2's hyperspherical layers (Lee et al. 2025).
    Hyperspherical = "hyperspherical" => HYPERSPHERICAL,
}

/// Normalization settings; every field has a default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NormConfig {
    /// Which method normalizes the hidden layers.
    pub kind: NormKind,
    /// Learning-rate multiplier of the weight-norm gains `g` (the paper's ablation
    /// favours 10).
    pub g_lr_scale: f64,
    /// Weight-normalize the output layer too (weight-norm methods only).
    pub wn_output_layer: bool,
    /// Weight norm's data-dependent init on the first batch.
    pub data_dependent_init: bool,
    /// Weight of the new batch in BN running statistics.
    pub bn_momentum: f64,
    /// BN's variance epsilon (> 0).
    pub bn_eps: f64,
    /// LN's variance epsilon, and RMSNorm's and GN's (> 0).
    pub ln_eps: f64,
    /// Group norm's groups per layer; it must divide every hidden layer's units or
    /// channels.
    pub groups: usize,
    /// SVB bound: singular values are kept in `[1/(1+eps), 1+eps]`.
    pub svb_eps: f64,
    /// Optimizer steps between SVB projections.
    pub svb_interval: u64,
    /// BBN bound on the relative per-channel gains: each within `[1/(1+eps), 1+eps]`
    /// of the layer's mean gain. 0.5: with 0.2 BBN did not learn CartPole (best
    /// evaluations 72, 111, 74 on seeds 1-3), with 0.5 it does on 4 of 5 seeds.
    pub bbn_eps: f64,
    /// Batch renormalization's bound on `r` (>= 1): `r` in `[1/r_max, r_max]`.
    pub brn_r_max: f64,
    /// Batch renormalization's bound on `d` (>= 0): `d` in `[-d_max, d_max]`.
    pub brn_d_max: f64,
    /// Updates of plain batch norm before batch renormalization's clip opens.
    pub brn_warmup: u64,
    /// Hyperspherical layers' head: a free linear layer (default), or SimbaV2's form,
    /// unit rows times a learnable scaler plus a bias.
    pub sphere_head: SphereHead,
}

/// The output layer of a hyperspherical Q-network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SphereHead {
    /// A plain linear layer with its bias, free as NaP leaves its output layer: a
    /// scalar Q-value gets its magnitude there.
    #[serde(rename = "linear")]
    Linear,
    /// SimbaV2's head: unit-norm rows projected every step, a per-action scaler
    /// (init 1), a bias. SimbaV2's categorical head takes its magnitude from a fixed
    /// support; a scalar Q's must grow in the scaler, by about one learning rate a step.
    #[serde(rename = "scaled")]
    Scaled,
}

impl NormConfig {
    /// Batch renormalization's clip and warm-up.
    pub fn renorm(&self) -> RenormConfig {
        RenormConfig {
            r_max: self.brn_r_max,
            d_max: self.brn_d_max,
            warmup: self.brn_warmup,
        }
    }
}

impl Default for NormConfig {
    fn default() -> Self {
        Self {
            kind: NormKind::None,
            g_lr_scale: 1.0,
            wn_output_layer: true,
            data_dependent_init: true,
            bn_momentum: 0.1,
            bn_eps: 1e-5,
            ln_eps: 1e-5,
            groups: 4,
            svb_eps: 0.05,
            svb_interval: 200,
            bbn_eps: 0.5,
            brn_r_max: 3.0,
            brn_d_max: 5.0,
            brn_warmup: 1000,
            sphere_head: SphereHead::Linear,
        }
    }
}

impl NormConfig {
    /// Range problems, each as `(field, what is allowed)`.
    pub fn problems(&self) -> Vec<(&'static str, &'static str)> {
        let mut p = vec![];
        if !positive(self.g_lr_scale) {
            p.push(("g_lr_scale", "a positive number"));
        }
        if !(self.bn_momentum > 0.0 && self.bn_momentum <= 1.0) {
            p.push(("bn_momentum", "a number in (0, 1]"));
        }
        if !positive(self.bn_eps) {
            p.push(("bn_eps", "a positive number"));
        }
        if !positive(self.ln_eps) {
            p.push(("ln_eps", "a positive number"));
        }
        if self.groups == 0 {
            p.push(("groups", "a positive integer"));
        }
        if !non_negative(self.svb_eps) {
            p.push(("svb_eps", "a non-negative number"));
        }
        if self.svb_interval == 0 {
            p.push(("svb_interval", "a positive integer"));
        }
        if !non_negative(self.bbn_eps) {
            p.push(("bbn_eps", "a non-negative number"));
        }
        if !(self.brn_r_max >= 1.0 && self.brn_r_max.is_finite()) {
            p.push(("brn_r_max", "a finite number >= 1"));
        }
        if !non_negative(self.brn_d_max) {
            p.push(("brn_d_max", "a finite number >= 0"));
        }
        p
    }
}

/// The forms of a layer without an activation normalization.
fn no_norm(_: &mut ParamStore, _: &str, _: &[usize], _: &NormConfig) -> Result<Norm> {
    Ok(Norm::None)
}

fn no_stacked(_: &mut Take, _: &NormConfig) -> Result<Option<Box<dyn Normalization>>> {
    Ok(None)
}

fn batch_norm(store: &mut ParamStore, prefix: &str, out: &[usize], c: &NormConfig) -> Result<Norm> {
    let bn = BatchNorm::new(store, prefix, out[0], c.bn_momentum, c.bn_eps)?;
    Ok(Norm::Batch(bn))
}

fn stacked_batch_norm(take: &mut Take, c: &NormConfig) -> Result<Option<Box<dyn Normalization>>> {
    Ok(Some(Box::new(stacked_bn(take, c, None)?)))
}

/// A population's batch norm, renormalized with `renorm`.
fn stacked_bn(take: &mut Take, c: &NormConfig, renorm: Option<RenormConfig>) -> Result<BatchNorm> {
    BatchNorm::stack(take, (c.bn_momentum, c.bn_eps), renorm)
}

const NONE: Method = Method {
    kernel: Kernel::Plain,
    keeps_bias: true,
    after_step: AfterStep::Nothing,
    head: None,
    single: no_norm,
    stacked: no_stacked,
};

const WEIGHT_NORM: Method = Method {
    kernel: Kernel::Normed,
    ..NONE
};

const WN_MEAN_ONLY_BN: Method = Method {
    kernel: Kernel::Normed,
    single: |store, prefix, out, c| {
        let bn = MeanOnlyBn::new(store, prefix, out[0], c.bn_momentum)?;
        Ok(Norm::MeanOnly(bn))
    },
    stacked: |take, c| Ok(Some(Box::new(MeanOnlyBn::stack(take, c.bn_momentum)?))),
    ..NONE
};

const BATCH_NORM: Method = Method {
    keeps_bias: false,
    single: batch_norm,
    stacked: stacked_batch_norm,
    ..NONE
};

const BATCH_RENORM: Method = Method {
    single: |store, prefix, out, c| {
        let settings = (c.bn_momentum, c.bn_eps);
        let bn = BatchNorm::renormalized(store, prefix, out[0], settings, c.renorm())?;
        Ok(Norm::Batch(bn))
    },
    stacked: |take, c| Ok(Some(Box::new(stacked_bn(take, c, Some(c.renorm()))?))),
    ..BATCH_NORM
};

const LAYER_NORM: Method = Method {
    keeps_bias: false,
    single: |store, prefix, out, c| Ok(Norm::Layer(LayerNorm::new(store, prefix, out, c.ln_eps)?)),
    stacked: |take, c| Ok(Some(Box::new(LayerNorm::stack(take, c.ln_eps)?))),
    ..NONE
};

const GROUP_NORM: Method = Method {
    single: |store, prefix, out, c| {
        let gn = GroupNorm::new(store, prefix, out, c.groups, c.ln_eps)?;
        Ok(Norm::Group(gn))
    },
    stacked: |take, c| Ok(Some(Box::new(GroupNorm::stack(take, c.groups, c.ln_eps)?))),
    ..LAYER_NORM
};

const RMS_NORM: Method = Method {
    single: |store, prefix, out, c| Ok(Norm::Rms(RmsNorm::new(store, prefix, out, c.ln_eps)?)),
    stacked: |take, c| Ok(Some(Box::new(RmsNorm::stack(take, c.ln_eps)?))),
    ..LAYER_NORM
};

const SVB: Method = Method {
    kernel: Kernel::Orthogonal,
    after_step: AfterStep::Svb,
    single: no_norm,
    stacked: |_, c| Ok(Some(Box::new(Svb::new(c.svb_interval, c.svb_eps, None)))),
    ..NONE
};

const BBN: Method = Method {
    keeps_bias: false,
    single: batch_norm,
    stacked: |take, c| {
        let bbn: Box<dyn Normalization> = Box::new(stacked_bn(take, c, None)?);
        let form = Svb::new(c.svb_interval, c.svb_eps, Some((bbn, c.bbn_eps)));
        Ok(Some(Box::new(form)))
    },
    ..SVB
};

const WN_PROJECTED: Method = Method {
    after_step: AfterStep::UnitRows,
    ..WEIGHT_NORM
};

const NAP: Method = Method {
    after_step: AfterStep::InitialNorm,
    ..LAYER_NORM
};

const HYPERSPHERICAL: Method = Method {
    kernel: Kernel::Orthogonal,
    keeps_bias: false,
    after_step: AfterStep::UnitRows,
    head: Some(HeadForm {
        single: |store, prefix, actions, c| match c.sphere_head {
            SphereHead::Scaled => Ok(Some(Norm::Sphere(Hyperspherical::head(
                store, prefix, actions,
            )?))),
            SphereHead::Linear => Ok(None),
        },
        stacked: |take, c| match c.sphere_head {
            SphereHead::Scaled => Ok(Some(Box::new(Hyperspherical::stack(take, true)?))),
            SphereHead::Linear => Ok(None),
        },
    }),
    single: |store, prefix, out, _| Ok(Norm::Sphere(Hyperspherical::hidden(store, prefix, out)?)),
    stacked: |take, _| Ok(Some(Box::new(Hyperspherical::stack(take, false)?))),
};

impl NormKind {
    /// Hidden layers are weight-normalized.
    pub fn uses_weight_norm(self) -> bool {
        self.method().kernel == Kernel::Normed
    }

    /// See [`Method::keeps_bias`].
    pub fn keeps_bias(self) -> bool {
        self.method().keeps_bias
    }

    /// Hidden weights are projected by SVB.
    pub fn uses_svb(self) -> bool {
        self.method().after_step == AfterStep::Svb
    }
}

impl std::fmt::Display for NormKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use serde::de::value::{Error, StrDeserializer};
    use serde::de::IntoDeserializer;
    use serde::Deserialize;

    use super::NormKind;

    /// Serde reads each kind's name as that kind, and the names are distinct.
    #[test]
    fn names_are_serdes() {
        for kind in NormKind::ALL {
            let name: StrDeserializer<Error> = kind.name().into_deserializer();
            assert_eq!(NormKind::deserialize(name).unwrap(), kind);
        }
        let mut names: Vec<_> = NormKind::ALL.iter().map(|k| k.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), NormKind::ALL.len());
    }
}
