use super::*;
use crate::minatar::test_support::rng;

/// A game where nothing spawns for a long time.
fn calm() -> Seaquest {
    let mut g = Seaquest::new(true);
    g.enemy_spawn_timer = 100_000;
    g.diver_spawn_timer = 100_000;
    g
}

/// A [`calm`] game's submarine dives one row and, holding `oxygen` and `divers`
/// aboard, surfaces (stepping with `r`): that step's reward and end, and the game.
fn surface(r: &mut GameRng, oxygen: i32, divers: i32) -> ((u32, bool), Seaquest) {
    let mut g = calm();
    g.step(Action::Down, r);
    g.oxygen = oxygen;
    g.divers_aboard = divers;
    (g.step(Action::Up, r), g)
}

/// The steps of `1..=n` no-ops on which the column `col` reads changed from the step
/// before (where it reads one both times).
fn move_steps(
    g: &mut Seaquest,
    r: &mut GameRng,
    n: u32,
    col: impl Fn(&Seaquest) -> Option<i32>,
) -> Vec<u32> {
    let mut moves = vec![];
    let mut last = None;
    for step in 1..=n {
        g.step(Action::Noop, r);
        let now = col(g);
        if now.is_some() && last.is_some() && now != last {
            moves.push(step);
        }
        last = now;
    }
    moves
}

/// A [`calm`] game with the submarine in the top left corner, out of the way.
fn cornered() -> Seaquest {
    let mut g = calm();
    g.player = (0, 0);
    g
}

fn mover(row: i32, col: i32, right: bool, move_timer: u32) -> Mover {
    Mover {
        row,
        col,
        right,
        move_timer,
        shot_timer: 0,
    }
}

fn render(g: &Seaquest) -> Vec<f32> {
    let mut obs = vec![0.0; 1000];
    g.render(&mut obs);
    obs
}

fn channel_count(obs: &[f32], c: usize) -> usize {
    obs[c * 100..(c + 1) * 100]
        .iter()
        .filter(|&&v| v == 1.0)
        .count()
}

#[test]
fn staying_at_surface_is_safe_forever() {
    let mut g = Seaquest::new(true);
    let mut r = rng();
    for _ in 0..5000 {
        assert_eq!(g.step(Action::Noop, &mut r), (0, false));
    }
    assert_eq!(g.oxygen, 200);
    assert!(!g.fish.is_empty() || !g.subs.is_empty() || !g.divers.is_empty());
}

#[test]
fn oxygen_runs_out_on_step_201() {
    let mut g = calm();
    let mut r = rng();
    assert_eq!(channel_count(&render(&g), 7), 10, "full gauge at 200");
    g.step(Action::Down, &mut r);
    assert_eq!(g.oxygen, 199);
    assert_eq!(channel_count(&render(&g), 7), 9);
    for k in 2..=200 {
        assert!(!g.step(Action::Noop, &mut r).1, "alive after step {k}");
        assert_eq!(g.oxygen, 200 - k);
        let expected_gauge = (200 - k) as usize / 20;
        assert_eq!(
            channel_count(&render(&g), 7),
            expected_gauge,
            "oxygen {}",
            g.oxygen
        );
    }
    assert_eq!(g.step(Action::Noop, &mut r), (0, true));
    assert_eq!(g.oxygen, -1);
    assert_eq!(channel_count(&render(&g), 7), 0);
}

#[test]
fn surfacing_with_no_divers_terminates() {
    let mut g = calm();
    let mut r = rng();
    g.step(Action::Down, &mut r);
    assert!(!g.surfaced);
    assert_eq!(g.step(Action::Up, &mut r), (0, true));
}

#[test]
fn surfacing_with_some_divers_refills_and_costs_one() {
    let mut g = calm();
    let mut r = rng();
    g.step(Action::Down, &mut r);
    g.step(Action::Down, &mut r);
    g.divers_aboard = 3;
    g.step(Action::Up, &mut r);
    assert_eq!(g.step(Action::Up, &mut r), (0, false));
    assert_eq!((g.oxygen, g.divers_aboard, g.surfaced), (200, 2, true));
    assert_eq!(g.ramp_index, 1);
    assert_eq!(g.enemy_spawn_interval, 19);
    // Staying up does nothing more.
    g.step(Action::Noop, &mut r);
    assert_eq!((g.oxygen, g.divers_aboard, g.ramp_index), (200, 2, 1));
}

#[test]
fn full_load_pays_oxygen_over_20_and_leaves_minus_one() {
    let mut r = rng();
    let (step, mut g) = surface(&mut r, 117, 6);
    assert_eq!(step, (5, false), "floor(117 / 20) = 5");
    assert_eq!(g.divers_aboard, -1);
    assert_eq!(channel_count(&render(&g), 8), 0, "no gauge for counts <= 0");
    // Surfacing with a negative count is not a termination.
    g.step(Action::Down, &mut r);
    assert_eq!(g.step(Action::Up, &mut r), (0, false));
    assert_eq!(g.divers_aboard, -2);
    assert_eq!(g.oxygen, 200);
}

#[test]
fn oxygen_zero_while_surfacing_terminates_and_still_scores() {
    let mut r = rng();
    let (step, g) = surface(&mut r, 0, 6);
    assert_eq!(step, (0, true), "floor(0 / 20) = 0 reward");
    assert_eq!(g.oxygen, 200, "the surfacing event still ran");
    let (step, g) = surface(&mut r, 0, 2);
    assert_eq!(step, (0, true));
    assert_eq!(g.divers_aboard, 1);
}

#[test]
fn ramping_by_surfacing_schedule() {
    let mut g = calm();
    let mut moves = vec![g.enemy_move_interval];
    let mut spawns = vec![g.enemy_spawn_interval];
    for _ in 0..25 {
        g.divers_aboard = 1;
        g.surfaced = false;
        g.breathe();
        moves.push(g.enemy_move_interval);
        spawns.push(g.enemy_spawn_interval);
    }
    assert_eq!(&moves[..8], &[5, 5, 4, 4, 3, 3, 2, 2]);
    assert!(moves[8..].iter().all(|&m| m == 2));
    for (k, &s) in spawns.iter().enumerate() {
        assert_eq!(s, (20 - k as i32).max(1) as u32);
    }
    assert_eq!(g.ramp_index, 19);
    let mut off = calm();
    off.ramping = false;
    off.divers_aboard = 1;
    off.surfaced = false;
    off.breathe();
    assert_eq!((off.enemy_spawn_interval, off.ramp_index), (20, 0));
}

#[test]
fn spawn_schedule_enemies_21_divers_31() {
    let mut g = Seaquest::new(false);
    let mut r = rng();
    let mut draw_steps = vec![];
    let mut diver_steps = vec![];
    let mut divers = 0;
    for step in 1..=95 {
        let before = r.clone();
        g.step(Action::Noop, &mut r);
        if r != before {
            draw_steps.push(step);
        }
        if g.divers.len() > divers {
            diver_steps.push(step);
        }
        divers = g.divers.len();
    }
    // Enemy attempts on 21, 41, 61, 81; divers on 31, 61, 91. Nothing else draws.
    assert_eq!(draw_steps, [21, 31, 41, 61, 81, 91]);
    assert_eq!(diver_steps, [31, 61, 91]);
}

#[test]
fn opposite_direction_enemy_on_row_blocks_spawn_but_consumes_draws() {
    let mut r = rng();
    let mut probe = r.clone();
    let right = uniform(&mut probe) < 0.5;
    uniform(&mut probe);
    let row: i32 = probe.random_range(1..=8);
    let mut g = calm();
    g.fish.push(mover(row, 5, !right, 3));
    g.spawn_enemy(&mut r);
    assert_eq!(g.fish.len() + g.subs.len(), 1, "blocked");
    assert_eq!(r, probe, "all three draws consumed");
    // Same direction does not block.
    let mut r = rng();
    let mut g = calm();
    g.fish.push(mover(row, 5, right, 3));
    g.spawn_enemy(&mut r);
    assert_eq!(g.fish.len() + g.subs.len(), 2);
}

#[test]
fn enemy_moves_first_after_m_steps_then_every_m_plus_1() {
    let mut g = calm();
    let mut r = rng();
    g.enemy_spawn_timer = 0;
    let moves = move_steps(&mut g, &mut r, 20, |g| {
        g.fish.first().or(g.subs.first()).map(|e| e.col)
    });
    assert_eq!(moves, [6, 12, 18], "created step 1, m = 5");
}

#[test]
fn sub_shoots_ten_steps_after_creation_then_every_11() {
    let mut g = cornered();
    let mut r = rng();
    let mut sub = mover(4, 9, false, 1000);
    sub.shot_timer = ENEMY_SHOT_INTERVAL;
    g.subs.push(sub);
    // The sub is created "on step 0" here; phase 6c counts down from this step on.
    let mut shots = vec![];
    for step in 1..=33 {
        let before = g.enemy_bullets.len();
        g.step(Action::Noop, &mut r);
        if g.enemy_bullets.len() > before {
            shots.push(step);
            let b = g.enemy_bullets.last().unwrap();
            assert_eq!((b.row, b.col), (4, 8), "first seen one cell ahead");
        }
    }
    assert_eq!(shots, [11, 22, 33]);
}

#[test]
fn removed_sub_still_fires_when_its_countdown_is_zero() {
    let mut r = rng();
    // The sub moves onto a player bullet in 6b and is destroyed, then fires in 6c.
    let mut g = cornered();
    g.subs.push(mover(4, 5, false, 0)); // shot countdown 0
    g.player_bullets.push(mover(4, 3, true, 0)); // to (4, 4) in phase 4
    assert_eq!(g.step(Action::Noop, &mut r).0, 1);
    assert!(g.subs.is_empty() && g.player_bullets.is_empty());
    assert_eq!(g.enemy_bullets.len(), 1, "the destroyed sub still fired");
    let b = g.enemy_bullets[0];
    assert_eq!((b.row, b.col), (4, 3), "fired on (4, 4), moved in phase 7");
    // Leaving the grid: the bullet is created off-grid and removed in phase 7.
    let mut g = cornered();
    g.subs.push(mover(4, 0, false, 0));
    g.step(Action::Noop, &mut r);
    assert!(g.subs.is_empty());
    assert!(g.enemy_bullets.is_empty());
}

#[test]
fn diver_moves_five_after_creation_then_every_6_and_is_rescued() {
    let mut g = calm();
    let mut r = rng();
    g.diver_spawn_timer = 0;
    let moves = move_steps(&mut g, &mut r, 18, |g| g.divers.first().map(|d| d.col));
    assert_eq!(moves, [6, 12, 18]);
    // Rescue: a diver moving onto the player.
    let mut g = calm();
    g.player = (3, 4);
    g.surfaced = false;
    g.divers.push(mover(3, 5, false, 0));
    g.step(Action::Noop, &mut r);
    assert!(g.divers.is_empty());
    assert_eq!(g.divers_aboard, 1);
    assert_eq!(channel_count(&render(&g), 8), 1);
    // With 6 aboard, divers pass over the player.
    let mut g = calm();
    g.player = (3, 4);
    g.divers_aboard = 6;
    g.divers.push(mover(3, 5, false, 0));
    g.step(Action::Noop, &mut r);
    assert_eq!(g.divers.len(), 1);
    assert_eq!(g.divers_aboard, 6);
    let obs = render(&g);
    assert_eq!(channel_count(&obs, 8), 6);
    assert_eq!(
        obs[800 + 99],
        0.0,
        "column 9 of the diver gauge is never used"
    );
}

#[test]
fn firing_cooldown_and_bullet_first_seen_ahead() {
    let mut g = calm();
    let mut r = rng();
    g.player = (4, 5);
    g.step(Action::Fire, &mut r);
    assert_eq!(g.player_bullets.len(), 1);
    let b = g.player_bullets[0];
    assert_eq!(
        (b.row, b.col, b.right),
        (4, 4, false),
        "facing left, one cell ahead"
    );
    let mut fired = vec![1];
    for step in 2..=11 {
        let pos = g.player;
        g.step(Action::Fire, &mut r);
        assert_eq!(g.player, pos, "fire never moves");
        if g.shot_cooldown == SHOT_COOLDOWN - 1 {
            fired.push(step);
        }
    }
    assert_eq!(fired, [1, 6, 11]);
    // Fired from column 9 facing right: leaves the grid at once.
    let mut g = calm();
    g.player = (4, 9);
    g.facing_right = true;
    g.step(Action::Fire, &mut r);
    assert!(g.player_bullets.is_empty());
    assert_eq!(g.shot_cooldown, 4);
}

#[test]
fn bullet_hits_oldest_fish_before_any_sub() {
    let mut g = cornered();
    let mut r = rng();
    g.subs.push(mover(5, 5, true, 100));
    g.fish = vec![mover(5, 5, true, 100), mover(5, 5, true, 50)];
    g.player_bullets.push(mover(5, 4, true, 0));
    assert_eq!(g.step(Action::Noop, &mut r).0, 1);
    assert_eq!(g.fish.len(), 1);
    assert_eq!(g.fish[0].move_timer, 49, "the oldest fish went");
    assert_eq!(g.subs.len(), 1);
    assert!(g.player_bullets.is_empty());
}

#[test]
fn bullets_and_enemies_cannot_pass_through_each_other() {
    // Bullet at (5, 3) moving right, fish at (5, 5) moving left and moving this step:
    // bullet to (5, 4), fish to (5, 4): hit in phase 8.
    let mut g = cornered();
    let mut r = rng();
    g.player_bullets.push(mover(5, 3, true, 0));
    g.fish.push(mover(5, 5, false, 0));
    assert_eq!(g.step(Action::Noop, &mut r).0, 1);
    assert!(g.fish.is_empty() && g.player_bullets.is_empty());
    // Adjacent: bullet moves onto the fish in phase 4.
    let mut g = cornered();
    g.player_bullets.push(mover(5, 4, true, 0));
    g.fish.push(mover(5, 5, false, 0));
    assert_eq!(g.step(Action::Noop, &mut r).0, 1);
    assert!(g.fish.is_empty());
}

#[test]
fn contact_with_fish_sub_or_enemy_bullet_terminates() {
    let mut r = rng();
    for kind in 0..3 {
        let mut g = calm();
        g.player = (3, 3);
        g.surfaced = false;
        let m = mover(3, 5, false, 0);
        match kind {
            0 => g.fish.push(m),
            1 => {
                let mut s = m;
                s.shot_timer = 100;
                g.subs.push(s)
            }
            _ => g.enemy_bullets.push(mover(3, 4, false, 0)),
        }
        // Fish/sub move to (3, 4): no contact yet; then the player steps into them.
        let (_, t) = g.step(Action::Noop, &mut r);
        assert_eq!(
            t,
            kind == 2,
            "bullet moves onto the player at once (kind {kind})"
        );
        if kind < 2 {
            assert_eq!(g.step(Action::Right, &mut r), (0, true), "kind {kind}");
        }
    }
}

#[test]
fn left_at_wall_still_turns_and_observation_shows_back_cell() {
    let mut g = calm();
    let mut r = rng();
    g.player = (2, 0);
    g.facing_right = true;
    g.step(Action::Left, &mut r);
    assert_eq!(g.player, (2, 0));
    assert!(!g.facing_right);
    let obs = render(&g);
    assert_eq!(obs[2 * 10], 1.0, "front (2, 0)");
    assert_eq!(obs[100 + 2 * 10 + 1], 1.0, "back (2, 1) when facing left");
    g.step(Action::Right, &mut r);
    let obs = render(&g);
    assert_eq!(
        obs[100 + 2 * 10],
        1.0,
        "back (2, 0) when facing right at (2, 1)"
    );
}

#[test]
fn trails_of_fish_subs_and_divers() {
    let mut g = calm();
    g.fish.push(mover(2, 0, true, 1)); // trail column -1: not drawn
    g.subs.push(mover(3, 4, false, 1)); // trail (3, 5)
    g.divers.push(mover(4, 7, true, 1)); // trail (4, 6)
    let obs = render(&g);
    assert_eq!(channel_count(&obs, 3), 2);
    assert_eq!(obs[300 + 35], 1.0);
    assert_eq!(obs[300 + 46], 1.0);
    assert_eq!(obs[500 + 20], 1.0);
    assert_eq!(obs[600 + 34], 1.0);
    assert_eq!(obs[900 + 47], 1.0);
}
