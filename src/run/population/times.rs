//! Where a population's steps spend their wall time, and the line it says at the end.

use std::time::Duration;

use super::Population;

/// Wall time a population spent in each part of its steps since it started (or since
/// [`Population::reset_times`]): what `bench population-host` reports per member.
#[derive(Clone, Debug, Default)]
pub struct HostTimes {
    /// Steps taken.
    pub steps: u64,
    /// The batched greedy forward and its one read, for all members.
    pub forward: Duration,
    /// The members' own work: exploration draw, environment step, replay push.
    pub members: Duration,
    /// The new frames' writes into the device mirror.
    pub mirror: Duration,
    /// Drawing the members' batches from their replays.
    pub sample: Duration,
    /// The population's updates (on an accelerator: mostly launching them).
    pub update: Duration,
    /// Wall time of whole steps (everything a step did, its logs, evaluations and
    /// checkpoints included) before learning starts and after, and their counts.
    pub wall: [Duration; 2],
    pub wall_steps: [u64; 2],
}

impl HostTimes {
    /// Agent-steps per second of `members` members over whole steps, acting only and
    /// with updates (`None` where no such step ran).
    pub fn throughput(&self, members: usize) -> [Option<f64>; 2] {
        [0, 1].map(|k| {
            let seconds = self.wall[k].as_secs_f64();
            (self.wall_steps[k] > 0 && seconds > 0.0)
                .then(|| (self.wall_steps[k] * members as u64) as f64 / seconds)
        })
    }
}

impl Population {
    /// One line of what the population trained per second, on standard error: the
    /// number a user compares with other trainers (`scripts/gpu-check.sh` reads it).
    pub(super) fn say_throughput(&self) {
        if self.quiet {
            return;
        }
        let members = self.members.len();
        let [acting, updating] = self.times.throughput(members);
        let part = |rate: Option<f64>, steps: u64, what: &str| {
            rate.map(|r| format!("{r:.0} agent-steps/s {what} ({steps} steps)"))
        };
        let parts: Vec<String> = [
            part(updating, self.times.wall_steps[1], "with updates"),
            part(acting, self.times.wall_steps[0], "acting only"),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !parts.is_empty() {
            let device = self.agents.device();
            let on = if device.is_cpu() { "cpu" } else { "cuda" };
            eprintln!("population of {members} on {on}: {}", parts.join(", "));
        }
    }

    /// Where the steps' time went since the start or the last [`Self::reset_times`].
    pub fn times(&self) -> &HostTimes {
        &self.times
    }

    pub fn reset_times(&mut self) {
        self.times = HostTimes::default();
    }
}
