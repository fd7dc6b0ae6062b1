#!/usr/bin/python3
"""torch_step_bench: one training step of a 25.2M-parameter MLP, 2 trainers.

Model: 6 x Linear(2048, 2048) with ReLU between (25.2M fp32 parameters,
100 MB of gradients), batch 32 per trainer, MSE loss, plain SGD; a step is
zero_grad + forward + backward + synchronization + optimizer step. In one
run, measured one after the other (never overlapping):

  compute only, 1 process     the model alone on the machine
  compute only, 2 processes   2 independent trainers, no synchronization:
                              the compute-only step docs/PERFORMANCE.md's
                              targets are relative to (2 trainers share the
                              machine's cores and memory bandwidth)
  lockstep only               compute only, 2 processes, plus a 4-byte
                              allreduce (torch gloo) after each backward:
                              no gradient moves, but every step waits for
                              the slower trainer, as every synchronous
                              data-parallel step does (the floor of any
                              gradient synchronization on this machine)
  torch DDP (gloo)            DistributedDataParallel, default 25 MB buckets
  gradsync DistributedOptimizer   gradients in the daemon's shared memory
  gradsync DDP allreduce_hook     DDP kept, buckets sent through gradsync

Every variant's trainers get the heap settings gradsync.run gives its
trainers (gradsync.trainer_malloc: freed memory kept for the next step),
references included, so that the comparison is of the synchronization
alone; ``--glibc-malloc-defaults`` runs every variant with glibc's
defaults instead; ``--launched-elsewhere`` starts the trainers as torchrun
would, with no heap variables, so the gradsync variants set their heap
when they connect and the references keep glibc's defaults (the table's
note says which).

The machine may be shared and noisy: the variants run in ``--rounds``
interleaved rounds (A B C D E, A B C D E, ...; at least 5, also with
--quick), and the table reports, per variant, the median over rounds of
each round's median step time, the spread of the rounds (min-max), and the
ratios to compute only and to DDP: of the medians, and the min-max of the
same ratio taken within each round (variants of one round ran minutes
apart at most, so a round's ratio cancels most of the machine's drift). Prints one markdown table and writes it
to bench-results/torch_step_bench.json with a bar plot
(bench-results/torch_step.png). Not a test: asserts nothing.

Run from the repository root after
`bazel build //client:libgradsync.so //daemon:gradsyncd`:

    /usr/bin/python3 tests/bench/torch_step_bench.py [--steps 20] [--rounds 3] [--threads 1]
        [--quick]   (--quick, or GRADSYNC_BENCH_QUICK=1: 4 steps, 5 rounds)
        [--glibc-malloc-defaults | --launched-elsewhere]

$GRADSYNC_BENCH_DAEMON_ARGS adds flags to the daemons it starts (e.g.
"--reduce-threads=2" or "--bucket-cap-mb=10"). $GRADSYNC_BENCH_REFERENCE_DAEMON
(a gradsyncd path, e.g. one built from main) adds a row: the
DistributedOptimizer through that binary, for a before/after in one run.
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
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_report  # noqa: E402
from gradsync import trainer_malloc  # noqa: E402

WIDTH, LAYERS, BATCH = 2048, 6, 32
LOCKSTEP_LABEL = "lockstep only (4-byte allreduce per step)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------
# Worker side: one trainer process.


def worker(variant: str, rank: int, world: int, port: int, steps: int, warmup: int,
           threads: int) -> Dict[str, float]:
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    layers: List[torch.nn.Module] = []
    for i in range(LAYERS):
        layers.append(torch.nn.Linear(WIDTH, WIDTH))
        if i < LAYERS - 1:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(BATCH, WIDTH, generator=g)
    y = torch.randn(BATCH, WIDTH, generator=g)
    sgd = torch.optim.SGD(model.parameters(), lr=1e-4)
    net, opt, cleanup = model, sgd, None

    barrier = None
    if variant == "lockstep":
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)
        barrier = torch.zeros(1)
    if variant in ("ddp", "gradsync_hook"):
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)
        net = DDP(model)
        if variant == "gradsync_hook":
            import gradsync.torch as gst
            state = gst.AllreduceHookState(net)
            net.register_comm_hook(state, gst.allreduce_hook)
            cleanup = state.close
    elif variant == "gradsync":
        import gradsync.torch as gst
        opt = gst.DistributedOptimizer(sgd, model.named_parameters())
        cleanup = opt.close

    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        if barrier is not None:
            dist.all_reduce(barrier)
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    if cleanup is not None:
        cleanup()
    if variant in ("ddp", "gradsync_hook", "lockstep"):
        import torch.distributed as dist
        dist.destroy_process_group()
    return {"median": statistics.median(times)}


# --------------------------------------------------------------------------
# Driver side.


def run_variant(variant: str, nproc: int, args: argparse.Namespace,
                socket_path: Optional[str]) -> Dict[str, float]:
    port = free_port()
    procs = []
    for rank in range(nproc):
        env = dict(os.environ, LOCAL_RANK=str(rank), OMP_NUM_THREADS=str(args.threads),
                   PYTHONPATH=os.path.join(ROOT, "client", "python"))
        if socket_path:
            env["GRADSYNC_SOCKET"] = socket_path
        if args.glibc_malloc_defaults:
            env.update(trainer_malloc.opt_out_env())
        elif not args.launched_elsewhere:
            env.update(trainer_malloc.steady_heap_env(env))
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", variant, str(rank),
             str(nproc), str(port), str(args.steps), str(args.warmup), str(args.threads)],
            env=env, stdout=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=900)
        if p.returncode != 0:
            raise RuntimeError(f"{variant} worker failed with code {p.returncode}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    # Synchronized trainers move in lockstep; report the slowest trainer.
    return {"median": max(r["median"] for r in results)}


def main() -> int:
    ap = argparse.ArgumentParser(description="training step: gradsync vs torch DDP vs compute")
    quick = bench_report.quick()
    ap.add_argument("--steps", type=int, default=4 if quick else 20,
                    help="timed steps per variant")
    ap.add_argument("--warmup", type=int, default=2 if quick else 3)
    ap.add_argument("--rounds", type=int, default=5,
                    help="interleaved repetitions (the median of them is reported)")
    ap.add_argument("--quick", action="store_true", help="fewer steps (GRADSYNC_BENCH_QUICK=1 too)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per trainer")
    ap.add_argument("--glibc-malloc-defaults", action="store_true",
                    help="run every variant's trainers with glibc's malloc defaults instead "
                         "of gradsync.run's heap settings")
    ap.add_argument("--launched-elsewhere", action="store_true",
                    help="start the trainers as torchrun would: no heap variables; the "
                         "gradsync variants set their heap when they connect, the "
                         "references keep glibc's defaults")
    ap.add_argument("--worker", nargs=7, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        v, rank, world, port, steps, warmup, threads = args.worker
        print(json.dumps(worker(v, int(rank), int(world), int(port), int(steps), int(warmup),
                                int(threads))))
        return 0

    from gradsync.daemon import LocalDaemon
    import torch

    tmp = tempfile.mkdtemp(prefix="gsb.", dir="/tmp")
    sock = os.path.join(tmp, "gs.sock")
    variants = [("compute only, 1 process", "compute", 1, False),
                ("compute only, 2 processes", "compute", 2, False),
                (LOCKSTEP_LABEL, "lockstep", 2, False),
                ("torch DDP (gloo)", "ddp", 2, False),
                ("gradsync DistributedOptimizer", "gradsync", 2, True),
                ("gradsync DDP allreduce_hook", "gradsync_hook", 2, True)]
    reference_daemon = os.environ.get("GRADSYNC_BENCH_REFERENCE_DAEMON")
    if reference_daemon:
        variants.append(("gradsync DistributedOptimizer, reference gradsyncd", "gradsync", 2,
                         True))
    medians: Dict[str, List[float]] = {v[0]: [] for v in variants}
    report = bench_report.Report("torch_step_bench")
    progress = bench_report.Progress("torch_step_bench", args.rounds * len(variants))
    load_before = os.getloadavg()[0]
    for rnd in range(args.rounds):
        for label, variant, nproc, needs_daemon in variants:
            progress.step(f"round {rnd + 1}/{args.rounds}: {label}")
            daemon = None
            if needs_daemon:
                binary = reference_daemon if label.endswith("reference gradsyncd") else None
                daemon = LocalDaemon(sock, nproc, ["--timeout-s=300"] + os.environ.get("GRADSYNC_BENCH_DAEMON_ARGS", "").split(),
                                     binary=binary,
                                     log_path=os.path.join(tmp, f"{variant}.log")).start()
            try:
                r = run_variant(variant, nproc, args, sock if needs_daemon else None)
            finally:
                if daemon is not None:
                    daemon.stop()
            medians[label].append(r["median"])
    load_after = os.getloadavg()[0]
    progress.finish()
    shutil.rmtree(tmp, ignore_errors=True)

    p50 = {label: statistics.median(v) for label, v in medians.items()}
    compute2 = p50["compute only, 2 processes"]
    ddp = p50["torch DDP (gloo)"]
    lockstep = p50[LOCKSTEP_LABEL]
    params = LAYERS * (WIDTH * WIDTH + WIDTH)
    title = (f"Training step, {LAYERS} x Linear({WIDTH},{WIDTH}) = {params / 1e6:.1f}M fp32 "
             f"parameters, batch {BATCH}/trainer")
    def round_ratios(label: str, ref: str) -> str:
        r = [a / b for a, b in zip(medians[label], medians[ref])]
        return f"{min(r):.3f}-{max(r):.3f}"

    heap = ("glibc's malloc defaults" if args.glibc_malloc_defaults else
            "no heap variables, as under torchrun: the gradsync variants set the steady "
            "heap with mallopt when they connect, the references keep glibc's defaults"
            if args.launched_elsewhere else
            "gradsync.run's (freed memory kept: MALLOC_MMAP_THRESHOLD_ and "
            "MALLOC_TRIM_THRESHOLD_) for every variant")
    report.table(
        title, ["variant", "trainers", "step, median of rounds (ms)", "rounds min-max (ms)",
                "vs compute only (2 proc)", "per round min-max", "vs lockstep only",
                "per round min-max", "vs torch DDP", "per round min-max"],
        [[label, nproc, p50[label] * 1e3,
          f"{min(medians[label]) * 1e3:.1f}-{max(medians[label]) * 1e3:.1f}",
          p50[label] / compute2, round_ratios(label, "compute only, 2 processes"),
          p50[label] / lockstep, round_ratios(label, LOCKSTEP_LABEL),
          p50[label] / ddp, round_ratios(label, "torch DDP (gloo)")]
         for label, _, nproc, _ in variants],
        note=f"torch {torch.__version__}, {args.threads} thread(s)/trainer, {os.cpu_count()} "
             f"cores; per round the median of {args.steps} steps after {args.warmup} warm-up; "
             f"{args.rounds} interleaved rounds; load average {load_before:.1f} before, "
             f"{load_after:.1f} after; trainers' heap: {heap}. Targets (docs/PERFORMANCE.md): gradsync step <= 1.15x "
             "compute only, <= 0.6x DDP.")
    fig, ax = bench_report.figure(
        f"Training step, 2 trainers: {params / 1e6:.1f}M-parameter MLP, batch {BATCH}/trainer",
        "step time, median of rounds (ms)", "variant", size=(9, 4))
    labels = [v[0] for v in variants]
    refs = {"compute only, 1 process", "compute only, 2 processes", LOCKSTEP_LABEL,
            "torch DDP (gloo)"}
    colors = ["#bdbdbd" if label in refs else "#3182bd" for label in labels]
    ax.barh(range(len(labels)), [p50[label] * 1e3 for label in labels], color=colors)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.set_xlim(0, max(p50.values()) * 1e3 * 1.1)
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color="#bdbdbd", label="reference (same run)"),
                       Patch(color="#3182bd", label="gradsync")], loc="upper right")
    report.plot(fig, "torch_step")
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
