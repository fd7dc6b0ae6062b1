#!/usr/bin/python3
"""buffers_bench: the cost of ``broadcast_buffers`` per step, ResNet-18, gradsync vs DDP.

DDP (``broadcast_buffers=True``, its default) broadcasts rank 0's buffers
(BatchNorm's running statistics) before every forward; gradsync's
``DistributedOptimizer(module=...)`` does the same through gs_broadcast.
Model: ResNet-18 as torchvision builds it (BasicBlock, BatchNorm, 11.7M
parameters, 20 BatchNorm layers: 9,600 fp32 running statistics + 20 int64
counters, 38.5 KB of buffers), written here (torchvision is not a
dependency); input 3x64x64, batch 4 per trainer, 2 trainers on one node,
SGD. Two figures per framework, measured in one run:

  buffer sync alone   one call of exactly what runs before each forward
                      (DDP: ``_sync_buffers()``, a coalesced Gloo broadcast;
                      gradsync: the forward pre-hook, one gs_broadcast),
                      median of --calls calls between steps
  step, on - off      the median training step with broadcast_buffers=True
                      minus the one with False (what a user pays; noisy:
                      the step is ~100x longer than the sync)

Variants alternate round by round (DDP on, DDP off, gradsync on, gradsync
off), so the machine's drift hits all alike; each figure is the median of
its rounds, with the rounds' min-max beside the sync's. Prints one markdown
table, writes bench-results/buffers_bench.json. Not a test: asserts nothing.

$GRADSYNC_BENCH_REFERENCE_ROOT (a checkout of another revision, e.g. the
integration branch, built with `bazel build //client:libgradsync.so
//daemon:gradsyncd`) adds that revision's daemon, library and Python
package as a third framework in every round: a before/after in one run.

Run from the repository root after
`bazel build //client:libgradsync.so //daemon:gradsyncd`:

    /usr/bin/python3 tests/bench/buffers_bench.py [--quick] [--rounds 3] [--steps 6]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REFERENCE_ROOT = os.environ.get("GRADSYNC_BENCH_REFERENCE_ROOT", "")
# Whose gradsync package a worker imports (the driver sets it per variant).
PACKAGE_ROOT = os.environ.get("GRADSYNC_BENCH_PACKAGE_ROOT", ROOT)
sys.path.insert(0, os.path.join(PACKAGE_ROOT, "client", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_report  # noqa: E402

BATCH, SIZE = 4, 64


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------
# ResNet-18, torchvision's architecture (its module and buffer layout).


def resnet18(num_classes: int = 1000):
    import torch.nn as nn

    class BasicBlock(nn.Module):
        def __init__(self, inplanes: int, planes: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = None
            if stride != 1 or inplanes != planes:
                self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False),
                                                nn.BatchNorm2d(planes))

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            return self.relu(self.bn2(self.conv2(out)) + identity)

    class ResNet18(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            layers, inplanes = [], 64
            for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
                layers.append(nn.Sequential(BasicBlock(inplanes, planes, stride),
                                            BasicBlock(planes, planes, 1)))
                inplanes = planes
            self.layer1, self.layer2, self.layer3, self.layer4 = layers
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(512, num_classes)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(self.avgpool(x).flatten(1))

    return ResNet18()


# --------------------------------------------------------------------------
# Worker side: one trainer process.


def worker(variant: str, buffers: bool, rank: int, world: int, port: int, steps: int,
           warmup: int, calls: int) -> Dict[str, float]:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(rank)  # unseeded replicas, as users write them: both frameworks align them
    model = resnet18()
    g = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(BATCH, 3, SIZE, SIZE, generator=g)
    y = torch.randint(0, 1000, (BATCH,), generator=g)
    sgd = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    if variant == "ddp":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)
        net, opt = DDP(model, broadcast_buffers=buffers), sgd
        sync_buffers = net._sync_buffers  # what DDP's forward runs first
    else:
        import gradsync.torch as gst
        net = model
        opt = gst.DistributedOptimizer(sgd, model.named_parameters(), module=model,
                                       broadcast_buffers=buffers)
        sync_buffers = lambda: opt._before_forward(model, ())  # the forward pre-hook  # noqa: E731

    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    sync_times = []
    if buffers:
        for _ in range(calls):
            start = time.perf_counter()
            sync_buffers()
            sync_times.append(time.perf_counter() - start)
    if variant == "ddp":
        import torch.distributed as dist
        dist.destroy_process_group()
    else:
        opt.close()
    return {"step": statistics.median(times),
            "sync": statistics.median(sync_times) if sync_times else 0.0}


# --------------------------------------------------------------------------
# Driver side.


def run_variant(variant: str, buffers: bool, args: argparse.Namespace,
                socket_path: Optional[str]) -> Dict[str, float]:
    port = free_port()
    procs = []
    root = REFERENCE_ROOT if variant == "reference" else ROOT
    for rank in range(2):
        env = dict(os.environ, LOCAL_RANK=str(rank), OMP_NUM_THREADS="1",
                   PYTHONPATH=os.path.join(root, "client", "python"),
                   GRADSYNC_BENCH_PACKAGE_ROOT=root,
                   GRADSYNC_LIB=os.path.join(root, "bazel-bin", "client", "libgradsync.so"))
        if socket_path:
            env["GRADSYNC_SOCKET"] = socket_path
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", variant, str(int(buffers)),
             str(rank), "2", str(port), str(args.steps), str(args.warmup), str(args.calls)],
            env=env, stdout=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=900)
        if p.returncode != 0:
            raise RuntimeError(f"{variant} worker failed with code {p.returncode}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    # Synchronized trainers move in lockstep: the slowest trainer's figures.
    return {k: max(r[k] for r in results) for k in ("step", "sync")}


def main() -> int:
    quick = bench_report.quick()
    ap = argparse.ArgumentParser(description="broadcast_buffers per step: gradsync vs DDP")
    ap.add_argument("--steps", type=int, default=4 if quick else 10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--calls", type=int, default=20 if quick else 100,
                    help="timed buffer syncs per variant")
    ap.add_argument("--rounds", type=int, default=3 if quick else 5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--worker", nargs=8, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        v, on, rank, world, port, steps, warmup, calls = args.worker
        print(json.dumps(worker(v, on == "1", int(rank), int(world), int(port), int(steps),
                                int(warmup), int(calls))))
        return 0

    from gradsync.daemon import LocalDaemon
    import torch

    tmp = tempfile.mkdtemp(prefix="gsbuf.", dir="/tmp")
    sock = os.path.join(tmp, "gs.sock")
    variants = [("ddp", True), ("ddp", False), ("gradsync", True), ("gradsync", False)]
    if REFERENCE_ROOT:
        variants += [("reference", True), ("reference", False)]
    runs: Dict[tuple, List[Dict[str, float]]] = {v: [] for v in variants}
    report = bench_report.Report("buffers_bench")
    progress = bench_report.Progress("buffers_bench", args.rounds * len(variants))
    for rnd in range(args.rounds):
        for variant, buffers in variants:
            progress.step(f"round {rnd + 1}/{args.rounds}: {variant} broadcast_buffers={buffers}")
            daemon = None
            if variant != "ddp":
                root = REFERENCE_ROOT if variant == "reference" else ROOT
                daemon = LocalDaemon(sock, 2, ["--timeout-s=300"],
                                     binary=os.path.join(root, "bazel-bin", "daemon", "gradsyncd"),
                                     log_path=os.path.join(tmp, "daemon.log")).start()
            try:
                runs[(variant, buffers)].append(
                    run_variant(variant, buffers, args, sock if daemon else None))
            finally:
                if daemon is not None:
                    daemon.stop()
    progress.finish()
    shutil.rmtree(tmp, ignore_errors=True)

    def med(variant: str, buffers: bool, key: str) -> float:
        return statistics.median(r[key] for r in runs[(variant, buffers)])

    def per_round(variant: str) -> str:
        d = [(a["step"] - b["step"]) * 1e3
             for a, b in zip(runs[(variant, True)], runs[(variant, False)])]
        return " ".join(f"{v:+.1f}" for v in d)

    def spread(variant: str) -> str:
        syncs = [r["sync"] * 1e6 for r in runs[(variant, True)]]
        return f"{min(syncs):.0f}-{max(syncs):.0f}"

    ddp_sync = med("ddp", True, "sync")
    rows = []
    labels = [("ddp", "torch DDP (gloo), broadcast_buffers=True (reference)"),
              ("gradsync", "gradsync DistributedOptimizer(module=), broadcast_buffers=True")]
    if REFERENCE_ROOT:
        labels.append(("reference", f"the same, built from {REFERENCE_ROOT}"))
    for variant, label in labels:
        sync = med(variant, True, "sync")
        on, off = med(variant, True, "step"), med(variant, False, "step")
        rows.append([label, sync * 1e6, spread(variant), sync / ddp_sync, on * 1e3, off * 1e3,
                     (on - off) * 1e3, per_round(variant)])
    model = resnet18()
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
    params = sum(p.numel() for p in model.parameters())
    report.table(
        f"broadcast_buffers per step, ResNet-18 ({params / 1e6:.1f}M parameters, "
        f"{buffer_bytes / 1e3:.1f} KB of buffers in {len(list(model.buffers()))} tensors), "
        f"1 node x 2 trainers (median of {args.rounds} alternated rounds)",
        ["what", "buffer sync alone, p50 (us)", "rounds min-max (us)", "vs DDP's",
         "step, on (ms)", "step, off (ms)",
         "step on - off (ms)", "per-round on - off (ms)"],
        rows,
        note=f"torch {torch.__version__}, 1 thread/trainer, {os.cpu_count()} cores; input "
             f"3x{SIZE}x{SIZE}, batch {BATCH}/trainer, SGD; per round the median of "
             f"{args.steps} steps after {args.warmup} warm-up and of {args.calls} buffer syncs. "
             "Buffer sync: DDP's _sync_buffers() (coalesced Gloo broadcast from rank 0), "
             "gradsync's forward pre-hook (one gs_broadcast of every buffer, packed). "
             "The step difference is within the steps' noise on a shared machine.")
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
