//! The registry of normalization methods: the presets ([`NormKind`], each a pair of a
//! weight rule and an activation normalization, `parts.rs`, with its report color),
//! written once in [`registry!`]'s one list below; each activation's forms for a single
//! network (`new`) and a population (`stack`); the settings, [`NormConfig`], and a
//! layer's [`Method`] composed from its two parts. The methods' files
//! (`methods/`) take plain settings, not this file's types: the registry imports them,
//! never the other way. Tests and benches iterate [`NormKind::ALL`] and
//! [`NormConfig::every_method`]. Adding a method: `docs/design.md`, "Adding a method".

use candle_core::Result;
use serde::{Deserialize, Serialize};

use super::norm::Norm;
use super::normalization::{Normalization, Take};
use super::parts::{refusal, Activation, AfterStep, Kernel, WeightRule};
use super::{BatchNorm, GroupNorm, Hyperspherical, LayerNorm, MeanOnlyBn, ParamStore};
use super::{RenormConfig, RmsNorm};
use crate::check::{non_negative, positive};

/// What a hidden layer of a method is, for the code that builds and steps networks of
/// it: composed from the method's two parts ([`NormConfig::method`]).
pub(crate) struct Method {
    pub kernel: Kernel,
    /// See [`Activation::keeps_bias`].
    pub keeps_bias: bool,
    /// The weight rule's step after the optimizer's.
    pub after_step: AfterStep,
    /// A single network's normalization of the layer.
    pub single: SingleForm,
}

/// Generates [`NormKind`] (each variant's serde name the entry's), `ALL`, `name()`,
/// `parts()` and `color()` from one list of
/// `Kind = "config_name" => (weight, activation) in (r, g, b)` entries.
macro_rules! registry {
    ($($(#[$doc:meta])* $kind:ident = $name:literal => ($weight:ident, $activation:ident) in $color:expr,)*) => {
        /// The normalization methods, as configs name them (`norm.kind`): each a preset
        /// of a weight rule and an activation normalization.
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

            /// The method's two parts.
            pub fn parts(self) -> (WeightRule, Activation) {
                match self {
                    $(NormKind::$kind => (WeightRule::$weight, Activation::$activation),)*
                }
            }

            /// The method's color in every report's figures, as RGB (Okabe-Ito's and
            /// Tol's colorblind-safe sets; the baseline, `none`, black).
            pub fn color(self) -> (u8, u8, u8) {
                match self {
                    $(NormKind::$kind => $color,)*
                }
            }
        }
    };
}

registry! {
    /// No normalization: a plain kernel, its bias and a ReLU.
    None = "none" => (Plain, None) in (0, 0, 0),
    /// Weight norm (Salimans & Kingma 2016), with its data-dependent init.
    WeightNorm = "weight_norm" => (WeightNorm, None) in (0, 114, 178),
    /// Weight norm with mean-only batch norm (ibid.).
    WnMeanOnlyBn = "wn_mean_only_bn" => (WeightNorm, MeanOnly) in (136, 34, 85),
    BatchNorm = "batch_norm" => (Plain, BatchNorm) in (213, 94, 0),
    LayerNorm = "layer_norm" => (Plain, LayerNorm) in (0, 158, 115),
    /// Singular value bounding (Jia et al. 2017).
    Svb = "svb" => (Svb, None) in (68, 170, 153),
    /// SVB with bounded batch norm.
    Bbn = "bbn" => (Svb, BoundedBatchNorm) in (170, 68, 153),
    RmsNorm = "rms_norm" => (Plain, RmsNorm) in (51, 34, 136),
    GroupNorm = "group_norm" => (Plain, GroupNorm) in (86, 180, 233),
    /// Batch renormalization (Ioffe 2017).
    BatchRenorm = "batch_renorm" => (Plain, BatchRenorm) in (230, 159, 0),
    /// Weight norm with its direction projected to unit norm after every step.
    WnProjected = "wn_projected" => (Projected, None) in (153, 153, 51),
    /// Normalize-and-Project (Lyle et al. 2024): layer norm, weights held at their
    /// initial norm.
    Nap = "nap" => (FixedNorm, LayerNorm) in (17, 119, 51),
    /// SimbaV2's hyperspherical layers (Lee et al. 2025).
    Hyperspherical = "hyperspherical" => (UnitRows, UnitFeatures) in (221, 204, 119),
}

impl NormKind {
    /// The preset that is this pair of parts, if one is.
    pub fn of(weight: WeightRule, activation: Activation) -> Option<NormKind> {
        NormKind::ALL
            .into_iter()
            .find(|k| k.parts() == (weight, activation))
    }
}

/// The pairs of parts that no preset names and that the methods of 2025 are made of:
/// unit-row weights with batch norm (CrossQ with weight norm's and XQC's layers), and
/// weight norm with layer norm. Tests and benches run them beside the presets.
pub const COMBINATIONS: [(WeightRule, Activation); 2] = [
    (WeightRule::UnitRows, Activation::BatchNorm),
    (WeightRule::WeightNorm, Activation::LayerNorm),
];

impl NormConfig {
    /// Every preset with the default settings, then each of [`COMBINATIONS`].
    pub fn every_method() -> Vec<NormConfig> {
        let presets = NormKind::ALL.into_iter().map(NormConfig::from);
        let pairs = COMBINATIONS
            .into_iter()
            .map(|(weight, activation)| NormConfig {
                weight,
                activation,
                ..NormConfig::default()
            });
        presets.chain(pairs).collect()
    }
}

impl NormConfig {
    /// The method `name` names, with the default settings: a preset's name, or two
    /// parts as `weight+activation` (as reports and `--dry-run` write a pair); a pair
    /// that cannot train is refused with the reason.
    pub fn from_name(name: &str) -> std::result::Result<NormConfig, String> {
        if let Some(kind) = NormKind::ALL.into_iter().find(|k| k.name() == name) {
            return Ok(kind.into());
        }
        let presets: Vec<&str> = NormKind::ALL.iter().map(|k| k.name()).collect();
        let unknown = || {
            format!(
                "unknown method '{name}': expected a preset ({}) or weight+activation",
                presets.join(", ")
            )
        };
        let (w, a) = name.split_once('+').ok_or_else(unknown)?;
        let weight = WeightRule::ALL.into_iter().find(|p| p.name() == w);
        let activation = Activation::ALL.into_iter().find(|p| p.name() == a);
        let (Some(weight), Some(activation)) = (weight, activation) else {
            return Err(unknown());
        };
        if let Some(why) = refusal(weight, activation) {
            return Err(format!("{name}: norm.activation must be {why}"));
        }
        Ok(NormConfig {
            weight,
            activation,
            ..NormConfig::default()
        })
    }
}

impl From<NormKind> for NormConfig {
    /// The default settings with `kind`'s two parts.
    fn from(kind: NormKind) -> Self {
        let (weight, activation) = kind.parts();
        Self {
            weight,
            activation,
            ..Self::default()
        }
    }
}

/// Normalization settings; every field has a default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NormConfig {
    /// How the hidden layers' weights are kept (`norm.weight`).
    pub weight: WeightRule,
    /// What normalizes the hidden layers' activations (`norm.activation`).
    pub activation: Activation,
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
    /// With `unit_rows` weights, the output layer: a free linear layer (default), unit
    /// rows and a bias, or SimbaV2's form, unit rows times a learnable scaler plus a
    /// bias.
    pub sphere_head: SphereHead,
}

/// The output layer of a network whose weights are `unit_rows`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SphereHead {
    /// A plain linear layer with its bias, free as NaP and CrossQ with weight norm leave
    /// their output layers: a scalar Q-value gets its magnitude there.
    #[serde(rename = "linear")]
    Linear,
    /// Unit-norm rows projected every step, as the hidden layers', and a bias (XQC's
    /// output layer, and CrossQ with weight norm's camera-ready code).
    #[serde(rename = "unit_rows")]
    UnitRows,
    /// SimbaV2's head: unit-norm rows projected every step, a per-action scaler
    /// (init 1), a bias. SimbaV2's categorical head takes its magnitude from a fixed
    /// support; a scalar Q's must grow in the scaler, by about one learning rate a step.
    #[serde(rename = "scaled")]
    Scaled,
}

impl NormConfig {
    /// The preset that is this config's pair of parts, if one is.
    pub fn kind(&self) -> Option<NormKind> {
        NormKind::of(self.weight, self.activation)
    }

    /// The method's name: its preset's, or its two parts' as `weight+activation`.
    pub fn name(&self) -> String {
        match self.kind() {
            Some(kind) => kind.name().to_string(),
            None => format!("{}+{}", self.weight, self.activation),
        }
    }

    /// What a hidden layer of this method is: the weight rule's kernel and step, the
    /// activation side's normalization and bias.
    pub(crate) fn method(&self) -> Method {
        Method {
            kernel: self.weight.kernel(),
            keeps_bias: self.activation.keeps_bias(),
            after_step: self.weight.after_step(),
            single: self.activation.single(),
        }
    }

    /// A population's form of a hidden layer's normalization: the activation side's.
    pub(crate) fn stacked_hidden(&self, take: &mut Take) -> Result<Option<Box<dyn Normalization>>> {
        (self.activation.stacked())(take, self)
    }

    /// The output layer's own form, where the weight rule has one with a normalization
    /// of its own (SimbaV2's scaled head), for a single network.
    pub(crate) fn head(
        &self,
        store: &mut ParamStore,
        prefix: &str,
        actions: usize,
    ) -> Result<Option<Norm>> {
        match self.head_rows() {
            Some(SphereHead::Scaled) => Ok(Some(Norm::Sphere(Hyperspherical::head(
                store, prefix, actions,
            )?))),
            _ => Ok(None),
        }
    }

    /// The same for a population, from the agents' stacked variables.
    pub(crate) fn stacked_head(&self, take: &mut Take) -> Result<Option<Box<dyn Normalization>>> {
        match self.head_rows() {
            Some(SphereHead::Scaled) => Ok(Some(Box::new(Hyperspherical::stack(take, true)?))),
            _ => Ok(None),
        }
    }

    /// With `unit_rows` weights, a head of unit rows (plain or scaled); else `None`.
    pub(crate) fn head_rows(&self) -> Option<SphereHead> {
        match (self.weight, self.sphere_head) {
            (WeightRule::UnitRows, SphereHead::UnitRows | SphereHead::Scaled) => {
                Some(self.sphere_head)
            }
            _ => None,
        }
    }

    /// SVB bounds a bounded batch norm's gains when it projects (BBN).
    pub(crate) fn bounds_gains(&self) -> bool {
        self.weight == WeightRule::Svb && self.activation == Activation::BoundedBatchNorm
    }

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
            weight: WeightRule::Plain,
            activation: Activation::None,
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
    /// Range problems and pairs that cannot train, each as `(field, what is allowed)`.
    pub fn problems(&self) -> Vec<(&'static str, &'static str)> {
        let mut p = vec![];
        if let Some(why) = refusal(self.weight, self.activation) {
            p.push(("activation", why));
        }
        if self.sphere_head != SphereHead::Linear && self.weight != WeightRule::UnitRows {
            p.push((
                "sphere_head",
                "\"linear\" unless norm.weight = \"unit_rows\" (it is the head of unit-row networks)",
            ));
        }
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

/// A single network's normalization of a hidden layer whose one sample's output has
/// shape `out_shape` (its variables named `prefix.*`).
pub(crate) type SingleForm = fn(&mut ParamStore, &str, &[usize], &NormConfig) -> Result<Norm>;
/// A population's, its variables taken from the agents' stacked ones; `None` for a layer
/// without one.
pub(crate) type StackedForm = fn(&mut Take, &NormConfig) -> Result<Option<Box<dyn Normalization>>>;

/// The activation side's forms, built here (the parts' file names no type of a
/// method's).
impl Activation {
    /// A single network's form of the activation side.
    pub(crate) fn single(self) -> SingleForm {
        match self {
            Activation::None => |_, _, _, _| Ok(Norm::None),
            Activation::BatchNorm | Activation::BoundedBatchNorm => |store, prefix, out, c| {
                let bn = BatchNorm::new(store, prefix, out[0], c.bn_momentum, c.bn_eps)?;
                Ok(Norm::Batch(bn))
            },
            Activation::BatchRenorm => |store, prefix, out, c| {
                let settings = (c.bn_momentum, c.bn_eps);
                let bn = BatchNorm::renormalized(store, prefix, out[0], settings, c.renorm())?;
                Ok(Norm::Batch(bn))
            },
            Activation::MeanOnly => |store, prefix, out, c| {
                let bn = MeanOnlyBn::new(store, prefix, out[0], c.bn_momentum)?;
                Ok(Norm::MeanOnly(bn))
            },
            Activation::LayerNorm => |store, prefix, out, c| {
                Ok(Norm::Layer(LayerNorm::new(store, prefix, out, c.ln_eps)?))
            },
            Activation::GroupNorm => |store, prefix, out, c| {
                let gn = GroupNorm::new(store, prefix, out, c.groups, c.ln_eps)?;
                Ok(Norm::Group(gn))
            },
            Activation::RmsNorm => {
                |store, prefix, out, c| Ok(Norm::Rms(RmsNorm::new(store, prefix, out, c.ln_eps)?))
            }
            Activation::UnitFeatures => |store, prefix, out, _| {
                Ok(Norm::Sphere(Hyperspherical::hidden(store, prefix, out)?))
            },
        }
    }

    /// A population's form of the activation side.
    pub(crate) fn stacked(self) -> StackedForm {
        match self {
            Activation::None => |_, _| Ok(None),
            Activation::BatchNorm | Activation::BoundedBatchNorm => |take, c| {
                let bn = BatchNorm::stack(take, (c.bn_momentum, c.bn_eps), None)?;
                Ok(Some(Box::new(bn)))
            },
            Activation::BatchRenorm => |take, c| {
                let bn = BatchNorm::stack(take, (c.bn_momentum, c.bn_eps), Some(c.renorm()))?;
                Ok(Some(Box::new(bn)))
            },
            Activation::MeanOnly => {
                |take, c| Ok(Some(Box::new(MeanOnlyBn::stack(take, c.bn_momentum)?)))
            }
            Activation::LayerNorm => {
                |take, c| Ok(Some(Box::new(LayerNorm::stack(take, c.ln_eps)?)))
            }
            Activation::GroupNorm => {
                |take, c| Ok(Some(Box::new(GroupNorm::stack(take, c.groups, c.ln_eps)?)))
            }
            Activation::RmsNorm => |take, c| Ok(Some(Box::new(RmsNorm::stack(take, c.ln_eps)?))),
            Activation::UnitFeatures => {
                |take, _| Ok(Some(Box::new(Hyperspherical::stack(take, false)?)))
            }
        }
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

    /// A method's name reads back as the method: every preset's, a pair's as
    /// `weight+activation`; a pair that cannot train and an unknown name are refused.
    #[test]
    fn every_method_reads_back_from_its_name() {
        use super::NormConfig;
        for method in NormConfig::every_method() {
            assert_eq!(NormConfig::from_name(&method.name()), Ok(method.clone()));
        }
        let pair = NormConfig::from_name("projected+layer_norm").unwrap();
        assert_eq!(pair.name(), "projected+layer_norm");
        assert!(NormConfig::from_name("plain+bounded_batch_norm").is_err());
        assert!(
            NormConfig::from_name("svb+bounded_batch_norm")
                .unwrap()
                .kind()
                == Some(NormKind::Bbn)
        );
        assert!(NormConfig::from_name("plain+sideways").is_err());
    }
}
