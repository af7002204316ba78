//! The distributional pieces against values worked by hand and the properties their
//! sources state.

use super::*;

fn close(a: f32, b: f32, tol: f32) -> bool {
    (a - b).abs() <= tol
}

/// Three atoms on [-1, 1]: all mass on 0 moved by 0.5 lands halfway between 0 and 1;
/// moved by 5 it is clipped onto the last atom; with `discount` 0 (a terminal step) the
/// whole distribution becomes the reward's, split around it.
#[test]
fn c51_projects_by_hand_worked_cases() {
    let s = Atoms {
        atoms: 3,
        v_min: -1.0,
        v_max: 1.0,
    };
    let mut out = [0f32; 3];
    s.project(&[0.0, 1.0, 0.0], 0.5, 1.0, &mut out);
    assert_eq!(out, [0.0, 0.5, 0.5]);
    s.project(&[0.2, 0.3, 0.5], 5.0, 0.99, &mut out);
    assert_eq!(out, [0.0, 0.0, 1.0]);
    s.project(&[0.2, 0.3, 0.5], -0.25, 0.0, &mut out);
    assert!(
        close(out[0], 0.25, 1e-6) && close(out[1], 0.75, 1e-6) && out[2] == 0.0,
        "{out:?}"
    );
    // An atom that lands exactly on another keeps all its mass there.
    s.project(&[1.0, 0.0, 0.0], 1.0, 1.0, &mut out);
    assert_eq!(out, [0.0, 1.0, 0.0]);
}

/// 51 atoms on [-10, 10], random distributions: the projection keeps the mass, and
/// where nothing is clipped its mean is the shifted mean (the split is linear
/// interpolation between neighbouring atoms).
#[test]
fn c51_keeps_mass_and_the_shifted_mean() {
    let s = Atoms {
        atoms: 51,
        v_min: -10.0,
        v_max: 10.0,
    };
    let mut seed = 7u64;
    let mut next = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 40) as f32) / (1u64 << 24) as f32
    };
    for _ in 0..50 {
        // Mass only on the middle atoms, so that the shift below clips none.
        let mut p: Vec<f32> = (0..51)
            .map(|j| if (15..36).contains(&j) { next() } else { 0.0 })
            .collect();
        let sum: f32 = p.iter().sum();
        p.iter_mut().for_each(|x| *x /= sum);
        let (reward, discount) = (next() * 2.0 - 1.0, 0.99);
        let mut out = vec![0f32; 51];
        s.project(&p, reward, discount, &mut out);
        assert!(close(out.iter().sum(), 1.0, 1e-5));
        let want = reward + discount * s.mean(&p);
        assert!(
            close(s.mean(&out), want, 1e-4),
            "{} against {want}",
            s.mean(&out)
        );
    }
}

/// HL-Gauss on 101 bins over [-5, 5]: a histogram sums to 1, its mean is the target
/// where the Gaussian lies inside the support, it peaks at the target's bin and is
/// symmetric about a bin's centre; a target far outside is clipped, not NaN.
#[test]
fn hl_gauss_histograms_hold_their_target() {
    let b = Bins {
        bins: 101,
        v_min: -5.0,
        v_max: 5.0,
    };
    let mut out = vec![0f32; 101];
    for y in [-3.3f32, -0.01, 0.0, 1.234, 4.0] {
        b.histogram(y, &mut out);
        assert!(close(out.iter().sum(), 1.0, 1e-5));
        let mean: f32 = out.iter().enumerate().map(|(i, p)| p * b.centre(i)).sum();
        assert!(close(mean, y, 1e-4), "{y}: mean {mean}");
        let peak = (0..101).max_by(|&i, &j| out[i].total_cmp(&out[j])).unwrap();
        assert!(
            (b.centre(peak) - y).abs() <= b.width() / 2.0 + 1e-6,
            "{y}: peak {peak}"
        );
    }
    b.histogram(b.centre(50), &mut out);
    for k in 1..10 {
        assert!(close(out[50 - k], out[50 + k], 1e-6));
    }
    // sigma = 0.75 widths: the centre bin holds erf(0.5 / (0.75 sqrt 2)) of the mass.
    let centre = libm::erf(0.5 / (0.75 * std::f64::consts::SQRT_2)) as f32;
    assert!(close(out[50], centre, 1e-5), "{} against {centre}", out[50]);
    b.histogram(1e6, &mut out);
    assert!(out.iter().all(|p| p.is_finite()));
    let mean: f32 = out.iter().enumerate().map(|(i, p)| p * b.centre(i)).sum();
    assert!(mean > 4.5, "{mean}");
}

/// Rewards of 1 with gamma 0.5 give returns 1, 1.5, 1.75, then an episode's end starts
/// again at 1: their variance and largest magnitude by hand, and both divisors.
#[test]
fn the_return_scale_follows_the_running_return() {
    let mut r = ReturnScale::new(0.5);
    for done in [false, false, true, false] {
        r.push(1.0, done);
    }
    let returns = [1.0, 1.5, 1.75, 1.0];
    let mean = returns.iter().sum::<f64>() / 4.0;
    let var = returns.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / 4.0;
    assert!((r.variance() - var).abs() < 1e-12);
    assert!((r.xqc_divisor() - (var.sqrt() + 1e-8)).abs() < 1e-12);
    // max|G| / v_max = 1.75 / 1 is larger than the deviation.
    assert!((r.simbav2_divisor(1.0) - 1.75).abs() < 1e-12);
    assert!((r.simbav2_divisor(100.0) - (var + 1e-8).sqrt()).abs() < 1e-12);
    assert_eq!(ReturnScale::new(0.9).variance(), 0.0);
    assert!(support_problem(1, 0.0, 1.0).is_some() && support_problem(51, 1.0, -1.0).is_some());
    assert!(support_problem(51, -10.0, 10.0).is_none());
}

/// A head's Q-value is the expectation of the atoms under its softmax: by hand for two
/// actions over three atoms.
#[test]
fn a_distributional_heads_q_is_its_expectation() {
    use candle_core::{Device, Tensor};
    let dev = Device::Cpu;
    let logits = Tensor::new(&[[[0f32, 0.0, 0.0], [0.0, 0.0, 2f32.ln()]]], &dev).unwrap();
    let atoms = Tensor::new(&[-1f32, 0.0, 1.0], &dev).unwrap();
    let q: Vec<Vec<f32>> = expected_q(&logits, &atoms).unwrap().to_vec2().unwrap();
    // Uniform: 0. Weights 1, 1, 2 over -1, 0, 1: (-1 + 2) / 4.
    assert!(
        close(q[0][0], 0.0, 1e-6) && close(q[0][1], 0.25, 1e-6),
        "{q:?}"
    );
}

/// The cross-entropy's value by hand, and its gradient through candle's backward
/// against the closed form: `(softmax - target) / B` on the taken action's logits, 0
/// on the others.
#[test]
fn the_cross_entropy_and_its_gradient_match_the_closed_form() {
    use candle_core::{Device, Tensor, Var};
    let dev = Device::Cpu;
    let (b, a, k) = (2usize, 3usize, 4usize);
    let values: Vec<f32> = (0..b * a * k)
        .map(|i| ((i * 37 % 11) as f32 - 5.0) / 4.0)
        .collect();
    let logits =
        Var::from_tensor(&Tensor::from_vec(values.clone(), (b, a, k), &dev).unwrap()).unwrap();
    let actions = [2u32, 0];
    let target: Vec<f32> = vec![0.1, 0.2, 0.3, 0.4, 0.0, 0.5, 0.5, 0.0];
    let targets = Tensor::from_vec(target.clone(), (b, k), &dev).unwrap();
    let loss = cross_entropy(logits.as_tensor(), &actions, &targets).unwrap();
    let grads = loss.backward().unwrap();
    let grad: Vec<f32> = grads
        .get(logits.as_tensor())
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let mut want_loss = 0f32;
    for (row, &act) in actions.iter().enumerate() {
        let z = &values[(row * a + act as usize) * k..][..k];
        let max = z.iter().fold(f32::MIN, |m, &x| m.max(x));
        let sum: f32 = z.iter().map(|x| (x - max).exp()).sum();
        for j in 0..k {
            let p = (z[j] - max).exp() / sum;
            let m = target[row * k + j];
            want_loss -= m * p.ln() / b as f32;
            for other in 0..a {
                let g = grad[(row * a + other) * k + j];
                let want = if other == act as usize {
                    (p - m) / b as f32
                } else {
                    0.0
                };
                assert!(
                    close(g, want, 1e-6),
                    "row {row} action {other} atom {j}: {g} against {want}"
                );
            }
        }
    }
    let got = loss.to_scalar::<f32>().unwrap();
    assert!(close(got, want_loss, 1e-5), "{got} against {want_loss}");
}

/// C51's batch targets: a row bootstraps from the distribution of its best next action
/// (by expected value, or by the online Q-values with Double DQN), a terminal row is its
/// reward's alone; HL-Gauss's are each scalar target's histogram.
#[test]
fn batch_targets_bootstrap_from_the_chosen_action() {
    let s = Atoms {
        atoms: 3,
        v_min: -1.0,
        v_max: 1.0,
    };
    // Two rows, two actions: action 1 has the larger expected value in row 0.
    let next_p = [0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0];
    let rows = Bootstrap {
        rewards: &[0.0, 0.5],
        terminated: &[0.0, 1.0],
        gamma: 0.5,
    };
    let t = s.targets(&next_p, None, &rows);
    // Row 0: atom 1 (value 1) moved to 0.5 is halfway between atoms 1 and 2.
    assert_eq!(&t[..3], &[0.0, 0.5, 0.5]);
    // Row 1 is terminal: the reward 0.5 alone.
    assert_eq!(&t[3..], &[0.0, 0.5, 0.5]);
    // Double DQN picks row 0's action 0 (value 0, moved to 0: atom 1).
    let t = s.targets(&next_p, Some(&[1.0, 0.0, 0.0, 0.0]), &rows);
    assert_eq!(&t[..3], &[0.0, 1.0, 0.0]);
    let b = Bins {
        bins: 11,
        v_min: -5.5,
        v_max: 5.5,
    };
    let h = b.targets(&[0.0, 2.0]);
    let mut one = vec![0f32; 11];
    b.histogram(2.0, &mut one);
    assert_eq!(&h[11..], &one[..]);
    assert!(close(h[..11].iter().sum(), 1.0, 1e-6));
}

/// The value entropy: `ln K` for equal logits, about 0 for one dominant atom, and
/// read at the taken action only.
#[test]
fn the_value_entropy_is_that_of_the_taken_actions_distribution() {
    let uniform = vec![0.5f32; 4];
    let peaked = vec![40.0f32, 0.0, 0.0, 0.0];
    let logits = [&uniform[..], &peaked, &peaked, &uniform].concat();
    let h = super::mean_entropy(&logits, (2, 4), &[0, 1]);
    assert!((h - 4f64.ln()).abs() < 1e-9, "{h}");
    let h = super::mean_entropy(&logits, (2, 4), &[1, 0]);
    assert!(h.abs() < 1e-12, "{h}");
}
