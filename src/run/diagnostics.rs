//! A run's diagnostics (docs/methods.md, "Diagnostics"): at every
//! `logging.layer_stats_interval`, the dormant units and effective rank on a fixed probe
//! batch, each layer's parameter norm, and the next update's effective step and the
//! angle each layer's weights turn in it (the effective learning rate); at every
//! evaluation, the Q overestimation. Logged to TensorBoard under `diagnostics/`, and
//! kept as curves for the run's summary and `normrl report`.
//!
//! Nothing here changes training: the probe has its own random generator, and the
//! network is only read, in evaluation mode.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::Result;
use normrl_agents::candle_core::Tensor;
use normrl_agents::diagnostics::{LayerParameters, ProbeDiagnostics, DORMANT_TAUS};
use normrl_agents::dqn::Dqn;
use normrl_agents::replay::{Batch, ReplayBuffer, Sampler};
use rand::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;
use serde::{Deserialize, Serialize};

use crate::logging::tensorboard::TensorBoard;

/// Observations in the probe batch (fewer if the replay holds fewer).
pub const PROBE_SIZE: usize = 256;

/// The diagnostics the report plots, one chart per environment each: whole-network
/// values, as `(curve, axis label)`.
pub const REPORTED: [(&str, &str); 7] = [
    ("dormant_tau0/all", "dead units (fraction, tau = 0)"),
    ("dormant_tau0.1/all", "dormant units (fraction, tau = 0.1)"),
    (
        "effective_rank",
        "effective rank of the penultimate features",
    ),
    ("param_norm/all", "parameter norm"),
    (
        "effective_step/all",
        "effective step ||dtheta|| / ||theta||",
    ),
    (
        "effective_angle/all",
        "effective angle (radians the weights turn in an update)",
    ),
    (
        "q_overestimation",
        "Q overestimation (max Q(s0) - discounted return)",
    ),
];

/// One evaluation's numbers: the mean return, and the mean over episodes of the
/// network's `max_a Q(s_0, a)` and of the discounted return each episode collected.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    pub mean_return: f64,
    pub q_start: f64,
    pub discounted_return: f64,
}

/// The probe, the parameters awaiting the next update, and every curve so far; saved
/// in checkpoints, so that a resumed run logs what an uninterrupted one would.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Diagnostics {
    probe: Option<Vec<f32>>,
    before_update: Option<LayerParameters>,
    pub curves: BTreeMap<String, Vec<(u64, f64)>>,
    /// Seconds spent computing diagnostics, to keep their cost in view.
    pub seconds: f64,
}

impl Diagnostics {
    fn record(&mut self, tb: &mut TensorBoard, name: &str, step: u64, value: f64) {
        tb.scalar(&format!("diagnostics/{name}"), value, step);
        self.curves
            .entry(name.to_string())
            .or_default()
            .push((step, value));
    }

    /// The interval's diagnostics: the probe batch's (drawn now if not yet) and the
    /// parameter norms; the next update's effective step is measured after it.
    pub fn at_interval(
        &mut self,
        agent: &Dqn,
        replay: &ReplayBuffer,
        seed: u64,
        step: u64,
        tb: &mut TensorBoard,
    ) -> Result<()> {
        let started = Instant::now();
        if let Some(probe) = self.probe_tensor(agent, replay, seed)? {
            let found = ProbeDiagnostics::of(agent.online(), &probe)?;
            for layer in &found.layers {
                for (tau, fraction) in DORMANT_TAUS.iter().zip(&layer.dormant) {
                    self.record(
                        tb,
                        &format!("dormant_tau{tau}/{}", layer.layer),
                        step,
                        *fraction,
                    );
                }
            }
            for (tau, fraction) in DORMANT_TAUS.iter().zip(found.network_dormant()) {
                self.record(tb, &format!("dormant_tau{tau}/all"), step, fraction);
            }
            self.record(tb, "effective_rank", step, found.effective_rank as f64);
        }
        let parameters = LayerParameters::of(agent.online())?;
        for (layer, norm) in parameters.norms() {
            self.record(tb, &format!("param_norm/{layer}"), step, norm);
        }
        self.before_update = Some(parameters);
        self.seconds += started.elapsed().as_secs_f64();
        Ok(())
    }

    /// Whether the interval's parameters wait for the next update.
    pub fn awaits_update(&self) -> bool {
        self.before_update.is_some()
    }

    /// After an update: the effective step, if the interval's parameters wait for it.
    pub fn after_update(&mut self, agent: &Dqn, step: u64, tb: &mut TensorBoard) -> Result<()> {
        let Some(before) = self.before_update.take() else {
            return Ok(());
        };
        let started = Instant::now();
        let after = LayerParameters::of(agent.online())?;
        for (layer, size) in before.effective_steps(&after) {
            self.record(tb, &format!("effective_step/{layer}"), step, size);
        }
        for (layer, angle) in before.turn_angles(&after) {
            self.record(tb, &format!("effective_angle/{layer}"), step, angle);
        }
        self.seconds += started.elapsed().as_secs_f64();
        Ok(())
    }

    /// An evaluation's Q overestimation: predicted against collected.
    pub fn at_evaluation(&mut self, eval: &Evaluation, step: u64, tb: &mut TensorBoard) {
        self.record(tb, "q_predicted", step, eval.q_start);
        self.record(tb, "q_discounted_return", step, eval.discounted_return);
        let over = eval.q_start - eval.discounted_return;
        self.record(tb, "q_overestimation", step, over);
    }

    /// The probe on the network's device, drawn uniformly from the replay the first
    /// time it holds [`PROBE_SIZE`] transitions (with a generator of its own); `None`
    /// before.
    fn probe_tensor(
        &mut self,
        agent: &Dqn,
        replay: &ReplayBuffer,
        seed: u64,
    ) -> Result<Option<Tensor>> {
        let shape = agent.online().obs_shape().to_vec();
        let obs_len: usize = shape.iter().product();
        if self.probe.is_none() {
            // A full probe (or the whole replay, when it holds fewer): drawn any
            // sooner, a tiny `learning_starts` would fix a probe of a few observations.
            let n = PROBE_SIZE.min(replay.capacity());
            if replay.transitions() < n.max(1) {
                return Ok(None);
            }
            let mut batch = Batch::new(n, obs_len);
            let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed ^ 0x5eed_d1a6);
            replay.sample(Sampler::Uniform, &mut batch, &mut rng)?;
            self.probe = Some(batch.obs);
        }
        let probe = self.probe.as_ref().expect("drawn above");
        let mut dims = vec![probe.len() / obs_len.max(1)];
        dims.extend(shape);
        let device = agent.online().store().device().clone();
        Ok(Some(Tensor::from_slice(probe, dims, &device)?))
    }
}
