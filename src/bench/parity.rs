//! `normrl bench parity --device cuda`: every normalization method computed on a device
//! against the CPU: Q-values (after data-dependent init where the method has one) and
//! the gradient of every trainable variable, from the same weights and batch.

use anyhow::Result;
use candle_core::{Device, Tensor};
use normrl_agents::dqn::{DqnConfig, ValueLoss};
use normrl_agents::nn::{NormConfig, NormKind, Pass, QNetwork, QNetworkConfig};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

/// Largest relative difference allowed between the device and the CPU (f32 sums in a
/// different order differ by ~1e-6; a wrong kernel by far more).
pub const TOLERANCE: f64 = 1e-3;

pub struct Parity {
    pub method: String,
    pub network: &'static str,
    /// Max |device - cpu| / max |cpu| over the Q-values.
    pub q_error: f64,
    /// The same over each variable's gradient, the worst variable.
    pub grad_error: f64,
    pub worst_variable: String,
}

fn relative_error(cpu: &Tensor, other: &Tensor) -> Result<f64> {
    let other = other.to_device(&Device::Cpu)?;
    let diff = (cpu - &other)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar::<f32>()?;
    let scale = cpu.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
    Ok(f64::from(diff) / f64::from(scale).max(1e-12))
}

/// Compares every method on the MLP, the MinAtar CNN and the Nature CNN.
pub fn check(device: &Device) -> Result<Vec<Parity>> {
    let cases: [(&str, QNetworkConfig, Vec<usize>, usize, usize); 3] = [
        (
            "mlp 4-64-64-2 b32",
            QNetworkConfig::mlp(vec![64, 64]),
            vec![4],
            2,
            32,
        ),
        (
            "minatar cnn b32",
            QNetworkConfig::minatar_cnn(),
            vec![4, 10, 10],
            6,
            32,
        ),
        (
            "nature cnn b8",
            QNetworkConfig::nature_cnn(),
            vec![4, 84, 84],
            4,
            8,
        ),
    ];
    let mut out = vec![];
    for method in NormConfig::every_method() {
        let norm = parity_norm(method);
        for (network, config, shape, n_actions, batch) in &cases {
            let case = Case {
                config,
                shape,
                n_actions: *n_actions,
                batch: *batch,
            };
            let (q_error, grad_error, worst_variable) = case.compare(&norm, device)?;
            out.push(Parity {
                method: norm.name(),
                network,
                q_error,
                grad_error,
                worst_variable,
            });
        }
    }
    Ok(out)
}

/// A method's settings in the parity checks: batch renormalization with its clip open
/// (in its warm-up it is batch norm).
fn parity_norm(method: NormConfig) -> NormConfig {
    NormConfig {
        brn_warmup: 0,
        ..method
    }
}

/// One network and batch of the parity check.
struct Case<'a> {
    config: &'a QNetworkConfig,
    shape: &'a [usize],
    n_actions: usize,
    batch: usize,
}

impl Case<'_> {
    /// The Q-values' relative error, the worst gradient's, and that gradient's variable,
    /// between the CPU and `device` from the same initial weights and inputs.
    fn compare(&self, norm: &NormConfig, device: &Device) -> Result<(f64, f64, String)> {
        let cpu = QNetwork::new(
            self.config,
            norm,
            self.shape,
            self.n_actions,
            0,
            &Device::Cpu,
        )?;
        let dev = QNetwork::new(self.config, norm, self.shape, self.n_actions, 0, device)?;
        dev.store().load_map(&cpu.store().to_map()?)?;
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(1);
        let len = self.batch * self.shape.iter().product::<usize>();
        let x: Vec<f32> = (0..len).map(|_| rng.random::<f32>()).collect();
        let w: Vec<f32> = (0..self.batch * self.n_actions)
            .map(|_| rng.random::<f32>() - 0.5)
            .collect();
        let (q_cpu, g_cpu) = self.run(&cpu, &Device::Cpu, &x, &w)?;
        let (q_dev, g_dev) = self.run(&dev, device, &x, &w)?;
        let mut grad_error = 0.0;
        let mut worst_variable = String::new();
        for ((param, a), b) in cpu.store().trainable().zip(&g_cpu).zip(&g_dev) {
            let error = match (a, b) {
                (Some(a), Some(b)) => relative_error(a, b)?,
                (None, None) => 0.0,
                // A gradient on one device only is a bug of its own.
                _ => f64::INFINITY,
            };
            if error >= grad_error {
                grad_error = error;
                worst_variable = param.name.clone();
            }
        }
        Ok((relative_error(&q_cpu, &q_dev)?, grad_error, worst_variable))
    }

    /// Q-values of `x` (after data-dependent init where due) and the gradients of
    /// `Σ w · Q` for every trainable variable.
    fn run(
        &self,
        net: &QNetwork,
        device: &Device,
        x: &[f32],
        w: &[f32],
    ) -> Result<(Tensor, Vec<Option<Tensor>>)> {
        let mut dims = vec![self.batch];
        dims.extend_from_slice(self.shape);
        let x = Tensor::from_slice(x, dims.as_slice(), device)?;
        let w = Tensor::from_slice(w, (self.batch, self.n_actions), device)?;
        if net.wants_data_dependent_init() {
            net.data_dependent_init(&x)?;
        }
        let q = net.forward(&x, Pass::TRAIN)?;
        let grads = (&q * &w)?.sum_all()?.backward()?;
        let g = net
            .store()
            .trainable()
            .map(|p| grads.get(p.var.as_tensor()).cloned())
            .collect();
        Ok((q, g))
    }
}

/// A population's step on a device against the same population's on the CPU.
pub struct PopulationParity {
    pub method: String,
    pub network: &'static str,
    /// Max relative difference of every agent's metrics (TD loss, mean Q, gradient
    /// norm) over the updates.
    pub metric_error: f64,
    /// `||a - b|| / ||a||` over every stacked variable after the updates (a variable
    /// near 0, a shift, would make a per-variable ratio meaningless).
    pub weight_error: f64,
    /// The device's path: its fused kernels, or the tensor forms.
    pub path: &'static str,
}

/// Agents, batch size and updates of [`population_check`].
const POPULATION: (usize, usize, usize) = (3, 8, 5);

/// Every method's population of three agents, five updates on its own batches, on the
/// MLP and the MinAtar CNN: on `device` (its fused kernels where the method has them on
/// that device, the tensor forms elsewhere) against the fused CPU step. On the CPU itself
/// the second population takes the tensor forms: a check of this check.
pub fn population_check(device: &Device) -> Result<Vec<PopulationParity>> {
    let mut out = vec![];
    let regression = DqnConfig::default();
    for method in NormConfig::every_method() {
        let norm = parity_norm(method);
        for net in &crate::bench::population::nets() {
            out.push(compare_populations(net, (&norm, &regression), device)?);
        }
    }
    // The distributional losses, whose targets a device makes in tensor ops.
    let norm = parity_norm(NormConfig::from(NormKind::BatchNorm));
    for loss in [ValueLoss::C51, ValueLoss::HlGauss] {
        let dqn = DqnConfig {
            loss,
            double_dqn: true,
            ..DqnConfig::default()
        };
        for net in &crate::bench::population::nets() {
            out.push(compare_populations(net, (&norm, &dqn), device)?);
        }
    }
    Ok(out)
}

/// Three agents of `norm` on `net`, on the CPU and on `device`, from the same weights,
/// as two populations updated on the same batches.
fn compare_populations(
    net: &crate::bench::population::Net,
    (norm, dqn): (&NormConfig, &DqnConfig),
    device: &Device,
) -> Result<PopulationParity> {
    use normrl_agents::optim::OptimizerConfig;
    use normrl_agents::population::PopulationDqn;
    let (agents, batch, updates) = POPULATION;
    let optimizer = OptimizerConfig {
        max_grad_norm: 1.0,
        ..Default::default()
    };
    let make = |dev: &Device| {
        crate::bench::population::agents_with(net, (norm, dqn), &optimizer, agents, dev)
    };
    let (cpu, other) = (make(&Device::Cpu)?, make(device)?);
    for (a, b) in cpu.iter().zip(&other) {
        b.online().store().load_map(&a.online().store().to_map()?)?;
    }
    let mut reference = PopulationDqn::from_agents(&cpu.iter().collect::<Vec<_>>())?;
    let mut tested = PopulationDqn::from_agents(&other.iter().collect::<Vec<_>>())?;
    if device.is_cpu() {
        tested = tested.with_tensor_forms()?;
    }
    let path = match tested.online().runs_device_kernels() {
        true => "kernels",
        false => "tensor-forms",
    };
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(2);
    let (obs_len, actions) = (net.obs.iter().product(), net.actions);
    let mut metric_error = 0f64;
    for _ in 0..updates {
        let batches: Vec<_> = (0..agents)
            .map(|_| {
                crate::bench::timing::random_batch(batch, obs_len, actions, net.binary, &mut rng)
            })
            .collect();
        let a = reference.update(&batches)?.metrics;
        let b = tested.update(&batches)?.metrics;
        metric_error = metric_error.max(relative_error(&a, &b)?);
    }
    let method = match dqn.loss {
        ValueLoss::C51 => format!("{}+c51", norm.name()),
        ValueLoss::HlGauss => format!("{}+hl_gauss", norm.name()),
        _ => norm.name(),
    };
    Ok(PopulationParity {
        method,
        network: net.name,
        metric_error,
        weight_error: weights_apart(&reference, &tested)?,
        path,
    })
}

/// `||a - b|| / ||a||` over all the online variables of two populations.
fn weights_apart(
    a: &normrl_agents::population::PopulationDqn,
    b: &normrl_agents::population::PopulationDqn,
) -> Result<f64> {
    let (mut diff, mut norm) = (0f64, 0f64);
    for ((_, x), (_, y)) in a.online().vars().iter().zip(b.online().vars()) {
        let x = x.as_tensor().flatten_all()?.to_vec1::<f32>()?;
        let y = y
            .as_tensor()
            .to_device(&Device::Cpu)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        for (x, y) in x.iter().zip(&y) {
            diff += f64::from(x - y).powi(2);
            norm += f64::from(*x).powi(2);
        }
    }
    Ok(diff.sqrt() / norm.sqrt().max(1e-12))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the CPU the population check compares the fused step with the tensor forms:
    /// every method, on both networks, within the tolerance.
    #[test]
    fn the_population_check_passes_on_the_cpu() {
        let rows = population_check(&Device::Cpu).unwrap();
        // Every method, and batch norm with each distributional loss.
        assert_eq!(rows.len(), 2 * NormConfig::every_method().len() + 4);
        for r in &rows {
            assert!(
                r.metric_error <= TOLERANCE && r.weight_error <= TOLERANCE,
                "{} {}: {:e} {:e}",
                r.method,
                r.network,
                r.metric_error,
                r.weight_error
            );
            assert_eq!(r.path, "tensor-forms");
        }
    }
}
