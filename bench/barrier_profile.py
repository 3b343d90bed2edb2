#!/usr/bin/env python3
"""barrier_profile.py -- where a keyed instance's CPU goes right after each
checkpoint barrier, against the rest of the interval (issue 20: the p99 at
50% load that checkpoints raise).  A diagnostic outside the suite; Linux
only, as root, with perf (Debian: linux-perf).

    bench/barrier_profile.py [--early-ms E] [--hz F] [--keep DIR]
                             BENCH [ARGS...]

runs BENCH ARGS (for instance build/bench/latency_bench --quick --only
load) under `perf record`, sampling CPU time at F Hz (default 20000) with
call chains, and with uprobes on sl_cow_map_freeze and
sl_cow_map_freeze_deferred in BENCH: the keyed map's freeze, which every
barrier's snapshot of a keyed instance makes on that instance's thread
(an aligned snapshot with the second, snapshot.c note 14).  For each
thread that froze a map, each interval from one freeze to the next
(intervals over 500 ms, which span the end of a run, are left out) is
split into its first E ms (default 5) and the rest.  The report gives per
thread:
  - the share of the time it was on a CPU, early and late;
  - the extra CPU per barrier: samples in the early parts, less what the
    late parts' rate predicts for that much time, in microseconds;
  - the same, function by function, as leaf (self time) and inclusive
    (anywhere in the first 14 frames of the call chain).
A function with a large extra costs more, per unit of time, right after a
barrier than later: that is the work a barrier brings with it.

Call chains need frame pointers: build BENCH with
    meson setup /tmp/build-fp -Dbuildtype=release \
        -Dc_args=-fno-omit-frame-pointer -Dtests=false -Dexamples=false
Without them the leaf (self) figures still hold.  The uprobes need the
symbols in BENCH itself (the bench programs link libsluice statically).
The probes are removed afterwards; --keep DIR keeps perf.data and the
perf script text there.
"""
import argparse
import bisect
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

PROBE_GROUP = "sluice_barrier"
# An aligned snapshot freezes with sl_cow_map_freeze_deferred (snapshot.c
# note 14); the final one, and others, with sl_cow_map_freeze.
PROBES = {"freeze": "sl_cow_map_freeze",
          "freeze_deferred": "sl_cow_map_freeze_deferred"}
MAX_INTERVAL_S = 0.5
INCLUSIVE_FRAMES = 14


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def add_probes(binary):
    events = []
    for name, symbol in PROBES.items():
        spec = f"{PROBE_GROUP}:{name}={symbol}"
        run(["perf", "probe", "-q", "-x", binary, "--add", spec])
        events.append(f"{PROBE_GROUP}:{name}")
    return events


def del_probe():
    subprocess.run(["perf", "probe", "-q", "--del", f"{PROBE_GROUP}:*"],
                   stderr=subprocess.DEVNULL)


HEADER = re.compile(r"^(\S.*?)\s+(\d+)\s+(\d+\.\d+):\s+(?:\d+\s+)?(\S+):")


def parse(path):
    """Samples of `perf script -F comm,tid,time,event,ip,sym`:
    (tid, comm, time_s, event, [frames, leaf first])."""
    samples, cur = [], None
    with open(path, errors="replace") as f:
        for line in f:
            if not line.strip():
                if cur:
                    samples.append(cur)
                cur = None
                continue
            m = HEADER.match(line)
            if m and not line[0].isspace():
                if cur:
                    samples.append(cur)
                cur = (int(m.group(2)), m.group(1).strip(),
                       float(m.group(3)), m.group(4), [])
                continue
            if cur is not None:
                parts = line.split()
                if len(parts) >= 2:
                    cur[4].append(parts[1].split("+")[0])
    if cur:
        samples.append(cur)
    return samples


def report(samples, hz, early_s, out):
    us_per_sample = 1e6 / hz
    freezes = collections.defaultdict(list)
    for tid, _, t, event, _ in samples:
        if event.split(":")[-1] in PROBES:
            freezes[tid].append(t)
    if not freezes:
        print("no freeze seen: did the run take checkpoints of keyed "
              "state?", file=out)
        return
    by_tid = collections.defaultdict(list)
    for s in samples:
        if s[0] in freezes:
            by_tid[s[0]].append(s)
    for tid, times in sorted(freezes.items()):
        times.sort()
        early_total = late_total = 0.0
        intervals = 0
        for i in range(len(times) - 1):
            gap = times[i + 1] - times[i]
            if gap > MAX_INTERVAL_S or gap <= early_s:
                continue
            intervals += 1
            early_total += early_s
            late_total += gap - early_s
        if intervals == 0:
            continue
        leaf_e, leaf_l = collections.Counter(), collections.Counter()
        incl_e, incl_l = collections.Counter(), collections.Counter()
        n_e = n_l = 0
        comm = by_tid[tid][0][1]
        for _, _, t, event, frames in by_tid[tid]:
            if event != "cpu-clock":
                continue
            i = bisect.bisect_right(times, t) - 1
            if i < 0 or i + 1 >= len(times):
                continue
            gap = times[i + 1] - times[i]
            if gap > MAX_INTERVAL_S or gap <= early_s:
                continue
            early = t - times[i] < early_s
            leaf = frames[0] if frames else "?"
            if early:
                n_e += 1
                leaf_e[leaf] += 1
            else:
                n_l += 1
                leaf_l[leaf] += 1
            for fn in set(frames[:INCLUSIVE_FRAMES]):
                (incl_e if early else incl_l)[fn] += 1
        scale = early_total / late_total
        print(f"thread {tid} ({comm}): {intervals} intervals between "
              f"freezes; first {early_s * 1e3:g} ms of each against the "
              f"rest", file=out)
        print(f"  on a CPU: {n_e * us_per_sample / (early_total * 1e6):.2f}"
              f" of the early time, {n_l * us_per_sample / (late_total * 1e6):.2f}"
              f" of the late", file=out)
        extra = (n_e - n_l * scale) * us_per_sample / intervals
        print(f"  extra CPU per barrier: {extra:.0f} us", file=out)
        for title, e_counts, l_counts in (("self", leaf_e, leaf_l),
                                          ("inclusive", incl_e, incl_l)):
            rows = []
            for fn in set(e_counts) | set(l_counts):
                early_us = e_counts[fn] * us_per_sample / intervals
                late_us = l_counts[fn] * scale * us_per_sample / intervals
                rows.append((early_us - late_us, fn, early_us, late_us))
            rows.sort(reverse=True)
            print(f"  {title}: extra us per barrier (early, late rate)",
                  file=out)
            for extra_us, fn, early_us, late_us in rows[:12]:
                print(f"    {extra_us:8.1f}  {fn} ({early_us:.1f}, "
                      f"{late_us:.1f})", file=out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--early-ms", type=float, default=5.0)
    ap.add_argument("--hz", type=int, default=20000)
    ap.add_argument("--keep", metavar="DIR")
    ap.add_argument("bench")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    if not shutil.which("perf"):
        sys.exit("barrier_profile: perf is not installed (Debian: "
                 "apt-get install linux-perf)")
    if a.early_ms <= 0 or a.hz <= 0:
        sys.exit("barrier_profile: --early-ms and --hz must be positive")
    binary = os.path.abspath(a.bench)
    if not os.access(binary, os.X_OK):
        sys.exit(f"barrier_profile: {a.bench} is not an executable")
    work = a.keep or tempfile.mkdtemp(prefix="barrier_profile.")
    os.makedirs(work, exist_ok=True)
    data = os.path.join(work, "perf.data")
    text = os.path.join(work, "perf.txt")
    del_probe()
    try:
        events = add_probes(binary)
    except subprocess.CalledProcessError:
        sys.exit(f"barrier_profile: no uprobes on sl_cow_map_freeze* in "
                 f"{binary} (root? the symbol present?)")
    try:
        run(["perf", "record", "-q", "-k", "mono", "-F", str(a.hz), "-g",
             "-e", "cpu-clock"]
            + [arg for e in events for arg in ("-e", e)]
            + ["-o", data, "--", binary]
            + a.args)
    finally:
        del_probe()
    with open(text, "w") as f:
        run(["perf", "script", "-i", data, "-F",
             "comm,tid,time,event,ip,sym", "--ns"], stdout=f,
            stderr=subprocess.DEVNULL)
    report(parse(text), a.hz, a.early_ms / 1e3, sys.stdout)
    if not a.keep:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
