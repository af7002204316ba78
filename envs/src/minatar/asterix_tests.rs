use super::*;
use crate::minatar::test_support::{assert_frozen, assert_set, rendered, rng};

fn enemy(col: i32, right: bool) -> Option<Entity> {
    Some(Entity {
        col,
        right,
        gold: false,
    })
}

fn gold(col: i32, right: bool) -> Option<Entity> {
    Some(Entity {
        col,
        right,
        gold: true,
    })
}

/// A new game (no ramping) with the player at `player`; where `moving`, the lanes move
/// on the next step.
fn player_at(player: (i32, i32), moving: bool) -> Asterix {
    let mut g = Asterix::new(false);
    g.player = player;
    if moving {
        g.move_timer = 0;
    }
    g
}

#[test]
fn spawns_on_step_11_and_every_10_then_moves_every_5() {
    let mut g = Asterix::new(false);
    let mut r = rng();
    g.player = (1, 5); // out of most traffic; the test re-checks terminal below
    let count = |g: &Asterix| g.lanes.iter().flatten().count();
    for step in 1..=10 {
        g.step(Action::Noop, &mut r);
        assert_eq!(count(&g), 0, "nothing before step 11 (step {step})");
    }
    g.step(Action::Noop, &mut r);
    assert_eq!(count(&g), 1);
    let (lane, e) = g
        .lanes
        .iter()
        .enumerate()
        .find_map(|(i, e)| e.map(|e| (i, e)))
        .unwrap();
    // Spawned at the edge and moved in the same step (motion also falls on step 11).
    assert_eq!(e.col, if e.right { 1 } else { 8 });
    for step in 12..=15 {
        g.step(Action::Noop, &mut r);
        assert_eq!(
            g.lanes[lane].unwrap().col,
            e.col,
            "no motion on step {step}"
        );
    }
    g.step(Action::Noop, &mut r); // step 16
    let moved = g.lanes[lane].map(|m| m.col);
    assert_eq!(moved, Some(e.col + if e.right { 1 } else { -1 }));
}

#[test]
fn ramps_every_102_steps_with_documented_intervals() {
    let mut g = Asterix::new(true);
    let mut r = rng();
    let mut seen = vec![];
    let mut last = g.intervals();
    for step in 1..=102 * 12 {
        g.lanes = [None; 8]; // keep the player alive; ramping is time-based only
        g.step(Action::Noop, &mut r);
        if g.intervals() != last {
            seen.push((step, g.intervals()));
            last = g.intervals();
        }
    }
    let expected: Vec<_> = [
        (9, 5),
        (8, 4),
        (7, 4),
        (6, 3),
        (5, 3),
        (4, 2),
        (3, 2),
        (2, 1),
        (1, 1),
    ]
    .iter()
    .enumerate()
    .map(|(k, &iv)| (102 * (k + 1), iv))
    .collect();
    assert_eq!(seen, expected);
    assert_eq!(g.ramp_index, 9, "ramping stops at (1, 1)");
}

#[test]
fn ramping_disabled_keeps_intervals() {
    let mut g = Asterix::new(false);
    let mut r = rng();
    for _ in 0..1000 {
        g.lanes = [None; 8];
        g.step(Action::Noop, &mut r);
    }
    assert_eq!(g.intervals(), (10, 5));
    assert_eq!(g.ramp_index, 0);
}

#[test]
fn player_moves_are_clamped_to_rows_1_to_8() {
    let mut g = Asterix::new(false);
    let mut r = rng();
    for _ in 0..10 {
        g.step(Action::Up, &mut r);
    }
    assert_eq!(g.player, (1, 5));
    g.player = (8, 9);
    g.step(Action::Down, &mut r);
    g.step(Action::Right, &mut r);
    assert_eq!(g.player, (8, 9));
    g.player = (4, 0);
    g.step(Action::Left, &mut r);
    g.step(Action::Fire, &mut r);
    assert_eq!(g.player, (4, 0));
}

#[test]
fn stepping_into_gold_collects_and_into_enemy_kills() {
    let mut r = rng();
    let mut g = player_at((3, 4), false);
    g.lanes[2] = gold(5, false); // row 3
    assert_eq!(g.step(Action::Right, &mut r), (1, false));
    assert_eq!(g.lanes[2], None);

    let mut g = player_at((3, 4), false);
    g.lanes[1] = enemy(4, true); // row 2
    assert_eq!(g.step(Action::Up, &mut r), (0, true));
    assert!(g.lanes[1].is_some(), "the enemy stays");
}

#[test]
fn no_swap_without_contact_and_moving_entity_hits_player() {
    let mut r = rng();
    // Player moves right into the cell the enemy leaves: caught before motion.
    let mut g = player_at((4, 3), true);
    g.lanes[3] = enemy(4, false);
    assert_eq!(g.step(Action::Right, &mut r), (0, true));
    // Enemy moves into a waiting player on a motion step.
    let mut g = player_at((4, 3), true);
    g.lanes[3] = enemy(4, false);
    assert_eq!(g.step(Action::Noop, &mut r), (0, true));
    assert_eq!(g.lanes[3].unwrap().col, 3);
    // Gold moving into the player pays.
    let mut g = player_at((4, 3), true);
    g.lanes[3] = gold(2, true);
    assert_eq!(g.step(Action::Noop, &mut r), (1, false));
    assert_eq!(g.lanes[3], None);
}

#[test]
fn entity_leaving_grid_is_removed_before_contact() {
    let mut r = rng();
    let mut g = player_at((4, 0), true);
    g.lanes[3] = enemy(0, false);
    g.lanes[5] = gold(9, true);
    // The player steps off the enemy's cell before the contact test.
    assert!(!g.step(Action::Right, &mut r).1, "player stepped away");
    assert_eq!(g.lanes[3], None, "left the grid");
    assert_eq!(g.lanes[5], None, "left the grid");
}

#[test]
fn termination_does_not_stop_later_phases() {
    let mut r = rng();
    let mut g = player_at((4, 5), true);
    g.lanes[3] = enemy(5, true); // kills in phase 3
    g.lanes[4] = gold(9, true); // still leaves the grid in phase 4
    let (reward, terminal) = g.step(Action::Noop, &mut r);
    assert!(terminal);
    assert_eq!(reward, 0);
    assert_eq!(g.lanes[4], None);
    assert_eq!(g.lanes[3].unwrap().col, 6, "the enemy still moved");
    assert_eq!(g.move_timer, g.move_interval - 1);
    assert_frozen(&mut g, Action::Left, &mut r);
}

#[test]
fn spawn_uses_kth_free_lane_and_consumes_draws_when_full() {
    let mut g = Asterix::new(false);
    g.spawn_timer = 0;
    g.player = (8, 9);
    for lane in 0..8 {
        if lane != 6 {
            g.lanes[lane] = gold(5, true);
        }
    }
    let mut r = rng();
    g.step(Action::Noop, &mut r);
    assert!(g.lanes[6].is_some(), "the only free lane was used");

    // No free lane: the two uniforms are still drawn, the integer is not.
    let mut full = Asterix::new(false);
    full.spawn_timer = 0;
    full.lanes = [gold(5, true); 8];
    let mut r1 = rng();
    full.step(Action::Noop, &mut r1);
    let mut r2 = rng();
    uniform(&mut r2);
    uniform(&mut r2);
    assert_eq!(r1, r2);
}

#[test]
fn spawn_distribution_direction_and_gold() {
    let mut r = rng();
    let (mut right, mut golds, n) = (0, 0, 30_000);
    for _ in 0..n {
        let mut g = Asterix::new(false);
        g.spawn(&mut r);
        let e = g.lanes.iter().flatten().next().unwrap();
        right += e.right as u32;
        golds += e.gold as u32;
        assert_eq!(e.col, if e.right { 0 } else { 9 });
    }
    let (pr, pg) = (right as f64 / n as f64, golds as f64 / n as f64);
    assert!((pr - 0.5).abs() < 0.015, "{pr}");
    assert!((pg - 1.0 / 3.0).abs() < 0.015, "{pg}");
}

#[test]
fn observation_channels_and_trails() {
    let mut g = Asterix::new(false);
    g.lanes[0] = enemy(0, true); // trail would be column -1: not drawn
    g.lanes[1] = gold(5, false); // trail at column 6
    g.lanes[2] = enemy(9, false); // trail at column 10: not drawn
    let obs = rendered(&g);
    assert_set(
        &obs,
        &[(0, 5, 5), (1, 1, 0), (1, 3, 9), (3, 2, 5), (2, 2, 6)],
    );
    assert_eq!(obs[200..300].iter().sum::<f32>(), 1.0);
    assert_eq!(obs.iter().sum::<f32>(), 5.0);
}
