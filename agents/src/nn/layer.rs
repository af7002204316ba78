//! One layer of a Q-network: a Linear or Conv2d kernel, optionally weight-normalized,
//! followed by the configured normalization and ReLU (hidden layers), or a bare linear
//! head (the output layer).

use candle_core::{Result, Tensor, Var};

use super::init::InitRng;
use super::norm::Norm;
use super::normalization::GraphLayer;
use super::params::StoreVersion;
use super::parts::{AfterStep, Kernel};
use super::weight::{Weight, WeightParam};
use super::{nap, wn_projected};
use super::{
    svb, BatchNorm, LinearMap, MeanOnlyBn, NormConfig, ParamStore, Pass, Role, WeightNorm,
};

pub struct Layer {
    name: String,
    pub(crate) kernel: LinearMap,
    /// The weight side: `w` or weight norm's `v` and gains, its rule after each
    /// optimizer step, NaP's initial norm.
    pub(crate) weight: Weight,
    pub(crate) bias: Option<Var>,
    pub(crate) norm: Norm,
    pub(crate) relu: bool,
    version: StoreVersion,
}

/// Scalars describing a layer's state, for logging.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerStats {
    pub layer: String,
    pub values: Vec<(&'static str, f64)>,
}

fn stats_of(v: &[f32]) -> (f64, f64, f64) {
    let n = v.len().max(1) as f64;
    let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
    let min = v.iter().fold(f64::INFINITY, |m, &x| m.min(f64::from(x)));
    let max = v
        .iter()
        .fold(f64::NEG_INFINITY, |m, &x| m.max(f64::from(x)));
    (mean, min, max)
}

impl Layer {
    /// A hidden layer normalized as `config` says. `out_shape` is one sample's output
    /// shape (for layer norm's per-feature affine).
    pub fn hidden(
        store: &mut ParamStore,
        name: &str,
        kernel: LinearMap,
        out_shape: &[usize],
        config: &NormConfig,
        rng: &mut InitRng,
    ) -> Result<Self> {
        let method = config.method();
        let units = kernel.units();
        let weight = match method.kernel {
            Kernel::Normed => Self::normed_weight(store, name, kernel, config, rng)?,
            Kernel::Orthogonal => {
                let w = rng.orthogonal(kernel.weight_shape(), &store.device().clone())?;
                WeightParam::Plain(store.add(&format!("{name}.weight"), w, Role::Weight)?)
            }
            Kernel::Plain => Self::plain_weight(store, name, kernel, rng)?,
        };
        let norm = (method.single)(store, name, out_shape, config)?;
        // Weight norm's data-dependent init sets the bias; SVB starts it at 0.
        let bias = match &weight {
            _ if !method.keeps_bias => None,
            WeightParam::Normed(_) if config.data_dependent_init => {
                Some(store.zeros(&format!("{name}.bias"), units, Role::Weight)?)
            }
            _ if method.kernel == Kernel::Orthogonal => {
                Some(store.zeros(&format!("{name}.bias"), units, Role::Weight)?)
            }
            _ => Some(Self::plain_bias(store, name, kernel, rng)?),
        };
        let mut weight = Weight::new(weight, method.after_step, 0);
        if method.after_step == AfterStep::InitialNorm {
            let w = weight.var().as_tensor();
            let rho = nap::initial_norm(w)?;
            weight.rho = Some(store.add(&format!("{name}.rho"), rho, Role::Buffer)?);
        }
        let layer = Self {
            name: name.to_string(),
            kernel,
            weight,
            bias,
            norm,
            relu: true,
            version: store.version_handle(),
        };
        layer.project_at_init()
    }

    /// Projected methods start on their sphere (SimbaV2 normalizes its network after
    /// init): unit rows here; NaP's `rho` is the initial norm already.
    fn project_at_init(self) -> Result<Self> {
        if self.weight.after == AfterStep::UnitRows {
            wn_projected::project(self.weight.var(), 0)?;
            self.version.bump();
        }
        Ok(self)
    }

    /// The output layer: plain, or weight-normalized when the weights are weight norm's
    /// and `wn_output_layer` is on (projected too with `projected`), or, with `unit_rows`
    /// weights, the head `sphere_head` names. No activation.
    pub fn output(
        store: &mut ParamStore,
        name: &str,
        kernel: LinearMap,
        config: &NormConfig,
        rng: &mut InitRng,
    ) -> Result<Self> {
        if config.head_rows().is_some() {
            let norm = config
                .head(store, name, kernel.units())?
                .unwrap_or(Norm::None);
            return Self::method_head(store, name, kernel, norm, rng);
        }
        let normed = config.weight.is_weight_norm() && config.wn_output_layer;
        let weight = if normed {
            Self::normed_weight(store, name, kernel, config, rng)?
        } else {
            Self::plain_weight(store, name, kernel, rng)?
        };
        let bias = if normed && config.data_dependent_init {
            store.zeros(&format!("{name}.bias"), kernel.units(), Role::Weight)?
        } else {
            Self::plain_bias(store, name, kernel, rng)?
        };
        let projected = normed && config.weight.after_step() == AfterStep::UnitRows;
        let after = match projected {
            true => AfterStep::UnitRows,
            false => AfterStep::Nothing,
        };
        let layer = Self {
            name: name.to_string(),
            kernel,
            weight: Weight::new(weight, after, 0),
            bias: Some(bias),
            norm: Norm::None,
            relu: false,
            version: store.version_handle(),
        };
        layer.project_at_init()
    }

    /// A head of unit rows: orthogonal, its form `norm` (a scaler, or none), a zero bias.
    fn method_head(
        store: &mut ParamStore,
        name: &str,
        kernel: LinearMap,
        norm: Norm,
        rng: &mut InitRng,
    ) -> Result<Self> {
        let w = rng.orthogonal(kernel.weight_shape(), &store.device().clone())?;
        let weight = WeightParam::Plain(store.add(&format!("{name}.weight"), w, Role::Weight)?);
        let bias = store.zeros(&format!("{name}.bias"), kernel.units(), Role::Weight)?;
        let layer = Self {
            name: name.to_string(),
            kernel,
            weight: Weight::new(weight, AfterStep::UnitRows, 0),
            bias: Some(bias),
            norm,
            relu: false,
            version: store.version_handle(),
        };
        layer.project_at_init()
    }

    fn plain_weight(
        store: &mut ParamStore,
        name: &str,
        kernel: LinearMap,
        rng: &mut InitRng,
    ) -> Result<WeightParam> {
        let w = Self::uniform(
            store,
            &format!("{name}.weight"),
            kernel.weight_shape(),
            kernel,
            rng,
        )?;
        Ok(WeightParam::Plain(w))
    }

    fn plain_bias(
        store: &mut ParamStore,
        name: &str,
        kernel: LinearMap,
        rng: &mut InitRng,
    ) -> Result<Var> {
        Self::uniform(
            store,
            &format!("{name}.bias"),
            vec![kernel.units()],
            kernel,
            rng,
        )
    }

    /// A variable of `shape`, uniform in `±1/sqrt(fan_in)` (PyTorch's default init of
    /// a layer's weight and bias).
    fn uniform(
        store: &mut ParamStore,
        name: &str,
        shape: impl Into<candle_core::Shape>,
        kernel: LinearMap,
        rng: &mut InitRng,
    ) -> Result<Var> {
        let bound = 1.0 / (kernel.fan_in() as f64).sqrt();
        let values = rng.uniform(shape, bound, &store.device().clone())?;
        store.add(name, values, Role::Weight)
    }

    fn normed_weight(
        store: &mut ParamStore,
        name: &str,
        kernel: LinearMap,
        config: &NormConfig,
        rng: &mut InitRng,
    ) -> Result<WeightParam> {
        let dev = store.device().clone();
        let wn = if config.data_dependent_init {
            let v = rng.normal(kernel.weight_shape(), 0.05, &dev)?;
            let g = Tensor::ones(kernel.units(), candle_core::DType::F32, &dev)?;
            WeightNorm::from_values(store, name, kernel, v, g)?
        } else {
            let bound = 1.0 / (kernel.fan_in() as f64).sqrt();
            let v = rng.uniform(kernel.weight_shape(), bound, &dev)?;
            WeightNorm::norm_preserving(store, name, kernel, v)?
        };
        Ok(WeightParam::Normed(wn))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn kernel(&self) -> LinearMap {
        self.kernel
    }

    pub fn weight_norm(&self) -> Option<&WeightNorm> {
        self.weight.weight_norm()
    }

    pub fn batch_norm(&self) -> Option<&BatchNorm> {
        match &self.norm {
            Norm::Batch(bn) => Some(bn),
            _ => None,
        }
    }

    pub fn mean_only_bn(&self) -> Option<&MeanOnlyBn> {
        match &self.norm {
            Norm::MeanOnly(bn) => Some(bn),
            _ => None,
        }
    }

    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref().map(|b| b.as_tensor())
    }

    /// The effective weight `w`: differentiable, or weight norm's cached `w`.
    pub fn weight(&self, differentiable: bool) -> Result<Tensor> {
        match &self.weight.param {
            WeightParam::Plain(w) => Ok(w.as_tensor().clone()),
            WeightParam::Normed(wn) if differentiable => wn.weight(),
            WeightParam::Normed(wn) => wn.cached_weight(),
        }
    }

    /// The layer as its normalization sees it on the graph.
    fn graph_layer(&self, relu: bool, pass: Pass) -> GraphLayer<'_> {
        GraphLayer {
            bias: self.bias.as_ref().map(Var::as_tensor),
            relu,
            stats: pass.stats,
        }
    }

    /// The kernel applied with the layer's (possibly normalized) weight: differentiable
    /// with respect to weight norm's `v` and `g`, or with the cached `w`.
    fn kernel_output(&self, x: &Tensor, differentiable: bool) -> Result<Tensor> {
        match &self.weight.param {
            WeightParam::Normed(wn) if differentiable => wn.apply(x),
            _ => self.kernel.apply(x, &self.weight(differentiable)?),
        }
    }

    /// The pre-activation: kernel, normalization, bias (no ReLU).
    #[cfg(any(test, feature = "test-support"))]
    pub fn pre_activation(&self, x: &Tensor, pass: Pass) -> Result<Tensor> {
        let t = self.kernel_output(x, pass.differentiable)?;
        self.norm
            .method()
            .graph_forward(&t, &self.graph_layer(false, pass))
    }

    /// The layer's output through candle's graph.
    pub fn forward(&self, x: &Tensor, pass: Pass) -> Result<Tensor> {
        let t = self.kernel_output(x, pass.differentiable)?;
        self.norm
            .method()
            .graph_forward(&t, &self.graph_layer(self.relu, pass))
    }

    /// Weight norm's data-dependent init on batch `x`: per unit, with
    /// `t = (v/||v||) . x`, sets `g = 1/(std(t)+eps)` and `b = -mean(t)/(std(t)+eps)`
    /// (with mean-only BN the batch mean is subtracted anyway: `b = 0` and the running
    /// mean starts at this batch's mean). Returns this layer's output on `x`, the next
    /// layer's input. Layers without weight norm just pass `x` on.
    pub fn data_dependent_init(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(wn) = self.weight_norm() {
            let t = self.kernel.apply(x, &wn.direction()?.detach())?;
            let bias = self.norm.method().initial_bias(&wn.initialize(&t)?)?;
            if let Some(b) = &self.bias {
                self.version.set(b, &bias.flatten_all()?)?;
            }
        }
        self.forward(x, Pass::EVAL)
    }

    /// The weight rule's step after optimizer step `updates` (counting from 1) on this
    /// layer, when due (`after_step.rs`, which a population's layer runs too): SVB's
    /// projection (and a bounded batch norm's bound of its gains) every `svb_interval`
    /// steps; unit rows or NaP's initial norms every step. Whether it ran.
    pub fn after_step(&self, updates: u64, config: &NormConfig) -> Result<bool> {
        let ran = self
            .weight
            .after_step(updates, config, self.norm.method())?;
        if ran {
            self.version.bump();
        }
        Ok(ran)
    }

    /// Weight norms, gains, singular-value extremes and BN statistics.
    pub fn stats(&self, singular_values: bool) -> Result<LayerStats> {
        let mut values = vec![];
        let w = self.weight(false)?;
        let units = self.kernel.units();
        let norms: Vec<f32> = w.reshape((units, ()))?.sqr()?.sum(1)?.sqrt()?.to_vec1()?;
        let (mean, min, max) = stats_of(&norms);
        values.extend([
            ("weight_norm_mean", mean),
            ("weight_norm_min", min),
            ("weight_norm_max", max),
        ]);
        if let Some(wn) = self.weight_norm() {
            let (mean, min, max) = stats_of(&wn.g.as_tensor().to_vec1()?);
            values.extend([("g_mean", mean), ("g_min", min), ("g_max", max)]);
        }
        if singular_values {
            let s = svb::singular_values(&w)?;
            values.push(("sv_max", s.first().copied().unwrap_or(0.0)));
            values.push(("sv_min", s.last().copied().unwrap_or(0.0)));
        }
        self.norm.method().log_stats(&mut values)?;
        Ok(LayerStats {
            layer: self.name.clone(),
            values,
        })
    }
}
