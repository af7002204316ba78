use super::*;
use crate::minatar::test_support::{assert_frozen, rng};

/// A new game whose aliens hold their fire for the whole test.
fn ceasefire(ramping: bool) -> SpaceInvaders {
    let mut g = SpaceInvaders::new(ramping);
    g.shot_timer = 1000;
    g
}

/// A [`ceasefire`] game without ramping of `aliens` and the cannon in column `cannon`,
/// the block marching on the next step.
fn marching(aliens: u128, cannon: i32) -> SpaceInvaders {
    let mut g = ceasefire(false);
    g.aliens = aliens;
    g.cannon = cannon;
    g.move_timer = 0;
    g
}

/// The steps of `1..=n` no-ops on which the block marched; `check(step, g)` looks at
/// the game after each.
fn march_steps(
    g: &mut SpaceInvaders,
    r: &mut GameRng,
    n: u32,
    mut check: impl FnMut(u32, &SpaceInvaders),
) -> Vec<u32> {
    let mut marches = vec![];
    let mut last = g.aliens;
    for step in 1..=n {
        g.step(Action::Noop, r);
        if g.aliens != last {
            marches.push(step);
            last = g.aliens;
        }
        check(step, g);
    }
    marches
}

fn cells(mask: u128) -> Vec<(i32, i32)> {
    (0..100)
        .filter(|i| mask & (1u128 << i) != 0)
        .map(|i| (i / 10, i % 10))
        .collect()
}

fn block(rows: std::ops::RangeInclusive<i32>, cols: std::ops::RangeInclusive<i32>) -> u128 {
    let mut m = 0;
    for r in rows {
        for c in cols.clone() {
            m |= bit(r, c);
        }
    }
    m
}

#[test]
fn noop_episode_is_shot_on_step_17() {
    let mut g = SpaceInvaders::new(true);
    let mut r = rng();
    let mut bullets = vec![];
    for step in 1..=16 {
        assert_eq!(g.step(Action::Noop, &mut r), (0, false), "step {step}");
        bullets.push(cells(g.enemy_bullets));
    }
    // First shot on step 11 from the lowest alien of column 5 (the cannon's column),
    // drawn on the alien's cell; it then falls one row per step.
    for (k, b) in bullets.iter().enumerate().take(10) {
        assert!(b.is_empty(), "no enemy bullet on step {}", k + 1);
    }
    assert_eq!(bullets[10], [(3, 5)]);
    assert_eq!(bullets[11], [(4, 5)]);
    assert_eq!(bullets[15], [(8, 5)]);
    assert_eq!(g.step(Action::Noop, &mut r), (0, true));
    assert_frozen(&mut g, Action::Fire, &mut r);
}

#[test]
fn first_bullet_hits_on_step_6() {
    let mut g = SpaceInvaders::new(true);
    let mut r = rng();
    g.step(Action::Fire, &mut r);
    assert_eq!(cells(g.player_bullets), [(8, 5)], "first seen on row 8");
    for step in 2..=5 {
        assert_eq!(
            g.step(Action::Fire, &mut r).0,
            0,
            "cooling down, step {step}"
        );
        assert_eq!(g.player_bullet_count(), 1);
    }
    assert_eq!(g.step(Action::Fire, &mut r).0, 1, "reaches row 3 on step 6");
    assert_eq!(g.alien_count(), 23);
    assert_eq!(g.aliens & bit(3, 5), 0);
    // Step 6 also fired a new bullet (cooldown over).
    assert_eq!(cells(g.player_bullets), [(8, 5)]);
}

#[test]
fn march_schedule_and_wall_turn() {
    let mut g = ceasefire(true);
    let mut r = rng();
    let marches = march_steps(&mut g, &mut r, 50, |step, g| match step {
        13 => assert_eq!(g.aliens, block(0..=3, 1..=6)),
        25 => assert_eq!(g.aliens, block(0..=3, 0..=5)),
        37 => {
            assert_eq!(g.aliens, block(1..=4, 0..=5), "wall: down one row");
            assert!(!g.moving_left());
        }
        49 => assert_eq!(g.aliens, block(1..=4, 1..=6)),
        _ => {}
    });
    assert_eq!(marches, [13, 25, 37, 49]);
}

#[test]
fn march_period_shrinks_with_alien_count() {
    let mut g = ceasefire(true);
    let mut r = rng();
    g.aliens = bit(0, 4) | bit(0, 6) | bit(1, 5);
    g.move_timer = 0;
    let marches = march_steps(&mut g, &mut r, 12, |_, _| {});
    assert_eq!(marches, [1, 4, 7, 10], "T = min(3, 12)");
    g.aliens = bit(2, 2);
    g.move_timer = 0;
    let start = g.aliens;
    g.step(Action::Noop, &mut r);
    g.step(Action::Noop, &mut r);
    assert_eq!(g.aliens, start >> 2, "a single alien marches every step");
}

#[test]
fn alien_shot_picks_nearest_column_left_on_tie_lowest_alien() {
    let mut g = SpaceInvaders::new(false);
    g.aliens = bit(0, 3) | bit(2, 3) | bit(1, 7);
    g.cannon = 5;
    g.alien_shot();
    assert_eq!(
        cells(g.enemy_bullets),
        [(2, 3)],
        "tie between 3 and 7 goes left"
    );
    g.enemy_bullets = 0;
    g.cannon = 6;
    g.alien_shot();
    assert_eq!(cells(g.enemy_bullets), [(1, 7)]);
}

#[test]
fn enemy_bullet_on_row_9_misses_a_cannon_moving_under_it() {
    let mut r = rng();
    let mut g = ceasefire(false);
    g.enemy_bullets = bit(9, 4);
    g.cannon = 5;
    assert_eq!(g.step(Action::Left, &mut r), (0, false));
    assert_eq!(g.enemy_bullets, 0);
    // A bullet on row 8 of the column the cannon moves into hits.
    let mut g = ceasefire(false);
    g.enemy_bullets = bit(8, 4);
    g.cannon = 5;
    assert_eq!(g.step(Action::Left, &mut r), (0, true));
}

#[test]
fn block_turning_on_row_9_ends_the_game_and_wraps() {
    let mut r = rng();
    let mut g = marching(bit(9, 0) | bit(8, 0), 7);
    assert_eq!(g.step(Action::Noop, &mut r), (0, true));
    assert_eq!(g.aliens, bit(0, 0) | bit(9, 0), "row 9 wrapped to row 0");
    // Aliens on row 9 marching sideways into the cannon.
    let mut g = marching(bit(9, 4), 3);
    assert_eq!(g.step(Action::Noop, &mut r), (0, true));
}

#[test]
fn swap_without_hit_and_wave_refill_with_ramp() {
    let mut r = rng();
    // The block steps sideways off the bullet's new cell: no hit.
    let mut g = ceasefire(true);
    g.aliens = bit(4, 5);
    g.player_bullets = bit(5, 5); // moves to (4, 5) in phase 2
    g.move_timer = 0; // the alien marches left to (4, 4) in phase 5
    assert_eq!(g.step(Action::Noop, &mut r).0, 0);
    assert_eq!(g.aliens, bit(4, 4));
    // Clearing the wave: refill, faster march, bullets kept.
    let mut g = ceasefire(true);
    g.aliens = bit(4, 5);
    g.player_bullets = bit(5, 5) | bit(9, 0);
    g.enemy_bullets = bit(2, 2);
    assert_eq!(g.step(Action::Noop, &mut r), (1, false));
    assert_eq!(g.aliens, ALIEN_BLOCK);
    assert_eq!(g.move_interval, 11);
    assert_eq!(g.ramp_index, 1);
    assert_eq!(cells(g.player_bullets), [(8, 0)]);
    assert_eq!(cells(g.enemy_bullets), [(3, 2)]);
    // Ramping stops at 6; disabled ramping keeps 12.
    g.move_interval = 6;
    g.aliens = bit(4, 7);
    g.player_bullets = bit(5, 7);
    g.step(Action::Noop, &mut r);
    assert_eq!(g.move_interval, 6);
    let mut off = ceasefire(false);
    off.aliens = bit(4, 5);
    off.player_bullets = bit(5, 5);
    off.step(Action::Noop, &mut r);
    assert_eq!((off.move_interval, off.ramp_index), (12, 0));
}

#[test]
fn scripted_dodging_trajectory() {
    // Fire whenever possible and step out of the way of each falling bullet. Every
    // event below is derived by hand from the rules.
    let mut g = SpaceInvaders::new(true);
    let mut r = rng();
    let mut total = 0;
    let script = |step: u32| match step {
        12 | 13 => Action::Left, // bullet falling in column 5; cannon to column 3
        _ => Action::Fire,
    };
    for step in 1..=20 {
        let (reward, terminal) = g.step(script(step), &mut r);
        total += reward;
        assert!(!terminal, "step {step}");
        match step {
            6 => assert_eq!(reward, 1, "hits (3, 5)"),
            11 => {
                // Column 5's lowest alien is now (2, 5); the second bullet is on row 3.
                assert_eq!(cells(g.enemy_bullets), [(2, 5)]);
                assert_eq!(reward, 0);
            }
            12 => assert_eq!(reward, 1, "second bullet reaches (2, 5)"),
            13 => {
                assert_eq!(g.cannon(), 3);
                assert_eq!(cells(g.enemy_bullets), [(4, 5)]);
            }
            // The block marched left on step 13: former column 6 is now column 5, and
            // the third bullet (fired on step 11) reaches its row-3 alien.
            16 => assert_eq!(reward, 1),
            18 => assert_eq!(cells(g.enemy_bullets), [(9, 5)], "misses the cannon"),
            19 => assert_eq!(g.enemy_bullet_count(), 0),
            _ => assert_eq!(reward, 0, "step {step}"),
        }
    }
    assert_eq!(total, 3);
    assert_eq!(g.alien_count(), 21);
}
