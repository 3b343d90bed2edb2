#!/usr/bin/env bash
# model/run.sh [--mutants | --all] — check model/barrier.pml with Spin.
#
# Default: every check below, exhaustive (no bitstate, no hash
# compaction): each prints Spin's summary and fails when Spin reports an
# error or could not finish the search.  --mutants: each seeded bug must
# make Spin report an error.  --all: both.  Needs spin and gcc.
set -euo pipefail
cd "$(dirname "$0")"

# The checks: NAME|spin -D flags|pan compile flags|pan run flags.
# Modes: 0 aligned, 1 unaligned, 2 aligned with a timeout, 3 at-least-once
# (barrier.pml note 5).  Bounds (barrier.pml): RECS records per source,
# NCP checkpoint ids, MAXC max_concurrent, CRASHES failovers, TIMEOUTS
# nondeterministic aborts, CAP_IN / CAP_OUT ring capacities in entries.
CHECKS=(
  "aligned|-DMODE=0 -DRECS=1 -DCRASHES=0 -DTIMEOUTS=1|-DSAFETY|"
  "unaligned|-DMODE=1 -DRECS=1 -DCRASHES=0 -DTIMEOUTS=0|-DSAFETY|"
  "unaligned-failover|-DMODE=1 -DRECS=1 -DNCP=1 -DMAXC=1 -DCRASHES=1 -DTIMEOUTS=0|-DSAFETY|"
  "timeout|-DMODE=2 -DRECS=1 -DMAXC=1 -DCRASHES=0 -DTIMEOUTS=1|-DSAFETY|"
  "at-least-once|-DMODE=3 -DRECS=1 -DCRASHES=0 -DTIMEOUTS=1|-DSAFETY|"
  "at-least-once-failover|-DMODE=3 -DRECS=1 -DNCP=1 -DMAXC=1 -DCRASHES=1 -DTIMEOUTS=0|-DSAFETY|"
  "no-cycles|-DMODE=1 -DRECS=1 -DNCP=1 -DMAXC=1 -DCRASHES=0 -DTIMEOUTS=1|-DNP|-l"
)

# The seeded bugs: NAME|spin -D flags|what Spin must find.
MUTANTS=(
  "MUT_COPY_CONSUMED|-DMODE=1 -DRECS=1 -DCRASHES=0 -DTIMEOUTS=0|a record both in state and in channel state"
  "MUT_NO_COPY|-DMODE=1 -DRECS=1 -DCRASHES=0 -DTIMEOUTS=0|a record before the barrier in neither"
  "MUT_COPY_PAST|-DMODE=1 -DRECS=1 -DCRASHES=0 -DTIMEOUTS=0|a record after the barrier in channel state"
  "MUT_NO_BLOCK|-DMODE=0 -DRECS=1 -DCRASHES=0 -DTIMEOUTS=0|records after the barrier read while aligning (aligned)"
  "MUT_POSITION_AHEAD|-DMODE=3 -DRECS=1 -DCRASHES=0 -DTIMEOUTS=0|a record before the barrier missing (at-least-once)"
  "MUT_NO_REPLAY|-DMODE=1 -DRECS=1 -DNCP=1 -DMAXC=1 -DCRASHES=1 -DTIMEOUTS=0|output lost after a failover"
  "MUT_NO_UNBLOCK|-DMODE=2 -DRECS=1 -DMAXC=1 -DCRASHES=0 -DTIMEOUTS=0|channels left blocked after a timeout switch"
  "MUT_END_DROPS|-DMODE=1 -DRECS=1 -DCRASHES=0 -DTIMEOUTS=0|a checkpoint every source took part in never completes"
)

say() { printf '[model] %s\n' "$*" >&2; }

for tool in spin gcc; do
  command -v "$tool" >/dev/null || { say "$tool not found (./run model installs it)"; exit 1; }
done

work=$(mktemp -d)
# The searches run in the background (start_search): stopped with the
# script, before their directory goes.
# stop() ends those still running by the PIDs they recorded (a search's
# subshell, then its pan; each removes its file when it ends), before
# their directory goes.
stop() {
  local f
  for f in "$work"/*/search.pid "$work"/*/pan.pid; do
    [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null
  done
  wait 2>/dev/null
  rm -rf "$work"
}
trap stop EXIT
trap 'exit 130' INT TERM
cp ./*.pml "$work"/

# search NAME DFLAGS CFLAGS RUNFLAGS: generate, compile and run one
# verifier in $work/NAME; its exit status (0, or 2 when Spin or gcc
# failed) in $work/NAME/status.  Several run at once (start_search).
search() {
  local name=$1 dflags=$2 cflags=$3 runflags=$4 dir="$work/$1" rc=0
  mkdir -p "$dir"
  echo "$BASHPID" >"$dir/search.pid" # for stop(), while this runs
  cp "$work"/*.pml "$dir"/
  # shellcheck disable=SC2086
  (cd "$dir" && spin -a $dflags barrier.pml >spin.log 2>&1) || rc=2
  # shellcheck disable=SC2086
  [ "$rc" = 0 ] && { (cd "$dir" && gcc -O2 -w -DCOLLAPSE -DMEMLIM=4096 $cflags \
    -o pan pan.c >gcc.log 2>&1) || rc=2; }
  # pan's PID in pan.pid, for stop(), while it runs.
  [ "$rc" = 0 ] && {
    # shellcheck disable=SC2086
    (cd "$dir" && echo "$BASHPID" >pan.pid &&
      exec ./pan -m1000000 -w25 $runflags >pan.log 2>&1) || true
    rm -f "$dir/pan.pid"
  }
  echo "$rc" >"$dir/status"
  rm -f "$dir/search.pid"
}

# start_search ARGS...: search ARGS in the background, at most as many at
# once as there are CPUs, or MODEL_JOBS (each pan is one single-threaded
# process of up to MEMLIM, 4 GB; the searches are independent, so the
# order they finish in does not matter).  wait -n: bash 4.3 or later.
running=0
jobs_max=${MODEL_JOBS:-$(nproc 2>/dev/null || echo 1)}
start_search() {
  if [ "$running" -ge "$jobs_max" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  search "$@" &
  running=$((running + 1))
}

# verdict NAME: after the search, print its summary; sets errors and
# complete (1 when the search finished); returns 2 if it could not run.
verdict() {
  local name=$1 dir="$work/$1" log="$work/$1/pan.log"
  if [ "$(cat "$dir/status" 2>/dev/null || echo 2)" != 0 ]; then
    say "$name: spin or gcc failed"
    cat "$dir/spin.log" "$dir/gcc.log" >&2 2>/dev/null || true
    return 2
  fi
  errors=$(awk '/errors:/{for(i=1;i<=NF;i++) if($i=="errors:") print $(i+1)}' "$log" | tail -n1)
  if [ -z "$errors" ]; then # pan died (out of memory?): no verdict at all
    say "$name: pan ended without a summary"
    tail -n 5 "$log" >&2 2>/dev/null || true
    return 2
  fi
  complete=1
  grep -q "Search not completed\|max search depth too small" "$log" && complete=0
  printf '%-26s %s\n' "$name" "$(grep -E 'errors:' "$log" | sed 's/^ *//')"
  grep -E 'states, stored|pan: elapsed' "$log" | sed 's/^ */                           /'
  if [ "$errors" != 0 ]; then
    grep -E '^pan:[0-9]|assertion violated|invalid end state' "$log" | head -n3 |
      sed 's/^/                           /'
    cp -r "$dir" "./.failed-$name" 2>/dev/null || true
  fi
}

start_checks() {
  local entry name d c r
  for entry in "${CHECKS[@]}"; do
    IFS='|' read -r name d c r <<<"$entry"
    start_search "$name" "$d" "$c" "$r"
  done
}

check_verdicts() {
  local rc=0 entry name d c r
  for entry in "${CHECKS[@]}"; do
    IFS='|' read -r name d c r <<<"$entry"
    verdict "$name" || { rc=1; continue; }
    if [ "$errors" != 0 ]; then
      say "$name: Spin found $errors error(s); trail and model kept in model/.failed-$name"
      rc=1
    elif [ "$complete" != 1 ]; then
      say "$name: the search did not complete"
      rc=1
    fi
  done
  return "$rc"
}

start_mutants() {
  local entry name d want
  for entry in "${MUTANTS[@]}"; do
    IFS='|' read -r name d want <<<"$entry"
    start_search "mutant $name" "-D$name $d" "-DSAFETY" ""
  done
}

mutant_verdicts() {
  local rc=0 entry name d want
  for entry in "${MUTANTS[@]}"; do
    IFS='|' read -r name d want <<<"$entry"
    verdict "mutant $name" || { rc=1; continue; }
    if [ "$errors" = 0 ]; then
      say "mutant $name: Spin found no error, but it breaks the protocol ($want)"
      rc=1
    fi
    rm -rf "./.failed-mutant $name"
  done
  return "$rc"
}

rc=0
case "${1:-}" in
  "") start_checks; wait; check_verdicts || rc=$? ;;
  --mutants) start_mutants; wait; mutant_verdicts || rc=$? ;;
  --all)
    start_checks; start_mutants; wait
    check_verdicts || rc=$?; mutant_verdicts || rc=$? ;;
  *) echo "usage: model/run.sh [--mutants | --all]" >&2; exit 2 ;;
esac
if [ "$rc" = 0 ]; then say "ok"; else say "FAILED"; fi
exit "$rc"
