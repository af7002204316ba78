//! A method's two parts, which combine freely (`docs/methods.md`, "Methods as parts"):
//! the weight side ([`WeightRule`]: how a layer's kernel weight is parameterized, started
//! and kept after each optimizer step) and the activation side ([`Activation`]: what
//! normalizes the kernel's output). Each part's facts sit beside its enum; the registry
//! (`registry.rs`) names today's 13 methods as presets of the two, builds each
//! activation's forms and composes a layer's method from the two.

use serde::{Deserialize, Serialize};

/// Generates a part's enum (each variant's serde name the entry's), `ALL` and `name()`
/// from one list of `Variant = "config_name"` entries.
macro_rules! part {
    ($(#[$enum_doc:meta])* $part:ident { $($(#[$doc:meta])* $variant:ident = $name:literal,)* }) => {
        $(#[$enum_doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum $part {
            $($(#[$doc])* #[serde(rename = $name)] $variant,)*
        }

        impl $part {
            /// Every value, in the list's order.
            pub const ALL: [$part; [$($name),*].len()] = [$($part::$variant),*];

            /// The value's name in configs (serde's).
            pub fn name(self) -> &'static str {
                match self {
                    $($part::$variant => $name,)*
                }
            }
        }

        impl std::fmt::Display for $part {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

part! {
    /// The weight side: how every hidden layer's kernel weight is kept (`norm.weight`):
    /// `plain`, `w` as it is, uniform in `±1/sqrt(fan_in)` at init; `weight_norm`,
    /// `g v / ||v||` (Salimans & Kingma 2016) with its data-dependent init; `projected`,
    /// weight norm with `v` back on the unit sphere after every step; `unit_rows`, each
    /// unit's incoming weights at unit norm, from an orthogonal init, after init and every
    /// step (SimbaV2's, CrossQ with weight norm's, XQC's); `fixed_norm`, held at its norm
    /// at init after every step, with a layer norm's gain and offset jointly (NaP's);
    /// `svb`, its singular values bounded every `svb_interval` steps (Jia et al. 2017),
    /// from an orthogonal init.
    WeightRule {
        Plain = "plain", WeightNorm = "weight_norm", Projected = "projected",
        UnitRows = "unit_rows", FixedNorm = "fixed_norm", Svb = "svb",
    }
}

part! {
    /// The activation side: what normalizes a hidden layer's kernel output
    /// (`norm.activation`): `none`; `batch_norm`; `mean_only`, the batch mean subtracted,
    /// no scale (Salimans & Kingma 2016); `batch_renorm` (Ioffe 2017);
    /// `bounded_batch_norm`, BBN's batch norm, its gains bounded when SVB projects (so
    /// with `svb` only); `layer_norm`; `group_norm`; `rms_norm`; `unit_features`,
    /// SimbaV2's per-unit scaler, then each sample's features put on the unit sphere.
    Activation {
        None = "none", BatchNorm = "batch_norm", MeanOnly = "mean_only",
        BatchRenorm = "batch_renorm", BoundedBatchNorm = "bounded_batch_norm",
        LayerNorm = "layer_norm", GroupNorm = "group_norm", RmsNorm = "rms_norm",
        UnitFeatures = "unit_features",
    }
}

/// A hidden layer's kernel weight, as a weight rule starts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// `w`, uniform in `±1/sqrt(fan_in)` (PyTorch's default).
    Plain,
    /// Weight norm's `w = g v / ||v||`.
    Normed,
    /// An orthogonal `w` (SVB's and SimbaV2's start: every singular value 1).
    Orthogonal,
}

/// The weight rule's work on a layer after an optimizer step, inside the update, for a
/// single network (`Layer::after_step`) and a population (`PopulationNet`) alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterStep {
    Nothing,
    /// Every `svb_interval` steps, SVB's bound of the singular values (a bounded batch
    /// norm's gains are bounded then too): `svb.rs`, on the host.
    Svb,
    /// Every step, each unit's incoming weights (weight norm's `v`) to norm 1
    /// (`wn_projected.rs`); also once at init.
    UnitRows,
    /// Every step, the weight to its norm at init and a layer norm's gain and offset
    /// jointly to theirs (`nap.rs`).
    InitialNorm,
}

impl WeightRule {
    /// How the rule starts a hidden layer's kernel.
    pub(crate) fn kernel(self) -> Kernel {
        match self {
            WeightRule::Plain | WeightRule::FixedNorm => Kernel::Plain,
            WeightRule::WeightNorm | WeightRule::Projected => Kernel::Normed,
            WeightRule::UnitRows | WeightRule::Svb => Kernel::Orthogonal,
        }
    }

    /// The rule's step after each optimizer step.
    pub(crate) fn after_step(self) -> AfterStep {
        match self {
            WeightRule::Plain | WeightRule::WeightNorm => AfterStep::Nothing,
            WeightRule::Projected | WeightRule::UnitRows => AfterStep::UnitRows,
            WeightRule::FixedNorm => AfterStep::InitialNorm,
            WeightRule::Svb => AfterStep::Svb,
        }
    }

    /// The weight is weight norm's `g v / ||v||`.
    pub fn is_weight_norm(self) -> bool {
        self.kernel() == Kernel::Normed
    }
}

impl Activation {
    /// The hidden layers keep a bias after the normalization: not where the method has a
    /// shift of its own (batch and layer norm's `beta`) or, as RMSNorm and unit
    /// features, none at all.
    pub fn keeps_bias(self) -> bool {
        matches!(self, Activation::None | Activation::MeanOnly)
    }
}

/// Where a pair of parts cannot train, what the activation may be instead, with the
/// reason (`docs/methods.md`, "Pairs refused").
pub fn refusal(weight: WeightRule, activation: Activation) -> Option<&'static str> {
    match (weight, activation) {
        (WeightRule::Svb, _) => None,
        (_, Activation::BoundedBatchNorm) => Some(
            "one other than \"bounded_batch_norm\" unless norm.weight = \"svb\": a bounded batch norm's gains are bounded when SVB projects the weights (BBN), and no other weight rule does",
        ),
        _ => None,
    }
}
