#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU (about 12 minutes on one H100/H200):
#   1. every normalization method on CUDA against the CPU: Q-values and the gradient
#      of every variable (MLP, MinAtar CNN, Nature CNN), tolerance 1e-3 relative;
#   2. update and acting times per method, MLP and MinAtar CNN at batch 32 and 256,
#      CPU (one thread) and GPU;
#   3. end-to-end training steps/s on CartPole and MinAtar Breakout, CPU and GPU;
#   4. four MinAtar Breakout runs side by side on the one GPU (`compare --jobs 4`);
#   5. populations: P agents' updates as one network against P separate agents, and
#      the update's graph size, tensors and reads per step, P = 1, 16, 64, 256
#      (`bench population`); then P agents trained end to end as one population
#      against P single runs, aggregate agent-steps/s on CartPole and MinAtar Breakout
#      (`bench population-train`).
#
#   scripts/gpu-check.sh                     # uses target/cuda/release/normrl
#   NORMRL_BIN=/path/to/normrl scripts/gpu-check.sh
#
# Build the binary with scripts/cuda-build.sh (on any machine). At run time it needs
# the driver's libcuda.so.1 and the CUDA 13 cuBLAS/cuRAND/NVRTC libraries on the
# library path (LD_LIBRARY_PATH), e.g. from the same PyPI wheels the build used.
set -uo pipefail

cd "$(dirname "$0")/.."
BIN=${NORMRL_BIN:-target/cuda/release/normrl}
if [ ! -x "$BIN" ]; then
    echo "gpu-check: no binary at $BIN: run scripts/cuda-build.sh first, or set NORMRL_BIN" >&2
    exit 2
fi
for dir in target/cuda-venv/lib/python3*/site-packages/nvidia/cu13/lib; do
    [ -d "$dir" ] && export LD_LIBRARY_PATH=$PWD/$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
done
failures=0
step() {
    echo
    echo "== $1"
    shift
    local start=$(date +%s)
    if ! "$@"; then
        echo "gpu-check: FAILED: $*"
        failures=$((failures + 1))
    fi
    echo "   ($(( $(date +%s) - start )) s)"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
    || echo "nvidia-smi not found"
step "parity: CUDA against the CPU" timeout 180 "$BIN" bench parity --device cuda
step "updates and acting, CPU, one thread" timeout 150 "$BIN" bench nn --device cpu --iters 60
step "updates and acting, CUDA" timeout 120 "$BIN" bench nn --device cuda --iters 100
step "end to end, CPU" timeout 90 "$BIN" bench train --device cpu --steps 4000
step "end to end, CUDA" timeout 90 "$BIN" bench train --device cuda --steps 4000
tmp=$(mktemp -d)
cat > "$tmp/side-by-side.toml" <<TOML
name = "gpu-side-by-side"
base = "$PWD/configs/minatar/breakout.toml"
seeds = 4
[set]
"run.total_steps" = 10_000
"replay.learning_starts" = 1_000
"eval.interval" = 0
"checkpoint.interval" = 0
"run.device" = "cuda"
TOML
step "4 runs side by side on one GPU (compare --jobs 4)" \
    timeout 180 "$BIN" compare --config "$tmp/side-by-side.toml" --runs-dir "$tmp/runs" --jobs 4
rm -rf "$tmp"
step "populations, CUDA (P = 1, 16, 64, 256)" \
    timeout 240 "$BIN" bench population --device cuda --iters 40
step "populations trained end to end, CUDA: agent-steps/s (P = 1, 16, 64, 256)" \
    timeout 420 "$BIN" bench population-train --device cuda --steps 300
echo
if [ "$failures" -eq 0 ]; then
    echo "gpu-check: all steps passed"
else
    echo "gpu-check: $failures step(s) failed"
    exit 1
fi
