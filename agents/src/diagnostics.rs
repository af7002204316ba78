//! The diagnostics normalization papers in deep RL report, to say why a method wins:
//! dormant units (Sokar et al. 2023), the effective rank of the penultimate features
//! (Kumar et al. 2021), and each layer's parameter norm and effective step (Lyle et
//! al. 2024). Q overestimation needs episodes and lives with evaluation (`normrl`'s
//! trainer). All of them read a network; none changes it.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use normrl_agents::diagnostics::{dormant_fractions, effective_rank};
//!
//! // Two units over three inputs: mean |h| of 0 and 2, scores 0 and 2 (mean 1).
//! let h = Tensor::new(&[[0f32, 1.0], [0.0, 3.0], [0.0, 2.0]], &Device::Cpu).unwrap();
//! assert_eq!(dormant_fractions(&h, &[0.0, 0.1]).unwrap(), vec![0.5, 0.5]);
//! // Singular values 3 and 1 (a diagonal matrix): 3/4 < 0.99, so both count.
//! let phi = Tensor::new(&[[3f32, 0.0], [0.0, 1.0]], &Device::Cpu).unwrap();
//! assert_eq!(effective_rank(&phi, 0.01).unwrap(), 2);
//! ```

use candle_core::{Result, Tensor};

use crate::nn::{svb, Pass, QNetwork};

/// The thresholds of dormant units: dead (`s_i = 0`) and dormant (`s_i <= 0.1`).
pub const DORMANT_TAUS: [f64; 2] = [0.0, 0.1];

/// The effective rank's tolerance: the smallest `k` whose top singular values hold
/// `1 - DELTA` of their sum.
pub const RANK_DELTA: f64 = 0.01;

/// For each `tau`, the fraction of a layer's units whose score
/// `s_i = mean_x |h_i(x)| / mean_k mean_x |h_k(x)|` is at most `tau`. `h` is the layer's
/// output over a batch, units along dimension 1 (a conv layer's channels, averaged over
/// positions too). A layer silent on every input has every unit dormant.
pub fn dormant_fractions(h: &Tensor, taus: &[f64]) -> Result<Vec<f64>> {
    let units = h.dim(1)?;
    let mut dims: Vec<usize> = (0..h.rank()).filter(|&d| d != 1).collect();
    dims.reverse();
    let mut mean_abs = h.abs()?;
    for d in dims {
        mean_abs = mean_abs.mean(d)?;
    }
    let activity: Vec<f64> = mean_abs
        .to_vec1::<f32>()?
        .into_iter()
        .map(f64::from)
        .collect();
    let layer_mean = activity.iter().sum::<f64>() / units.max(1) as f64;
    Ok(taus
        .iter()
        .map(|&tau| {
            let dormant = activity
                .iter()
                .filter(|&&a| layer_mean == 0.0 || a / layer_mean <= tau)
                .count();
            dormant as f64 / units.max(1) as f64
        })
        .collect())
}

/// `srank_delta(Phi) = min{k : sum_{i<=k} sigma_i >= (1 - delta) sum_i sigma_i}` of a
/// feature matrix (rows: inputs, columns: units); 0 for a zero matrix.
pub fn effective_rank(features: &Tensor, delta: f64) -> Result<usize> {
    let sigma = svb::singular_values(features)?;
    let total: f64 = sigma.iter().sum();
    if total <= 0.0 {
        return Ok(0);
    }
    let mut cumulative = 0.0;
    for (k, s) in sigma.iter().enumerate() {
        cumulative += s;
        if cumulative >= (1.0 - delta) * total {
            return Ok(k + 1);
        }
    }
    Ok(sigma.len())
}

/// One layer's dormant fractions (one per [`DORMANT_TAUS`]) and unit count.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerActivity {
    pub layer: String,
    pub units: usize,
    pub dormant: Vec<f64>,
}

/// The probe batch's diagnostics of a network in evaluation mode (the mode it acts
/// in): each hidden layer's dormant fractions, and the effective rank of the last
/// hidden layer's output.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeDiagnostics {
    pub layers: Vec<LayerActivity>,
    pub effective_rank: usize,
}

impl ProbeDiagnostics {
    pub fn of(net: &QNetwork, probe: &Tensor) -> Result<Self> {
        let hidden = net.hidden_outputs(probe, Pass::EVAL)?;
        let mut layers = vec![];
        for (layer, h) in &hidden {
            layers.push(LayerActivity {
                layer: layer.clone(),
                units: h.dim(1)?,
                dormant: dormant_fractions(h, &DORMANT_TAUS)?,
            });
        }
        let effective_rank = match hidden.last() {
            Some((_, phi)) => effective_rank(&phi.flatten_from(1)?, RANK_DELTA)?,
            None => 0,
        };
        Ok(Self {
            layers,
            effective_rank,
        })
    }

    /// The fraction of all hidden units at each threshold (units pooled over layers).
    pub fn network_dormant(&self) -> Vec<f64> {
        let units: usize = self.layers.iter().map(|l| l.units).sum();
        (0..DORMANT_TAUS.len())
            .map(|i| {
                let dormant: f64 = self
                    .layers
                    .iter()
                    .map(|l| l.dormant[i] * l.units as f64)
                    .sum();
                dormant / units.max(1) as f64
            })
            .collect()
    }
}

/// The network's trainable values, each parameter flattened under its name, in store
/// order: the parameters of a step's two sides (`normrl` keeps one such snapshot to
/// measure the next update's step). A layer is the name before the first `.`:
/// `fc0.weight` and `fc0.bn.gamma` are layer `fc0`. (Snapshots saved by older
/// versions hold one entry per layer, named by the layer: they measure the same steps
/// and no angle.)
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LayerParameters(pub Vec<(String, Vec<f32>)>);

/// The layer a parameter belongs to.
fn layer_of(name: &str) -> &str {
    name.split('.').next().unwrap_or(name)
}

/// Whether a parameter is its layer's weights: the matrix or filters (`.weight`), or
/// weight norm's direction (`.v`), whose turn is the effective learning rate.
fn is_weights(name: &str) -> bool {
    matches!(name.split_once('.'), Some((_, "weight" | "v")))
}

impl LayerParameters {
    /// The online network's trainable values.
    pub fn of(net: &QNetwork) -> Result<Self> {
        let values = net
            .store()
            .trainable()
            .map(|p| Ok((p.name.clone(), p.var.as_tensor().flatten_all()?.to_vec1()?)))
            .collect::<Result<_>>()?;
        Ok(Self(values))
    }

    /// `f` summed per layer over the parameters `keep` selects, in layer order, and
    /// over all of them last (`all`).
    fn per_layer(
        &self,
        after: &LayerParameters,
        keep: fn(&str) -> bool,
        f: impl Fn(&[f32], &[f32]) -> [f64; 3],
    ) -> Vec<(String, [f64; 3])> {
        let mut out: Vec<(String, [f64; 3])> = vec![];
        let mut all = [0.0; 3];
        for ((name, before), (_, now)) in self.0.iter().zip(&after.0) {
            if !keep(name) {
                continue;
            }
            let sums = f(before, now);
            let layer = layer_of(name);
            match out.last_mut() {
                Some((l, acc)) if l == layer => add(acc, sums),
                _ => out.push((layer.to_string(), sums)),
            }
            add(&mut all, sums);
        }
        out.push(("all".into(), all));
        out
    }

    /// `||theta_l||` per layer, and the whole network's last.
    pub fn norms(&self) -> Vec<(String, f64)> {
        self.per_layer(
            self,
            |_| true,
            |v, _| [sum_sq(v.iter().map(|&x| f64::from(x))), 0.0, 0.0],
        )
        .into_iter()
        .map(|(l, [sq, ..])| (l, sq.sqrt()))
        .collect()
    }

    /// The effective step `||theta(t+1) - theta(t)|| / ||theta(t)||` per layer from
    /// `self` (before) to `after`, and the whole network's last.
    pub fn effective_steps(&self, after: &LayerParameters) -> Vec<(String, f64)> {
        let sums = |b: &[f32], a: &[f32]| {
            let diff = sum_sq(b.iter().zip(a).map(|(&b, &a)| f64::from(a - b)));
            [diff, sum_sq(b.iter().map(|&x| f64::from(x))), 0.0]
        };
        self.per_layer(after, |_| true, sums)
            .into_iter()
            .map(|(l, [diff, norm, _])| (l, ratio(diff, norm)))
            .collect()
    }

    /// The angle in radians each layer's weights (weight norm's direction `v`) turn
    /// from `self` to `after`, `arccos(<w, w'> / (||w|| ||w'||))`, and all layers'
    /// weights as one vector last: the effective learning rate of a scale-invariant
    /// layer, whose step changes the function by its angle, not its length.
    pub fn turn_angles(&self, after: &LayerParameters) -> Vec<(String, f64)> {
        let sums = |b: &[f32], a: &[f32]| {
            let dot = b
                .iter()
                .zip(a)
                .map(|(&b, &a)| f64::from(b) * f64::from(a))
                .sum();
            let (nb, na) = (
                sum_sq(b.iter().map(|&x| f64::from(x))),
                sum_sq(a.iter().map(|&x| f64::from(x))),
            );
            [dot, nb, na]
        };
        self.per_layer(after, is_weights, sums)
            .into_iter()
            .filter(|(_, [_, nb, na])| *nb > 0.0 && *na > 0.0)
            .map(|(l, [dot, nb, na])| (l, (dot / (nb * na).sqrt()).clamp(-1.0, 1.0).acos()))
            .collect()
    }
}

fn add(acc: &mut [f64; 3], x: [f64; 3]) {
    for (a, x) in acc.iter_mut().zip(x) {
        *a += x;
    }
}

fn sum_sq(values: impl Iterator<Item = f64>) -> f64 {
    values.map(|x| x * x).sum()
}

/// `sqrt(diff / norm)`, 0 for a zero norm.
fn ratio(diff: f64, norm: f64) -> f64 {
    if norm > 0.0 {
        (diff / norm).sqrt()
    } else {
        0.0
    }
}
