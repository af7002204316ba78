//! Hyperspherical layers' CPU loops and fused op (`nn/methods/hyperspherical.rs`): a hidden
//! layer's `y = relu(s t) / max(||relu(s t)||, eps)`, the norm over the units (over the
//! channels at each position of a feature map), and its closed-form backward.
//!
//! `t` is `[outer, units, inner]` in memory (`[B, units]`: `inner = 1`; `[B, C, H, W]`:
//! `inner = H W`), `s` one scaler per unit. With `r = relu(s t)`, `n = max(||r||, eps)`
//! and `y = r / n` per `(outer, inner)` vector: `dr = (dy - y (y . dy)) / n` where the
//! norm is above its floor (else `dy / eps`), 0 where `r = 0`; `dt = s dr`,
//! `ds = Σ dr t`. Candle's tensor ops take about three times as long on MinAtar's CNN
//! (the norm runs over a strided axis, and every op writes its own buffer).

use candle_core::{CustomOp2, Tensor};

use super::per_agent::OpGradient;
use super::{cpu_forward, gradient_like, with_values, Grads2};

/// SimbaV2's floor of a feature vector's norm.
pub(crate) const EPS: f32 = 1e-8;

/// The op: `t` and the per-unit scaler `s` in, the unit-norm features out.
pub(crate) struct FusedSphere;

/// `(outer, units, inner)` of `t` for `units` scalers: the units are `t`'s axis 1.
fn dims(t: &[usize], units: usize) -> candle_core::Result<(usize, usize, usize)> {
    if t.len() < 2 || t[1] != units {
        candle_core::bail!("hyperspherical layer: {units} scalers for features {t:?}");
    }
    let inner = t[2..].iter().product();
    Ok((t[0], units, inner))
}

impl CustomOp2 for FusedSphere {
    cpu_forward!("hyperspherical", |op, t @ l1, s @ l2| {
        let d = dims(l1.dims(), s.len())?;
        Ok((sphere_forward(t, s, d).0, l1.shape().clone()))
    });

    fn bwd(&self, t: &Tensor, s: &Tensor, out: &Tensor, dy: &Tensor) -> Grads2 {
        let s_flat = s.flatten_all()?;
        let d = dims(t.dims(), s_flat.elem_count())?;
        let (dt, ds) = with_values(&t.contiguous()?, |t| {
            with_values(&s_flat, |s| {
                with_values(&out.contiguous()?, |y| {
                    with_values(&dy.contiguous()?, |dy| {
                        let (_, inv) = sphere_forward(t, s, d);
                        Ok(sphere_backward(t, s, y, &inv, dy, d))
                    })
                })
            })
        })?;
        Ok((gradient_like(dt, t)?, gradient_like(ds, s)?))
    }
}

/// The op in a population, on each agent's `[B, units, inner]` values and scalers: the
/// same loops (no CUDA kernel: a device takes the tensor form).
pub(crate) struct AgentSphere {
    /// Positions per feature map (1 for a dense layer).
    pub inner: usize,
}

impl AgentSphere {
    fn dims(&self, t: &[f32], s: &[f32]) -> candle_core::Result<(usize, usize, usize)> {
        let per_sample = s.len() * self.inner;
        if per_sample == 0 || !t.len().is_multiple_of(per_sample) {
            candle_core::bail!(
                "hyperspherical layer: {} values for {} scalers",
                t.len(),
                s.len()
            );
        }
        Ok((t.len() / per_sample, s.len(), self.inner))
    }
}

impl super::per_agent::AgentKernel<1> for AgentSphere {
    fn name(&self) -> &'static str {
        "hyperspherical-per-agent"
    }

    fn forward(&self, _agent: usize, t: &[f32], [s]: [&[f32]; 1]) -> candle_core::Result<Vec<f32>> {
        Ok(sphere_forward(t, s, self.dims(t, s)?).0)
    }

    fn backward(
        &self,
        pass: OpGradient<'_, [f32], 1>,
    ) -> candle_core::Result<(Vec<f32>, [Vec<f32>; 1])> {
        let (t, [s], out, dy) = pass.parts();
        let d = self.dims(t, s)?;
        let (_, inv) = sphere_forward(t, s, d);
        let (dt, ds) = sphere_backward(t, s, out, &inv, dy, d);
        Ok((dt, [ds]))
    }
}

/// The features `y` and each vector's `1 / max(||r||, eps)`, for `t` of `(outer, units,
/// inner)`.
pub(crate) fn sphere_forward(
    t: &[f32],
    s: &[f32],
    (outer, units, inner): (usize, usize, usize),
) -> (Vec<f32>, Vec<f32>) {
    let mut y = vec![0f32; t.len()];
    let mut inv = vec![0f32; outer * inner];
    let mut sums = vec![0f32; inner];
    for o in 0..outer {
        let base = o * units * inner;
        sums.iter_mut().for_each(|v| *v = 0.0);
        for (u, &su) in s.iter().enumerate() {
            let row = base + u * inner;
            for ((y, &t), sum) in y[row..row + inner]
                .iter_mut()
                .zip(&t[row..row + inner])
                .zip(&mut sums)
            {
                *y = (t * su).max(0.0);
                *sum += *y * *y;
            }
        }
        let inv_o = &mut inv[o * inner..(o + 1) * inner];
        for (v, &sum) in inv_o.iter_mut().zip(&sums) {
            *v = 1.0 / sum.max(EPS * EPS).sqrt();
        }
        for u in 0..units {
            let row = base + u * inner;
            y[row..row + inner]
                .iter_mut()
                .zip(inv_o.iter())
                .for_each(|(y, v)| *y *= v);
        }
    }
    (y, inv)
}

/// `(dt, ds)` from the forward's `y` and inverse norms and `dy`.
pub(crate) fn sphere_backward(
    t: &[f32],
    s: &[f32],
    y: &[f32],
    inv: &[f32],
    dy: &[f32],
    (outer, units, inner): (usize, usize, usize),
) -> (Vec<f32>, Vec<f32>) {
    if inner == 1 {
        return rows_backward(t, s, y, inv, dy);
    }
    let mut dt = vec![0f32; t.len()];
    let mut ds = vec![0f32; units];
    let mut along = vec![0f32; inner];
    for o in 0..outer {
        let base = o * units * inner;
        let inv_o = &inv[o * inner..(o + 1) * inner];
        along.iter_mut().for_each(|a| *a = 0.0);
        for u in 0..units {
            let row = base + u * inner;
            for ((a, &y), &d) in along
                .iter_mut()
                .zip(&y[row..row + inner])
                .zip(&dy[row..row + inner])
            {
                *a += y * d;
            }
        }
        // At the floor the norm is a constant: nothing along `y` is removed.
        for (a, &v) in along.iter_mut().zip(inv_o) {
            if v >= 1.0 / EPS {
                *a = 0.0;
            }
        }
        for (u, (&su, dsu)) in s.iter().zip(ds.iter_mut()).enumerate() {
            let row = base + u * inner;
            for i in 0..inner {
                let k = row + i;
                let dr = if y[k] > 0.0 {
                    (dy[k] - y[k] * along[i]) * inv_o[i]
                } else {
                    0.0
                };
                *dsu += dr * t[k];
                dt[k] = dr * su;
            }
        }
    }
    (dt, ds)
}

/// [`sphere_backward`] on rows (a dense layer's `[B, units]`): zipped, not indexed, so
/// the loop has no bounds checks and vectorizes (its speed no longer hangs on where the
/// linker puts it).
fn rows_backward(t: &[f32], s: &[f32], y: &[f32], inv: &[f32], dy: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let units = s.len();
    let mut dt = dy.to_vec();
    let mut ds = vec![0f32; units];
    let rows = dt.chunks_exact_mut(units).zip(y.chunks_exact(units));
    for ((d, y), (t, &inv)) in rows.zip(t.chunks_exact(units).zip(inv)) {
        // At the floor the norm is a constant: nothing along `y` is removed.
        let along = match inv < 1.0 / EPS {
            true => y.iter().zip(d.iter()).map(|(y, d)| y * d).sum::<f32>(),
            false => 0.0,
        };
        let values = d.iter_mut().zip(y).zip(t).zip(ds.iter_mut().zip(s));
        for (((d, &y), &t), (ds, &s)) in values {
            let dr = if y > 0.0 { (*d - y * along) * inv } else { 0.0 };
            *ds += dr * t;
            *d = dr * s;
        }
    }
    (dt, ds)
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor, Var};

    use super::FusedSphere;
    use crate::nn::hyperspherical::sphere;

    /// The fused op's output and gradients are the tensor form's, on a dense batch and
    /// on feature maps with a position of zeros (the norm's floor).
    #[test]
    fn fused_op_matches_the_tensor_form() {
        let dev = Device::Cpu;
        for dims in [vec![5usize, 7], vec![3, 4, 2, 3]] {
            let n: usize = dims.iter().product();
            let mut values: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0)
                .collect();
            if dims.len() == 4 {
                // Sample 0, position 0: every channel 0.
                for c in 0..dims[1] {
                    values[c * 6] = 0.0;
                }
            }
            let t =
                Var::from_tensor(&Tensor::from_vec(values, dims.clone(), &dev).unwrap()).unwrap();
            let mut s_dims = vec![dims[1]];
            s_dims.extend(vec![1; dims.len() - 2]);
            let s_values: Vec<f32> = (0..dims[1])
                .map(|u| 0.3 + 0.2 * u as f32 - 0.5 * (u % 2) as f32)
                .collect();
            let s = Var::from_tensor(&Tensor::from_vec(s_values, s_dims, &dev).unwrap()).unwrap();
            let upstream = Tensor::from_vec(
                (0..n)
                    .map(|i| ((i * 13 % 7) as f32 - 3.0) / 3.0)
                    .collect::<Vec<_>>(),
                dims.clone(),
                &dev,
            )
            .unwrap();
            let fused = t
                .as_tensor()
                .apply_op2(&s.as_tensor().flatten_all().unwrap(), FusedSphere)
                .unwrap();
            let reference = sphere(t.as_tensor(), s.as_tensor(), 0, false).unwrap();
            let grads = |y: &Tensor| {
                let g = (y * &upstream)
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .backward()
                    .unwrap();
                let flat = |v: &Var| {
                    g.get(v.as_tensor())
                        .unwrap()
                        .flatten_all()
                        .unwrap()
                        .to_vec1::<f32>()
                        .unwrap()
                };
                (flat(&t), flat(&s))
            };
            let close = |a: &[f32], b: &[f32], what: &str| {
                for (x, y) in a.iter().zip(b) {
                    assert!(
                        (x - y).abs() <= 1e-5 * y.abs().max(1.0),
                        "{dims:?} {what}: {x} vs {y}"
                    );
                }
            };
            let flat = |y: &Tensor| y.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            close(&flat(&fused), &flat(&reference), "output");
            let ((dt_f, ds_f), (dt_r, ds_r)) = (grads(&fused), grads(&reference));
            close(&dt_f, &dt_r, "dt");
            close(&ds_f, &ds_r, "ds");
        }
    }
}
