use super::*;
use crate::minatar::test_support::{assert_set, rendered, rng};

/// A car in column `col`, `timer` steps from moving, of signed velocity `v`.
fn car(col: i32, timer: u32, v: i32) -> Car {
    Car { col, timer, v }
}

/// A game with every car parked far from the chicken's column and stopped for a while.
fn quiet() -> Freeway {
    let mut g = Freeway::new(false);
    for parked in &mut g.cars {
        *parked = car(9, 1000, 5);
    }
    g
}

/// [`quiet`] with the chicken on `row`, `cooldown` steps before it may move.
fn chicken_at(row: i32, cooldown: u32) -> Freeway {
    let mut g = quiet();
    g.chicken_row = row;
    g.cooldown = cooldown;
    g
}

#[test]
fn episode_lasts_exactly_2501_steps() {
    let mut g = Freeway::new(false);
    let mut r = rng();
    g.reset(&mut r);
    for step in 1..=2500 {
        assert!(!g.step(Action::Noop, &mut r).1, "step {step}");
    }
    assert!(g.step(Action::Noop, &mut r).1);
}

#[test]
fn chicken_first_moves_on_step_4_then_every_3() {
    let mut g = quiet();
    let mut r = rng();
    let mut rows = vec![];
    for _ in 0..10 {
        g.step(Action::Up, &mut r);
        rows.push(g.chicken_row);
    }
    assert_eq!(rows, [9, 9, 9, 8, 8, 8, 7, 7, 7, 6]);
}

#[test]
fn down_from_row_9_spends_the_cooldown() {
    let mut g = quiet();
    let mut r = rng();
    g.cooldown = 0;
    g.step(Action::Down, &mut r);
    assert_eq!(g.chicken_row, 9);
    assert_eq!(g.cooldown, 2, "reloaded to 3 then decremented");
    g.step(Action::Up, &mut r);
    assert_eq!(g.chicken_row, 9, "still cooling down");
}

#[test]
fn crossing_pays_rerandomizes_and_keeps_columns() {
    let mut g = quiet();
    let mut r = rng();
    for (i, car) in g.cars.iter_mut().enumerate() {
        car.col = i as i32;
        car.v = 1;
        car.timer = 7;
    }
    g.chicken_row = 1;
    g.cooldown = 0;
    let mut expected_rng = r.clone();
    let (reward, _) = g.step(Action::Up, &mut r);
    assert_eq!(reward, 1);
    assert_eq!(g.chicken_row, 9);
    // 8 integers then 8 uniforms were drawn.
    let speeds: Vec<i32> = (0..8).map(|_| expected_rng.random_range(1..=5)).collect();
    for (i, car) in g.cars.iter().enumerate() {
        let right = uniform(&mut expected_rng) > 0.5;
        assert_eq!(car.v, if right { speeds[i] } else { -speeds[i] });
        assert_eq!(car.col, i as i32, "columns kept");
        assert_eq!(
            car.timer,
            speeds[i] as u32 - 1,
            "countdown = speed, then one step"
        );
    }
    assert_eq!(expected_rng, r);
}

#[test]
fn car_of_speed_s_moves_every_s_plus_1_steps_from_step_s_plus_1() {
    for speed in 1..=5 {
        let mut g = quiet();
        let mut r = rng();
        g.cars[7] = car(0, speed, -(speed as i32));
        let mut moves = vec![];
        for step in 1..=20 {
            let before = g.cars[7].col;
            g.step(Action::Noop, &mut r);
            if g.cars[7].col != before {
                moves.push(step);
            }
        }
        let period = speed as usize + 1;
        let expected: Vec<usize> = (1..=20).filter(|s| s % period == 0).collect();
        assert_eq!(moves, expected, "speed {speed}");
        assert_eq!(
            g.cars[7].col,
            (-(expected.len() as i32)).rem_euclid(10),
            "wraps left"
        );
    }
}

#[test]
fn hits_send_chicken_home_without_touching_cooldown() {
    let mut r = rng();
    // A parked car on the chicken's cell.
    let mut g = chicken_at(5, 2);
    g.cars[4] = car(4, 3, 2);
    g.step(Action::Noop, &mut r);
    assert_eq!(g.chicken_row, 9);
    assert_eq!(g.cooldown, 1);
    // Stepping up into a car's cell.
    let mut g = chicken_at(6, 0);
    g.cars[4] = car(4, 3, 2);
    g.step(Action::Up, &mut r);
    assert_eq!(g.chicken_row, 9);
    // A car driving into the chicken (wrapping from column 9 to 0 elsewhere).
    let mut g = chicken_at(3, COOLDOWN);
    g.cars[2] = car(3, 0, 1);
    g.step(Action::Noop, &mut r);
    assert_eq!(g.chicken_row, 9);
    assert_eq!(g.cars[2].timer, 1);
}

#[test]
fn reset_draws_eight_integers_then_eight_uniforms() {
    let mut r = rng();
    let mut check = r.clone();
    let mut g = Freeway::new(false);
    g.reset(&mut r);
    let speeds: Vec<i32> = (0..8).map(|_| check.random_range(1..=5)).collect();
    for (car, s) in g.cars.iter().zip(speeds) {
        let right = uniform(&mut check) > 0.5;
        assert_eq!(car.v, if right { s } else { -s });
        assert_eq!(car.col, 0);
        assert_eq!(car.timer, s as u32);
    }
    assert_eq!(g.chicken_row, 9);
    assert_eq!(g.cooldown, 3);
    assert_eq!(r, check);
}

#[test]
fn observation_trails_wrap_by_speed_channel() {
    let mut g = quiet();
    g.cars[0] = car(0, 1, 3); // behind = column 9 (wrapped), channel 4
    g.cars[1] = car(9, 1, -1); // behind = column 0 (wrapped), channel 2
    let obs = rendered(&g);
    assert_set(
        &obs,
        &[(0, 9, 4), (1, 1, 0), (4, 1, 9), (1, 2, 9), (2, 2, 0)],
    );
    assert_eq!(obs.iter().sum::<f32>(), 1.0 + 16.0);
}
