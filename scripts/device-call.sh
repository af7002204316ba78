#!/usr/bin/env bash
# The one call a lent GPU machine gets (issue 52): everything prepared here, so that the
# lease (15 minutes of device time in all, 10 a command) goes to measuring.
#
#   scripts/device-call.sh prepare PEERS   here, with or without a GPU: builds the CUDA
#       binary (scripts/cuda-build.sh), strips it and xz's it into .device/normrl.xz,
#       copies the JAX peer from the folder PEERS into .device/peers, and keeps .device/
#       out of git (.git/info/exclude), so that the device tool carries it by name.
#   scripts/device-call.sh run             on the device (the run tool's command, with
#       carry [".device"] and timeout_s 600), under one deadline (DEADLINE_S, default
#       540 s), each step getting what is left at most; results in 5 files under $OUT:
#       1. gpu-check.txt     scripts/gpu-check.sh: parity, memory, kernels, speed
#                            (GPU_CHECK_SECONDS, default 270)
#       2. study-shape.txt   the study's shape: K populations of 5 trained at once
#                            against one population of 5K (K = 4 and 16), agent-steps/s
#       3. study-time.txt    the study's time on one GPU: `compare --dry-run` there
#       4. jax.jsonl, jax.txt  the JAX population peer (BUDGET_S, default 105)
#   A rehearsal on a CPU, with the CPU build and small shapes:
#     DEVICE=cpu NORMRL_BIN=target/release/normrl SHAPE_K="2" OUT=/tmp/out \
#       DEADLINE_S=300 scripts/device-call.sh run
set -uo pipefail
cd "$(dirname "$0")/.."

prepare() {
  local peers=${1:?"prepare needs the JAX peer's folder"}
  scripts/cuda-build.sh || exit 1
  mkdir -p .device
  strip -o .device/normrl target/cuda/release/normrl
  xz -T0 -9 -f .device/normrl
  rm -rf .device/peers
  cp -r "$peers" .device/peers
  local exclude
  exclude=$(git rev-parse --git-dir)/info/exclude
  mkdir -p "$(dirname "$exclude")"
  grep -qx '/.device/' "$exclude" 2>/dev/null || echo '/.device/' >>"$exclude"
  du -sh .device/normrl.xz .device/peers
}

END=0
# shellcheck source=scripts/deadline.sh
source scripts/deadline.sh

# `population P STEPS OUT`: one population of P on MinAtar Breakout, in the study's
# setting (batch 32, an update every 4 frames), its output into OUT.
population() {
  limited 150 "$BIN" train --config configs/minatar/breakout.toml --device "$DEVICE" \
    --set run.population="$1" --set replay.batch_size=32 --set replay.train_frequency=4 \
    --set run.total_steps="$2" --set replay.learning_starts=1000 \
    --set eval.interval=0 --set eval.episodes=1 --set checkpoint.interval=0 \
    --set checkpoint.replay=false --set logging.progress=false \
    --run-dir "$tmp/shape-$RANDOM$RANDOM" >"$3" 2>&1
}
rate_of() { grep -oE '[0-9]+ agent-steps/s with updates' "$1" | grep -oE '^[0-9]+' | tail -n1; }

# The study trains 210 populations of 5 per game (42 variants x 5 seeds): on one GPU,
# K of them at once or one population of 5K, whichever keeps the GPU busier.
study_shape() {
  local k steps=${SHAPE_STEPS:-5000}
  echo "the study's shape on $DEVICE: agent-steps/s with updates, MinAtar Breakout, batch 32, an update every 4 frames, $steps steps a member"
  for k in ${SHAPE_K:-4 16}; do
    local i pids=() sum=0 failed=0
    for ((i = 0; i < k; i++)); do
      population 5 "$steps" "$tmp/k$k-$i" &
      pids+=($!)
    done
    for i in "${!pids[@]}"; do
      wait "${pids[$i]}" || failed=$((failed + 1))
      sum=$(( sum + $(rate_of "$tmp/k$k-$i" || echo 0) ))
    done
    echo "$k populations of 5 at once: $sum agent-steps/s in all ($failed failed)"
    [ "$failed" -gt 0 ] && tail -n 3 "$tmp/k$k-0"
    if population $((5 * k)) "$steps" "$tmp/one$k"; then
      echo "one population of $((5 * k)): $(rate_of "$tmp/one$k") agent-steps/s"
    else
      echo "one population of $((5 * k)): failed or cut: $(tail -n 1 "$tmp/one$k")"
    fi
  done
}

# The study as populations of its seeds on this device: `compare --dry-run` trains the
# first for 300 steps with updates and prices the whole grid by its rate. (The extension
# lives beside the study: a comparison's base configs are found from its folder.)
study_time() {
  local gpu=configs/compare/minatar-study-v1-device.toml
  printf 'extends = "minatar-study-v1.toml"\nname = "minatar-study-v1-device"\npopulation = "seeds"\n' >"$gpu"
  limited 90 "$BIN" compare --config "$gpu" --dry-run --runs-dir "$tmp/study" \
    --set run.device="$DEVICE" | grep -v '^minatar_'
  echo "compare --dry-run: exit ${PIPESTATUS[0]}"
  rm -f "$gpu"
}

run() {
  END=$(( $(date +%s) + ${DEADLINE_S:-540} ))
  : "${OUT:?run needs \$OUT, the folder the results go to}"
  DEVICE=${DEVICE:-cuda}
  BIN=${NORMRL_BIN:-}
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  if [ -z "$BIN" ]; then
    BIN=$tmp/normrl
    python3 -c 'import lzma, shutil, sys
with lzma.open(sys.argv[1]) as f, open(sys.argv[2], "wb") as g: shutil.copyfileobj(f, g)' \
      .device/normrl.xz "$BIN" && chmod +x "$BIN" || exit 1
  fi
  local lib
  for lib in /opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib \
      /usr/local/cuda-13.0/targets/x86_64-linux/lib; do
    [ -d "$lib" ] && export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  done
  export NORMRL_BIN=$BIN GPU_CHECK_DEVICE=$DEVICE
  local check=${GPU_CHECK_SECONDS:-270}
  [ "$check" -gt "$(left)" ] && check=$(left)
  GPU_CHECK_SECONDS=$check scripts/gpu-check.sh >"$OUT/gpu-check.txt" 2>&1
  echo "gpu-check: exit $?" >>"$OUT/gpu-check.txt"
  study_shape >"$OUT/study-shape.txt" 2>&1
  study_time >"$OUT/study-time.txt" 2>&1
  if [ -d .device/peers ] && [ "$DEVICE" = cuda ]; then
    local budget=${BUDGET_S:-105}
    [ "$budget" -gt $(( $(left) - 5 )) ] && budget=$(( $(left) - 5 ))
    BUDGET_S=$budget bash .device/peers/jax_population_gpu.sh >/dev/null 2>"$OUT/jax.txt"
  fi
  echo "device-call: $(( ${DEADLINE_S:-540} - $(left) )) s"
}

case "${1:-}" in
  prepare) prepare "${2:-}" ;;
  run) run ;;
  *) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
