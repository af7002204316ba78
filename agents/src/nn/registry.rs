//! The registry of normalization methods: each kind's config name, its hidden layers'
//! kernel and bias, and its normalization for a single network and for a population,
//! written once, in [`registry!`]'s one list below. [`NormKind`], its config names
//! (serde's), [`NormKind::ALL`] and every question about a kind are generated from that
//! list; tests and benches iterate [`NormKind::ALL`]. Adding a method: its file in
//! `nn/`, its kernels if any, one entry here, its section in `docs/methods.md`
//! (`docs/design.md`, "Adding a method").

use candle_core::Result;
use serde::{Deserialize, Serialize};

use super::layer::Norm;
use super::stacked::{StackedNorm, Take};
use super::{batch_norm, group_norm, layer_norm, mean_only_bn, rms_norm, svb};
use super::{BatchNorm, GroupNorm, LayerNorm, MeanOnlyBn, NormConfig, ParamStore, RmsNorm};

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

/// What a method is, for the code that builds and steps networks of it.
pub(crate) struct Method {
    pub kernel: Kernel,
    /// The hidden layers keep a bias after the normalization: not where the method has a
    /// shift of its own (batch and layer norm's `beta`) or, as RMSNorm, none at all.
    pub keeps_bias: bool,
    /// The weight is projected every `svb_interval` optimizer steps (SVB's bound of the
    /// singular values; BBN bounds its gains then too): the method's step after the
    /// optimizer's, `svb::after_step`, for a single network and a population alike.
    pub projects: bool,
    /// A single network's normalization of a hidden layer of `units` units whose one
    /// sample's output has shape `out_shape` (its variables named `prefix.*`).
    pub single: SingleForm,
    /// The population's form of a hidden layer's normalization, its variables taken from
    /// the agents' stacked ones; `None` for a layer without one.
    pub stacked: StackedForm,
}

pub(crate) type SingleForm = fn(&mut ParamStore, &str, &[usize], &NormConfig) -> Result<Norm>;
pub(crate) type StackedForm = fn(&mut Take, &NormConfig) -> Result<Option<Box<dyn StackedNorm>>>;

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
}

/// The forms of a layer without an activation normalization.
fn no_norm(_: &mut ParamStore, _: &str, _: &[usize], _: &NormConfig) -> Result<Norm> {
    Ok(Norm::None)
}

fn no_stacked(_: &mut Take, _: &NormConfig) -> Result<Option<Box<dyn StackedNorm>>> {
    Ok(None)
}

fn batch_norm(store: &mut ParamStore, prefix: &str, out: &[usize], c: &NormConfig) -> Result<Norm> {
    let bn = BatchNorm::new(store, prefix, out[0], c.bn_momentum, c.bn_eps)?;
    Ok(Norm::Batch(bn))
}

fn stacked_batch_norm(take: &mut Take, c: &NormConfig) -> Result<Option<Box<dyn StackedNorm>>> {
    Ok(Some(Box::new(batch_norm::StackedBatchNorm::stack(
        take, c,
    )?)))
}

const NONE: Method = Method {
    kernel: Kernel::Plain,
    keeps_bias: true,
    projects: false,
    single: no_norm,
    stacked: no_stacked,
};

const WEIGHT_NORM: Method = Method {
    kernel: Kernel::Normed,
    ..NONE
};

const WN_MEAN_ONLY_BN: Method = Method {
    kernel: Kernel::Normed,
    keeps_bias: true,
    projects: false,
    single: |store, prefix, out, c| {
        let bn = MeanOnlyBn::new(store, prefix, out[0], c.bn_momentum)?;
        Ok(Norm::MeanOnly(bn))
    },
    stacked: |take, c| {
        Ok(Some(Box::new(mean_only_bn::StackedMeanOnly::stack(
            take, c,
        )?)))
    },
};

const BATCH_NORM: Method = Method {
    kernel: Kernel::Plain,
    keeps_bias: false,
    projects: false,
    single: batch_norm,
    stacked: stacked_batch_norm,
};

const BATCH_RENORM: Method = Method {
    single: |store, prefix, out, c| {
        let settings = (c.bn_momentum, c.bn_eps);
        let bn = BatchNorm::renormalized(store, prefix, out[0], settings, c.renorm())?;
        Ok(Norm::Batch(bn))
    },
    ..BATCH_NORM
};

const LAYER_NORM: Method = Method {
    kernel: Kernel::Plain,
    keeps_bias: false,
    projects: false,
    single: |store, prefix, out, c| Ok(Norm::Layer(LayerNorm::new(store, prefix, out, c.ln_eps)?)),
    // Group norm with one group: each sample over all its features.
    stacked: |take, c| {
        let (gamma, beta) = layer_norm::stacked_vars(take)?;
        let form = group_norm::StackedGroupNorm::new(gamma, beta, 1, c.ln_eps);
        Ok(Some(Box::new(form)))
    },
};

const GROUP_NORM: Method = Method {
    single: |store, prefix, out, c| {
        let gn = GroupNorm::new(store, prefix, out, c.groups, c.ln_eps)?;
        Ok(Norm::Group(gn))
    },
    stacked: |take, c| {
        Ok(Some(Box::new(group_norm::StackedGroupNorm::stack(
            take, c,
        )?)))
    },
    ..LAYER_NORM
};

const RMS_NORM: Method = Method {
    single: |store, prefix, out, c| Ok(Norm::Rms(RmsNorm::new(store, prefix, out, c.ln_eps)?)),
    stacked: |take, c| Ok(Some(Box::new(rms_norm::StackedRmsNorm::stack(take, c)?))),
    ..LAYER_NORM
};

const SVB: Method = Method {
    kernel: Kernel::Orthogonal,
    keeps_bias: true,
    projects: true,
    single: no_norm,
    stacked: |_, c| Ok(Some(Box::new(svb::StackedSvb::new(c, None)))),
};

const BBN: Method = Method {
    kernel: Kernel::Orthogonal,
    keeps_bias: false,
    projects: true,
    single: batch_norm,
    stacked: |take, c| {
        let bn = batch_norm::StackedBatchNorm::stack(take, c)?;
        Ok(Some(Box::new(svb::StackedSvb::new(c, Some(Box::new(bn))))))
    },
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
        self.method().projects
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
