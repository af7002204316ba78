//! Populations (issue 20, first part): P agents trained as one program whose every
//! tensor carries a leading population axis, so that the number of operations per
//! step does not grow with P (on a GPU, a fixed number of kernel launches for a whole
//! study). So far: MLP Q-networks without normalization, with weight norm (and its
//! data-dependent init on each agent's first batch), layer norm or batch norm
//! (statistics per agent), stacked from single networks, and their DQN update with
//! Adam and hard target syncs, equal to each agent trained alone
//! (`agents/tests/population.rs`), measured by `normrl bench population`. Not yet: the
//! other normalizations, CNNs, the trainer's `run.population`, acting, checkpoints,
//! device replay.

mod conv;
mod dqn;
mod net;

pub use dqn::PopulationDqn;
pub use net::PopulationNet;
