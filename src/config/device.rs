//! Which device a run asks for (`run.device`), and the device it gets.

use anyhow::{bail, Result};

/// What the user asked for as a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    Auto,
    Cpu,
    Cuda(usize),
}

pub fn parse_device_spec(spec: &str) -> Result<DeviceSpec> {
    match spec {
        "auto" => Ok(DeviceSpec::Auto),
        "cpu" => Ok(DeviceSpec::Cpu),
        "cuda" => Ok(DeviceSpec::Cuda(0)),
        _ => match spec.strip_prefix("cuda:").and_then(|n| n.parse().ok()) {
            Some(n) => Ok(DeviceSpec::Cuda(n)),
            None => bail!("run.device = '{spec}' is invalid: expected auto, cpu, cuda or cuda:N"),
        },
    }
}

/// The device for a spec: `auto` takes the GPU when this build has CUDA and one is
/// present, else the CPU. A GPU is opened once per process and shared: the memory
/// check, a trainer and a population's P members all get the same device (one stream
/// and one cuBLAS handle, not one per member), so their tensors can meet.
pub fn select_device(spec: DeviceSpec) -> Result<candle_core::Device> {
    match spec {
        DeviceSpec::Cpu => Ok(candle_core::Device::Cpu),
        DeviceSpec::Cuda(n) => {
            if !candle_core::utils::cuda_is_available() {
                bail!("run.device asks for cuda:{n}, but this normrl binary was built without CUDA (build with --features cuda, see README)");
            }
            // candle's error carries a backtrace when RUST_BACKTRACE is set: the first
            // line says it all.
            opened_cuda(n).map_err(|e| {
                let cause = e.to_string();
                anyhow::anyhow!(
                    "no usable CUDA device {n}: {}",
                    cause.lines().next().unwrap_or_default()
                )
            })
        }
        DeviceSpec::Auto => {
            if candle_core::utils::cuda_is_available() {
                if let Ok(d) = opened_cuda(0) {
                    return Ok(d);
                }
            }
            Ok(candle_core::Device::Cpu)
        }
    }
}

/// CUDA device `n`, opened on first use and then shared.
fn opened_cuda(n: usize) -> candle_core::Result<candle_core::Device> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static OPENED: OnceLock<Mutex<HashMap<usize, candle_core::Device>>> = OnceLock::new();
    let mut opened = OPENED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(d) = opened.get(&n) {
        return Ok(d.clone());
    }
    let d = candle_core::Device::new_cuda(n)?;
    opened.insert(n, d.clone());
    Ok(d)
}
