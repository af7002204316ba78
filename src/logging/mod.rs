//! What a run writes for people: TensorBoard events, HParams sessions, the progress
//! bar, videos of episodes.

pub(crate) mod font;
pub mod hparams;
pub(crate) mod progress;
pub mod tensorboard;
pub mod video;
