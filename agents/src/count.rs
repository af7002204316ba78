//! The two numbers that decide a population's speed on a GPU, counted on any device:
//! the tensor operations of a step (each a kernel launch on a GPU) and its reads from
//! the device to the host (each a wait for the device).
//!
//! Operations are counted as the tensors created: candle numbers every tensor it makes
//! from one process-wide counter, and every kernel writes a new tensor. Views
//! (reshapes, narrows) and uploads are tensors too, so the count bounds the launches
//! from above; the fused CPU optimizer updates in place and creates none, where a
//! GPU's optimizer runs a fixed number of operations per variable, whatever P. The
//! counter is the process's: count where no other thread makes tensors.

use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::{DType, Device, Result, Tensor, WithDType};

static READS: AtomicU64 = AtomicU64::new(0);

/// The tensors this process has created so far (every thread's), not counting the
/// one this call makes to read the counter.
pub fn tensors_created() -> u64 {
    let probe = Tensor::zeros((), DType::U8, &Device::Cpu).expect("a scalar on the CPU");
    // `TensorId` shows its number only through `Debug`: `TensorId(123)`.
    let id = format!("{:?}", probe.id());
    let digits: String = id.chars().filter(char::is_ascii_digit).collect();
    digits.parse::<u64>().expect("a tensor id holds a number") - 1
}

/// The population's reads from the device to the host so far (every one goes through
/// [`read_to_host`]).
pub fn device_reads() -> u64 {
    READS.load(Ordering::Relaxed)
}

/// A vector's values on the host, counted as one read.
pub fn read_to_host<T: WithDType>(t: &Tensor) -> Result<Vec<T>> {
    READS.fetch_add(1, Ordering::Relaxed);
    t.to_vec1()
}

/// A matrix's rows on the host, counted as one read.
pub fn read_rows_to_host<T: WithDType>(t: &Tensor) -> Result<Vec<Vec<T>>> {
    READS.fetch_add(1, Ordering::Relaxed);
    t.to_vec2()
}
