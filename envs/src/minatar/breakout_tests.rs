use super::*;
use crate::minatar::test_support::{assert_frozen, cell, rng, started};
use crate::minatar::{MinAtar, MinAtarConfig};
use crate::Env;

/// A state with the ball at `ball` moving `dir`, the paddle at `paddle`, no bricks.
fn situation(ball: (i32, i32), dir: (i32, i32), paddle: i32) -> Breakout {
    Breakout {
        paddle,
        ball,
        dir,
        trail: ball,
        bricks: 0,
        strike: false,
        terminal: false,
    }
}

/// A new game, its bricks all standing, with the ball starting at `ball` moving `dir`
/// (as a reset may start it).
fn starting_at(ball: (i32, i32), dir: (i32, i32)) -> Breakout {
    let mut g = Breakout::new(true);
    g.ball = ball;
    g.trail = ball;
    g.dir = dir;
    g
}

/// What a step did: its reward and end, then the ball's cell and direction.
type After = ((u32, bool), (i32, i32), (i32, i32));

/// One no-op step of `g`.
fn noop(g: &mut Breakout) -> After {
    let step = g.step(Action::Noop, &mut rng());
    (step, g.ball, g.dir)
}

/// One no-op step of [`situation`]`(ball, dir, paddle)`.
fn after_noop(ball: (i32, i32), dir: (i32, i32), paddle: i32) -> After {
    noop(&mut situation(ball, dir, paddle))
}

#[test]
fn reset_has_thirty_bricks_and_both_starts() {
    let mut seen = [false, false];
    let mut r = rng();
    let mut g = Breakout::new(true);
    for _ in 0..64 {
        g.reset(&mut r);
        assert_eq!(g.brick_count(), 30);
        assert_eq!(g.paddle, 4);
        assert_eq!(g.trail, g.ball);
        match (g.ball, g.dir) {
            ((3, 0), (1, 1)) => seen[0] = true,
            ((3, 9), (1, -1)) => seen[1] = true,
            other => panic!("unexpected start {other:?}"),
        }
    }
    assert_eq!(seen, [true, true]);
}

#[test]
fn noop_from_left_start_loses_ball_on_step_six() {
    let mut g = starting_at((3, 0), (1, 1));
    let mut r = rng();
    let expected = [(4, 1), (5, 2), (6, 3), (7, 4), (8, 5)];
    for want in expected {
        assert_eq!(g.step(Action::Noop, &mut r), (0, false));
        assert_eq!(g.ball, want);
    }
    assert_eq!(g.step(Action::Noop, &mut r), (0, true));
    assert_eq!(g.ball, (9, 6), "the lost ball is drawn on row 9");
    // Frozen after the end.
    assert_frozen(&mut g, Action::Left, &mut r);
}

#[test]
fn noop_from_right_start_bounces_then_breaks_a_brick() {
    let mut g = starting_at((3, 9), (1, -1));
    let mut r = rng();
    // Down-left to row 8, paddle (col 4) right below the old cell at step 6: vertical
    // flip, ball stays on row 8 and shifts left. Then up-left to the wall.
    let path = [
        (4, 8),
        (5, 7),
        (6, 6),
        (7, 5),
        (8, 4),
        (8, 3),
        (7, 2),
        (6, 1),
        (5, 0),
        (4, 0), // side wall: column clamped, horizontal flip
    ];
    for (k, want) in path.iter().enumerate() {
        assert_eq!(g.step(Action::Noop, &mut r), (0, false), "step {}", k + 1);
        assert_eq!(g.ball, *want, "step {}", k + 1);
    }
    assert_eq!(g.dir, (-1, 1));
    // Step 11: up-right into brick (3, 1): +1, stays on row 4, shifts to column 1.
    assert_eq!(g.step(Action::Noop, &mut r), (1, false));
    assert_eq!(g.ball, (4, 1));
    assert_eq!(
        g.trail,
        (4, 0),
        "trail beside the ball after a row-keeping bounce"
    );
    assert_eq!(g.dir, (1, 1));
    assert!(g.strike);
    assert_eq!(g.brick_count(), 29);
    assert!(!g.has_brick(3, 1));
    // Step 12 touches no brick: the strike flag clears.
    g.step(Action::Noop, &mut r);
    assert_eq!(g.ball, (5, 2));
    assert!(!g.strike);
}

#[test]
fn strike_flag_lets_ball_pass_into_bricks_until_a_non_brick_step() {
    let mut g = situation((5, 4), (-1, 1), 0);
    let mut r = rng();
    g.bricks = bit(4, 5) | bit(3, 6) | bit(1, 8);
    g.strike = true;
    // Target (4, 5) holds a brick, but the flag is set: pass into it, no reward.
    assert_eq!(g.step(Action::Noop, &mut r), (0, false));
    assert_eq!(g.ball, (4, 5));
    assert_eq!(g.dir, (-1, 1));
    assert!(g.has_brick(4, 5), "brick stays under the ball");
    assert!(g.strike);
    // Again into (3, 6): still a brick step, flag stays.
    assert_eq!(g.step(Action::Noop, &mut r), (0, false));
    assert_eq!(g.ball, (3, 6));
    assert!(g.strike);
    // (2, 7) is empty: the flag clears.
    g.step(Action::Noop, &mut r);
    assert_eq!(g.ball, (2, 7));
    assert!(!g.strike);
    // (1, 8) holds a brick and the flag is clear: broken, bounce down, column shifts.
    assert_eq!(g.step(Action::Noop, &mut r), (1, false));
    assert_eq!(g.ball, (2, 8));
    assert_eq!(g.dir, (1, 1));
    assert_eq!(g.bricks, bit(4, 5) | bit(3, 6));
}

#[test]
fn ball_can_rest_on_a_brick_after_a_bounce() {
    // Up-right into (2, 5): broken; the ball lands on (3, 5) which holds a brick that is
    // not tested this step.
    let mut g = situation((3, 4), (-1, 1), 0);
    g.bricks = bit(2, 5) | bit(3, 5);
    assert_eq!(noop(&mut g), ((1, false), (3, 5), (1, 1)));
    assert!(g.has_brick(3, 5));
}

#[test]
fn top_wall_and_top_corner() {
    let mut r = rng();
    let after = after_noop((0, 4), (-1, 1), 0);
    assert_eq!(after, ((0, false), (0, 5), (1, 1)));

    let mut g = situation((0, 9), (-1, 1), 0);
    g.step(Action::Noop, &mut r);
    assert_eq!(g.ball, (0, 9), "both flips: the ball stays on its cell");
    assert_eq!(g.trail, g.ball);
    assert_eq!(g.dir, (1, -1));
}

#[test]
fn side_wall_then_brick_uses_clamped_column() {
    let mut g = situation((4, 9), (-1, 1), 0);
    g.bricks = bit(3, 9) | bit(3, 8);
    assert_eq!(noop(&mut g), ((1, false), (4, 9), (1, -1)));
    assert_eq!(g.bricks, bit(3, 8), "the brick straight above was hit");
}

#[test]
fn paddle_under_old_cell_flips_vertically() {
    let after = after_noop((8, 5), (1, 1), 5);
    assert_eq!(after, ((0, false), (8, 6), (-1, 1)));
}

#[test]
fn paddle_at_target_column_reverses_fully() {
    let after = after_noop((8, 5), (1, 1), 6);
    assert_eq!(after, ((0, false), (8, 6), (-1, -1)));
}

#[test]
fn paddle_test_uses_this_steps_paddle_move() {
    let mut r = rng();
    // Paddle under the old cell moves away: lost.
    let mut g = situation((8, 5), (1, 1), 5);
    assert_eq!(g.step(Action::Left, &mut r), (0, true));
    assert_eq!(g.ball, (9, 6));
    // Paddle moves into the target column: full reversal.
    let mut g = situation((8, 5), (1, 1), 5);
    assert_eq!(g.step(Action::Right, &mut r), (0, false));
    assert_eq!(g.dir, (-1, -1));
    // Up, down and fire do not move the paddle.
    let mut g = situation((5, 5), (1, 1), 5);
    for a in [Action::Up, Action::Down, Action::Fire, Action::Noop] {
        g.step(a, &mut r);
        assert_eq!(g.paddle, 5);
    }
    // The paddle is clamped at the edges.
    let mut g = situation((5, 5), (-1, 1), 0);
    g.step(Action::Left, &mut r);
    assert_eq!(g.paddle, 0);
    g.paddle = 9;
    g.step(Action::Right, &mut r);
    assert_eq!(g.paddle, 9);
}

#[test]
fn side_wall_at_bottom_only_paddle_under_ball_saves() {
    let mut r = rng();
    let after = after_noop((8, 9), (1, 1), 9);
    assert_eq!(after, ((0, false), (8, 9), (-1, -1)));
    let mut g = situation((8, 9), (1, 1), 8);
    assert_eq!(g.step(Action::Noop, &mut r), (0, true));
    assert_eq!(g.ball, (9, 9));
}

#[test]
fn refill_waits_for_bottom_row_and_happens_even_when_ball_is_lost() {
    let mut r = rng();
    let mut g = situation((7, 3), (1, 1), 0);
    g.step(Action::Noop, &mut r);
    assert_eq!(g.brick_count(), 0, "no refill away from the bottom test");
    assert_eq!(g.step(Action::Noop, &mut r), (0, true));
    assert_eq!(g.brick_count(), 30);
    // And when the paddle saves the ball.
    let mut g = situation((8, 3), (1, 1), 3);
    assert_eq!(g.step(Action::Noop, &mut r), (0, false));
    assert_eq!(g.bricks, BRICK_ROWS);
}

#[test]
fn observation_channels() {
    let (mut env, mut obs) = started::<Breakout>(0.0, 1);
    let (row, col) = env.game().ball();
    assert_eq!(cell(&obs, 0, 9, 4), 1.0);
    assert_eq!(cell(&obs, 1, row as usize, col as usize), 1.0);
    assert_eq!(cell(&obs, 2, row as usize, col as usize), 1.0);
    assert_eq!(
        cell(&obs, 3, row as usize, col as usize),
        1.0,
        "start cell is a brick"
    );
    assert_eq!(obs.iter().sum::<f32>(), 1.0 + 1.0 + 1.0 + 30.0);
    env.step(0, &mut obs).unwrap();
    let (r2, c2) = env.game().ball();
    assert_eq!(cell(&obs, 1, r2 as usize, c2 as usize), 1.0);
    assert_eq!(cell(&obs, 2, row as usize, col as usize), 1.0);
    assert_eq!(obs[100..200].iter().sum::<f32>(), 1.0);
}

#[test]
fn same_seed_same_episode() {
    let run = |seed| {
        let mut env = MinAtar::<Breakout>::new(MinAtarConfig::default());
        let mut obs = vec![0.0; 400];
        env.reset(Some(seed), &mut obs).unwrap();
        let mut trace = vec![];
        for i in 0..300 {
            let s = env.step(i % 3, &mut obs).unwrap();
            trace.push((s.reward, s.terminated, env.game().ball()));
        }
        trace
    };
    assert_eq!(run(9), run(9));
}
