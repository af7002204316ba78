//! One step of every member, their environments on `run.threads` threads where their
//! work pays for the hand-off.

use std::time::{Duration, Instant};

use anyhow::Result;
use normrl_agents::replay::ReplayBuffer;

use super::Population;
use crate::run::train::Trainer;

/// Steps timed on one thread before a population with `run.threads > 1` decides
/// whether its members' work is worth threads.
const PROBE_STEPS: u32 = 64;

/// The members' work per step from which threads pay (their hand-off costs tens of
/// microseconds, more on busy cores).
const WORTH_THREADS: Duration = Duration::from_micros(200);

/// Whether a population steps its members on threads.
#[derive(Clone, Copy, Debug)]
pub(super) enum Threading {
    /// One thread (`run.threads = 1`, or too little work to share).
    Off,
    /// Timing the first steps on one thread.
    Probing {
        steps: u32,
        spent: Duration,
    },
    On,
}

impl Population {
    /// One step of every member: the greedy actions of all in one forward, then each
    /// member's own epsilon-greedy draw and environment step (on `run.threads` threads:
    /// each member's environment, replay and generator are its own, so the threads
    /// change nothing but the time).
    pub(super) fn act(&mut self) -> Result<()> {
        let obs: Vec<f32> = self
            .members
            .iter()
            .flat_map(|m| m.obs().iter().copied())
            .collect();
        let start = Instant::now();
        let greedy = self.agents.greedy_actions(&obs)?;
        let forward_done = Instant::now();
        // Frames written so far, to find this step's new ones for the device mirror.
        let written: Option<Vec<u64>> = self.frames.as_ref().map(|_| {
            let replays = self.members.iter().map(Trainer::replay);
            replays.map(ReplayBuffer::written).collect()
        });
        let ended = &self.ended;
        let step = |(i, member): (usize, &mut Trainer)| -> Result<()> {
            if ended[i] {
                return Ok(());
            }
            let action = member.explore_or(greedy[i] as usize)?;
            member.apply_action(action)
        };
        match (&self.pool, self.threading) {
            (Some(pool), Threading::On) => {
                // One contiguous chunk of members per thread: one task each, so the
                // threads' hand-offs cost the same whatever P.
                use rayon::prelude::*;
                let chunk = self.members.len().div_ceil(pool.current_num_threads());
                let members = &mut self.members;
                pool.install(|| {
                    members
                        .par_chunks_mut(chunk)
                        .enumerate()
                        .try_for_each(|(c, part)| {
                            let first = c * chunk;
                            part.iter_mut()
                                .enumerate()
                                .try_for_each(|(j, m)| step((first + j, m)))
                        })
                })?
            }
            _ => self.members.iter_mut().enumerate().try_for_each(step)?,
        }
        let members_done = Instant::now();
        self.decide_threading(members_done - forward_done);
        if let Some(written) = written {
            self.mirror_new_frames(&written)?;
        }
        let t = &mut self.times;
        t.steps += 1;
        t.forward += forward_done - start;
        t.members += members_done - forward_done;
        t.mirror += members_done.elapsed();
        Ok(())
    }

    /// With `run.threads > 1`: after the first [`PROBE_STEPS`] steps on one thread,
    /// threads step the members only if their work takes at least [`WORTH_THREADS`] a
    /// step. Below that the hand-off to other threads costs more than it saves, and on
    /// a machine whose cores are busy it costs far more (measured: a CartPole
    /// population of 256 on a busy 2-core machine, 5x slower on two threads).
    fn decide_threading(&mut self, members_took: Duration) {
        let Threading::Probing { steps, spent } = &mut self.threading else {
            return;
        };
        *steps += 1;
        *spent += members_took;
        if *steps < PROBE_STEPS {
            return;
        }
        let per_step = *spent / *steps;
        self.threading = match per_step >= WORTH_THREADS {
            true => Threading::On,
            false => {
                eprintln!(
                    "run.threads = {}: the members' environments take {} us a step, too little to share; stepping them on one thread",
                    self.members[0].config().run.threads,
                    per_step.as_micros()
                );
                Threading::Off
            }
        };
    }

    /// Steps the members on `run.threads` threads from the first step, whatever their
    /// work (for tests: that threads change nothing in a run).
    #[cfg(any(test, feature = "test-support"))]
    pub fn always_threaded(mut self) -> Self {
        if self.pool.is_some() {
            self.threading = Threading::On;
        }
        self
    }

    /// Whether the members' environments step on threads now.
    #[cfg(any(test, feature = "test-support"))]
    pub fn steps_on_threads(&self) -> bool {
        matches!(self.threading, Threading::On)
    }
}
