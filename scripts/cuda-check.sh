#!/usr/bin/env bash
# The CUDA code's proof without a GPU, run by .ci/run after the tests:
#   1. the CUDA kernels, compiled for the host under an emulation of CUDA's built-ins
#      (agents/build.rs), against the CPU ops: the test command runs them where the
#      machine has a C++20 compiler and leaves them out, with a build warning, where
#      it has none; here a machine without one fails instead of passing unseen;
#   2. every line behind the `cuda` feature, tests included, compiled with clippy's
#      warnings as errors. The test command builds without the feature, so without
#      this a refactor that renames what only the CUDA path uses breaks the GPU build
#      unseen (it did once: issue 53).
# The second step's target directory lives in the same cache as the toolkit
# (~/.cache/normrl, see scripts/cuda-env.sh): candle's own CUDA kernels are compiled by
# nvcc in candle-kernels' build script (most of the 10-15 minutes of a first check on
# 2 cores), and a machine compiles them once; later checks take under a minute.
set -euo pipefail

cd "$(dirname "$0")/.."
start=$(date +%s)

# In the test command's own target directory, before the CUDA environment changes
# RUSTFLAGS (which would rebuild everything there).
emulated=$(cargo test -p normrl-agents --lib kernels::cuda::tests 2>&1) || {
    echo "$emulated" >&2
    exit 1
}
passed=$(echo "$emulated" | grep -oE 'test result: ok\. [0-9]+ passed' | grep -oE '[0-9]+ passed' | head -n1)
if [ -z "$passed" ] || [ "${passed%% *}" -eq 0 ]; then
    echo "$emulated" >&2
    echo "cuda-check: the emulated CUDA kernel tests did not run (no C++20 compiler for agents/build.rs?)" >&2
    exit 1
fi
echo "cuda-check: emulated CUDA kernels against the CPU ops: $passed"

# shellcheck source=scripts/cuda-env.sh
source scripts/cuda-env.sh
export CARGO_TARGET_DIR=$NORMRL_CUDA_CACHE/cuda-check-target
cargo clippy --workspace --all-targets --features cuda -- -D warnings
echo "cuda-check: the cuda feature compiles clean (clippy -D warnings, all targets); $(( $(date +%s) - start )) s in all"
