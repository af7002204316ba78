//! Where a run sits in a comparison's grid, as the figures need it: its method (what
//! gets a color), and the batch size and sampler it trained with (what become panels
//! and the headline figure's x axis). One color per method, fixed by name, so that a
//! method looks the same in every figure of every report.

use normrl_agents::nn::NormKind;
use normrl_agents::replay::Sampler;
use serde::Serialize;

use super::stats::fnv1a;

/// A run's method and setting.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct RunAxes {
    pub method: String,
    pub setting: Setting,
}

/// The axes besides the method that a figure splits into panels.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Setting {
    pub sampler: Option<String>,
    pub batch_size: Option<usize>,
}

impl Setting {
    /// A panel's title: "batch 32", "sequential, batch 4"; empty when the run's config
    /// is unknown.
    pub fn title(&self) -> String {
        let batch = self.batch_size.map(|b| format!("batch {b}"));
        [self.sampler.clone(), batch]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl RunAxes {
    /// A run's axes from its comparison label (`b32-uniform-batch_norm`) and, where the
    /// run wrote one, its resolved config (TOML). The method is the label less its
    /// batch-size and sampler parts (the named variant or the norm, with any other axis
    /// of the grid); a label of nothing else is the run's norm.
    pub fn of(variant: &str, config: Option<&str>, norm: &str) -> Self {
        let table: Option<toml::Table> = config.and_then(|c| toml::from_str(c).ok());
        let replay = table.as_ref().and_then(|t| t.get("replay"));
        let mut batch_size = replay
            .and_then(|r| r.get("batch_size"))
            .and_then(toml::Value::as_integer)
            .and_then(|b| usize::try_from(b).ok());
        let mut sampler = replay
            .and_then(|r| r.get("sampler"))
            .and_then(|s| s.get("type"))
            .and_then(toml::Value::as_str)
            .map(str::to_string);
        let mut rest = vec![];
        for part in variant.split('-') {
            let as_batch = part.strip_prefix('b').and_then(|n| n.parse::<usize>().ok());
            if as_batch.is_some() && (batch_size.is_none() || batch_size == as_batch) {
                batch_size = as_batch;
            } else if Sampler::ALL.iter().any(|s| s.name() == part)
                && sampler.as_deref().is_none_or(|s| s == part)
            {
                sampler = Some(part.to_string());
            } else {
                rest.push(part);
            }
        }
        let method = match rest.join("-") {
            m if m.is_empty() => norm.to_string(),
            m => m,
        };
        Self {
            method,
            setting: Setting {
                sampler,
                batch_size,
            },
        }
    }
}

/// The sampler of i.i.d. batches: what the others (correlated batches) are compared
/// with.
pub const UNIFORM: &str = Sampler::IID.name();

/// Where a sampler goes in a figure's lines and a table's columns: uniform, the
/// reference, first, then the others from the least correlated to the most, in the
/// order `Sampler::ALL` lists them (`recent`, `sequential`, `online`), then any other
/// label by name.
pub fn sampler_rank(sampler: Option<&str>) -> (usize, Option<&str>) {
    let known = Sampler::ALL.iter().position(|s| Some(s.name()) == sampler);
    (known.unwrap_or(Sampler::ALL.len()), sampler)
}

/// Colors of labels that name no method of the registry (whose colors are its own:
/// `NormKind::color`): the pilot's CrossQ variant.
const KNOWN: [(&str, (u8, u8, u8)); 1] = [("crossq", (204, 121, 167))];

/// Colors for methods the registry does not name (pairs of parts, other labels),
/// picked by a hash of the name (the same name, the same color, in every report).
const OTHERS: [(u8, u8, u8); 6] = [
    (102, 102, 102),
    (136, 204, 238),
    (204, 102, 119),
    (68, 119, 170),
    (187, 187, 187),
    (238, 119, 51),
];

/// A method's color as RGB.
pub fn color_of(method: &str) -> (u8, u8, u8) {
    if let Some(kind) = NormKind::ALL.iter().find(|k| k.name() == method) {
        return kind.color();
    }
    if let Some((_, c)) = KNOWN.iter().find(|(name, _)| *name == method) {
        return *c;
    }
    let hash = fnv1a(method.bytes());
    // A variant of a method (`weight_norm_init256`, `batch_norm_hl_gauss`) takes a
    // shade of that method's color, so that a reader sees which method it varies.
    let suffix_of = |k: &NormKind| method.strip_prefix(k.name())?.strip_prefix('_');
    let base = NormKind::ALL
        .iter()
        .filter(|k| suffix_of(k).is_some_and(|suffix| !suffix.is_empty()))
        .max_by_key(|k| k.name().len());
    if let Some(kind) = base {
        return shade(*kind, hash);
    }
    OTHERS[(hash % OTHERS.len() as u64) as usize]
}

/// Shades a variant's color is picked from: darker and lighter. Not much darker (that
/// read as `none`'s black: weight norm's blue darkened by 0.65 is (0, 40, 62)), nor much
/// lighter (faint on white).
const SHADES: [(f64, f64); 2] = [(0.0, 0.4), (255.0, 0.45)];

/// How far (RGB distance) a shade stays from every other method's color to be picked.
const APART: f64 = 50.0;

/// A shade of `base`'s color picked by `hash` among those at least [`APART`] from every
/// other method's color (weight norm's blue lightened is group norm's sky blue); the
/// darker one where neither is. Two variants of one method may share a shade.
fn shade(base: NormKind, hash: u64) -> (u8, u8, u8) {
    let (r, g, b) = base.color();
    let towards =
        |c: u8, target: f64, amount: f64| (c as f64 + (target - c as f64) * amount).round() as u8;
    let shades = SHADES.map(|(target, amount)| {
        let c = |v| towards(v, target, amount);
        (c(r), c(g), c(b))
    });
    let apart = |s: &(u8, u8, u8)| {
        let mut others = NormKind::ALL.iter().filter(|k| k.name() != base.name());
        others.all(|k| distance(*s, k.color()) >= APART)
    };
    let picked: Vec<(u8, u8, u8)> = shades.into_iter().filter(apart).collect();
    match picked.is_empty() {
        false => picked[(hash % picked.len() as u64) as usize],
        true => shades[0],
    }
}

/// Distance between two colors in RGB.
fn distance(a: (u8, u8, u8), b: (u8, u8, u8)) -> f64 {
    let d = |x: u8, y: u8| (f64::from(x) - f64::from(y)).powi(2);
    (d(a.0, b.0) + d(a.1, b.1) + d(a.2, b.2)).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_splits_into_method_and_setting() {
        let config = "[replay]\nbatch_size = 4\n[replay.sampler]\ntype = \"sequential\"\n";
        let axes = RunAxes::of("b4-sequential-batch_norm", Some(config), "batch_norm");
        assert_eq!(axes.method, "batch_norm");
        assert_eq!(axes.setting.batch_size, Some(4));
        assert_eq!(axes.setting.sampler.as_deref(), Some("sequential"));
        assert_eq!(axes.setting.title(), "sequential, batch 4");
        // Without a config (a run from before result files), from the label alone.
        let old = RunAxes::of("b32-crossq", None, "batch_renorm");
        assert_eq!(
            (old.method.as_str(), old.setting.batch_size),
            ("crossq", Some(32))
        );
        // A label with nothing but the setting is the run's norm; a name with dashes
        // keeps them.
        assert_eq!(RunAxes::of("b4", None, "svb").method, "svb");
        assert_eq!(RunAxes::of("b4-my-method", None, "svb").method, "my-method");
    }

    #[test]
    fn uniform_comes_first() {
        let mut samplers = vec![
            Some("online"),
            Some("sequential"),
            Some("later"),
            Some("uniform"),
            Some("recent"),
        ];
        samplers.sort_by_key(|s| sampler_rank(*s));
        assert_eq!(
            samplers,
            [
                Some("uniform"),
                Some("recent"),
                Some("sequential"),
                Some("online"),
                Some("later")
            ]
        );
    }

    /// Every method of the registry has a color of its own, unlike the other labels'
    /// and the hashed ones.
    #[test]
    fn every_method_keeps_its_color_and_known_ones_differ() {
        let named = NormKind::ALL.iter().map(|k| color_of(k.name()));
        let fixed = KNOWN.iter().map(|(name, _)| color_of(name));
        let all: Vec<_> = named.chain(fixed).chain(OTHERS).collect();
        let distinct: std::collections::BTreeSet<_> = all.iter().collect();
        assert_eq!(distinct.len(), all.len(), "{all:?}");
        assert_eq!(color_of("weight_norm"), (0, 114, 178));
        assert_eq!(color_of("my_method"), color_of("my_method"));
        assert!(OTHERS.contains(&color_of("unit_rows+batch_norm")));
    }

    /// A variant named after a method is a shade of that method's color, picked by the
    /// longest method name it starts with.
    #[test]
    fn a_variant_takes_a_shade_of_its_methods_color() {
        let (wn, variant) = (color_of("weight_norm"), color_of("weight_norm_init256"));
        assert_ne!(variant, wn);
        assert!(
            shades_of(NormKind::WeightNorm).contains(&variant),
            "{variant:?}"
        );
        let mob = NormKind::WnMeanOnlyBn;
        assert!(shades_of(mob).contains(&color_of("wn_mean_only_bn_init256")));
        assert_ne!(color_of("wn_mean_only_bn_init256"), variant);
        // Blue (0, 114, 178) darkened by 0.4, by hand: lightened by 0.45 it is
        // (115, 177, 213), 35 from group norm's sky blue (86, 180, 233).
        assert_eq!(variant, (0, 68, 107));
        // No method's variant lies near another method's color (`none`'s black too),
        // unless neither shade is apart.
        for kind in NormKind::ALL.iter().filter(|k| k.color() != (0, 0, 0)) {
            let shade = color_of(&format!("{}_variant", kind.name()));
            let near = NormKind::ALL
                .iter()
                .filter(|o| o.name() != kind.name())
                .any(|o| distance(shade, o.color()) < APART);
            assert!(!near || shade == shades_of(*kind)[0], "{}", kind.name());
        }
        // Not a prefix at a word's end: `batch_normal` is no variant of `batch_norm`.
        assert!(OTHERS.contains(&color_of("batch_normal")));
    }

    /// The shades `kind`'s variants take, by hash.
    fn shades_of(kind: NormKind) -> Vec<(u8, u8, u8)> {
        (0..2).map(|h| shade(kind, h)).collect()
    }
}
