# shellcheck shell=bash
# One deadline for a script's steps (sourced by gpu-check.sh and device-call.sh): set
# END (seconds since the epoch) first.
#   left                   seconds until END
#   limited SECONDS CMD... CMD with at most SECONDS, never past END (status 124 when
#                          fewer than 5 are left, as `timeout` gives when it cuts)
left() { echo $(( END - $(date +%s) )); }
limited() {
  local want=$1 have
  shift
  have=$(left)
  [ "$have" -lt "$want" ] && want=$have
  [ "$want" -lt 5 ] && return 124
  # No kill after the signal: a run stopped by it writes its checkpoint and says so
  # (status 124), where a kill would read as a failure.
  timeout "$want" "$@"
}
