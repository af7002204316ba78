//! Compiles the population's CUDA kernels (`src/kernels/cuda`): for the host, under an
//! emulation of CUDA's built-ins, so that the tests check each kernel against the CPU
//! op on any machine with a C++20 compiler; and with the `cuda` feature also by nvcc
//! to PTX, which the GPU path loads.

use std::path::PathBuf;

const KERNELS: &str = "src/kernels/cuda";

fn main() {
    println!("cargo::rerun-if-changed={KERNELS}");
    println!("cargo::rustc-check-cfg=cfg(normrl_emulation)");
    let sources: Vec<PathBuf> = std::fs::read_dir(KERNELS)
        .expect("the kernels' folder")
        .map(|e| e.expect("a kernel file").path())
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();
    host_emulation(&sources);
    #[cfg(feature = "cuda")]
    ptx();
}

/// The kernels as host C++ (`-x c++`), with the emulation's built-ins; on success the
/// crate is built with `cfg(normrl_emulation)`, which the kernels' tests need. Where
/// the host has no C++20 compiler of the GCC or Clang kind (MSVC, none), the build
/// goes on without them and says so; where it has one, a kernel that does not compile
/// fails the build.
fn host_emulation(sources: &[PathBuf]) {
    let build = || {
        let mut b = cc::Build::new();
        b.cpp(true)
            .std("c++20")
            .define("NORMRL_HOST_EMULATION", None)
            // No fused multiply-adds: the kernels round as the Rust ops do.
            .flag("-ffp-contract=off")
            .flag("-x")
            .flag("c++")
            .include(KERNELS)
            .warnings(true)
            .cargo_warnings(false);
        b
    };
    // The probe: the emulation's own file alone, which any such compiler takes.
    let probe = build()
        .file(format!("{KERNELS}/emulate.cpp"))
        .try_compile("normrl_emulation_probe");
    if let Err(e) = probe {
        println!(
            "cargo::warning=no C++20 compiler for the CUDA kernels' host emulation ({e}); their tests are left out"
        );
        return;
    }
    build()
        .cargo_warnings(true)
        .files(sources)
        .file(format!("{KERNELS}/emulate.cpp"))
        .compile("normrl_cuda_emulation");
    println!("cargo::rustc-cfg=normrl_emulation");
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
