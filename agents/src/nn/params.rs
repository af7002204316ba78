//! A named store of a network's variables, with the groups the optimizer and the
//! checkpoints need.
//!
//! ```
//! use candle_core::{DType, Device};
//! use normrl_agents::nn::{Role, ParamStore};
//!
//! let mut store = ParamStore::new(Device::Cpu);
//! let w = store.zeros("fc0.weight", (2, 3), Role::Weight).unwrap();
//! assert_eq!(store.trainable().count(), 1);
//! assert_eq!(w.dims(), &[2, 3]);
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use candle_core::{DType, Device, Result, Shape, Tensor, Var};

/// What a variable is, which decides how it is trained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Weights, biases, BN/LN affine parameters: the base learning rate.
    Weight,
    /// Weight-norm gains `g`: the base learning rate times `g_lr_scale`.
    Gain,
    /// Running statistics: saved and synced, never given gradients.
    Buffer,
}

#[derive(Debug, Clone)]
pub struct Param {
    pub name: String,
    pub var: Var,
    pub role: Role,
}

/// A layer's link to its store's version. Every change a layer makes to a variable
/// outside an optimizer step goes through [`StoreVersion::set`] (or, for changes in
/// place, is followed by [`StoreVersion::bump`]), so that caches keyed by the version
/// (weight norm's `w` and norms, batch norm's evaluation statistics) never go stale.
#[derive(Debug, Clone)]
pub(crate) struct StoreVersion(Arc<AtomicU64>);

impl StoreVersion {
    /// A version of no store: a population's normalization keeps its variables outside
    /// one (its network marks its own changes), and bumps this one to no effect.
    pub(crate) fn detached() -> Self {
        Self(Arc::default())
    }

    #[inline]
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    #[inline]
    pub(crate) fn bump(&self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }

    /// `var = value`, then a new version.
    pub(crate) fn set(&self, var: &Var, value: &Tensor) -> Result<()> {
        var.set(value)?;
        self.bump();
        Ok(())
    }
}

/// Every variable of one network, in creation order.
#[derive(Debug, Clone)]
pub struct ParamStore {
    params: Vec<Param>,
    device: Device,
    /// Bumped by every change of the trainable values (optimizer steps, loads,
    /// projections) so that layers can cache derived weights.
    version: Arc<AtomicU64>,
}

impl ParamStore {
    pub fn new(device: Device) -> Self {
        Self {
            params: vec![],
            device,
            version: Arc::new(AtomicU64::new(0)),
        }
    }

    /// An empty store whose version is `version` (a population's, so that its
    /// optimizer's steps move the network's version).
    pub(crate) fn sharing_version(device: Device, version: Arc<AtomicU64>) -> Self {
        Self {
            params: vec![],
            device,
            version,
        }
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Registers `value` as a new variable.
    pub fn add(&mut self, name: &str, value: Tensor, role: Role) -> Result<Var> {
        let value = value.to_device(&self.device)?.to_dtype(DType::F32)?;
        let var = Var::from_tensor(&value)?;
        self.params.push(Param {
            name: name.to_string(),
            var: var.clone(),
            role,
        });
        Ok(var)
    }

    /// Registers an existing variable (a population's, so that the fused optimizer can
    /// train it).
    pub(crate) fn insert(&mut self, name: &str, var: Var, role: Role) {
        self.params.push(Param {
            name: name.to_string(),
            var,
            role,
        });
    }

    pub fn zeros<S: Into<Shape>>(&mut self, name: &str, shape: S, role: Role) -> Result<Var> {
        let t = Tensor::zeros(shape, DType::F32, &self.device)?;
        self.add(name, t, role)
    }

    pub fn ones<S: Into<Shape>>(&mut self, name: &str, shape: S, role: Role) -> Result<Var> {
        let t = Tensor::ones(shape, DType::F32, &self.device)?;
        self.add(name, t, role)
    }

    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// The variables that receive gradients.
    pub fn trainable(&self) -> impl Iterator<Item = &Param> {
        self.params.iter().filter(|p| p.role != Role::Buffer)
    }

    pub fn get(&self, name: &str) -> Option<&Param> {
        self.params.iter().find(|p| p.name == name)
    }

    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// The handle through which a layer changes its variables (and so moves the
    /// version) and reads the version that keys its caches.
    pub(crate) fn version_handle(&self) -> StoreVersion {
        StoreVersion(self.version.clone())
    }

    /// Marks every derived cache stale. Call after changing variables in place.
    pub fn bump_version(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    /// Copies every variable (buffers included) from a store of the same network.
    pub fn copy_from(&self, other: &ParamStore) -> Result<()> {
        self.check_same_layout(other)?;
        for (dst, src) in self.params.iter().zip(&other.params) {
            dst.var.set(&src.var.as_tensor().to_device(&self.device)?)?;
        }
        self.bump_version();
        Ok(())
    }

    /// Polyak averaging: `self = (1 - tau) * self + tau * other`, for trainable
    /// variables; buffers are copied.
    pub fn soft_update_from(&self, other: &ParamStore, tau: f64) -> Result<()> {
        self.check_same_layout(other)?;
        for (dst, src) in self.params.iter().zip(&other.params) {
            let new = match dst.role {
                Role::Buffer => src.var.as_tensor().clone(),
                _ => ((dst.var.as_tensor() * (1.0 - tau))? + (src.var.as_tensor() * tau)?)?,
            };
            dst.var.set(&new)?;
        }
        self.bump_version();
        Ok(())
    }

    fn check_same_layout(&self, other: &ParamStore) -> Result<()> {
        let same = self.params.len() == other.params.len()
            && self
                .params
                .iter()
                .zip(&other.params)
                .all(|(a, b)| a.name == b.name && a.var.dims() == b.var.dims());
        if same {
            Ok(())
        } else {
            candle_core::bail!("the two networks have different variables")
        }
    }

    /// A copy of every variable by name, for checkpoints (later updates, which happen
    /// in place, do not show in it).
    pub fn to_map(&self) -> Result<HashMap<String, Tensor>> {
        self.params
            .iter()
            .map(|p| Ok((p.name.clone(), p.var.as_tensor().copy()?)))
            .collect()
    }

    /// Loads every variable from `map`; a missing name or a shape mismatch is an error.
    pub fn load_map(&self, map: &HashMap<String, Tensor>) -> Result<()> {
        for p in &self.params {
            let t = map
                .get(&p.name)
                .ok_or_else(|| candle_core::Error::Msg(format!("checkpoint lacks '{}'", p.name)))?;
            if t.dims() != p.var.dims() {
                candle_core::bail!(
                    "checkpoint '{}' has shape {:?}, the network expects {:?}",
                    p.name,
                    t.dims(),
                    p.var.dims()
                );
            }
            p.var
                .set(&t.to_device(&self.device)?.to_dtype(DType::F32)?)?;
        }
        self.bump_version();
        Ok(())
    }
}
