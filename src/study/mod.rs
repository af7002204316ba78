//! Many runs: a comparison's grid (`compare.rs`), its fixed plan, a Slurm job array,
//! and the status of a study's runs.

pub mod compare;
pub mod estimate;
pub mod execute;
mod extends;
pub mod finished;
pub mod plan;
pub mod rates;
pub mod slurm;
pub mod status;
