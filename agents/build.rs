//! Compiles the population's CUDA kernels (`src/kernels/cuda`): always for the host,
//! under an emulation of CUDA's built-ins, so that the tests check each kernel against
//! the CPU op on any machine; and with the `cuda` feature also by nvcc to PTX, which the
//! GPU path loads.

use std::path::PathBuf;

const KERNELS: &str = "src/kernels/cuda";

fn main() {
    println!("cargo::rerun-if-changed={KERNELS}");
    let sources: Vec<PathBuf> = std::fs::read_dir(KERNELS)
        .expect("the kernels' folder")
        .map(|e| e.expect("a kernel file").path())
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();
    host_emulation(&sources);
    #[cfg(feature = "cuda")]
    ptx();
}

/// The kernels as host C++ (`-x c++`), with the emulation's built-ins.
fn host_emulation(sources: &[PathBuf]) {
    cc::Build::new()
        .cpp(true)
        .std("c++20")
        .define("NORMRL_HOST_EMULATION", None)
        // No fused multiply-adds: the kernels round as the Rust ops do.
        .flag("-ffp-contract=off")
        .flag("-x")
        .flag("c++")
        .files(sources)
        .file(format!("{KERNELS}/emulate.cpp"))
        .include(KERNELS)
        .warnings(true)
        .compile("normrl_cuda_emulation");
}

/// The kernels as PTX for the GPU, one module per file (`$OUT_DIR/ptx.rs`).
#[cfg(feature = "cuda")]
fn ptx() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    cudaforge::KernelBuilder::new()
        .source_dir(KERNELS)
        .arg("-std=c++17")
        .arg("-O3")
        // Products and sums round as the CPU ops' do (see common.cuh).
        .arg("-fmad=false")
        .build_ptx()
        .expect("nvcc: the population kernels")
        .write(out.join("ptx.rs"))
        .expect("ptx.rs");
}
