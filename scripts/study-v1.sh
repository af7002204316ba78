#!/usr/bin/env bash
# The first edition of the study on one machine, session after session: its three
# comparisons (docs/results/minatar-study-v1/README.md says what each is) run in the
# background from the committed archives, by binaries built from the commits that
# trained them, and their finished runs are packed back at a session's end.
#
#   scripts/study-v1.sh start          unpack what runs/ lacks, build the two binaries
#                                      (about 5 minutes each, once), start the three
#                                      comparisons under nice, their ids in runs/*.pid
#   scripts/study-v1.sh pause|resume   stop and continue them (benchmarks, test suites)
#   scripts/study-v1.sh status         each comparison's process and finished runs
#   scripts/study-v1.sh pack NAME      pack every finished run into the archives, the
#                                      CPU that trained the new ones recorded as NAME
#   scripts/study-v1.sh report DIR     the report of all three into DIR/all, and of the
#                                      seven methods (weight norm's two with the fixed
#                                      init only) into DIR/seven, by the checkout's build
#   scripts/study-v1.sh finish         once every run is finished: the score ranges fixed
#                                      in the study's config, both reports drawn into
#                                      docs/results/minatar-study-v1/{all,seven}
#
# Processes are found by the ids this script wrote, never by name.
set -euo pipefail
cd "$(dirname "$0")/.."

results=docs/results/minatar-study-v1
# archive:comparison:binary:jobs, the binary named by the commit that trains it. Each
# comparison gets both cores: while two run they share them, and when one finishes the
# other still keeps both busy (with one job it would leave a core idle to the end).
parts=(
  "runs:minatar-study-v1:normrl-9ad77c5:2"
  "init256:minatar-study-v1-init256:normrl-init256-c8d9ba3:2"
  "online:minatar-study-v1-online:normrl-init256-c8d9ba3:2"
)
field() { echo "$1" | cut -d: -f"$2"; }

# The study's binary (commit 9ad77c5) and the retrain's (9ad77c5 with the init fix),
# built in worktrees outside the checkout and copied into runs/.bin, so that a rebuild of
# the checkout never changes them mid-study.
build() {
  mkdir -p runs/.bin
  local name=$1 patch=${2:-} tree=/tmp/normrl-study-$1
  [ -x "runs/.bin/$name" ] && return
  [ -d "$tree" ] || git worktree add --detach "$tree" 9ad77c5
  # The patch once: a tree with changes has it already.
  if [ -n "$patch" ] && git -C "$tree" diff --quiet; then
    git -C "$tree" apply "$PWD/$patch"
  fi
  (cd "$tree" && cargo build --release)
  cp "$tree/target/release/normrl" "runs/.bin/$name"
}

running() { [ -f "runs/$1.pid" ] && kill -0 "$(cat "runs/$1.pid")" 2>/dev/null; }

# Runs of comparison $2 that a live process holds, by `normrl status` (binary $1): a
# comparison started without this script, or whose id file was lost. A second one
# would only skip the held runs and take the next, two processes more on the cores.
held() {
  "runs/.bin/$1" status "runs/$2" | awk -F'|' '/^\| b/ { n += $4 } END { print n + 0 }'
}

start() {
  for part in "${parts[@]}"; do
    local archive comparison
    archive=$(field "$part" 1) comparison=$(field "$part" 2)
    if [ ! -f "runs/$comparison/plan.json" ]; then
      mkdir -p "runs/$comparison"
      tar -xJf "$results/$archive.tar.xz" -C "runs/$comparison"
    fi
  done
  build normrl-9ad77c5
  build normrl-init256-c8d9ba3 "$results/init256.patch"
  for part in "${parts[@]}"; do
    local archive comparison binary jobs
    archive=$(field "$part" 1) comparison=$(field "$part" 2)
    binary=$(field "$part" 3) jobs=$(field "$part" 4)
    if running "$archive"; then
      echo "$comparison: already running (pid $(cat "runs/$archive.pid"))"
      continue
    fi
    if [ "$(held "$binary" "$comparison")" -gt 0 ]; then
      echo "$comparison: runs held by a process not in runs/$archive.pid; not started" >&2
      continue
    fi
    nohup nice -n 10 "runs/.bin/$binary" compare \
      --config "configs/compare/$comparison.toml" --jobs "$jobs" \
      >>"runs/$comparison.log" 2>&1 &
    echo $! >"runs/$archive.pid"
    echo "$comparison: started (pid $!), log runs/$comparison.log"
  done
}

signal() {
  for part in "${parts[@]}"; do
    local archive
    archive=$(field "$part" 1)
    if running "$archive"; then kill "-$1" "$(cat "runs/$archive.pid")"; fi
  done
}

status() {
  for part in "${parts[@]}"; do
    local archive comparison state=stopped
    archive=$(field "$part" 1) comparison=$(field "$part" 2)
    running "$archive" && state="running (pid $(cat "runs/$archive.pid"))"
    local done
    done=$(find "runs/$comparison" -name result.json 2>/dev/null | wc -l)
    echo "$comparison: $state, $done runs finished"
  done
}

pack() {
  local machine=${1:?"pack needs the machine's name, e.g. amd-epyc"}
  for part in "${parts[@]}"; do
    local archive comparison
    archive=$(field "$part" 1) comparison=$(field "$part" 2)
    python3 scripts/pack-results.py "runs/$comparison" "$results/$archive.tar.xz" \
      --machines "$results/machines.txt" --machine "$machine"
  done
}

report() {
  local out=${1:?"report needs an output folder"}
  local dirs=(runs/minatar-study-v1 runs/minatar-study-v1-init256 runs/minatar-study-v1-online)
  cargo build --release --quiet
  target/release/normrl report "${dirs[@]}" --config configs/compare/minatar-study-v1.toml \
    --out "$out/all" >/dev/null
  target/release/normrl report "${dirs[@]}" --config configs/compare/minatar-study-v1.toml \
    --leave-out weight_norm --leave-out wn_mean_only_bn --out "$out/seven" >/dev/null
}

# Once every run of the three is finished: both reports drawn into the results folder,
# and the score ranges they derived fixed into the study's config (exactly, from
# report.md's block), so that every later report normalizes alike. Fixed ranges
# normalize exactly as derived ones, so the reports need no second draw.
finish() {
  local config=configs/compare/minatar-study-v1.toml left=0
  for part in "${parts[@]}"; do
    local comparison binary n
    comparison=$(field "$part" 2) binary=$(field "$part" 3)
    n=$("runs/.bin/$binary" status "runs/$comparison" |
      awk -F'|' '$2 ~ /^ all / { print $4 + $5 + $6 + $7 + $8 }')
    [ "${n:-1}" = 0 ] || { echo "$comparison: ${n:-?} runs not finished" >&2; left=1; }
  done
  [ "$left" = 0 ] || exit 1
  report "$results"
  if ! grep -q '^\[report.scores\]' "$config"; then
    { echo; echo "# The score ranges of all three comparisons' runs, fixed once the grids were done."
      sed -n '/^```toml$/,/^```$/p' "$results/all/report.md" | sed '1d;$d'; } >>"$config"
  fi
}

case "${1:-}" in
  start) start ;;
  pause) signal STOP ;;
  resume) signal CONT ;;
  status) status ;;
  pack) pack "${2:-}" ;;
  report) report "${2:-}" ;;
  finish) finish ;;
  *) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
