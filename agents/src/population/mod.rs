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
pub use net::PopulationNet;
pub use shards::{cpu_shard_size, ShardedPopulation};
