#!/usr/bin/python3
"""half_conversion_bench: the one-node fp16 / bf16 reduction with the CPU's
conversion instructions (F16C / AVX2) against the software conversions.

Runs local_reduce_bench (one node, 1 thread rows) alternately with
GRADSYNC_HALF_CONVERSION=software and without, ROUNDS times per dtype, and
prints per row the median of the rounds' times (each itself a median of 7)
with their min-max, the speedup, and the load average before and after.
Not a test: asserts nothing. GRADSYNC_BENCH_QUICK=1: 4 MB, 3 rounds, 2 trainers.
--nodes=2 [--worker-staging]: the cross-node path's local passes instead
(sum into the fp32 staging, write back from it; local_reduce_bench's
--nodes=2 rows).

Run from the repository root after `bazel build //tests/bench:local_reduce_bench`:
  /usr/bin/python3 tests/bench/half_conversion_bench.py [--mb=16] [--rounds=5] [--trainers=2,3]
      [--nodes=1|2] [--worker-staging]
"""
from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys

BENCH = "bazel-bin/tests/bench/local_reduce_bench"
ROW = re.compile(r"^\| gradsync LocalReducer( \+ non-finite check)?, (\d+) trainers \| 1 \| ([\d.]+) \|")


def run(dtype: str, mb: int, trainers: str, software: bool, extra: list) -> dict:
    env = dict(os.environ)
    env.pop("GRADSYNC_HALF_CONVERSION", None)
    if software:
        env["GRADSYNC_HALF_CONVERSION"] = "software"
    out = subprocess.run([BENCH, f"--dtype={dtype}", f"--mb={mb}", f"--trainers={trainers}"] + extra,
                         env=env, check=True, capture_output=True, text=True).stdout
    rows = {}
    for line in out.splitlines():
        m = ROW.match(line)
        if m:
            rows[(int(m.group(2)), bool(m.group(1)))] = float(m.group(3))
    return rows


def main() -> int:
    opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    quick = os.environ.get("GRADSYNC_BENCH_QUICK") == "1"  # scripts/bench.sh --quick
    mb = int(opts.get("mb", 4 if quick else 16))
    rounds = int(opts.get("rounds", 3 if quick else 5))
    trainers = opts.get("trainers", "2" if quick else "2,3")
    nodes = opts.get("nodes", "1")
    extra = [f"--nodes={nodes}"] + (["--worker-staging"] if "--worker-staging" in sys.argv else [])
    load_before = open("/proc/loadavg").read().split()[:3]
    print(f"## fp16 / bf16 local reduction, {mb} MB per trainer, {' '.join(extra)}, 1 thread, "
          f"median of {rounds} interleaved rounds\n")
    print("| dtype | trainers | check | software ms (min-max) | hardware ms (min-max) | speedup |")
    print("|---|---|---|---|---|---|")
    for dtype in ("float16", "bfloat16"):
        times = {False: [], True: []}
        for _ in range(rounds):
            for software in (True, False):
                times[software].append(run(dtype, mb, trainers, software, extra))
        for key in sorted(times[True][0]):
            sw = [r[key] for r in times[True]]
            hw = [r[key] for r in times[False]]
            print(f"| {dtype} | {key[0]} | {'yes' if key[1] else 'no'} | "
                  f"{statistics.median(sw):.1f} ({min(sw):.1f}-{max(sw):.1f}) | "
                  f"{statistics.median(hw):.1f} ({min(hw):.1f}-{max(hw):.1f}) | "
                  f"{statistics.median(sw) / statistics.median(hw):.1f}x |")
    load_after = open("/proc/loadavg").read().split()[:3]
    print(f"\nload average (1/5/15 min): before {' '.join(load_before)}, after {' '.join(load_after)}; "
          f"{os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
