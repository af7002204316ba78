#!/usr/bin/env bash
# The GPU check, sized for a short lease: at most GPU_CHECK_SECONDS (default 360) on one
# H100/H200, ending with one table:
#   1. parity: every normalization method on CUDA against the CPU (Q-values and every
#      gradient; MLP, MinAtar CNN, Nature CNN), and every method's population of 3
#      over 5 updates (metrics and weights; on the population kernels where the method
#      has them, `bench parity` says which), with the worst relative error;
#   2. memory: the GPU's memory in use (peak, nvidia-smi) over a population of 256
#      trained N and 2N steps (MinAtar Breakout, capacity 100,000 per member): the
#      same peak both times when no step keeps what it made; then the population
#      kernels' gain: one update at P = 256 through them and through the tensor forms;
#   2c. a distributional loss (C51, HL-Gauss) on the device: P = 64, batch norm;
#   3. speed: aggregate agent-steps/s with an update every step through `normrl train`
#      (the line it prints), MinAtar Breakout, P = 1, 16, 64, 256, 1024 at batch 32 and
#      P = 256 at batch 4, for none, weight norm and batch norm, with the step captured
#      as CUDA graphs (the default; the row says whether the capture held or why not),
#      then for none without them (run.cuda_graphs=false), and P = 256 none with TF32
#      products (run.tf32). P = 1 is one agent.
# Each step gets what is left of the deadline at most; a row the deadline cut says so.
#
#   scripts/gpu-check.sh                     # uses target/cuda/release/normrl
#   NORMRL_BIN=/path/to/normrl scripts/gpu-check.sh
#   GPU_CHECK_DEVICE=cpu GPU_CHECK_POPULATIONS="1 4" scripts/gpu-check.sh   # a dry run
#
# Build the binary with scripts/cuda-build.sh (on any machine). At run time it needs
# the driver's libcuda.so.1 and the CUDA 13 cuBLAS/cuRAND/NVRTC libraries on the
# library path (LD_LIBRARY_PATH), e.g. from the same PyPI wheels the build used.
set -uo pipefail

cd "$(dirname "$0")/.."
BIN=${NORMRL_BIN:-target/cuda/release/normrl}
DEVICE=${GPU_CHECK_DEVICE:-cuda}
POPULATIONS=${GPU_CHECK_POPULATIONS:-1 16 64 256 1024}
MEMORY_P=${GPU_CHECK_MEMORY_P:-256}
END=$(( $(date +%s) + ${GPU_CHECK_SECONDS:-360} ))
if [ ! -x "$BIN" ]; then
    echo "gpu-check: no binary at $BIN: run scripts/cuda-build.sh first, or set NORMRL_BIN" >&2
    exit 2
fi
for dir in "${NORMRL_CUDA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/normrl}"/cuda-venv/lib/python3*/site-packages/nvidia/cu13/lib; do
    [ -d "$dir" ] && export LD_LIBRARY_PATH=$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
table=$tmp/table
failures=0

row() { printf '| %-8s | %-34s | %s |\n' "$1" "$2" "$3" | tee -a "$table"; }
# shellcheck source=scripts/deadline.sh
source scripts/deadline.sh
used_mib() {
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -n1
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
    || echo "nvidia-smi not found"

# 1. Parity.
limited 90 "$BIN" bench parity --device "$DEVICE" > "$tmp/parity" 2>&1
code=$?
# Rows end with the Q-values' and the gradients' worst relative differences, then the
# variable's name.
worst=$(tail -n +3 "$tmp/parity" | awk 'NF >= 4 { print $(NF-2); print $(NF-1) }' \
    | sort -g | tail -n1)
case $code in
    0) row parity "methods, networks, populations" "pass (worst ${worst:-?})" ;;
    124) row parity "methods, networks, populations" "cut by the deadline" ;;
    *) row parity "methods, networks, populations" "FAIL (exit $code): $(tail -n1 "$tmp/parity")"
       failures=$((failures + 1)) ;;
esac

# `train P BATCH METHOD STEPS WARMUP [GRAPHS [TF32 [LOSS]]]`: a population through
# `normrl train` (CUDA graphs on unless GRAPHS is false, TF32 products if TF32 is true,
# `dqn.loss` LOSS, Huber by default); prints its rate with updates, and leaves the peak
# of GPU memory in use (MiB) in $tmp/peak.
train() {
    local p=$1 batch=$2 method=$3 steps=$4 warmup=$5 graphs=${6:-true} tf32=${7:-false}
    local loss=${8:-huber}
    local pid peak=0 used
    rm -rf "$tmp/run"
    limited 120 "$BIN" train --config configs/minatar/breakout.toml --device "$DEVICE" \
        --set run.population="$p" --set replay.batch_size="$batch" \
        --set run.cuda_graphs="$graphs" --set run.tf32="$tf32" \
        --set norm.kind="$method" --set dqn.loss="$loss" --set run.total_steps="$steps" \
        --set replay.learning_starts="$warmup" --set replay.train_frequency=1 \
        --set eval.interval=0 --set eval.episodes=1 --set checkpoint.interval=0 \
        --set checkpoint.replay=false --set logging.progress=false \
        --run-dir "$tmp/run" > "$tmp/out" 2>&1 &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        used=$(used_mib)
        [ -n "$used" ] && [ "$used" -gt "$peak" ] && peak=$used
        sleep 0.5
    done
    wait "$pid"
    local code=$?
    echo "$peak" > "$tmp/peak"
    if [ "$code" -ne 0 ]; then
        [ "$code" -eq 124 ] && echo "cut by the deadline" && return
        echo "FAIL (exit $code): $(grep -v '^ ' "$tmp/out" | tail -n1)"
        return 1
    fi
    # A population says its rate; a single run on the CPU (its own engine) says its
    # steps/s over the whole run in its summary.
    local rate
    rate=$(grep -oE '[0-9]+ agent-steps/s with updates' "$tmp/out" | grep -oE '^[0-9]+')
    [ -z "$rate" ] && rate=$(grep -oE '[0-9]+ steps/s$' "$tmp/out" | grep -oE '^[0-9]+' | head -n1)
    if [ -z "$rate" ]; then
        echo "no rate in the output"
        return 1
    fi
    awk -v r="$rate" 'BEGIN { printf "%.1fk agent-steps/s", r / 1000 }'
    # What the population said of its graphs (nothing where it has none: off, or
    # not a CUDA device).
    grep -oE 'the update (replays as one CUDA graph.*|runs eagerly.*)' "$tmp/out" \
        | head -n1 | sed 's/^/; /' || true
}

# 2. Memory: the same population N and 2N steps (half acting, half updating).
for steps in 1000 2000; do
    result=$(train "$MEMORY_P" 32 none "$steps" 500) || failures=$((failures + 1))
    peak="$(cat "$tmp/peak") MiB"
    [ -z "$(used_mib)" ] && peak="n/a (no nvidia-smi)"
    row memory "P=$MEMORY_P b32 none, $steps steps" "peak $peak; $result"
done

# 2b. The population kernels' and the graphs' gain: one update of MinAtar's CNN at
# P = 256, batch 32, through the kernels, through the tensor forms and as a CUDA graph,
# interleaved in one process.
limited 90 "$BIN" bench population --device "$DEVICE" --method none --case "cnn b32 P=256" \
    --iters 20 > "$tmp/kernels" 2>&1
code=$?
rate() { grep "^$1 agent-updates/s" "$tmp/kernels" | awk '{ print $(NF-1) }'; }
case $code in
    0) row kernels "P=256 b32 none, one update" \
           "$(rate population) agent-updates/s; tensor forms $(rate tensor-forms); graph $(rate graphs)" ;;
    124) row kernels "P=256 b32 none, one update" "cut by the deadline" ;;
    *) row kernels "P=256 b32 none, one update" "FAIL (exit $code): $(tail -n1 "$tmp/kernels")"
       failures=$((failures + 1)) ;;
esac

# 2c. A distributional loss on the device: its targets in tensor ops, inside the
# captured update (C51's scatter, HL-Gauss's erf).
for loss in c51 hl_gauss; do
    result=$(train 64 32 batch_norm 400 100 true false "$loss") || failures=$((failures + 1))
    row speed "P=64 b32 batch_norm, $loss" "$result"
done

# 3. Speed: the rows that matter most first, in case the deadline cuts the rest.
speed() {
    local p=$1 batch=$2 method=$3 graphs=${4:-true} steps
    # Enough steps with updates to time, few enough for the lease.
    steps=$(( p >= 1024 ? 300 : (p >= 256 ? 400 : 600) ))
    result=$(train "$p" "$batch" "$method" "$steps" 100 "$graphs") || failures=$((failures + 1))
    local name="P=$p b$batch $method"
    [ "$graphs" = false ] && name="$name, no graphs"
    row speed "$name" "$result"
}
for method in none weight_norm batch_norm; do
    for p in $POPULATIONS; do
        speed "$p" 32 "$method"
    done
    speed 256 4 "$method"
done
for p in $POPULATIONS; do
    speed "$p" 32 none false
done
# TF32's speed (its effect on learning takes whole runs: see performance.md).
result=$(train 256 32 none 400 100 true true) || failures=$((failures + 1))
row speed "P=256 b32 none, TF32" "$result"


echo
echo "gpu-check on $DEVICE, $(( ${GPU_CHECK_SECONDS:-360} - $(left) )) s:"
echo "| check    | case                               | result |"
echo "|----------|------------------------------------|--------|"
cat "$table"
if [ "$failures" -eq 0 ]; then
    echo "gpu-check: all steps passed"
else
    echo "gpu-check: $failures step(s) failed"
    exit 1
fi
