//! Populations (issue 20, first part): P agents trained as one program whose every
//! tensor carries a leading population axis, so that the number of operations per
//! step does not grow with P (on a GPU, a fixed number of kernel launches for a whole
//! study). So far: MLP Q-networks without normalization or with layer norm, stacked
//! from single networks, and their DQN update with Adam and hard target syncs, equal
//! to each agent trained alone (`agents/tests/population.rs`). Not yet: the other
//! normalizations, CNNs, the trainer's `run.population`, checkpoints, the operation
//! counters and `normrl bench population`.

mod dqn;
mod net;

pub use dqn::PopulationDqn;
pub use net::PopulationNet;
