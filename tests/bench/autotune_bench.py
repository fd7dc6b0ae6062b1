#!/usr/bin/python3
"""autotune_bench: --autotune's step time against the best fixed bucket cap.

One gradsyncd, 2 trainers (gradsync's DistributedOptimizer), two models of
different shapes: the 25.2M-parameter MLP of torch_step_bench.py (6 large
tensors, 100 MB of gradients) and a deep narrow MLP with many small tensors
(120 x Linear(128, 128): 240 tensors, 7.9 MB). Per model, in one run:

  fixed caps   a sweep of --bucket-cap-mb (first cap 1 MiB): per cap, the
               median step after warm-up
  autotune     --autotune from the default caps; the step time is the
               median of the steps after the choice applied (the iteration
               in the daemon's event=autotune_chosen line)

and the ratio of autotune to the best fixed cap. Prints one table; writes
nothing else. Not a test: asserts nothing.

    bazel build //daemon:gradsyncd //client:libgradsync.so
    /usr/bin/python3 tests/bench/autotune_bench.py [--steps 10] [--models mlp,narrow]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

import bench_report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

MODELS = {
    # key: (label, width, layers, batch per trainer, steps --autotune may take
    # to choose: candidates are placed ~2 s of steps ahead, so fast steps need more)
    "mlp": ("25.2M MLP (6 x 2048x2048)", 2048, 6, 32, 90),
    "narrow": ("narrow deep MLP (120 x 128x128)", 128, 120, 64, 900),
}
FIXED_CAPS_MB = [0.25, 1, 4, 25, 100]


def worker(model_name: str, steps: int) -> List[float]:
    import torch
    import gradsync.torch as gst
    torch.set_num_threads(1)
    torch.manual_seed(0)
    _, width, layers, batch, _ = MODELS[model_name]
    mods: List[torch.nn.Module] = []
    for i in range(layers):
        mods.append(torch.nn.Linear(width, width))
        if i < layers - 1:
            mods.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*mods)
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, width, generator=g)
    y = torch.randn(batch, width, generator=g)
    opt = gst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-4),
                                   model.named_parameters())
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - start)
    opt.close()
    return times


def run(model_name: str, steps: int, daemon_args: List[str], tmp: str, tag: str):
    """Step times (slowest trainer per step) and the daemon's log."""
    from gradsync.daemon import LocalDaemon
    sock = os.path.join(tmp, "gs.sock")
    log = os.path.join(tmp, f"{tag}.log")
    daemon = LocalDaemon(sock, 2, ["--timeout-s=300"] + daemon_args, log_path=log).start()
    try:
        procs = []
        for rank in range(2):
            env = dict(os.environ, LOCAL_RANK=str(rank), OMP_NUM_THREADS="1",
                       GRADSYNC_SOCKET=sock, PYTHONPATH=os.path.join(ROOT, "client", "python"))
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker", model_name, str(steps)],
                env=env, stdout=subprocess.PIPE, text=True))
        per_rank = []
        for p in procs:
            out, _ = p.communicate(timeout=3600)
            if p.returncode != 0:
                raise RuntimeError(f"{tag} worker failed with code {p.returncode}")
            per_rank.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        daemon.stop()
    with open(log) as f:
        text = f.read()
    return [max(ts) for ts in zip(*per_rank)], text


def main() -> int:
    ap = argparse.ArgumentParser(description="--autotune vs the best fixed bucket cap")
    quick = bench_report.quick()  # scripts/bench.sh --quick: the small model, fewer steps
    ap.add_argument("--steps", type=int, default=5 if quick else 10,
                    help="timed steps per fixed cap / after the choice")
    ap.add_argument("--warmup", type=int, default=2 if quick else 3)
    ap.add_argument("--models", default="narrow" if quick else "mlp,narrow",
                    help="mlp, narrow or both")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]))), flush=True)
        return 0

    tmp = tempfile.mkdtemp(prefix="gsat.", dir="/tmp")
    report = bench_report.Report("autotune_bench")
    models = args.models.split(",")
    progress = bench_report.Progress("autotune_bench", len(models) * (len(FIXED_CAPS_MB) + 1))
    rows = []
    try:
        for model_name in models:
            label = MODELS[model_name][0]
            fixed: Dict[float, float] = {}
            for cap in FIXED_CAPS_MB:
                progress.step(f"{model_name} cap {cap} MiB")
                times, _ = run(model_name, args.warmup + args.steps,
                               [f"--bucket-cap-mb={cap}", "--first-bucket-cap-mb=1"], tmp,
                               f"fixed{cap}")
                fixed[cap] = statistics.median(times[args.warmup:])
                print(f"  {label}: cap {cap} MiB: {fixed[cap] * 1e3:.1f} ms", file=sys.stderr,
                      flush=True)
            total = MODELS[model_name][4] + args.steps
            progress.step(f"{model_name} --autotune")
            times, log = run(model_name, total, ["--autotune"], tmp, "autotune")
            chosen = re.search(r"event=autotune_chosen index=\d+ first_bucket_cap_mb=(\S+) "
                               r"bucket_cap_mb=(\S+) median_step_s=\S+ at_iteration=(\d+)", log)
            if not chosen or int(chosen.group(3)) + 2 >= total:
                print(f"  {label}: autotune did not finish in {total} steps", file=sys.stderr)
                continue
            after = times[int(chosen.group(3)) + 1:]
            tuned = statistics.median(after)
            best_cap = min(fixed, key=fixed.get)
            rows.append((label, " / ".join(f"{c}: {fixed[c] * 1e3:.0f}" for c in FIXED_CAPS_MB),
                         f"{best_cap} MiB, {fixed[best_cap] * 1e3:.1f}",
                         f"first {chosen.group(1)}, cap {chosen.group(2)} MiB", len(after),
                         f"{tuned * 1e3:.1f}", f"{tuned / fixed[best_cap]:.2f}x"))
            print(f"  {label}: autotune chose {chosen.group(1)}/{chosen.group(2)} MiB: "
                  f"{tuned * 1e3:.1f} ms", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    progress.finish()
    report.table("--autotune vs fixed caps, 1 daemon x 2 trainers (DistributedOptimizer), "
                 "median step",
                 ["model", "fixed caps, MiB: ms", "best fixed", "autotune chose",
                  "steps after choice", "autotune step (ms)", "vs best fixed"], rows)
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
