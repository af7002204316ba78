//! What a run writes as it goes, apart from checkpoints: TensorBoard events, the
//! evaluation and training curves, the updates' means, the first divergence, the
//! heartbeat, and at the end `summary.json` and `result.json`. The trainer is the loop;
//! this is its record.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use normrl_agents::dqn::UpdateInfo;
use normrl_agents::Metric;

use crate::config::{Keep, TrainConfig};
use crate::logging::hparams;
use crate::logging::tensorboard::TensorBoard;
use crate::logging::video::Video;
use crate::run::files::{
    host_name, unix_seconds, Divergence, Heartbeat, RunResult, RunSummary, HEARTBEAT_FILE,
    RESULT_FILE, SUMMARY_FILE,
};
use crate::run::periodic::mean;

/// Seconds between heartbeats, at the most.
const HEARTBEAT_SECONDS: f64 = 5.0;

/// Games whose returns make the progress bar's recent mean.
const RECENT_GAMES: usize = 20;

pub(crate) struct Recorder {
    run_dir: PathBuf,
    pub(crate) tb: TensorBoard,
    pub(crate) episodes: u64,
    pub(crate) eval_curve: Vec<(u64, f64)>,
    pub(crate) train_curve: Vec<(u64, f64)>,
    recent_returns: VecDeque<f64>,
    /// Sums of loss, mean Q and gradient norm since the last log, and their count.
    update_sums: Option<[Metric; 3]>,
    /// The sum of a distributional head's value entropies since the last log.
    entropy_sum: Option<f64>,
    updates_since_log: u64,
    /// Set when a loss, Q-value or parameter stopped being finite; the loop then ends.
    diverged: Option<Divergence>,
    /// The comparison's label of this run, for `result.json`.
    variant: Option<String>,
    /// When the heartbeat was last written.
    last_beat: Option<Instant>,
}

impl Recorder {
    /// A record in `run_dir`; this creates the TensorBoard events file.
    pub(crate) fn new(run_dir: &Path) -> Result<Self> {
        Ok(Self {
            run_dir: run_dir.to_path_buf(),
            tb: TensorBoard::new(run_dir)?,
            episodes: 0,
            eval_curve: vec![],
            train_curve: vec![],
            recent_returns: VecDeque::new(),
            update_sums: None,
            entropy_sum: None,
            updates_since_log: 0,
            diverged: None,
            variant: None,
            last_beat: None,
        })
    }

    /// The session's start in TensorBoard, or where a resumed run picks it up.
    pub(crate) fn begin(&mut self, config: &TrainConfig, step: u64) {
        if step == 0 {
            let toml = format!("```toml\n{}\n```", config.to_toml());
            self.tb.text("config", &toml, 0);
            let start = hparams::session_start(config, unix_seconds());
            self.tb
                .plugin_summary(hparams::SESSION_START_TAG, "hparams", start, 0);
        } else {
            // Events from after the checkpoint (later steps) were lost with the
            // interrupted process's replay state; TensorBoard drops them from here on.
            self.tb.restart(step + 1);
        }
    }

    /// Records the first divergence (the loop stops after this step).
    pub(crate) fn diverge(&mut self, step: u64, what: String) {
        if self.diverged.is_none() {
            self.diverged = Some(Divergence { step, what });
        }
    }

    pub(crate) fn divergence(&self) -> Option<&Divergence> {
        self.diverged.as_ref()
    }

    /// Adds an update's numbers to the sums logged next (on a GPU without waiting).
    /// Values already on the host are checked at once; a device's at the next log.
    pub(crate) fn update(&mut self, step: u64, info: &UpdateInfo) -> Result<()> {
        let named = [
            ("td_loss", &info.td_loss),
            ("q_mean", &info.q_mean),
            ("grad_norm", &info.grad_norm),
        ];
        let bad = named.into_iter().find_map(|(name, metric)| match metric {
            Metric::Host(v) if !v.is_finite() => Some(format!("{name} = {v}")),
            _ => None,
        });
        if let Some(what) = bad {
            self.diverge(step, what);
        }
        let next = match self.update_sums.take() {
            None => [
                info.td_loss.clone(),
                info.q_mean.clone(),
                info.grad_norm.clone(),
            ],
            Some([l, q, g]) => [
                l.add(&info.td_loss)?,
                q.add(&info.q_mean)?,
                g.add(&info.grad_norm)?,
            ],
        };
        self.update_sums = Some(next);
        if let Some(h) = info.value_entropy {
            self.entropy_sum = Some(self.entropy_sum.unwrap_or(0.0) + h);
        }
        self.updates_since_log += 1;
        Ok(())
    }

    /// Logs the means of the updates recorded since the last log.
    pub(crate) fn log_updates(&mut self, step: u64) -> Result<()> {
        let Some([loss, q, g]) = self.update_sums.take() else {
            return Ok(());
        };
        let n = self.updates_since_log.max(1) as f64;
        self.updates_since_log = 0;
        let entropy = self.entropy_sum.take().map(|sum| sum / n);
        // One read of each sum (on a GPU, each waits for the device).
        let means = [loss.value()? / n, q.value()? / n, g.value()? / n];
        self.log_update_means(step, means, entropy);
        Ok(())
    }

    /// The updates' mean TD loss, Q-value and gradient norm since the last log, and a
    /// distributional head's mean value entropy (a population computes them for all
    /// its members at once).
    pub(crate) fn log_update_means(&mut self, step: u64, means: [f64; 3], entropy: Option<f64>) {
        let logged = [
            ("td_loss", "losses/td_loss"),
            ("q_mean", "losses/q_values"),
            ("grad_norm", "losses/grad_norm"),
        ];
        for ((name, tag), v) in logged.into_iter().zip(means) {
            if !v.is_finite() {
                self.diverge(step, format!("{name} = {v} (mean since the last log)"));
            }
            self.tb.scalar(tag, v, step);
        }
        if let Some(h) = entropy {
            self.tb.scalar("losses/value_entropy", h, step);
        }
    }

    /// A finished game's return and length.
    pub(crate) fn game(&mut self, step: u64, ret: f64, length: f64) {
        self.episodes += 1;
        self.train_curve.push((step, ret));
        self.tb.scalar("charts/episodic_return", ret, step);
        self.tb.scalar("charts/episodic_length", length, step);
        self.recent_returns.push_back(ret);
        if self.recent_returns.len() > RECENT_GAMES {
            self.recent_returns.pop_front();
        }
    }

    /// The mean return of the last games, for the progress bar.
    pub(crate) fn recent_return(&self) -> Option<f64> {
        mean(self.recent_returns.iter().copied())
    }

    /// An evaluation's mean return, on the curve and in TensorBoard.
    pub(crate) fn evaluation(&mut self, step: u64, ret: f64) {
        self.eval_curve.push((step, ret));
        self.tb.scalar("eval/episodic_return", ret, step);
    }

    /// The first episode of an evaluation as an animated image (`eval.video`).
    pub(crate) fn episode_video(&mut self, step: u64, video: Video) -> Result<()> {
        if let Some((gif, width, height)) = video.finish()? {
            self.tb.image("eval/episode", &gif, width, height, step);
        }
        Ok(())
    }

    /// The next evaluation's index (its environment's seed derives from it).
    pub(crate) fn evaluations(&self) -> u64 {
        self.eval_curve.len() as u64
    }

    /// A divergence's line on the terminal and in TensorBoard.
    pub(crate) fn diverged_at(&mut self, step: u64, divergence: &Divergence) {
        let line = format!("diverged at step {}: {}", divergence.step, divergence.what);
        eprintln!("{line}");
        self.tb.text("diverged", &line, step);
    }

    /// Names the run's variant in its `result.json` (a comparison's label).
    pub(crate) fn set_variant(&mut self, variant: &str) {
        self.variant = Some(variant.to_string());
    }

    /// `heartbeat`: when the run last logged, on which host and process, for
    /// `normrl status`; at most every few seconds (a fast run logs hundreds of times a
    /// minute).
    pub(crate) fn beat(&mut self, step: u64) -> Result<()> {
        if self
            .last_beat
            .is_some_and(|t| t.elapsed().as_secs_f64() < HEARTBEAT_SECONDS)
        {
            return Ok(());
        }
        self.last_beat = Some(Instant::now());
        let beat = Heartbeat {
            unix_seconds: unix_seconds(),
            host: host_name(),
            pid: std::process::id(),
            step,
        };
        crate::storage::write_atomic(
            &self.run_dir.join(HEARTBEAT_FILE),
            serde_json::to_string(&beat)?.as_bytes(),
        )
    }

    /// The run stopped: `normrl status` no longer says running.
    pub(crate) fn stop_beating(&self) {
        let _ = std::fs::remove_file(self.run_dir.join(HEARTBEAT_FILE));
    }

    /// `summary.json`, `result.json` and the session's end; then, with
    /// `checkpoint.keep = "none"`, the checkpoints go.
    pub(crate) fn write_end(
        &mut self,
        config: &TrainConfig,
        summary: &RunSummary,
        step: u64,
    ) -> Result<()> {
        let end = hparams::session_end(summary.diverged.is_none(), unix_seconds());
        self.tb
            .plugin_summary(hparams::SESSION_END_TAG, "hparams", end, step);
        let result = RunResult::new(config, self.variant.clone(), summary.clone());
        crate::storage::write_atomic(
            &self.run_dir.join(RESULT_FILE),
            serde_json::to_string(&result)?.as_bytes(),
        )?;
        crate::storage::write_atomic(
            &self.run_dir.join(SUMMARY_FILE),
            serde_json::to_string_pretty(summary)?.as_bytes(),
        )?;
        self.tb.flush()?;
        self.stop_beating();
        if config.checkpoint.keep == Keep::None {
            let dir = self.run_dir.join("checkpoints");
            std::fs::remove_dir_all(&dir)
                .with_context(|| format!("cannot remove {}", dir.display()))?;
        }
        Ok(())
    }
}
