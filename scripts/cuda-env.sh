# Sourced by scripts/cuda-build.sh and scripts/cuda-check.sh: the CUDA 13.0 toolkit from
# PyPI's wheels (nvcc, headers, runtime, cuBLAS, cuRAND, NVRTC; only the 13.x wheels ship
# nvcc) and a stub libcuda.so for the link, both kept in a cache outside the checkout
# (NORMRL_CUDA_CACHE, default ~/.cache/normrl) so that a machine downloads the 1.2 GB of
# wheels once, whichever clone builds. Sets CUDA, LINK, PATH, LIBRARY_PATH, RUSTFLAGS and
# the CUDA_* variables candle's and our build scripts read.
# shellcheck shell=bash

NORMRL_CUDA_CACHE=${NORMRL_CUDA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/normrl}
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
PYTHON=${PYTHON:-python3}
VENV=$NORMRL_CUDA_CACHE/cuda-venv

if ! command -v "$PYTHON" >/dev/null; then
    echo "cuda: needs python3 (for the CUDA toolkit wheels from PyPI)" >&2
    exit 2
fi
mkdir -p "$NORMRL_CUDA_CACHE"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
if ! ls "$VENV"/lib/python3*/site-packages/nvidia/cu13/bin/nvcc >/dev/null 2>&1; then
    echo "cuda: installing the CUDA 13.0 toolkit wheels into $VENV (about 1.2 GB, once)"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check \
        "cuda-toolkit[nvcc,cudart,cublas,curand,nvrtc,crt,nvvm,cccl]==13.0.*"
fi
CUDA=$(echo "$VENV"/lib/python3*/site-packages/nvidia/cu13)
export CUDA_ROOT=$CUDA CUDA_PATH=$CUDA CUDA_TOOLKIT_ROOT_DIR=$CUDA
export PATH=$CUDA/bin:$PATH

# Link-time libraries: the wheels ship only versioned names, and libcuda belongs to the
# driver, so the link uses a stub with the driver API's symbols left undefined.
LINK=$NORMRL_CUDA_CACHE/cuda-link
mkdir -p "$LINK"
for lib in cudart cublas cublasLt curand nvrtc; do
    real=$(ls "$CUDA"/lib/lib$lib.so.* 2>/dev/null | grep -v builtins | head -n1 || true)
    [ -n "$real" ] && ln -sf "$real" "$LINK/lib$lib.so"
done
if [ ! -f "$LINK/libcuda.so" ]; then
    # Every driver API function cuda.h declares, under its plain and its versioned
    # (_v2, ...) names, returning CUDA_ERROR_NO_DEVICE (100): enough for the linker to
    # record the dependency on libcuda.so.1 (the driver's, bound at run time), and on
    # a machine without a driver, with the link folder on LD_LIBRARY_PATH, the binary
    # starts and reports that there is no device.
    {
        grep -ohE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\(' "$CUDA"/include/cuda.h
        cc -E -I"$CUDA/include" "$CUDA/include/cuda.h" | grep -oE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\('
    } | tr -d '( \t' | sort -u | sed 's/.*/int &(void) { return 100; }/' > "$LINK/stub.c"
    cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$LINK/libcuda.so.tmp.$$" "$LINK/stub.c"
    mv "$LINK/libcuda.so.tmp.$$" "$LINK/libcuda.so"
    ln -sf libcuda.so "$LINK/libcuda.so.1"
    echo "cuda: stub libcuda.so with $(wc -l < "$LINK/stub.c") driver functions"
fi
export LIBRARY_PATH=$LINK:$CUDA/lib${LIBRARY_PATH:+:$LIBRARY_PATH}
export RUSTFLAGS="${RUSTFLAGS:-} -L native=$LINK -L native=$CUDA/lib"
echo "cuda: nvcc $(nvcc --version | grep -o 'release [0-9.]*'), compute capability $CUDA_COMPUTE_CAP, toolkit in $NORMRL_CUDA_CACHE"
