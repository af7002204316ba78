//! Weight normalization (Salimans & Kingma, 2016): each output unit's weight vector is
//! `w = g * v / ||v||`, with `g` a scalar per unit and the norm over the unit's inputs
//! (`(c_in, kh, kw)` for conv). `w` is recomputed from `g` and `v` in every training
//! forward, so autodiff yields the paper's gradients
//!
//! ```text
//! dL/dg = (dL/dw) . v/||v||
//! dL/dv = g/||v|| * (dL/dw - (dL/dg) * v/||v||)
//! ```
//!
//! Gradient-free forwards (acting, target networks) on the graph reuse a cached `w`,
//! recomputed only when the variables change, so acting costs what a plain layer costs.
//! The host path never forms `w`: it caches the norms instead ([`Self::unit_norms`]).
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use normrl_agents::nn::{LinearMap, ParamStore, WeightNorm};
//!
//! let mut store = ParamStore::new(Device::Cpu);
//! let kernel = LinearMap::Linear { n_in: 3, n_out: 2 };
//! let v = Tensor::new(&[[3.0f32, 0.0, 4.0], [0.0, 2.0, 0.0]], &Device::Cpu).unwrap();
//! let g = Tensor::new(&[10.0f32, -1.0], &Device::Cpu).unwrap();
//! let wn = WeightNorm::from_values(&mut store, "fc", kernel, v, g).unwrap();
//! let w = wn.weight().unwrap().to_vec2::<f32>().unwrap();
//! assert_eq!(w, vec![vec![6.0, 0.0, 8.0], vec![0.0, -1.0, 0.0]]);
//! ```

use std::sync::{Arc, Mutex};

use candle_core::{Result, Tensor, Var};

use crate::kernels::conv::DataConv2d;
use crate::kernels::linear::LinearCore;
use crate::kernels::per_agent::{Applied, PerAgent};
use crate::kernels::product::Product;
use crate::kernels::weight_norm::{
    add_norm_gradient, gain_gradient_from_sums, inverse_norms, unit_scales, FusedWeightNorm,
    NormedKernel, ScaleByGain,
};
use crate::kernels::with_values;
use crate::nn::normalization::{push, HostGradients};
use crate::nn::params::StoreVersion;
use crate::nn::{LinearMap, ParamStore, Role};

/// How many more values than the weight an output must have before forming `w` (one
/// more graph node, about a microsecond) pays for the per-output scaling it saves.
const FORM_WEIGHT_MARGIN: usize = 4096;

pub struct WeightNorm {
    kernel: LinearMap,
    pub(crate) v: Var,
    /// One gain per output unit, shape `[units]`.
    pub(crate) g: Var,
    version: StoreVersion,
    cache: Mutex<Option<(u64, Tensor)>>,
    unit_norms: UnitNormCache,
}

impl WeightNorm {
    /// Registers `{prefix}.v` and `{prefix}.g` with the given values.
    pub fn from_values(
        store: &mut ParamStore,
        prefix: &str,
        kernel: LinearMap,
        v: Tensor,
        g: Tensor,
    ) -> Result<Self> {
        let v = store.add(&format!("{prefix}.v"), v, Role::Weight)?;
        let g = store.add(&format!("{prefix}.g"), g, Role::Gain)?;
        Ok(Self {
            kernel,
            v,
            g,
            version: store.version_handle(),
            cache: Mutex::new(None),
            unit_norms: UnitNormCache::default(),
        })
    }

    /// `g = ||v||` per unit, so that `w` starts equal to `v` (the init without
    /// data-dependent initialization).
    pub fn norm_preserving(
        store: &mut ParamStore,
        prefix: &str,
        kernel: LinearMap,
        v: Tensor,
    ) -> Result<Self> {
        let units = kernel.units();
        let g = v.reshape((units, ()))?.sqr()?.sum(1)?.sqrt()?;
        Self::from_values(store, prefix, kernel, v, g)
    }

    pub fn kernel(&self) -> LinearMap {
        self.kernel
    }

    /// `v / ||v||` per unit (the direction), differentiable.
    pub fn direction(&self) -> Result<Tensor> {
        let units = self.kernel.units();
        let v = self.v.as_tensor().reshape((units, ()))?;
        let norm = v.sqr()?.sum_keepdim(1)?.sqrt()?;
        v.broadcast_div(&norm)?.reshape(self.kernel.weight_shape())
    }

    /// `w = g * v / ||v||`, differentiable with respect to `g` and `v`. On the CPU one
    /// fused op computes it and its closed-form backward; elsewhere (and in
    /// [`Self::weight_reference`]) tensor ops do.
    pub fn weight(&self) -> Result<Tensor> {
        if self.v.device().is_cpu() {
            let v = self.v.as_tensor();
            return v.apply_op2(
                self.g.as_tensor(),
                FusedWeightNorm {
                    units: self.kernel.units(),
                },
            );
        }
        self.weight_reference()
    }

    /// The layer's kernel applied with `w` to `x`, differentiable. On the CPU `w` is
    /// formed only where the output has at least 4,096 values more than the weight (a
    /// convolution's feature maps, a large batch): that is then the smaller pass,
    /// forward and backward. Elsewhere it is never formed
    /// ([`Self::apply_output_scaled`]), which saves a graph node.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let forms_weight = match self.output_len(x) {
            Some(out_len) => out_len >= self.v.elem_count() + FORM_WEIGHT_MARGIN,
            None => false,
        };
        if !self.v.device().is_cpu() || forms_weight {
            return self.kernel.apply(x, &self.weight()?);
        }
        self.apply_output_scaled(x)
    }

    /// Values of the kernel's output on `x`, if `x` has the kernel's rank.
    fn output_len(&self, x: &Tensor) -> Option<usize> {
        let dims = x.dims();
        let rank = match self.kernel {
            LinearMap::Linear { .. } => 2,
            LinearMap::Conv2d { .. } => 4,
        };
        (dims.len() == rank).then(|| {
            dims[0]
                * self
                    .kernel
                    .output_shape(&dims[1..])
                    .iter()
                    .product::<usize>()
        })
    }

    /// [`Self::apply`] without forming `w`: the kernel runs with `v` and each unit's
    /// output is scaled by `g / ||v||`, in one op with the kernel where the kernel has
    /// a fused op. CPU only.
    pub fn apply_output_scaled(&self, x: &Tensor) -> Result<Tensor> {
        let (v, g) = (self.v.as_tensor(), self.g.as_tensor());
        let units = self.kernel.units();
        let inv_norms = with_values(v, |v| Ok(inverse_norms(v, units)))?;
        match self.kernel {
            LinearMap::Linear { .. } => {
                let x = x.contiguous()?;
                let core = LinearCore::of(x.shape(), v.shape())?;
                x.apply_op3(v, g, NormedKernel { core, inv_norms })
            }
            LinearMap::Conv2d {
                k,
                stride,
                padding: 0,
                ..
            } if !x.track_op() => {
                let (cols, core) = DataConv2d { k, stride }.columns(x, v)?;
                cols.apply_op3(v, g, NormedKernel { core, inv_norms })
            }
            LinearMap::Conv2d { .. } => {
                let t = self.kernel.apply(x, v)?;
                t.apply_op3(v, g, ScaleByGain { inv_norms })
            }
        }
    }

    /// `w` from unfused tensor ops (autodiff through each), the reference the fused
    /// path is tested against.
    pub fn weight_reference(&self) -> Result<Tensor> {
        let units = self.kernel.units();
        let dir = self.direction()?.reshape((units, ()))?;
        let g = self.g.as_tensor().reshape((units, 1))?;
        dir.broadcast_mul(&g)?.reshape(self.kernel.weight_shape())
    }

    /// `w` without gradient, recomputed only when the store's version changed.
    pub fn cached_weight(&self) -> Result<Tensor> {
        let version = self.version.get();
        let mut cache = self.cache.lock().expect("weight cache poisoned");
        if let Some((v, w)) = cache.as_ref() {
            if *v == version {
                return Ok(w.clone());
            }
        }
        let w = self.weight()?.detach();
        *cache = Some((version, w.clone()));
        Ok(w)
    }

    /// `1/||v_u||` and `g_u/||v_u||` on host values, computed once per version of the
    /// store (see [`UnitNorms`]). CPU only.
    #[inline]
    pub fn unit_norms(&self) -> Result<Arc<UnitNorms>> {
        let version = self.version.get();
        let units = self.kernel.units();
        self.unit_norms.get(version, &self.v, &self.g, units)
    }

    /// Sets `g` (after data-dependent initialization).
    pub fn set_gain(&self, g: &Tensor) -> Result<()> {
        self.version.set(&self.g, &g.reshape(self.kernel.units())?)
    }
}

/// The host path (CPU MLPs): the kernel runs with `v` and each unit's output is scaled
/// by `g_u/||v_u||` in the layer's output pass; `w` is never formed.
impl WeightNorm {
    /// The kernel's output `v x` on host values, and the norms that scale it.
    #[inline]
    pub(crate) fn host_kernel(
        &self,
        core: &LinearCore,
        x: &[f32],
    ) -> Result<(Vec<f32>, Arc<UnitNorms>)> {
        let norms = self.unit_norms()?;
        let t = with_values(self.v.as_tensor(), |v| Ok(core.forward(x, v)))?;
        Ok((t, norms))
    }

    /// Pushes `dL/dv` and `dL/dg` from `dt`, the gradient of the scaled output with
    /// respect to `v x`, and `gain_sums` (`Σ dL/dy · t` per unit); returns the input's
    /// gradient when asked.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn host_backward(
        &self,
        core: &LinearCore,
        input: &[f32],
        dt: &[f32],
        gain_sums: &[f32],
        norms: &UnitNorms,
        input_gradient: bool,
        grads: &mut HostGradients,
    ) -> Result<Option<Vec<f32>>> {
        // dL/dg_u = Σ dL/dy t / ||v_u||; dL/dv = (dL/dt)^T x minus the part along v_u
        // (the gradient through the norm).
        let inv = &norms.inv_norms;
        let dg = gain_gradient_from_sums(gain_sums, inv);
        let (dv, dx) = with_values(self.v.as_tensor(), |v| {
            let (mut dv, dx) = core.backward(input, v, dt, input_gradient);
            with_values(self.g.as_tensor(), |g| {
                add_norm_gradient(&mut dv, v, g, &dg, inv);
                Ok(())
            })?;
            Ok((dv, dx))
        })?;
        push(grads, &self.v, dv);
        push(grads, &self.g, dg);
        Ok(dx)
    }
}

/// `1/||v_u||` and `s_u = g_u/||v_u||` per unit `u`, on host values.
///
/// Every forward of the host path (an update's, acting, TD targets) runs the kernel
/// with `v` and scales its output by `s_u`; the scale costs nothing, as it joins the
/// bias pass. The norms change only when `v` and `g` do, so they are kept for the
/// store's version: in training, acting computes them once after each update and the
/// next update's forward reads them.
///
/// ```
/// use candle_core::{Device, Tensor};
/// use normrl_agents::nn::{LinearMap, ParamStore, WeightNorm};
///
/// let mut store = ParamStore::new(Device::Cpu);
/// let kernel = LinearMap::Linear { n_in: 2, n_out: 2 };
/// let v = Tensor::new(&[[3.0f32, 4.0], [0.0, 2.0]], &Device::Cpu).unwrap();
/// let g = Tensor::new(&[10.0f32, -1.0], &Device::Cpu).unwrap();
/// let wn = WeightNorm::from_values(&mut store, "fc", kernel, v, g).unwrap();
/// let norms = wn.unit_norms().unwrap();
/// assert_eq!(norms.inv_norms, vec![0.2, 0.5]);
/// assert_eq!(norms.scales, vec![2.0, -0.5]);
/// ```
#[derive(Debug, PartialEq)]
pub struct UnitNorms {
    pub inv_norms: Vec<f32>,
    pub scales: Vec<f32>,
}

/// [`UnitNorms`] for one version of the store.
#[derive(Default)]
pub(crate) struct UnitNormCache(Mutex<Option<(u64, Arc<UnitNorms>)>>);

impl UnitNormCache {
    /// The norms of `v` and `g` (`units` rows) at `version`, computed on the first call
    /// for that version.
    pub fn get(&self, version: u64, v: &Var, g: &Var, units: usize) -> Result<Arc<UnitNorms>> {
        let mut entry = self.0.lock().expect("unit norm cache poisoned");
        if let Some((at, norms)) = entry.as_ref() {
            if *at == version {
                return Ok(norms.clone());
            }
        }
        let inv_norms = with_values(v.as_tensor(), |v| Ok(inverse_norms(v, units)))?;
        let scales = with_values(g.as_tensor(), |g| Ok(unit_scales(g, &inv_norms)))?;
        let norms = Arc::new(UnitNorms { inv_norms, scales });
        *entry = Some((version, norms.clone()));
        Ok(norms)
    }
}

/// Small constant of data-dependent initialization: `g = 1 / (std + eps)`.
pub(crate) const DDI_EPS: f64 = 1e-6;

/// Weight norm's population form: the weight a product uses from `v` `[P, out, in]`
/// and gains `g` `[P, 1, out]`: `g v / ||v||` per unit (`v`'s norms over its inputs,
/// per agent); with `direction`, `v / ||v||` alone.
pub(crate) fn stacked_weight(v: &Tensor, g: &Tensor, direction: bool) -> Result<Tensor> {
    if !direction && v.device().is_cpu() && v.rank() == 3 {
        return Ok(stacked_weight_applied(v, g)?.out);
    }
    stacked_weight_reference(v, g, direction)
}

/// [`stacked_weight`] as one fused CPU op with its closed-form backward, per agent,
/// kept for an explicit backward.
pub(crate) fn stacked_weight_applied(v: &Tensor, g: &Tensor) -> Result<Applied> {
    let agents = v.dim(0)?;
    PerAgent::new(crate::kernels::weight_norm::AgentWeight, agents).apply1(v, g)
}

/// Weight norm's per-unit scale `g / ||v||` `[P, 1, out]` from `v` `[P, out, in]` and
/// gains `g` `[P, 1, out]`, as one fused CPU op with its backward, kept for an explicit
/// backward: a layer's output is then its product with `v`, scaled per unit
/// (`kernels::bias_relu::AgentScaledBias`), and `w` is never formed.
pub(crate) fn stacked_scale_applied(v: &Tensor, g: &Tensor) -> Result<Applied> {
    let agents = v.dim(0)?;
    PerAgent::new(crate::kernels::weight_norm::AgentWeightScale, agents).apply1(g, v)
}

/// The gradients of `v` and `g` `(dv, dg)` of a layer scaled by
/// [`stacked_scale_applied`], from its product's gradient with respect to `v` (`dw`,
/// `[P, out, in]`, a fresh tensor: `v`'s gradient is made in its place on the CPU) and
/// its scale's (`ds`, `[P, 1, out]`): one pass over `v` per agent (the scale's own
/// backward and a sum made three).
pub(crate) fn stacked_scale_gradients(
    (v, g, s): (&Tensor, &Tensor, &Tensor),
    dw: Tensor,
    ds: &Tensor,
) -> Result<(Tensor, Tensor)> {
    use crate::kernels::weight_norm::{AddNormShare, AgentWeightScale};
    use crate::kernels::with_values;
    #[cfg(feature = "cuda")]
    if v.device().is_cuda() {
        let (v, g, s) = (v.contiguous()?, g.contiguous()?, s.contiguous()?);
        let kept = (&v, &g, Some(&s));
        return crate::kernels::cuda::device::weight_norm_scale_backward(kept, Some(&dw), ds);
    }
    let p = v.dim(0)?;
    let dw = dw.contiguous()?;
    let (v, g, s, ds) = (
        v.contiguous()?,
        g.contiguous()?,
        s.contiguous()?,
        ds.contiguous()?,
    );
    let run = crate::kernels::per_agent::agent_run;
    let dg = with_values(&v, |v| {
        with_values(&g, |g| {
            with_values(&s, |s| {
                with_values(&ds, |ds| {
                    let (mut dg, mut c) = (Vec::with_capacity(g.len()), Vec::new());
                    for i in 0..p {
                        let (s, ds) = (Some(run(s, p, i)), run(ds, p, i));
                        let (v, g) = (run(v, p, i), run(g, p, i));
                        let (g1, c1) = AgentWeightScale::unit_factors(v, g, s, ds)?;
                        dg.extend(g1);
                        c.extend(c1);
                    }
                    // The norms' share into the product's gradient, in place.
                    dw.inplace_op1(&AddNormShare { v, c: &c })?;
                    Ok(dg)
                })
            })
        })
    })?;
    Ok((dw, Tensor::from_vec(dg, g.shape(), g.device())?))
}

/// [`stacked_scale_applied`] as tensor ops, on any device (and the fused op's
/// reference): `g / ||v||`, shaped for outputs of `rank` (`[P, 1, out]`, or `[P, 1,
/// out, 1]` over feature maps).
pub(crate) fn stacked_scale_reference(v: &Tensor, g: &Tensor, rank: usize) -> Result<Tensor> {
    let inv_norm = v.sqr()?.sum_keepdim(2)?.sqrt()?.recip()?.transpose(1, 2)?;
    let s = (g * inv_norm)?;
    match rank {
        4 => s.unsqueeze(3),
        _ => Ok(s),
    }
}

/// [`stacked_weight`] as tensor ops, on any device (and the fused op's reference).
pub(crate) fn stacked_weight_reference(v: &Tensor, g: &Tensor, direction: bool) -> Result<Tensor> {
    let inv_norm = v.sqr()?.sum_keepdim(2)?.sqrt()?.recip()?;
    match direction {
        true => v.broadcast_mul(&inv_norm),
        false => v.broadcast_mul(&(inv_norm * g.transpose(1, 2)?)?),
    }
}

/// Data-dependent init in a population: from each agent's outputs `t` of the weights'
/// directions on its batch, per unit the gain `1 / (std(t) + eps)` and the scaled mean
/// `mean(t) gain` (the bias is its negative, unless the normalization takes it).
pub(crate) fn stacked_initial_gain(t: &Tensor) -> Result<(Tensor, Tensor)> {
    let (mean, var) = crate::nn::normalization::unit_moments(t, 1)?;
    let scale = (var.sqrt()? + DDI_EPS)?.recip()?;
    let mean_scaled = (mean * &scale)?;
    Ok((scale, mean_scaled))
}

/// Weight norm on a population's layer: the gains `g` `[P, 1, out]` over the layer's
/// `v` `[P, out, in]`, and the fused op formed from them (the weight `g v / ||v||`, or
/// the per-unit scale `g / ||v||` where the layer is [`Self::scaled`]), kept for the
/// network's version it was formed at: a step's acting forward and its training
/// forward share the online network's, a target network keeps its own until the next
/// sync.
pub(crate) struct StackedWeightNorm {
    pub(crate) g: Var,
    scaled: bool,
    cache: Mutex<Option<(u64, Arc<Applied>)>>,
}

impl StackedWeightNorm {
    /// Gains `g` of a layer; `scaled` where its output is scaled per unit rather than
    /// its weight formed (a bias and no normalization after the product, as a single
    /// network's layer).
    pub(crate) fn new(g: Var, scaled: bool) -> Self {
        Self {
            g,
            scaled,
            cache: Mutex::default(),
        }
    }

    /// The same over a copy of the gains (a target network), with no op formed.
    pub(crate) fn copied(&self) -> Result<Self> {
        Ok(Self::new(
            crate::nn::normalization::copy_var(&self.g)?,
            self.scaled,
        ))
    }

    /// Whether the fused ops scale the layer's output per unit (the product is `v`'s;
    /// `kernels::bias_relu::AgentScaledBias`) rather than form its weight.
    pub(crate) fn scaled(&self) -> bool {
        self.scaled
    }

    /// The weight a product with `v` uses: `v` itself where the layer is scaled,
    /// `v / ||v||` with `direction` (data-dependent init), else `g v / ||v||`; through
    /// the fused op (at `version`) with `fused`, else the tensor forms.
    pub(crate) fn weight(
        &self,
        v: &Var,
        direction: bool,
        fused: bool,
        version: u64,
    ) -> Result<Tensor> {
        let (v, g) = (v.as_tensor(), self.g.as_tensor());
        match (direction, fused) {
            (false, _) if self.scaled => Ok(v.clone()),
            (false, true) => Ok(self.fused(v, version, true)?.out.clone()),
            (_, true) => stacked_weight(v, g, direction),
            (_, false) => stacked_weight_reference(v, g, direction),
        }
    }

    /// The fused op at the network's `version`, with its backward: the scale where the
    /// layer is [`Self::scaled`], else the weight. With `cache`, the op formed at this
    /// version is reused; without (inside a captured CUDA graph, whose replay must form
    /// it from its own step's variables), it is formed afresh and not kept.
    pub(crate) fn fused(&self, v: &Tensor, version: u64, cache: bool) -> Result<Arc<Applied>> {
        let form = || -> Result<Arc<Applied>> {
            let g = self.g.as_tensor();
            Ok(Arc::new(match self.scaled {
                true => stacked_scale_applied(v, g)?,
                false => stacked_weight_applied(v, g)?,
            }))
        };
        if !cache {
            return form();
        }
        let mut kept = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, applied)) = kept.as_ref() {
            if *at == version {
                return Ok(applied.clone());
            }
        }
        let applied = form()?;
        *kept = Some((version, applied.clone()));
        Ok(applied)
    }

    /// The tensor forms' per-unit scale of a scaled layer's output `h` (`None` where
    /// the layer forms its weight instead).
    pub(crate) fn scale_output(&self, v: &Var, h: Tensor) -> Result<Tensor> {
        match self.scaled {
            true => h.broadcast_mul(&stacked_scale_reference(
                v.as_tensor(),
                self.g.as_tensor(),
                h.rank(),
            )?),
            false => Ok(h),
        }
    }

    /// Data-dependent init from the layer's outputs `t` of its directions on each
    /// agent's batch: sets the gains and returns each unit's scaled mean, shaped as
    /// `bias_shape` (the bias is its negative, unless the normalization takes it).
    pub(crate) fn initialize(&self, t: &Tensor, bias_shape: &candle_core::Shape) -> Result<Tensor> {
        let (scale, mean_scaled) = stacked_initial_gain(t)?;
        self.g.set(&scale.reshape(self.g.shape())?)?;
        mean_scaled.reshape(bias_shape)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use candle_core::{Device, Tensor};

    use crate::nn::{LinearMap, ParamStore, WeightNorm};

    /// A population's effective weight per agent equals its tensor-op form, value and
    /// gradients of `v` and `g` (a zero gain included).
    #[test]
    fn the_population_weight_equals_the_tensor_form() {
        use crate::test_support::{assert_same_gradients, explicit_gradients};
        use crate::test_support::{gradients, max_relative};
        use candle_core::Var;
        let mut rng = crate::test_support::Normals::new(9);
        let mut random = |dims: &[usize]| crate::test_support::random(&mut rng, dims);
        let v = Var::from_tensor(&random(&[3, 5, 7])).unwrap();
        let mut gains = random(&[3, 1, 5])
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        gains[2] = 0.0;
        let g =
            Var::from_tensor(&Tensor::from_vec(gains, (3, 1, 5), &Device::Cpu).unwrap()).unwrap();
        let weights = random(&[3, 5, 7]);
        let applied = super::stacked_weight_applied(v.as_tensor(), g.as_tensor()).unwrap();
        let fused = super::stacked_weight(v.as_tensor(), g.as_tensor(), false).unwrap();
        let reference =
            super::stacked_weight_reference(v.as_tensor(), g.as_tensor(), false).unwrap();
        assert!(max_relative(&fused, &reference) < 1e-6);
        assert!(max_relative(&applied.out, &reference) < 1e-6);
        let gr = gradients(&reference, &weights);
        // Through candle's backward and through the op's explicit one.
        let explicit = explicit_gradients(&applied, v.as_tensor(), &weights);
        let stores = [gradients(&fused, &weights), explicit];
        assert_same_gradients(&stores, &gr, &[&v, &g], (1e-5, "weight norm"));
    }

    /// Weight norm's per-unit scale equals its tensor form, values and gradients of
    /// `v` and `g` (by candle's backward and by the op's explicit one), a zero gain
    /// among them.
    #[test]
    fn the_population_scale_equals_the_tensor_form() {
        use crate::test_support::explicit_gradients;
        use crate::test_support::{gradients, max_relative};
        use candle_core::Var;
        let mut rng = crate::test_support::Normals::new(10);
        let mut random = |dims: &[usize]| crate::test_support::random(&mut rng, dims);
        let v = Var::from_tensor(&random(&[3, 5, 7])).unwrap();
        let g = random(&[3, 1, 5]).flatten_all().unwrap();
        let mut gains = g.to_vec1::<f32>().unwrap();
        gains[3] = 0.0;
        let g = Tensor::from_vec(gains, (3, 1, 5), &Device::Cpu).unwrap();
        let g = Var::from_tensor(&g).unwrap();
        let weights = random(&[3, 1, 5]);
        let applied = super::stacked_scale_applied(v.as_tensor(), g.as_tensor()).unwrap();
        let reference = super::stacked_scale_reference(v.as_tensor(), g.as_tensor(), 3);
        let reference = reference.unwrap();
        assert!(max_relative(&applied.out, &reference) < 1e-6);
        let gr = gradients(&reference, &weights);
        let graph = gradients(&applied.out, &weights);
        let explicit = explicit_gradients(&applied, g.as_tensor(), &weights);
        for gf in [graph, explicit] {
            for var in [&v, &g] {
                let (a, b) = (
                    gf.get(var.as_tensor()).unwrap(),
                    gr.get(var.as_tensor()).unwrap(),
                );
                assert!(max_relative(a, b) < 1e-5, "gradient of {:?}", var.dims());
            }
        }
        // With the product's gradient `dw` added in the same pass.
        let dw = random(&[3, 5, 7]);
        let forms = (v.as_tensor(), g.as_tensor(), &applied.out);
        let (dv, dg) = super::stacked_scale_gradients(forms, dw.copy().unwrap(), &weights).unwrap();
        let dv_ref = (gr.get(v.as_tensor()).unwrap() + &dw).unwrap();
        assert!(max_relative(&dv, &dv_ref) < 1e-5);
        assert!(max_relative(&dg, gr.get(g.as_tensor()).unwrap()) < 1e-5);
    }

    #[test]
    fn norms_are_kept_until_the_store_changes() {
        let dev = Device::Cpu;
        let mut store = ParamStore::new(dev.clone());
        let kernel = LinearMap::Linear { n_in: 2, n_out: 1 };
        let v = Tensor::new(&[[3.0f32, 4.0]], &dev).unwrap();
        let g = Tensor::new(&[1.0f32], &dev).unwrap();
        let wn = WeightNorm::from_values(&mut store, "fc", kernel, v, g).unwrap();
        let first = wn.unit_norms().unwrap();
        assert!(Arc::ptr_eq(&first, &wn.unit_norms().unwrap()));
        assert_eq!(first.inv_norms, vec![0.2]);
        // A change that goes through the store (as an optimizer step does).
        wn.v.set(&Tensor::new(&[[0.0f32, 2.0]], &dev).unwrap())
            .unwrap();
        wn.g.set(&Tensor::new(&[3.0f32], &dev).unwrap()).unwrap();
        store.bump_version();
        let second = wn.unit_norms().unwrap();
        assert_eq!((second.inv_norms[0], second.scales[0]), (0.5, 1.5));
    }
}
