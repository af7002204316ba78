//! What a run writes for people: TensorBoard events, HParams sessions, the progress
//! bar.

pub mod hparams;
pub(crate) mod progress;
pub mod tensorboard;
