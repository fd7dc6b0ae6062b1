#!/usr/bin/python3
"""link_bench: gradsync against torch DDP over a real, rate-limited link.

Two "hosts" are two network namespaces joined by a veth pair (10.231.77.1
and 10.231.77.2, names gsal-*), each end limited with `tc qdisc ... tbf` to
1 Gbit/s, then to 10 Gbit/s. Each host runs 2 trainers:

  gradsync   one gradsyncd per host (node 0 leads, on its veth address); the
             two trainers of a host are summed in shared memory, so one
             node-level reduction crosses the link.
  torch DDP  4 gloo processes (2 per host), ranks in host order, so DDP's
             ring crosses the link like it would between two machines.

Workloads: the 25.2M-parameter MLP of torch_step_bench.py (a full training
step, batch 32 per trainer) and 100 MB of gradients synchronized alone
(gradsync: tests/bench/bench_trainer, 4 tensors of 25 MB; torch: gloo
allreduce of DDP's 25 MB buckets). Per cell: the median step time of the
slowest trainer, and the bytes the veth carried (both directions) per step,
read from its counters over the whole run divided by its steps.

Writes bench-results/link_bench.json and bench-results/link_bench.png and
prints the table. Needs root (namespaces, tc). Not a test: asserts nothing.

    bazel build //daemon:gradsyncd //client:libgradsync.so //tests/bench:bench_trainer
    /usr/bin/python3 tests/bench/link_bench.py [--steps 8] [--warmup 2] [--rates 1gbit,10gbit]
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shutil
import signal
import socket as pysocket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

import bench_report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GRADSYNCD = os.path.join(ROOT, "bazel-bin/daemon/gradsyncd")
BENCH_TRAINER = os.path.join(ROOT, "bazel-bin/tests/bench/bench_trainer")

# Names and a subnet only this benchmark uses.
HOSTS = [("gsal-a", "gsal-va", "10.231.77.1"), ("gsal-b", "gsal-vb", "10.231.77.2")]
DAEMON_PORT, DDP_PORT = 29517, 29518
WIDTH, LAYERS, BATCH = 2048, 6, 32
GRAD_BYTES, GRAD_TENSORS = 100 * 1000 * 1000, 4


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), check=check, capture_output=True, text=True)


def in_ns(ns: str, cmd: List[str]) -> List[str]:
    return ["ip", "netns", "exec", ns] + cmd


# --------------------------------------------------------------------------
# The link.


def remove_link() -> None:
    for ns, _, _ in HOSTS:
        sh("ip", "netns", "del", ns, check=False)  # takes its veth end along


def make_link(rate: str) -> None:
    remove_link()
    for ns, _, _ in HOSTS:
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    (ns_a, dev_a, _), (ns_b, dev_b, _) = HOSTS
    sh("ip", "link", "add", dev_a, "netns", ns_a, "type", "veth", "peer", "name", dev_b, "netns",
       ns_b)
    for ns, dev, addr in HOSTS:
        sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
        sh("ip", "-n", ns, "link", "set", dev, "up")
        # Each direction limited at its sender.
        sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
           "burst", "256kb", "latency", "50ms")


def link_bytes() -> int:
    total = 0
    for ns, dev, _ in HOSTS:
        out = sh(*in_ns(ns, ["cat", f"/sys/class/net/{dev}/statistics/tx_bytes"])).stdout
        total += int(out.strip())
    return total


# --------------------------------------------------------------------------
# Worker side: one torch trainer process (run inside its host's namespace).


def make_mlp():
    import torch
    layers = []
    for i in range(LAYERS):
        layers.append(torch.nn.Linear(WIDTH, WIDTH))
        if i < LAYERS - 1:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def worker(variant: str, rank: int, world: int, steps: int, warmup: int) -> Dict[str, float]:
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    times: List[float] = []
    if variant == "grad_ddp":
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"tcp://{HOSTS[0][2]}:{DDP_PORT}", rank=rank,
                                world_size=world)
        buckets = [torch.ones(GRAD_BYTES // GRAD_TENSORS // 4) for _ in range(GRAD_TENSORS)]
        for i in range(warmup + steps):
            start = time.perf_counter()
            for b in buckets:
                dist.all_reduce(b)
            if i >= warmup:
                times.append(time.perf_counter() - start)
        dist.destroy_process_group()
        return {"median": statistics.median(times)}

    model = make_mlp()
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(BATCH, WIDTH, generator=g)
    y = torch.randn(BATCH, WIDTH, generator=g)
    sgd = torch.optim.SGD(model.parameters(), lr=1e-4)
    net, opt, cleanup = model, sgd, None
    if variant == "mlp_ddp":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo", init_method=f"tcp://{HOSTS[0][2]}:{DDP_PORT}", rank=rank,
                                world_size=world)
        net = DDP(model)
    else:
        import gradsync.torch as gst
        opt = gst.DistributedOptimizer(sgd, model.named_parameters())
        cleanup = opt.close
    for i in range(warmup + steps):
        start = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    if cleanup is not None:
        cleanup()
    if variant == "mlp_ddp":
        import torch.distributed as dist
        dist.destroy_process_group()
    return {"median": statistics.median(times)}


# --------------------------------------------------------------------------
# Driver side.


def wait_for_socket(path: str, proc: subprocess.Popen, log: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gradsyncd exited: {open(log).read()[-2000:]}")
        with pysocket.socket(pysocket.AF_UNIX) as s:
            try:
                s.connect(path)
                return
            except OSError:
                pass
        time.sleep(0.05)  # polling a state with a deadline
    raise RuntimeError(f"gradsyncd did not come up: {open(log).read()[-2000:]}")


def start_daemons(tmp: str) -> List[subprocess.Popen]:
    token = os.path.join(tmp, "token")
    with open(os.open(token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write("link-bench-token\n")
    daemons = []
    for rank, (ns, _, addr) in enumerate(HOSTS):
        sock = os.path.join(tmp, f"n{rank}.sock")
        log = os.path.join(tmp, f"n{rank}.log")
        args = [GRADSYNCD, f"--socket={sock}", "--num-nodes=2", f"--node-rank={rank}",
                "--local-size=2", "--job-id=linkbench", f"--job-token-file={token}",
                f"--shm-prefix=gsal{rank}", "--timeout-s=600"]
        args += [f"--listen={addr}:{DAEMON_PORT}"] if rank == 0 else [
            f"--listen={addr}:0", f"--leader={HOSTS[0][2]}:{DAEMON_PORT}"]
        args += os.environ.get("GRADSYNC_BENCH_DAEMON_ARGS", "").split()
        p = subprocess.Popen(in_ns(ns, args), stdout=open(log, "w"), stderr=subprocess.STDOUT)
        daemons.append(p)
        wait_for_socket(sock, p, log)
    return daemons


def stop(procs: List[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_cell(variant: str, args: argparse.Namespace, tmp: str) -> Dict[str, float]:
    """One (system, workload) on the current link: median step, link bytes per step."""
    gradsync = variant in ("mlp_gradsync", "grad_gradsync")
    daemons = start_daemons(tmp) if gradsync else []
    procs = []
    before = link_bytes()
    try:
        for host, (ns, dev, _) in enumerate(HOSTS):
            for local in range(2):
                env = dict(os.environ, LOCAL_RANK=str(local), OMP_NUM_THREADS="1",
                           GLOO_SOCKET_IFNAME=dev,
                           PYTHONPATH=os.path.join(ROOT, "client", "python"),
                           GRADSYNC_SOCKET=os.path.join(tmp, f"n{host}.sock"))
                if variant == "grad_gradsync":
                    cmd = [BENCH_TRAINER, f"--socket={env['GRADSYNC_SOCKET']}",
                           f"--bytes={GRAD_BYTES}", f"--tensors={GRAD_TENSORS}",
                           f"--iters={args.steps}", f"--warmup={args.warmup}"]
                else:
                    cmd = [sys.executable, os.path.abspath(__file__), "--worker", variant,
                           str(2 * host + local), "4", str(args.steps), str(args.warmup)]
                procs.append(subprocess.Popen(in_ns(ns, cmd), env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True))
        medians = []
        for p in procs:
            out, _ = p.communicate(timeout=1800)
            if p.returncode != 0:
                raise RuntimeError(f"{variant} trainer failed ({p.returncode}): {out[-3000:]}")
            last = out.strip().splitlines()[-1]
            if variant == "grad_gradsync":
                medians.append(float(re.search(r"p50_us=([\d.]+)", last).group(1)) * 1e-6)
            else:
                medians.append(json.loads(last)["median"])
    finally:
        stop(procs)
        stop(daemons)
    steps = args.steps + args.warmup
    # Synchronized trainers move in lockstep: the slowest one is the job's step.
    return {"step_s": max(medians), "link_mb_per_step": (link_bytes() - before) / steps / 1e6}


def plot(rows: List[List], report: "bench_report.Report") -> None:
    import matplotlib
    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt
    labels = sorted({(r[0], r[1]) for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, col, title in ((axes[0], 3, "step time (ms)"), (axes[1], 4, "MB on the link per step")):
        for k, system in enumerate(("gradsync", "torch DDP (gloo)")):
            values = [next((r[col] for r in rows if (r[0], r[1]) == lab and r[2] == system), 0)
                      for lab in labels]
            ax.bar([i + 0.4 * k for i in range(len(labels))], values, width=0.4, label=system)
        ax.set_xticks([i + 0.2 for i in range(len(labels))])
        ax.set_xticklabels([f"{w}\n{r}" for w, r in labels], fontsize=8)
        ax.set_title(title)
        ax.legend()
    fig.suptitle("2 hosts (netns + veth + tbf) x 2 trainers: gradsync vs torch DDP")
    report.plot(fig, "link_bench")


def main() -> int:
    ap = argparse.ArgumentParser(description="gradsync vs torch DDP over a rate-limited veth")
    quick = bench_report.quick()  # scripts/bench.sh --quick: fewer steps
    ap.add_argument("--steps", type=int, default=3 if quick else 8)
    ap.add_argument("--warmup", type=int, default=1 if quick else 2)
    ap.add_argument("--rates", default="1gbit,10gbit")
    ap.add_argument("--workloads", default="mlp,grad")
    ap.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        v, rank, world, steps, warmup = args.worker
        print(json.dumps(worker(v, int(rank), int(world), int(steps), int(warmup))), flush=True)
        return 0
    if os.geteuid() != 0:
        print("link_bench: needs root (ip netns, tc); skipped")
        return 0
    for path in (GRADSYNCD, BENCH_TRAINER):
        if not os.path.exists(path):
            print(f"missing {path}: run bazel build //daemon:gradsyncd //client:libgradsync.so "
                  "//tests/bench:bench_trainer")
            return 1
    # The namespaces go whatever happens (a signal too).
    atexit.register(remove_link)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    tmp = tempfile.mkdtemp(prefix="gsal.", dir="/tmp")
    atexit.register(shutil.rmtree, tmp, True)

    workload_names = {"mlp": "25.2M MLP step", "grad": "100 MB gradients"}
    rates, workloads = args.rates.split(","), args.workloads.split(",")
    report = bench_report.Report("link_bench")
    progress = bench_report.Progress("link_bench", 2 * len(rates) * len(workloads))
    rows: List[List] = []
    for rate in rates:
        make_link(rate)
        for w in workloads:
            for system, variant in (("gradsync", f"{w}_gradsync"), ("torch DDP (gloo)", f"{w}_ddp")):
                progress.step(f"{rate} {workload_names[w]} {system}")
                r = run_cell(variant, args, tmp)
                rows.append([workload_names[w], rate, system, round(r["step_s"] * 1e3, 1),
                             round(r["link_mb_per_step"], 1)])
    progress.finish()
    remove_link()

    for row in rows:  # the ratio against DDP in the same run, same link and workload
        ddp = next(r for r in rows if r[0] == row[0] and r[1] == row[1] and r[2] != "gradsync")
        row.append(f"{row[3] / ddp[3]:.2f}x" if ddp[3] else "-")
    report.table(
        "gradsync vs torch DDP over a rate-limited veth (2 hosts x 2 trainers)",
        ["workload", "link", "system", "step (ms)", "MB on link / step", "time vs DDP"], rows,
        note=(f"{args.steps} steps after {args.warmup} warm-up, median step of the slowest "
              f"trainer; bytes from the veth's tx counters"))
    try:
        plot(rows, report)
    except ImportError as e:
        print(f"no plot: {e}", file=sys.stderr)
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
