//! Weight norm's training ops on the CPU, which never form `w = g v/||v||`: the kernel
//! runs with `v` and each unit's output is scaled by `s = g/||v||`. With `t` the kernel
//! applied with `v` and `y = s t`:
//!
//! ```text
//! dL/dt = dL/dy * s
//! dL/dg = Σ dL/dy * t / ||v||
//! dL/dv = (kernel's weight gradient from dL/dt) - (dL/dg * g / ||v||^2) v
//! ```
//!
//! [`NormedKernel`] is the kernel and the scaling in one op (Linear, and convolutions of
//! data); [`ScaleByGain`] scales the output of any other kernel, whose own op then adds
//! its part of `dL/dv`.

use candle_core::{CustomOp2, CustomOp3, Result, Shape, Storage, Tensor};

use super::dense::{dot, f32_slice, lane_sum};
use super::per_agent::OpGradient;
#[cfg(feature = "cuda")]
use super::per_agent::{DeviceOutput, OpInputs};
use super::product::Product;
use super::units::Units;
use super::with_values;
use super::{cpu_forward, gradient_like, Grads2, Grads3};

/// The units of an output of `shape`, checked against the gains and inverse norms.
fn units_of(shape: &Shape, g: &[f32], inv_norms: &[f32]) -> Result<Units> {
    let units = Units::of(shape)?;
    if g.len() != units.units || inv_norms.len() != units.units {
        candle_core::bail!("weight norm: {} gains for {} units", g.len(), units.units);
    }
    Ok(units)
}

/// `s_u = g_u / ||v_u||`, the factor by which weight norm scales unit `u`'s output.
pub(crate) fn unit_scales(g: &[f32], inv_norms: &[f32]) -> Vec<f32> {
    g.iter().zip(inv_norms).map(|(g, i)| g * i).collect()
}

crate::kernels::avx2::dispatch! {
    /// `x *= s_u` per unit, in place: the kernel's output becomes the layer's.
    fn scale_in_place(units: Units, x: &mut [f32], s: &[f32]) {
        if units.inner == 1 {
            let n = s.len();
            for row in x.chunks_exact_mut(n) {
                for (x, s) in row.iter_mut().zip(s) {
                    *x *= s;
                }
            }
        } else {
            // Runs of `inner` values per unit; a closure here would stay outside the
            // AVX2 copy.
            let block = units.units * units.inner;
            for x in x.chunks_exact_mut(block) {
                for (x, s) in x.chunks_exact_mut(units.inner).zip(s) {
                    x.iter_mut().for_each(|x| *x *= s);
                }
            }
        }
    }
}

crate::kernels::avx2::dispatch! {
    /// `(dL/dt, Σ_u dL/dy * y)` in one pass: `dL/dt = dL/dy * s_u`, and the per-unit
    /// sums of `dL/dy * y`, from which `dL/dg` follows.
    fn scaled_gradient(units: Units, dy: &[f32], y: &[f32], s: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let mut dt = vec![0f32; dy.len()];
        let mut sums = vec![0f32; s.len()];
        if units.inner == 1 {
            let n = s.len();
            let rows = dt.chunks_exact_mut(n).zip(dy.chunks_exact(n)).zip(y.chunks_exact(n));
            for ((dt, dy), y) in rows {
                let (dt, dy, y, sums) = (&mut dt[..n], &dy[..n], &y[..n], &mut sums[..n]);
                for u in 0..n {
                    dt[u] = dy[u] * s[u];
                    sums[u] += dy[u] * y[u];
                }
            }
        } else {
            let (block, inner) = (units.units * units.inner, units.inner);
            let blocks = dt.chunks_exact_mut(block).zip(dy.chunks_exact(block));
            for ((dt, dy), y) in blocks.zip(y.chunks_exact(block)) {
                let runs = dt.chunks_exact_mut(inner).zip(dy.chunks_exact(inner));
                for (u, ((dt, dy), y)) in runs.zip(y.chunks_exact(inner)).enumerate() {
                    for (dt, dy) in dt.iter_mut().zip(dy) {
                        *dt = dy * s[u];
                    }
                    sums[u] += lane_sum(dy, y, |dy, y| dy * y);
                }
            }
        }
        (dt, sums)
    }
}

/// `dL/dg_u = Σ dL/dy * t / ||v_u||`, with `t` the kernel's output (with `v`).
fn gain_gradient(units: &Units, dy: &[f32], t: &[f32], inv_norms: &[f32]) -> Vec<f32> {
    gain_gradient_from_sums(&units.sums2(dy, t, inv_norms, |dy, t, _| dy * t), inv_norms)
}

/// `dL/dg_u` from the per-unit sums `Σ dL/dy * t`.
pub(crate) fn gain_gradient_from_sums(sums: &[f32], inv_norms: &[f32]) -> Vec<f32> {
    sums.iter().zip(inv_norms).map(|(s, i)| s * i).collect()
}

crate::kernels::avx2::dispatch! {
    /// `dv -= (dg_u * g_u / ||v_u||^2) v_u` per unit row: the gradient through the norm.
    pub(crate) fn add_norm_gradient(dv: &mut [f32], v: &[f32], g: &[f32], dg: &[f32], inv_norms: &[f32]) {
        let n = v.len() / g.len().max(1);
        for (u, (d_row, row)) in dv.chunks_exact_mut(n).zip(v.chunks_exact(n)).enumerate() {
            let c = dg[u] * g[u] * inv_norms[u] * inv_norms[u];
            for (d, v) in d_row.iter_mut().zip(row) {
                *d -= c * v;
            }
        }
    }
}

/// The kernel applied with `v`, each unit's output scaled by `g/||v||`: one graph node.
pub(crate) struct NormedKernel<K> {
    pub core: K,
    pub inv_norms: Vec<f32>,
}

/// `(dL/dinput if asked, dL/dv, dL/dg)`.
type NormedGradients = (Option<Vec<f32>>, Vec<f32>, Vec<f32>);

impl<K: Product> NormedKernel<K> {
    /// The layer's output `s_u * (input (*) v)` on host values.
    fn forward_values(&self, input: &[f32], v: &[f32], g: &[f32]) -> Result<Vec<f32>> {
        let units = units_of(&self.core.out_shape(), g, &self.inv_norms)?;
        let mut y = self.core.forward(input, v);
        scale_in_place(units, &mut y, &unit_scales(g, &self.inv_norms));
        Ok(y)
    }

    /// `(dL/dinput if asked, dL/dv, dL/dg)` from the output `y` and its gradient `dy`.
    fn gradients(
        &self,
        input: &[f32],
        v: &[f32],
        gains: &[f32],
        y: &[f32],
        dy: &[f32],
        input_gradient: bool,
    ) -> Result<NormedGradients> {
        let inv = &self.inv_norms;
        let units = units_of(&self.core.out_shape(), gains, inv)?;
        let (dt, sums) = scaled_gradient(units, dy, y, &unit_scales(gains, inv));
        // Σ dy t / ||v|| with t = y / s = y ||v|| / g; where a gain is 0 (y = 0 there)
        // t comes from the kernel again.
        let dg: Vec<f32> = if gains.iter().all(|g| *g != 0.0) {
            sums.iter().zip(gains).map(|(s, g)| s / g).collect()
        } else {
            gain_gradient(&units, dy, &self.core.forward(input, v), inv)
        };
        let (mut dv, dinput) = self.core.backward(input, v, &dt, input_gradient);
        add_norm_gradient(&mut dv, v, gains, &dg, inv);
        Ok((dinput, dv, dg))
    }
}

impl<K: Product + Send + Sync> CustomOp3 for NormedKernel<K> {
    cpu_forward!("weight-normed-kernel", |op, input @ l1, v @ l2, g @ l3| {
        let y = op.forward_values(input, v, g)?;
        Ok((y, op.core.out_shape()))
    });

    fn bwd(&self, input: &Tensor, v: &Tensor, g: &Tensor, y: &Tensor, dy: &Tensor) -> Grads3 {
        let dy = dy.contiguous()?;
        let input_gradient = input.track_op();
        let (dinput, dv, dg) = with_values(g, |gains| {
            with_values(input, |input| {
                with_values(v, |vv| {
                    with_values(&dy, |dyv| {
                        with_values(y, |yv| {
                            self.gradients(input, vv, gains, yv, dyv, input_gradient)
                        })
                    })
                })
            })
        })?;
        Ok((
            dinput
                .map(|d| Tensor::from_vec(d, input.shape(), input.device()))
                .transpose()?,
            gradient_like(dv, v)?,
            gradient_like(dg, g)?,
        ))
    }
}

/// `y = t * g_u / ||v_u||` per unit, where `t` is the kernel applied with `v`. The
/// gradient reaching `v` here is the one through its norm; the kernel adds the rest:
///
/// ```text
/// dL/dt = dL/dy * g/||v||
/// dL/dg = Σ dL/dy * t / ||v||
/// dL/dv = -(dL/dg * g / ||v||^2) v        (plus the kernel's (dL/dt)^T x)
/// ```
pub(crate) struct ScaleByGain {
    pub inv_norms: Vec<f32>,
}

impl CustomOp3 for ScaleByGain {
    cpu_forward!("weight-norm-scale", |op, t @ l1, _s2 @ _l2, g @ l3| {
        let units = units_of(l1.shape(), g, &op.inv_norms)?;
        let mut out = t.to_vec();
        scale_in_place(units, &mut out, &unit_scales(g, &op.inv_norms));
        Ok((out, l1.shape().clone()))
    });

    fn bwd(&self, t: &Tensor, v: &Tensor, g: &Tensor, _y: &Tensor, dy: &Tensor) -> Grads3 {
        let dy = dy.contiguous()?;
        let units = Units::of(t.shape())?;
        let gains = g.to_vec1::<f32>()?;
        let s = unit_scales(&gains, &self.inv_norms);
        let (dt, sums) = with_values(t, |tv| {
            with_values(&dy, |dyv| Ok(scaled_gradient(units, dyv, tv, &s)))
        })?;
        let dg = gain_gradient_from_sums(&sums, &self.inv_norms);
        let dv = with_values(v, |vv| {
            let mut dv = vec![0f32; vv.len()];
            add_norm_gradient(&mut dv, vv, &gains, &dg, &self.inv_norms);
            Ok(dv)
        })?;
        Ok((
            gradient_like(dt, t)?,
            gradient_like(dv, v)?,
            gradient_like(dg, g)?,
        ))
    }
}

/// `w = g * v / ||v||` per unit in one pass, with the paper's closed-form gradients.
pub(crate) struct FusedWeightNorm {
    pub units: usize,
}

crate::kernels::avx2::dispatch! {
    /// `(1 / ||v_u||)` per unit `u` of `v`'s `units` rows: the squared norms first, then
    /// the roots and quotients in SIMD lanes (one at a time, they cost more than the
    /// squares).
    pub(crate) fn inverse_norms(v: &[f32], units: usize) -> Vec<f32> {
        // Loops, not collected iterators: those compiled outside the AVX2 copy.
        let mut inv = vec![0f32; units];
        for (inv, row) in inv.iter_mut().zip(v.chunks_exact(v.len() / units)) {
            *inv = lane_sum(row, row, |x, y| x * y);
        }
        for x in inv.iter_mut() {
            *x = 1.0 / x.sqrt();
        }
        inv
    }
}

impl CustomOp2 for FusedWeightNorm {
    cpu_forward!("fused-weight-norm", |op, v @ l1, g @ l2| {
        let n = v.len() / op.units;
        let inv = inverse_norms(v, op.units);
        let mut w = Vec::with_capacity(v.len());
        for (i, row) in v.chunks_exact(n).enumerate() {
            let scale = g[i] * inv[i];
            w.extend(row.iter().map(|x| x * scale));
        }
        Ok((w, l1.shape().clone()))
    });

    fn bwd(&self, v: &Tensor, g: &Tensor, _w: &Tensor, dw: &Tensor) -> Grads2 {
        let dw = dw.contiguous()?;
        let (v_s, v_l) = v.storage_and_layout();
        let (g_s, g_l) = g.storage_and_layout();
        let (dw_s, dw_l) = dw.storage_and_layout();
        let (Storage::Cpu(v_c), Storage::Cpu(g_c), Storage::Cpu(dw_c)) = (&*v_s, &*g_s, &*dw_s)
        else {
            candle_core::bail!("fused weight norm runs on the CPU only");
        };
        let (vv, gv, dwv) = (
            f32_slice(v_c, v_l)?,
            f32_slice(g_c, g_l)?,
            f32_slice(dw_c, dw_l)?,
        );
        let n = vv.len() / self.units;
        let inv = inverse_norms(vv, self.units);
        let mut dv = Vec::with_capacity(vv.len());
        let mut dg = Vec::with_capacity(self.units);
        for i in 0..self.units {
            let (row, drow) = (&vv[i * n..(i + 1) * n], &dwv[i * n..(i + 1) * n]);
            // dL/dg = dL/dw . v/||v||
            let dgi = dot(row, drow) * inv[i];
            // dL/dv = g/||v|| (dL/dw - dL/dg v/||v||)
            let scale = gv[i] * inv[i];
            dv.extend(
                row.iter()
                    .zip(drow)
                    .map(|(a, d)| scale * (d - dgi * a * inv[i])),
            );
            dg.push(dgi);
        }
        let dv = Tensor::from_vec(dv, v.shape(), v.device())?;
        let dg = Tensor::from_vec(dg, g.shape(), g.device())?;
        Ok((Some(dv), Some(dg)))
    }
}

/// Weight norm's effective weight in a population, one agent at a time: `v` `[out,
/// in...]` (a single network's layout) and gains `g` `[out]` make `w = g v / ||v||`,
/// each unit's norm over its inputs (its row). With `s = g / ||v||` and `c = Σ_i dw v /
/// ||v||` per unit: `dg = c` and `dv = s (dw - v c / (g ||v||))`, written below without
/// the division by `g` (a gain may be 0).
pub(crate) struct AgentWeight;

impl AgentWeight {
    /// Per-unit values `[P, 1, out]` (a gain's layout) as a column `[P, out, 1]` over
    /// `v`'s rows.
    #[cfg(feature = "cuda")]
    fn per_row(x: &Tensor, v: &Tensor) -> Result<Tensor> {
        let (p, out) = (v.dim(0)?, v.dim(1)?);
        x.reshape((p, out, 1))
    }

    /// `1 / ||v_u||` of each unit (row) of `v`, summed in `f64`.
    fn inverse_norms(v: &[f32], out: usize) -> Vec<f64> {
        let inputs = v.len() / out.max(1);
        let rows = v.chunks_exact(inputs.max(1));
        rows.map(|row| 1.0 / dot64(row, row).sqrt()).collect()
    }

    fn check(v: &[f32], g: &[f32]) -> Result<()> {
        if g.is_empty() || v.is_empty() || !v.len().is_multiple_of(g.len()) {
            candle_core::bail!("weight norm: {} weights for {} gains", v.len(), g.len());
        }
        Ok(())
    }
}

crate::kernels::avx2::dispatch! {
    /// `Σ a_i b_i` in `f64`, over eight interleaved partial sums: a fixed order (the
    /// same result on every CPU, AVX2 or not: no operation is fused) that vectorizes,
    /// where one running sum waits on each add.
    fn dot64(a: &[f32], b: &[f32]) -> f64 {
        let mut lanes = [0f64; 8];
        let (xs, ys) = (a.chunks_exact(8), b.chunks_exact(8));
        let rest: f64 = xs
            .remainder()
            .iter()
            .zip(ys.remainder())
            .map(|(&x, &y)| f64::from(x) * f64::from(y))
            .sum();
        for (x, y) in xs.zip(ys) {
            for k in 0..8 {
                lanes[k] += f64::from(x[k]) * f64::from(y[k]);
            }
        }
        lanes.iter().sum::<f64>() + rest
    }
}

impl super::per_agent::AgentKernel<1> for AgentWeight {
    fn name(&self) -> &'static str {
        "weight-norm-weight-per-agent"
    }

    fn forward(&self, _agent: usize, v: &[f32], [g]: [&[f32]; 1]) -> Result<Vec<f32>> {
        Self::check(v, g)?;
        let inv = Self::inverse_norms(v, g.len());
        let mut w = v.to_vec();
        let inputs = v.len() / g.len();
        for ((row, &g), &inv) in w.chunks_exact_mut(inputs).zip(g).zip(&inv) {
            let scale = (f64::from(g) * inv) as f32;
            row.iter_mut().for_each(|x| *x *= scale);
        }
        Ok(w)
    }

    fn backward(&self, pass: OpGradient<'_, [f32], 1>) -> Result<(Vec<f32>, [Vec<f32>; 1])> {
        let (v, [g], _, dw) = pass.parts();
        Self::check(v, g)?;
        let inv = Self::inverse_norms(v, g.len());
        let inputs = v.len() / g.len();
        let mut dv = vec![0f32; v.len()];
        let mut dg = Vec::with_capacity(g.len());
        let rows = v.chunks_exact(inputs).zip(dw.chunks_exact(inputs));
        for ((((row, drow), out), &g), &inv) in
            rows.zip(dv.chunks_exact_mut(inputs)).zip(g).zip(&inv)
        {
            let dot = dot64(row, drow);
            dg.push((dot * inv) as f32);
            // dv = g/||v|| dw - g dot / ||v||^3 v.
            let a = f64::from(g) * inv;
            let b = a * dot * inv * inv;
            for ((o, &x), &dx) in out.iter_mut().zip(row).zip(drow) {
                *o = (a * f64::from(dx) - b * f64::from(x)) as f32;
            }
        }
        Ok((dv, [dg]))
    }

    #[cfg(feature = "cuda")]
    fn cuda_forward(&self, x: OpInputs<'_, Tensor, 1>) -> DeviceOutput {
        let (v, [g]) = (x.t, x.params);
        // `w = v s` with each unit's `s = g / ||v||` from the scale kernel.
        let s = super::cuda::device::weight_norm_scale(v, g)?;
        let w = v.broadcast_mul(&Self::per_row(&s, v)?)?;
        Ok(Some((w, Some(s))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_gradients(&self, pass: OpGradient<'_, Tensor, 1>) -> Result<(Tensor, [Tensor; 1])> {
        let (v, [g], _, dw) = pass.parts();
        let Some(s) = pass.kept else {
            candle_core::bail!("weight norm: the CUDA forward kept no scale");
        };
        // `v`'s share through the product `dw s`, the scale's gradient `Σ dw v` per unit,
        // then the scale kernel's backward adds `v`'s share through its norms.
        let direct = dw.broadcast_mul(&Self::per_row(s, v)?)?;
        let ds = (dw * v)?.sum_keepdim(2)?.reshape(g.shape())?;
        let kept = (v, g, Some(s));
        let (dv, dg) = super::cuda::device::weight_norm_scale_backward(kept, Some(&direct), &ds)?;
        Ok((dv, [dg]))
    }
}

/// Weight norm's per-unit scale in a population, one agent at a time: `s = g / ||v||`
/// from gains `g` `[out]` (the op's input) and `v` `[out, in...]` (its parameter). Its
/// backward takes `ds` to `dg = ds / ||v||` and `v`'s share through its norm, `dv =
/// -g ds v / ||v||^3` (the product's share, `dt^T x`, is the product's gradient).
pub(crate) struct AgentWeightScale;

impl super::per_agent::AgentKernel<1> for AgentWeightScale {
    fn name(&self) -> &'static str {
        "weight-norm-scale-per-agent"
    }

    fn forward(&self, _agent: usize, g: &[f32], [v]: [&[f32]; 1]) -> Result<Vec<f32>> {
        AgentWeight::check(v, g)?;
        let inv = AgentWeight::inverse_norms(v, g.len());
        Ok(g.iter()
            .zip(&inv)
            .map(|(&g, i)| (f64::from(g) * i) as f32)
            .collect())
    }

    fn backward(&self, pass: OpGradient<'_, [f32], 1>) -> Result<(Vec<f32>, [Vec<f32>; 1])> {
        let (g, [v], _, ds) = pass.parts();
        let (dg, dv) = Self::gradients(v, g, ds)?;
        Ok((dg, [dv]))
    }

    #[cfg(feature = "cuda")]
    fn cuda_forward(&self, x: OpInputs<'_, Tensor, 1>) -> DeviceOutput {
        let (g, [v]) = (x.t, x.params);
        Ok(Some((super::cuda::device::weight_norm_scale(v, g)?, None)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_gradients(&self, pass: OpGradient<'_, Tensor, 1>) -> Result<(Tensor, [Tensor; 1])> {
        let (g, [v], _, ds) = pass.parts();
        let (dv, dg) = super::cuda::device::weight_norm_scale_backward((v, g, None), None, ds)?;
        Ok((dg, [dv]))
    }
}

impl AgentWeightScale {
    /// `dg` and `v`'s share of the gradient through its norms, `c_u v` per unit, from
    /// the scale's gradient `ds` (the op's own backward; the product's share is the
    /// product's).
    pub(crate) fn gradients(v: &[f32], g: &[f32], ds: &[f32]) -> Result<(Vec<f32>, Vec<f32>)> {
        let (dg, c) = Self::unit_factors(v, g, None, ds)?;
        let inputs = v.len() / g.len();
        // Extended unit by unit, not zero-filled then written.
        let mut dv = Vec::with_capacity(v.len());
        for (row, &c) in v.chunks_exact(inputs).zip(&c) {
            dv.extend(row.iter().map(|&x| c * x));
        }
        Ok((dg, dv))
    }

    /// `dg = ds / ||v||` and each unit's factor `c = -g ds / ||v||^3` of `v`'s share
    /// through its norms (`c v`). With the scale `s` as the forward formed it, each
    /// unit's `1 / ||v||` is `s / g` (one pass over `v` fewer), its norm where the gain
    /// is 0.
    pub(crate) fn unit_factors(
        v: &[f32],
        g: &[f32],
        s: Option<&[f32]>,
        ds: &[f32],
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        AgentWeight::check(v, g)?;
        if ds.len() != g.len() || s.is_some_and(|s| s.len() != g.len()) {
            candle_core::bail!(
                "weight norm's scale: gradients do not fit {} gains",
                g.len()
            );
        }
        let inputs = v.len() / g.len();
        let inv: Vec<f64> = match s {
            Some(s) => (0..g.len())
                .map(|u| match g[u] {
                    0.0 => {
                        let row = &v[u * inputs..(u + 1) * inputs];
                        1.0 / dot64(row, row).sqrt()
                    }
                    gain => f64::from(s[u]) / f64::from(gain),
                })
                .collect(),
            None => AgentWeight::inverse_norms(v, g.len()),
        };
        let dg = ds
            .iter()
            .zip(&inv)
            .map(|(&d, i)| (f64::from(d) * i) as f32)
            .collect();
        // Each unit's factor in f64; the pass over its row is f32 (it vectorizes).
        let c = g
            .iter()
            .zip(ds)
            .zip(&inv)
            .map(|((&g, &d), i)| -(f64::from(g) * f64::from(d) * i * i * i) as f32)
            .collect();
        Ok((dg, c))
    }
}

/// `dw += c_u v_u` for each unit's row: weight norm's share of `v`'s gradient through
/// its norms, added in place to the product's share (a fresh gradient of one update):
/// `v`'s whole gradient without a buffer of its own.
pub(crate) struct AddNormShare<'a> {
    pub v: &'a [f32],
    pub c: &'a [f32],
}

impl candle_core::InplaceOp1 for AddNormShare<'_> {
    fn name(&self) -> &'static str {
        "weight-norm-add-norm-share"
    }

    fn cpu_fwd(
        &self,
        storage: &mut candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> Result<()> {
        let dw = super::dense::f32_slice_mut(storage, layout)?;
        if self.c.is_empty() || dw.len() != self.v.len() || !dw.len().is_multiple_of(self.c.len()) {
            candle_core::bail!(
                "weight norm: a gradient of {} for {} weights of {} units",
                dw.len(),
                self.v.len(),
                self.c.len()
            );
        }
        let inputs = dw.len() / self.c.len();
        let rows = dw.chunks_exact_mut(inputs).zip(self.v.chunks_exact(inputs));
        for ((d, x), &c) in rows.zip(self.c) {
            for (o, &x) in d.iter_mut().zip(x) {
                *o += c * x;
            }
        }
        Ok(())
    }
}
