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
use crate::nn::linear_map::unit_moments_after as unit_moments;
use crate::nn::normalization::{copy_var, push, HostGradients};
use crate::nn::params::StoreVersion;
use crate::nn::{LinearMap, ParamStore, Role};

/// How many more values than the weight an output must have before forming `w` (one
/// more graph node, about a microsecond) pays for the per-output scaling it saves.
const FORM_WEIGHT_MARGIN: usize = 4096;

/// Weight norm on one layer, for any number of leading axes: a single network's (`v`
/// in its kernel's layout, gains `[units]`) or a population's (`v` `[P, out, in]`, gains
/// `[P, 1, out]`, each agent's its own; [`Self::stacked`]).
pub struct WeightNorm {
    kernel: LinearMap,
    pub(crate) v: Var,
    /// One gain per output unit (and agent).
    pub(crate) g: Var,
    /// Leading axes before a unit's: 0 for one network, 1 for a population.
    lead: usize,
    /// A population's layer scales its output per unit by `g / ||v||` rather than form
    /// its weight (a bias and no normalization after the product, as a single
    /// network's layer does on the CPU).
    scaled: bool,
    version: StoreVersion,
    cache: Mutex<Option<(u64, Tensor)>>,
    /// A population's fused op ([`Self::fused`]) at the version it was formed at.
    applied: Mutex<Option<(u64, Arc<Applied>)>>,
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
        Ok(Self::of(kernel, v, g, 0, false, store.version_handle()))
    }

    /// A population's layer: `v` `[P, out, in]` and gains `g` `[P, 1, out]`, outside any
    /// store (the population's network keeps its own version and passes it in);
    /// `scaled` where its output is scaled per unit rather than its weight formed.
    pub(crate) fn stacked(v: Var, g: Var, scaled: bool) -> Result<Self> {
        let (_, n_out, n_in) = v.dims3()?;
        let kernel = LinearMap::Linear { n_in, n_out };
        Ok(Self::of(kernel, v, g, 1, scaled, StoreVersion::detached()))
    }

    fn of(
        kernel: LinearMap,
        v: Var,
        g: Var,
        lead: usize,
        scaled: bool,
        version: StoreVersion,
    ) -> Self {
        Self {
            kernel,
            v,
            g,
            lead,
            scaled,
            version,
            cache: Mutex::default(),
            applied: Mutex::default(),
            unit_norms: UnitNormCache::default(),
        }
    }

    /// An independent copy of `v` and the gains (a population's target network), outside
    /// any store, with nothing formed.
    pub(crate) fn copied(&self) -> Result<Self> {
        let (v, g) = (copy_var(&self.v)?, copy_var(&self.g)?);
        let version = StoreVersion::detached();
        Ok(Self::of(self.kernel, v, g, self.lead, self.scaled, version))
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

    /// `v / ||v||` per unit (the direction), differentiable, in `v`'s shape.
    pub fn direction(&self) -> Result<Tensor> {
        let v = self.v.as_tensor();
        let rows = v.flatten_from(self.lead + 1)?;
        let norm = rows.sqr()?.sum_keepdim(self.lead + 1)?.sqrt()?;
        rows.broadcast_div(&norm)?.reshape(v.shape())
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
        let v = self.v.as_tensor();
        let dir = self.direction()?.flatten_from(self.lead + 1)?;
        let mut column = dir.dims()[..=self.lead].to_vec();
        column.push(1);
        let g = self.g.as_tensor().reshape(column)?;
        dir.broadcast_mul(&g)?.reshape(v.shape())
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

    /// Data-dependent init from the layer's outputs `t` of its directions on a batch
    /// (each agent's its own in a population): per unit, sets the gain `1 / (std(t) +
    /// eps)` and returns the scaled mean `mean(t) gain`, shaped to broadcast against
    /// `t` (the bias is its negative, unless the normalization takes it).
    pub(crate) fn initialize(&self, t: &Tensor) -> Result<Tensor> {
        let (mean, var) = unit_moments(t, self.lead)?;
        let scale = (var.sqrt()? + DDI_EPS)?.recip()?;
        self.version.set(&self.g, &scale.reshape(self.g.shape())?)?;
        mean * scale
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

/// A population's weight `g v / ||v||` from `v` `[P, out, in]` and gains `g` `[P, 1,
/// out]` as one fused CPU op with its closed-form backward, per agent, kept for an
/// explicit backward.
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

/// A population's layer (`lead` 1): the weight its product uses and the fused ops,
/// formed once per version of the population's network (`version`, which it keeps
/// itself): a step's acting forward and its training forward share the online
/// network's, a target network keeps its own until the next sync.
impl WeightNorm {
    /// Whether the fused ops scale the layer's output per unit (the product is `v`'s;
    /// `kernels::bias_relu::AgentScaledBias`) rather than form its weight.
    pub(crate) fn scaled(&self) -> bool {
        self.scaled
    }

    /// The weight a population's product uses: `v` itself where the layer is scaled,
    /// else `g v / ||v||`, through the fused op (at `version`) with `fused`, else the
    /// tensor forms.
    pub(crate) fn stacked_weight(&self, fused: bool, version: u64) -> Result<Tensor> {
        match fused {
            _ if self.scaled => Ok(self.v.as_tensor().clone()),
            true => Ok(self.fused(version, true)?.out.clone()),
            false => self.weight_reference(),
        }
    }

    /// The fused op at the network's `version`, with its backward: the scale where the
    /// layer is [`Self::scaled`], else the weight. With `cache`, the op formed at this
    /// version is reused; without (inside a captured CUDA graph, whose replay must form
    /// it from its own step's variables), it is formed afresh and not kept.
    pub(crate) fn fused(&self, version: u64, cache: bool) -> Result<Arc<Applied>> {
        let form = || -> Result<Arc<Applied>> {
            let (v, g) = (self.v.as_tensor(), self.g.as_tensor());
            Ok(Arc::new(match self.scaled {
                true => stacked_scale_applied(v, g)?,
                false => stacked_weight_applied(v, g)?,
            }))
        };
        if !cache {
            return form();
        }
        let mut kept = self.applied.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, applied)) = kept.as_ref() {
            if *at == version {
                return Ok(applied.clone());
            }
        }
        let applied = form()?;
        *kept = Some((version, applied.clone()));
        Ok(applied)
    }

    /// The tensor forms' per-unit scale of a scaled layer's output `h` (`h` as it is
    /// where the layer forms its weight instead).
    pub(crate) fn scale_output(&self, h: Tensor) -> Result<Tensor> {
        match self.scaled {
            true => h.broadcast_mul(&stacked_scale_reference(
                self.v.as_tensor(),
                self.g.as_tensor(),
                h.rank(),
            )?),
            false => Ok(h),
        }
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
        let wn = WeightNorm::stacked(v.clone(), g.clone(), false).unwrap();
        let fused = wn.stacked_weight(true, 0).unwrap();
        let reference = wn.weight_reference().unwrap();
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
