//! Populations (issue 20, first part): P agents trained as one program whose every
//! tensor carries a leading population axis, so that the number of operations per
//! step does not grow with P (on a GPU, a fixed number of kernel launches for a whole
//! study). So far: MLPs and MinAtar's CNN with no normalization, weight norm (and its
//! data-dependent init on each agent's first batch), weight norm with mean-only batch
//! norm or batch norm (statistics per agent), and MLPs with layer norm, group norm or
//! RMSNorm, stacked from single networks; their DQN update (Adam, hard target syncs),
//! acting (one forward and one read of the P actions) and saved state, each agent
//! exactly as alone (`agents/tests/population.rs`); measured by `normrl bench
//! population`. Not yet: batch renormalization and SVB/BBN's projections, per-sample
//! norms on CNNs, the trainer's `run.population` and comparisons' grouping, device
//! replay.

mod conv;
pub mod count;
mod dqn;
mod net;

pub use dqn::{PopulationDqn, PopulationInfo};
pub use net::PopulationNet;
