//! A preallocated ring of observation frames with the transitions between them, and
//! pluggable samplers that make batches i.i.d.-ish (`uniform`) or deliberately
//! correlated (`recent`, `sequential`, `online`).
//!
//! Each slot holds one observation frame; the slot's action, reward and flags describe
//! the step from that frame to the next slot's frame, so next observations are not
//! stored twice. The last frame of an episode (terminated or truncated) holds no
//! transition; the next episode's first frame follows it. Binary observations (MinAtar)
//! are stored bit-packed.
//!
//! ```
//! use normrl_agents::replay::{Batch, ReplayBuffer, Sampler};
//! use rand::SeedableRng;
//!
//! let mut replay = ReplayBuffer::new(100, 2, false);
//! replay.start_episode(&[0.0, 0.0]);
//! replay.push(1, 1.0, false, false, &[1.0, 1.0]);
//! replay.push(0, 2.0, true, false, &[2.0, 2.0]);
//! assert_eq!(replay.transitions(), 2);
//! let mut batch = Batch::new(2, 2);
//! let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(0);
//! replay.sample(Sampler::Sequential, &mut batch, &mut rng).unwrap();
//! assert_eq!(batch.obs, [0.0, 0.0, 1.0, 1.0]);
//! assert_eq!(batch.next_obs, [1.0, 1.0, 2.0, 2.0]);
//! assert_eq!(batch.terminated, [0.0, 1.0]);
//! ```

mod buffer;
mod frames;
mod samplers;

pub use buffer::{ReplayBuffer, ReplayError};
pub use frames::FrameEncoding;
pub use samplers::{Batch, Sampler, INIT_OBSERVATIONS};
