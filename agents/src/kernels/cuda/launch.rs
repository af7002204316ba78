//! What every kernel launch here shares on a CUDA device: the PTX modules `build.rs`
//! compiled, and the device address of a tensor's values.

use candle_core::cuda_backend::cudarc::driver::DevicePtr;
use candle_core::cuda_backend::{CudaDevice, CudaFunc};
use candle_core::{Result, Storage, Tensor};

mod ptx {
    include!(concat!(env!("OUT_DIR"), "/ptx.rs"));
}

/// Kernel `name` of module `module` (a `.cu` file's stem), loaded once per device.
pub(crate) fn module_function(dev: &CudaDevice, name: &str, module: &str) -> Result<CudaFunc> {
    let source = match module {
        "optimizer" => ptx::OPTIMIZER,
        "td" => ptx::TD,
        other => candle_core::bail!("no CUDA module '{other}'"),
    };
    dev.get_or_load_custom_func(name, &format!("normrl-{module}"), source)
}

/// The device address of contiguous `t`'s first value. The kernels that take an
/// address (in a table) run on candle's one stream, after every write before them.
pub(crate) fn address(t: &Tensor) -> Result<u64> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(s) = &*storage else {
        candle_core::bail!("a CUDA kernel's tensor is on {:?}", t.device().location());
    };
    if !layout.is_contiguous() {
        candle_core::bail!("a CUDA kernel's tensor must be contiguous");
    }
    let slice = s.as_cuda_slice::<f32>()?;
    let stream = s.device().cuda_stream();
    let (ptr, _read) = slice.device_ptr(&stream);
    Ok(ptr + (layout.start_offset() * std::mem::size_of::<f32>()) as u64)
}
