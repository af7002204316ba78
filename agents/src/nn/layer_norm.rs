//! Layer normalization (Ba et al., 2016): each sample is normalized over all of a
//! layer's features (`(C, H, W)` for conv), then scaled and shifted per feature. On the
//! CPU one fused op computes it and its closed-form backward; elsewhere (and as the
//! tested reference) differentiable tensor ops do (candle's own `LayerNorm` drops
//! gradients).
//!
//! Per sample, with `x̂ = (t - mean) / sqrt(var + eps)` over its `n` features:
//! `dbeta = Σ_b dy`, `dgamma = Σ_b dy·x̂`, and with `d = dy·gamma`,
//! `dt = (d - Σd/n - x̂ Σ(d·x̂)/n) / sqrt(var + eps)`.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use normrl_agents::nn::{LayerNorm, ParamStore};
//!
//! let mut store = ParamStore::new(Device::Cpu);
//! let ln = LayerNorm::new(&mut store, "fc", &[2], 0.0).unwrap();
//! let t = Tensor::new(&[[1.0f32, 3.0], [10.0, 30.0]], &Device::Cpu).unwrap();
//! let y = ln.forward(&t).unwrap().to_vec2::<f32>().unwrap();
//! assert_eq!(y, vec![vec![-1.0, 1.0], vec![-1.0, 1.0]]);
//! ```

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor, Var};

use super::dense::{f32_slice, lane_sum};
use super::fused::{gradient_through_relu, relu_in_place, with_values};
use super::kernel::sample_moments;
use super::{Group, ParamStore};

pub struct LayerNorm {
    gamma: Var,
    beta: Var,
    eps: f64,
}

impl LayerNorm {
    /// `features`: one sample's shape, e.g. `[n]` or `[C, H, W]`.
    pub fn new(store: &mut ParamStore, prefix: &str, features: &[usize], eps: f64) -> Result<Self> {
        Ok(Self {
            gamma: store.ones(&format!("{prefix}.ln.gamma"), features, Group::Weight)?,
            beta: store.zeros(&format!("{prefix}.ln.beta"), features, Group::Weight)?,
            eps,
        })
    }

    pub fn forward(&self, t: &Tensor) -> Result<Tensor> {
        self.forward_then(t, false)
    }

    /// `relu(forward(t))`, in one op on the CPU.
    pub fn forward_relu(&self, t: &Tensor) -> Result<Tensor> {
        self.forward_then(t, true)
    }

    fn forward_then(&self, t: &Tensor, relu: bool) -> Result<Tensor> {
        if !t.device().is_cpu() {
            let y = self.forward_reference(t)?;
            return if relu { y.relu() } else { Ok(y) };
        }
        t.contiguous()?.apply_op3(
            &self.gamma.as_tensor().contiguous()?,
            &self.beta.as_tensor().contiguous()?,
            FusedLayerNorm {
                eps: self.eps,
                relu,
            },
        )
    }

    /// The layer through candle's tensor ops.
    pub fn forward_reference(&self, t: &Tensor) -> Result<Tensor> {
        let (mean, var) = sample_moments(t)?;
        t.broadcast_sub(&mean)?
            .broadcast_div(&(var + self.eps)?.sqrt()?)?
            .broadcast_mul(self.gamma.as_tensor())?
            .broadcast_add(self.beta.as_tensor())
    }
}

struct FusedLayerNorm {
    eps: f64,
    /// A ReLU follows in the same op.
    relu: bool,
}

impl FusedLayerNorm {
    /// Per sample (row of `n` values): mean and `1 / sqrt(var + eps)`.
    fn statistics(&self, t: &[f32], n: usize) -> Vec<(f32, f32)> {
        t.chunks_exact(n)
            .map(|row| {
                let sum = f64::from(lane_sum(row, row, |x, _| x));
                let mean = sum / n as f64;
                let m = mean as f32;
                let var = f64::from(lane_sum(row, row, |x, _| (x - m) * (x - m))) / n as f64;
                (m, (1.0 / (var + self.eps).sqrt()) as f32)
            })
            .collect()
    }

    fn features(t: &Shape, gamma: &Shape) -> Result<usize> {
        let n = t.elem_count() / t.dims().first().copied().unwrap_or(1).max(1);
        if gamma.elem_count() != n {
            candle_core::bail!("layer norm: {t:?} does not fit an affine of shape {gamma:?}");
        }
        Ok(n)
    }
}

impl CustomOp3 for FusedLayerNorm {
    fn name(&self) -> &'static str {
        "layer-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (t, gamma, beta) = (f32_slice(s1, l1)?, f32_slice(s2, l2)?, f32_slice(s3, l3)?);
        let n = Self::features(l1.shape(), l2.shape())?;
        let mut out = Vec::with_capacity(t.len());
        for (row, (m, inv)) in t.chunks_exact(n).zip(self.statistics(t, n)) {
            out.extend(
                row.iter()
                    .zip(gamma.iter().zip(beta))
                    .map(|(x, (g, b))| (x - m) * inv * g + b),
            );
        }
        if self.relu {
            relu_in_place(&mut out);
        }
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        t: &Tensor,
        gamma: &Tensor,
        beta: &Tensor,
        out: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let dy = gradient_through_relu(self.relu, out, dy)?;
        let n = Self::features(t.shape(), gamma.shape())?;
        let gamma_values = gamma.flatten_all()?.to_vec1::<f32>()?;
        let (dt, dgamma, dbeta) = with_values(t, |t| {
            with_values(&dy, |dy| {
                let mut dgamma = vec![0f32; n];
                let mut dbeta = vec![0f32; n];
                let mut dt = Vec::with_capacity(t.len());
                let rows = t.chunks_exact(n).zip(dy.chunks_exact(n));
                for ((row, drow), (m, inv)) in rows.zip(self.statistics(t, n)) {
                    let xhat: Vec<f32> = row.iter().map(|x| (x - m) * inv).collect();
                    let d: Vec<f32> = drow.iter().zip(&gamma_values).map(|(g, w)| g * w).collect();
                    let mean_d = lane_sum(&d, &d, |d, _| d) / n as f32;
                    let mean_dx = lane_sum(&d, &xhat, |d, x| d * x) / n as f32;
                    dt.extend(
                        d.iter()
                            .zip(&xhat)
                            .map(|(d, x)| inv * (d - mean_d - x * mean_dx)),
                    );
                    for (((dg, db), g), x) in dgamma.iter_mut().zip(&mut dbeta).zip(drow).zip(&xhat)
                    {
                        *dg += g * x;
                        *db += g;
                    }
                }
                Ok((dt, dgamma, dbeta))
            })
        })?;
        Ok((
            Some(Tensor::from_vec(dt, t.shape(), t.device())?),
            Some(Tensor::from_vec(dgamma, gamma.shape(), gamma.device())?),
            Some(Tensor::from_vec(dbeta, beta.shape(), beta.device())?),
        ))
    }
}
