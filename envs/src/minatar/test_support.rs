//! Helpers the games' unit tests share: the seeded stream, a started wrapper, cell
//! look-ups in an observation and the check that a finished game stays frozen.

use super::{Action, Game, GameRng, MinAtar, MinAtarConfig, CELLS, SIZE};
use rand::SeedableRng;
use std::fmt::Debug;

/// The stream every game test draws from, so that expected draws can be replayed.
pub(crate) fn rng() -> GameRng {
    GameRng::seed_from_u64(0)
}

/// A wrapper around `G` with sticky probability `sticky`, reset with `seed`, and the
/// observation that reset wrote.
pub(crate) fn started<G: Game>(sticky: f64, seed: u64) -> (MinAtar<G>, Vec<f32>) {
    let mut env = MinAtar::<G>::new(MinAtarConfig {
        sticky,
        ..Default::default()
    });
    let mut obs = vec![0.0; G::CHANNELS * CELLS];
    crate::Env::reset(&mut env, Some(seed), &mut obs).unwrap();
    (env, obs)
}

/// Cell `(row, col)` of `channel` in a `[C, 10, 10]` observation.
pub(crate) fn cell(obs: &[f32], channel: usize, row: usize, col: usize) -> f32 {
    obs[channel * CELLS + row * SIZE + col]
}

/// A terminal game is frozen: stepping it with `action` reports `(0, true)` and changes
/// nothing.
pub(crate) fn assert_frozen<G: Game + PartialEq + Debug>(
    g: &mut G,
    action: Action,
    r: &mut GameRng,
) {
    let frozen = g.clone();
    assert_eq!(g.step(action, r), (0, true));
    assert_eq!(*g, frozen);
}

/// The observation of `g` alone.
pub(crate) fn rendered<G: Game>(g: &G) -> Vec<f32> {
    let mut obs = vec![0.0; G::CHANNELS * CELLS];
    g.render(&mut obs);
    obs
}

/// Asserts that every `(channel, row, col)` of `cells` is set in `obs`.
pub(crate) fn assert_set(obs: &[f32], cells: &[(usize, usize, usize)]) {
    for &(channel, row, col) in cells {
        assert_eq!(
            cell(obs, channel, row, col),
            1.0,
            "{:?}",
            (channel, row, col)
        );
    }
}
