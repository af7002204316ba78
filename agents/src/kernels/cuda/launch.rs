//! What every kernel launch here shares on a CUDA device: the PTX modules `build.rs`
//! compiled, and the device address of a tensor's values.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, DevicePtr};
use candle_core::cuda_backend::{CudaDType, CudaDevice};
use candle_core::{Result, Storage, Tensor};

mod ptx {
    include!(concat!(env!("OUT_DIR"), "/ptx.rs"));
}

/// Every module: a `.cu` file's stem and its PTX.
const MODULES: [(&str, &str); 7] = [
    ("batch_norm", ptx::BATCH_NORM),
    ("bias_relu", ptx::BIAS_RELU),
    ("im2col", ptx::IM2COL),
    ("optimizer", ptx::OPTIMIZER),
    ("row_norm", ptx::ROW_NORM),
    ("td", ptx::TD),
    ("weight_norm", ptx::WEIGHT_NORM),
];

/// Kernel `name` of module `module` (a `.cu` file's stem), loaded once per device.
pub(crate) fn module_function(dev: &CudaDevice, name: &str, module: &str) -> Result<CudaFunction> {
    let Some(&(_, source)) = MODULES.iter().find(|(m, _)| *m == module) else {
        candle_core::bail!("no CUDA module '{module}'");
    };
    let f = dev.get_or_load_custom_func(name, &format!("normrl-{module}"), source)?;
    Ok(f.into_cuda_function())
}

/// The device address of contiguous `t`'s first value (of type `T`). The kernels run
/// on candle's one stream, after every write before them, so an address is all they
/// need.
pub(crate) fn address<T: CudaDType>(t: &Tensor) -> Result<u64> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(s) = &*storage else {
        candle_core::bail!("a CUDA kernel's tensor is on {:?}", t.device().location());
    };
    if !layout.is_contiguous() {
        candle_core::bail!("a CUDA kernel's tensor must be contiguous");
    }
    let slice = s.as_cuda_slice::<T>()?;
    let stream = s.device().cuda_stream();
    let (ptr, _read) = slice.device_ptr(&stream);
    Ok(ptr + (layout.start_offset() * std::mem::size_of::<T>()) as u64)
}
