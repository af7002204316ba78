#!/usr/bin/env bash
# Builds the CUDA binary of normrl (target/cuda/release/normrl, --features cuda) on any
# Linux x86_64 machine, with or without a GPU, from the CUDA toolkit wheels on PyPI.
# Carry the binary to a GPU machine (driver for CUDA 13.0 or newer) and run it there.
#
#   scripts/cuda-build.sh                 # compute capability 90 (H100/H200)
#   CUDA_COMPUTE_CAP=80 scripts/cuda-build.sh   # A100
#
# What it does: the CUDA 13.0 toolkit wheels and a stub libcuda.so for the link (the
# real one comes with the GPU driver at run time), kept in ~/.cache/normrl (see
# scripts/cuda-env.sh), then `cargo build --release --features cuda`.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=scripts/cuda-env.sh
source scripts/cuda-env.sh

# A target directory of its own: the CPU build's artifacts stay valid.
export CARGO_TARGET_DIR=$ROOT/target/cuda
start=$(date +%s)
cargo build --release --features cuda --bins "$@"
echo "cuda-build: built target/cuda/release/normrl with CUDA in $(( $(date +%s) - start )) s"
echo "cuda-build: at run time the binary needs the driver's libcuda.so.1 and, on the"
echo "  library path, cuBLAS/cuRAND/NVRTC/cudart 13 (e.g. LD_LIBRARY_PATH=$CUDA/lib)."
echo "  Without a GPU: LD_LIBRARY_PATH=$LINK:$CUDA/lib target/cuda/release/normrl ..."
echo "  (the stub driver answers 'no device'; never put $LINK on a GPU machine's path)."
