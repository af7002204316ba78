#!/usr/bin/env bash
# Builds the CUDA binary of normrl (target/cuda/release/normrl, --features cuda) on any
# Linux x86_64 machine, with or without a GPU, from the CUDA toolkit wheels on PyPI.
# Carry the binary to a GPU machine (driver for CUDA 13.0 or newer) and run it there.
#
#   scripts/cuda-build.sh                 # compute capability 90 (H100/H200)
#   CUDA_COMPUTE_CAP=80 scripts/cuda-build.sh   # A100
#
# What it does: a Python venv under target/cuda-venv with the CUDA 13.0 toolkit
# wheels (nvcc, headers, runtime, cuBLAS, cuRAND, NVRTC; only the 13.x wheels ship
# nvcc), a stub libcuda.so for the link (the real one comes with the GPU driver at run
# time), then `cargo build --release --features cuda`.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=$ROOT/target/cuda-venv
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
PYTHON=${PYTHON:-python3}

if ! command -v "$PYTHON" >/dev/null; then
    echo "cuda-build: needs python3 (for the CUDA toolkit wheels from PyPI)" >&2
    exit 2
fi
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
if [ ! -x "$VENV/lib/python3"*/site-packages/nvidia/cu13/bin/nvcc ]; then
    echo "cuda-build: installing the CUDA 13.0 toolkit wheels into $VENV (about 1.2 GB)"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check \
        "cuda-toolkit[nvcc,cudart,cublas,curand,nvrtc,crt,nvvm,cccl]==13.0.*"
fi
CUDA=$(echo "$VENV"/lib/python3*/site-packages/nvidia/cu13)
export CUDA_ROOT=$CUDA CUDA_PATH=$CUDA CUDA_TOOLKIT_ROOT_DIR=$CUDA
export PATH=$CUDA/bin:$PATH

# Link-time libraries: the wheels ship only versioned names, and libcuda belongs to the
# driver, so the link uses a stub with the driver API's symbols left undefined.
LINK=$ROOT/target/cuda-link
mkdir -p "$LINK"
for lib in cudart cublas cublasLt curand nvrtc; do
    real=$(ls "$CUDA"/lib/lib$lib.so.* 2>/dev/null | grep -v builtins | head -n1 || true)
    [ -n "$real" ] && ln -sf "$real" "$LINK/lib$lib.so"
done
if [ ! -f "$LINK/libcuda.so" ]; then
    # Every driver API function cuda.h declares, under its plain and its versioned
    # (_v2, ...) names, returning CUDA_ERROR_NO_DEVICE (100): enough for the linker to
    # record the dependency on libcuda.so.1 (the driver's, bound at run time), and on
    # a machine without a driver, with target/cuda-link on LD_LIBRARY_PATH, the binary
    # starts and reports that there is no device.
    {
        grep -ohE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\(' "$CUDA"/include/cuda.h
        cc -E -I"$CUDA/include" "$CUDA/include/cuda.h" | grep -oE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\('
    } | tr -d '( \t' | sort -u | sed 's/.*/int &(void) { return 100; }/' > "$LINK/stub.c"
    cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$LINK/libcuda.so" "$LINK/stub.c"
    ln -sf libcuda.so "$LINK/libcuda.so.1"
    echo "cuda-build: stub libcuda.so with $(wc -l < "$LINK/stub.c") driver functions"
fi
export LIBRARY_PATH=$LINK:$CUDA/lib${LIBRARY_PATH:+:$LIBRARY_PATH}
export RUSTFLAGS="${RUSTFLAGS:-} -L native=$LINK -L native=$CUDA/lib"

echo "cuda-build: nvcc $(nvcc --version | grep -o 'release [0-9.]*'), compute capability $CUDA_COMPUTE_CAP"
# A target directory of its own: the CPU build's artifacts stay valid.
export CARGO_TARGET_DIR=$ROOT/target/cuda
start=$(date +%s)
cargo build --release --features cuda --bins "$@"
echo "cuda-build: built target/cuda/release/normrl with CUDA in $(( $(date +%s) - start )) s"
echo "cuda-build: at run time the binary needs the driver's libcuda.so.1 and, on the"
echo "  library path, cuBLAS/cuRAND/NVRTC/cudart 13 (e.g. LD_LIBRARY_PATH=$CUDA/lib)."
echo "  Without a GPU: LD_LIBRARY_PATH=$LINK:$CUDA/lib target/cuda/release/normrl ..."
echo "  (the stub driver answers 'no device'; never put $LINK on a GPU machine's path)."
