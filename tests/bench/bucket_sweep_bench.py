#!/usr/bin/python3
"""bucket_sweep_bench: training step time vs the daemon's bucket cap.

The figure the PyTorch DDP paper uses to choose its 25 MB default: for two
models of different shapes, 2 trainers on one gradsyncd (started here), a
training step (zero_grad + forward + backward + gradsync's
DistributedOptimizer step) at bucket caps from 0.25 to 200 MB (log-spaced).

  mlp          6 x Linear(2048, 2048): 25.2M parameters in 12 large tensors
               (torch_step_bench's model)
  transformer  a small TransformerEncoder, 6 layers of d_model 256: 4.8M
               parameters in 72 small tensors

The reference, measured in the same run: each model's compute-only step (2
independent trainers, no synchronization). The daemon's default cap is
marked on the plot.

Writes bench-results/bucket_sweep_bench.json and
bench-results/bucket_sweep.png. Not a test: asserts nothing.

Run from the repository root after
`bazel build //client:libgradsync.so //daemon:gradsyncd`:

    /usr/bin/python3 tests/bench/bucket_sweep_bench.py [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import shutil
import tempfile
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_report  # noqa: E402

DEFAULT_CAP_MB = 25  # daemon/config.h bucket_cap_mb
MODELS = ["mlp", "transformer"]


def caps_mb(quick: bool) -> List[float]:
    if quick:
        return [0.25, 2.5, 25, 200]
    return [0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 200]


# --------------------------------------------------------------------------
# Worker side: one trainer process.


def build_model(name: str):
    import torch
    torch.manual_seed(0)
    if name == "mlp":
        layers: list = []
        for i in range(6):
            layers.append(torch.nn.Linear(2048, 2048))
            if i < 5:
                layers.append(torch.nn.ReLU())
        return torch.nn.Sequential(*layers), (32, 2048), (32, 2048)
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024,
                                             dropout=0.0, batch_first=True)
    return torch.nn.TransformerEncoder(layer, num_layers=6), (8, 32, 256), (8, 32, 256)


def worker(model_name: str, rank: int, steps: int, warmup: int) -> None:
    """Runs one measurement per stdin line ("compute", or "sync" once the
    driver has started a daemon with the next cap) and prints its result as
    JSON: torch starts once per model, not once per cap."""
    import time
    import torch

    torch.set_num_threads(1)
    model, x_shape, y_shape = build_model(model_name)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(*x_shape, generator=g), torch.randn(*y_shape, generator=g)
    params = list(model.parameters())
    for line in sys.stdin:
        sync = line.strip() == "sync"
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        if sync:
            import gradsync.torch as gst
            opt = gst.DistributedOptimizer(opt, model.named_parameters())
        times = []
        for i in range(warmup + steps):
            start = time.perf_counter()
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            if i >= warmup:
                times.append(time.perf_counter() - start)
        if sync:
            opt.close()
        print(json.dumps({"median_s": statistics.median(times), "tensors": len(params),
                          "params": sum(p.numel() for p in params)}), flush=True)


# --------------------------------------------------------------------------
# Driver side.


class Trainers:
    """The two trainer processes of one model, measuring on request."""

    def __init__(self, model: str, steps: int, warmup: int, socket_path: str):
        self.procs = []
        for rank in range(2):
            env = dict(os.environ, LOCAL_RANK=str(rank), OMP_NUM_THREADS="1",
                       GRADSYNC_SOCKET=socket_path,
                       PYTHONPATH=os.path.join(ROOT, "client", "python"))
            self.procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker", model, str(rank),
                 str(steps), str(warmup)], env=env, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, text=True))

    def measure(self, what: str) -> Dict:
        for p in self.procs:
            p.stdin.write(what + "\n")
            p.stdin.flush()
        results = []
        for p in self.procs:
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"a trainer exited with code {p.wait()}")
            results.append(json.loads(line))
        # Synchronized trainers move in lockstep; report the slowest.
        return {**results[0], "median_s": max(r["median_s"] for r in results)}

    def close(self) -> None:
        for p in self.procs:
            p.stdin.close()
        for p in self.procs:
            p.wait(timeout=60)


def plot(report: bench_report.Report, caps: List[float], results: Dict, compute: Dict) -> None:
    fig, ax = bench_report.figure(
        "Training step time vs bucket cap, 2 trainers, gradsync DistributedOptimizer",
        "bucket cap (MB, log scale)", "step time, median (ms)")
    colors = {"mlp": "tab:blue", "transformer": "tab:orange"}
    for model in MODELS:
        info = compute[model]
        label = f"{model} ({info['params'] / 1e6:.1f}M params, {info['tensors']} tensors)"
        ax.plot(caps, [results[model][c] * 1e3 for c in caps], "o-", color=colors[model],
                label=label)
        ax.axhline(info["median_s"] * 1e3, color=colors[model], linestyle=":",
                   label=f"{model}: compute only, no sync (reference)")
    ax.axvline(DEFAULT_CAP_MB, color="gray", linestyle="--",
               label=f"default cap ({DEFAULT_CAP_MB} MB)")
    ax.set_xscale("log")
    ax.set_xticks(caps)
    ax.set_xticklabels([f"{c:g}" for c in caps])
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
    report.plot(fig, "bucket_sweep")


def main() -> int:
    ap = argparse.ArgumentParser(description="step time vs bucket cap")
    ap.add_argument("--quick", action="store_true", help="fewer caps and steps")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per point")
    ap.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        model, rank, steps, warmup = args.worker
        worker(model, int(rank), int(steps), int(warmup))
        return 0

    from gradsync.daemon import LocalDaemon

    quick = bench_report.quick()
    caps = caps_mb(quick)
    steps = args.steps or (4 if quick else 15)
    warmup = 2 if quick else 3
    report = bench_report.Report("bucket_sweep_bench")
    progress = bench_report.Progress("bucket_sweep_bench", len(MODELS) * (len(caps) + 1))
    tmp = tempfile.mkdtemp(prefix="gsbb.", dir="/tmp")
    sock = os.path.join(tmp, "gs.sock")
    compute: Dict[str, Dict] = {}
    results: Dict[str, Dict[float, float]] = {m: {} for m in MODELS}
    try:
        for model in MODELS:
            progress.step(f"{model}: compute only")
            trainers = Trainers(model, steps, warmup, sock)
            try:
                compute[model] = trainers.measure("compute")
                for cap in caps:
                    progress.step(f"{model}: cap {cap:g} MB")
                    daemon = LocalDaemon(sock, 2, ["--timeout-s=300", f"--bucket-cap-mb={cap}"],
                                         log_path=os.path.join(tmp, f"{model}-{cap}.log")).start()
                    try:
                        results[model][cap] = trainers.measure("sync")["median_s"]
                    finally:
                        daemon.stop()
            finally:
                trainers.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    progress.finish()

    rows = []
    for cap in caps:
        row: list = [cap]
        for model in MODELS:
            row += [results[model][cap] * 1e3, results[model][cap] / compute[model]["median_s"]]
        rows.append(row)
    rows.append(["compute only (reference)"] + sum(
        ([compute[m]["median_s"] * 1e3, 1.0] for m in MODELS), []))
    report.table(
        f"Step time vs bucket cap: 2 trainers, median of {steps} steps after {warmup} warm-up",
        ["cap MB"] + sum(([f"{m} ms", f"{m} vs compute"] for m in MODELS), []), rows,
        note=f"Models: " + "; ".join(
            f"{m} {compute[m]['params'] / 1e6:.1f}M params in {compute[m]['tensors']} tensors"
            for m in MODELS) + f". Default cap {DEFAULT_CAP_MB} MB (first bucket 1 MB).")
    plot(report, caps, results, compute)
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
