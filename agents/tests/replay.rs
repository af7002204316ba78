//! Replay buffer and samplers.

use normrl_agents::replay::{Batch, FrameEncoding, ReplayBuffer, ReplayError, Sampler};
use rand::SeedableRng;
use rand_xoshiro::Xoshiro256PlusPlus;

/// Fills a buffer with episodes of `len` steps; observation = global frame counter,
/// reward = the step index within the episode.
fn filled(capacity: usize, episodes: usize, len: usize) -> ReplayBuffer {
    let mut replay = ReplayBuffer::new(capacity, 1, false);
    let mut frame = 0.0f32;
    for _ in 0..episodes {
        replay.start_episode(&[frame]);
        for t in 0..len {
            frame += 1.0;
            let last = t + 1 == len;
            replay.push(t % 3, t as f32, last, false, &[frame]);
        }
        frame += 1.0;
    }
    replay
}

fn rng() -> Xoshiro256PlusPlus {
    Xoshiro256PlusPlus::seed_from_u64(7)
}

#[test]
fn next_observation_follows_within_episodes() {
    let replay = filled(1000, 5, 20);
    assert_eq!(replay.transitions(), 100);
    let mut batch = Batch::new(64, 1);
    let mut r = rng();
    for _ in 0..20 {
        replay.sample(Sampler::Uniform, &mut batch, &mut r).unwrap();
        for i in 0..64 {
            assert_eq!(batch.next_obs[i], batch.obs[i] + 1.0);
            let last = batch.rewards[i] == 19.0;
            assert_eq!(batch.terminated[i], if last { 1.0 } else { 0.0 });
        }
    }
}

#[test]
fn sequential_batches_are_consecutive_transitions() {
    let replay = filled(1000, 10, 7);
    let mut batch = Batch::new(16, 1);
    let mut r = rng();
    let mut starts = std::collections::HashSet::new();
    for _ in 0..200 {
        replay
            .sample(Sampler::Sequential, &mut batch, &mut r)
            .unwrap();
        for i in 1..16 {
            // Consecutive frames, or a jump of 2 across an episode boundary (the
            // episode's final frame starts no transition).
            let gap = batch.obs[i] - batch.obs[i - 1];
            let boundary = batch.terminated[i - 1] == 1.0;
            assert_eq!(gap, if boundary { 2.0 } else { 1.0 }, "{:?}", batch.obs);
        }
        starts.insert(batch.obs[0] as i64);
    }
    assert!(starts.len() > 30, "starts vary: {}", starts.len());
}

#[test]
fn recent_draws_only_from_newest_window() {
    let replay = filled(1000, 10, 30); // 300 transitions, frames 0..=309
    let mut batch = Batch::new(32, 1);
    let mut r = rng();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..100 {
        replay
            .sample(Sampler::Recent { window: 40 }, &mut batch, &mut r)
            .unwrap();
        for &o in &batch.obs {
            seen.insert(o as i64);
        }
    }
    // The newest 40 transitions: the last episode's 30 (frames 279..=308) and the
    // previous episode's last 10 (frames 268..=277).
    let allowed: std::collections::HashSet<i64> = (279..=308).chain(268..=277).collect();
    assert!(
        seen.is_subset(&allowed),
        "{:?}",
        seen.difference(&allowed).collect::<Vec<_>>()
    );
    assert_eq!(seen.len(), 40, "the whole window is used");
}

#[test]
fn online_is_newest_transitions_in_order() {
    let replay = filled(1000, 3, 5);
    let mut batch = Batch::new(7, 1);
    replay
        .sample(Sampler::Online, &mut batch, &mut rng())
        .unwrap();
    // Episodes occupy frames 0..=5, 6..=11, 12..=17; transitions start at all but the
    // last frame of each.
    assert_eq!(batch.obs, [9.0, 10.0, 12.0, 13.0, 14.0, 15.0, 16.0]);
}

#[test]
fn ring_wraps_and_evicts_oldest() {
    let replay = filled(50, 40, 10); // 440 frames through a 50-frame ring
    assert!(replay.transitions() <= 49);
    let mut batch = Batch::new(64, 1);
    let mut r = rng();
    for sampler in [Sampler::Uniform, Sampler::Sequential, Sampler::Online] {
        let mut b = Batch::new(if sampler == Sampler::Uniform { 64 } else { 8 }, 1);
        replay.sample(sampler, &mut b, &mut r).unwrap();
        for i in 0..b.size {
            assert!(
                b.obs[i] >= 439.0 - 50.0,
                "{sampler:?} returned evicted frame {}",
                b.obs[i]
            );
            assert_eq!(b.next_obs[i], b.obs[i] + 1.0);
        }
    }
    replay.sample(Sampler::Uniform, &mut batch, &mut r).unwrap();
}

#[test]
fn truncation_keeps_final_observation_and_is_not_terminal() {
    let mut replay = ReplayBuffer::new(10, 2, false);
    replay.start_episode(&[0.0, 0.0]);
    replay.push(1, 1.0, false, true, &[5.0, 5.0]); // time limit
    replay.start_episode(&[9.0, 9.0]);
    let mut batch = Batch::new(1, 2);
    replay
        .sample(Sampler::Online, &mut batch, &mut rng())
        .unwrap();
    assert_eq!(batch.next_obs, [5.0, 5.0]);
    assert_eq!(batch.terminated, [0.0]);
}

/// Stores the one transition `a -> b` (action 2, reward 0.5) in an empty `replay` and
/// samples it back.
fn round_trip(replay: &mut ReplayBuffer, a: &[f32], b: &[f32]) -> Batch {
    replay.start_episode(a);
    replay.push(2, 0.5, false, false, b);
    let mut batch = Batch::new(1, a.len());
    replay
        .sample(Sampler::Uniform, &mut batch, &mut rng())
        .unwrap();
    batch
}

#[test]
fn binary_observations_round_trip_bit_packed() {
    let mut replay = ReplayBuffer::new(10, 130, true);
    let a: Vec<f32> = (0..130).map(|i| ((i * 7) % 3 == 0) as u8 as f32).collect();
    let b: Vec<f32> = a.iter().map(|v| 1.0 - v).collect();
    let batch = round_trip(&mut replay, &a, &b);
    assert_eq!(batch.obs, a);
    assert_eq!(batch.next_obs, b);
    assert_eq!(batch.actions, [2]);
}

#[test]
fn byte_observations_round_trip_exactly() {
    // Every 8-bit level k/255, as the Atari preprocessing produces them.
    let a: Vec<f32> = (0..=255u8).map(|k| f32::from(k) / 255.0).collect();
    let b: Vec<f32> = a.iter().rev().copied().collect();
    let mut replay = ReplayBuffer::with_encoding(4, 256, FrameEncoding::Bytes);
    let batch = round_trip(&mut replay, &a, &b);
    assert_eq!(batch.obs, a);
    assert_eq!(batch.next_obs, b);
}

#[test]
fn too_few_transitions_is_an_error() {
    let replay = filled(100, 1, 3);
    let mut batch = Batch::new(8, 1);
    let err = replay
        .sample(Sampler::Sequential, &mut batch, &mut rng())
        .unwrap_err();
    assert_eq!(
        err,
        ReplayError::TooFew {
            have: 3,
            need: 8,
            sampler: "sequential"
        }
    );
    replay
        .sample(Sampler::Uniform, &mut batch, &mut rng())
        .unwrap();
}

/// The data-dependent init's batch: `n` stored observations evenly spaced from the
/// oldest to the newest (a wrapped ring's live frames only), all of them when fewer are
/// stored, drawn without the sampler's generator.
#[test]
fn spread_observations_span_the_stored_frames() {
    // 5 episodes of 20 steps: frames 0..=104 (one extra frame per episode's start).
    let replay = filled(1000, 5, 20);
    let mut out = vec![];
    replay.spread_observations(4, &mut out);
    assert_eq!(out, [0.0, 26.0, 52.0, 78.0]);
    replay.spread_observations(10_000, &mut out);
    assert_eq!(out.len(), 105);
    assert!(
        out.windows(2).all(|w| w[1] == w[0] + 1.0),
        "every frame once, in order"
    );

    let wrapped = filled(50, 40, 10); // 440 frames through a 50-frame ring
    wrapped.spread_observations(5, &mut out);
    assert_eq!(out.len(), 5);
    assert!(
        out.iter().all(|&f| f >= 439.0 - 50.0),
        "an evicted frame: {out:?}"
    );
    assert!(
        out.windows(2).all(|w| w[1] > w[0]),
        "oldest to newest: {out:?}"
    );
}
