//! Populations: P agents trained as one program whose every tensor carries a leading
//! population axis, so that the number of operations per step does not grow with P (on
//! a GPU, a fixed number of kernel launches for a whole study; counted in `count`).
//!
//! Every method: MLPs and MinAtar's CNN with no normalization, weight norm (and its
//! data-dependent init on each agent's first batch), weight norm with mean-only batch
//! norm, batch norm, batch renormalization, layer norm, group norm, RMSNorm (statistics
//! per agent, and per sample for the last three), SVB and BBN (their projections per
//! agent on the host, every `svb_interval` updates); Adam or RMSprop; hard, Polyak or no
//! target updates; CrossQ's joint forward. Gamma and the learning rate may differ per
//! agent. Agents stack from single ones where they stand and export back into them (the
//! trainer's checkpoints are single runs'), and each trains exactly as alone
//! (`agents/tests/population.rs`). The members' replay frames can live on the device
//! (`DeviceFrames`: one scatter per step, one gather per batch).
//!
//! # Paths
//!
//! Which code runs a layer is chosen in one place, `PopulationNet::path`:
//!
//! - **CPU ops** (`Path::CpuOps`, on the CPU): each agent's values through its single
//!   network's fused loops (`kernels::per_agent`), one op per layer's step whatever P;
//!   an update's backward by hand (`tape`). A layer whose method has no fused op takes
//!   its tensor form, and its update candle's backward.
//! - **CUDA kernels** (`Path::DeviceKernels`): the same ops' kernels (`kernels/cuda`),
//!   where every layer has them (`PopulationNet::cuda_fusable`: a method's
//!   `Normalization::has_cuda_kernel`, no convolution after the first layer); the
//!   backward by hand; each step captured once as a CUDA graph and replayed.
//! - **Tensor forms** (`Path::TensorForms`): candle's ops on any device and candle's
//!   backward; the fused paths' reference (`use_tensor_forms`, on the CPU too), and what
//!   a device runs where a layer has no kernel, or a forward for candle's graph.
//! - **Host** is a single network's path, not a population's: a CPU MLP's layers on
//!   plain buffers (`QNetwork::runs_on_host`, `nn/host_mlp.rs`).
//!
//! A layer's weight is a single network's weight type with one leading axis
//! (`nn::weight::Weight`); weight norm's share of each path (its fused weight or output
//! scale, cached per version of the variables) is `nn::weight_norm::WeightNorm`'s.
//!
//! On the CPU an update's backward is taken by hand over the fused ops (`tape`), and a
//! population runs in shards of agents that fit a core's cache (`ShardedPopulation`),
//! on the run's threads. On CUDA the update and the acting forward read fixed buffers
//! (`inputs`) and are each captured once as a CUDA graph and replayed (`graph`).

pub(crate) mod conv;
pub use crate::count;
mod dqn;
mod frames;
mod graph;
mod inputs;
mod net;
mod shards;
mod tape;

pub use dqn::{PopulationDqn, PopulationInfo};
pub use frames::DeviceFrames;
pub use net::{Path, PopulationNet};
pub use shards::{cpu_shard_size, ShardedPopulation};
