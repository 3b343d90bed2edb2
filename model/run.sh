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
trap 'rm -rf "$work"' EXIT
cp ./*.pml "$work"/

# verify NAME DFLAGS CFLAGS RUNFLAGS: prints the summary; sets errors,
# complete (1 when the search finished).
verify() {
  local name=$1 dflags=$2 cflags=$3 runflags=$4 dir="$work/$1" log
  mkdir -p "$dir"
  cp "$work"/*.pml "$dir"/
  # shellcheck disable=SC2086
  (cd "$dir" && spin -a $dflags barrier.pml >spin.log 2>&1) || {
    cat "$dir/spin.log" >&2; return 2; }
  # shellcheck disable=SC2086
  (cd "$dir" && gcc -O2 -w -DCOLLAPSE -DMEMLIM=4096 $cflags -o pan pan.c) || return 2
  log="$dir/pan.log"
  # shellcheck disable=SC2086
  (cd "$dir" && ./pan -m1000000 -w25 $runflags >pan.log 2>&1) || true
  errors=$(awk '/errors:/{for(i=1;i<=NF;i++) if($i=="errors:") print $(i+1)}' "$log" | tail -n1)
  errors=${errors:-1}
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

run_checks() {
  local rc=0 entry name d c r
  for entry in "${CHECKS[@]}"; do
    IFS='|' read -r name d c r <<<"$entry"
    verify "$name" "$d" "$c" "$r" || { rc=1; continue; }
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

run_mutants() {
  local rc=0 entry name d want
  for entry in "${MUTANTS[@]}"; do
    IFS='|' read -r name d want <<<"$entry"
    verify "mutant $name" "-D$name $d" "-DSAFETY" "" || { rc=1; continue; }
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
  "") run_checks || rc=$? ;;
  --mutants) run_mutants || rc=$? ;;
  --all) run_checks || rc=$?; run_mutants || rc=$? ;;
  *) echo "usage: model/run.sh [--mutants | --all]" >&2; exit 2 ;;
esac
if [ "$rc" = 0 ]; then say "ok"; else say "FAILED"; fi
exit "$rc"
