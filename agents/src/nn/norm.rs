//! A single network's normalization of a hidden layer, one variant per type that
//! implements [`Normalization`] (a kind of the registry may share a type: batch norm,
//! batch renormalization and BBN are `Batch`), and [`with_method!`], which dispatches
//! on it statically on the host path's hot loop. (A population's layer holds its
//! normalization as a `Box<dyn Normalization>`: its calls are one per layer and batch
//! of agents.)

use super::normalization::{Identity, Normalization};
use super::{BatchNorm, GroupNorm, Hyperspherical, LayerNorm, MeanOnlyBn, RmsNorm};

pub(crate) enum Norm {
    None,
    MeanOnly(MeanOnlyBn),
    Batch(BatchNorm),
    Layer(LayerNorm),
    Rms(RmsNorm),
    Group(GroupNorm),
    Sphere(Hyperspherical),
}

impl Norm {
    /// The method behind the layer's activation normalization, as a trait object (for
    /// the calls off the hot path; [`with_method!`] dispatches statically).
    pub(crate) fn method(&self) -> &dyn Normalization {
        with_method!(self, |m| m)
    }
}

/// Evaluates `$body` with `$m` bound to the layer's [`Normalization`], one arm per
/// method, so that each call is static and inlined (a trait-object call per layer cost
/// acting on a small MLP about 5%, measured).
macro_rules! with_method {
    ($norm:expr, |$m:ident| $body:expr) => {
        match $norm {
            Norm::None => {
                let $m = &Identity;
                $body
            }
            Norm::MeanOnly($m) => $body,
            Norm::Batch($m) => $body,
            Norm::Layer($m) => $body,
            Norm::Rms($m) => $body,
            Norm::Group($m) => $body,
            Norm::Sphere($m) => $body,
        }
    };
}
pub(crate) use with_method;
