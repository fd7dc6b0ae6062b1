#!/usr/bin/python3
"""sync_bench: gradsync iterations against Gloo and torch.distributed.

Starts a real gradsyncd and N real trainer processes (bench_trainer) and
times a synchronized iteration (first mark_ready -> gs_wait returns) for
100 MB of fp32 gradients in 4 x 25 MB buckets, and for one 4 KB bucket.
In the same run it times torch.distributed.all_reduce (gloo backend) of the
same sizes with the same number of processes: the reference from
docs/PERFORMANCE.md.

A second table runs N daemons on loopback (N "nodes", one trainer each,
the bucket cap set so each size is one bucket) and compares a gradsync
iteration with a plain Gloo allreduce program (gloo_allreduce_bench) and
torch.distributed with the same number of processes.

A sweep of message sizes (4 KB to 256 MB, one bucket each) times, with 2
processes, a gradsync iteration on one daemon and across 2 daemons, torch
gloo and plain Gloo, and plots bandwidth vs size, the latency CDF of the
4 KB iteration, and where a bucket's time goes (the daemons' own stats:
wait for ready, local reduce, collective, write-back).

Every figure compared is the same statistic: the p50 of single iterations
(gradsync: first mark_ready -> gs_wait; torch: one all_reduce and divide;
plain Gloo: one gloo::allreduce), with the p10-p90 spread beside it.
$GRADSYNC_BENCH_REFERENCE_DAEMON (a gradsyncd path, e.g. one built from
main) adds a 2-daemon column for that binary to the sweep, alternated with
this build's in $GRADSYNC_BENCH_XNODE_ROUNDS rounds per size (default 1;
the median of the rounds' p50s): a before/after in one run.

--xnode-only runs only 2 daemons x $GRADSYNC_BENCH_XNODE_LOCAL trainers
(default 1) at $GRADSYNC_BENCH_XNODE_SIZES (bytes, default
4096,65536,1048576) against torch gloo and plain Gloo (2 processes), and
the reference (with $GRADSYNC_BENCH_REFERENCE_TRAINER, a bench_trainer
built with the reference's client library, if given), each once per round
for $GRADSYNC_BENCH_XNODE_ROUNDS rounds (default 5): medians of the rounds'
p50s with their min-max, and ratios taken within each round.

Prints markdown tables; writes bench-results/sync_bench.json and
bench-results/*.png (bench_report). Not a test: asserts nothing.

Run from the repository root after `bazel build //daemon:gradsyncd
//tools/gradsyncctl //tests/bench:bench_trainer //tests/bench:gloo_allreduce_bench`:
  /usr/bin/python3 tests/bench/sync_bench.py [--quick]
"""
from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import bench_report

GLOO_BENCH = None  # set in main
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DAEMON = os.path.join(ROOT, "bazel-bin/daemon/gradsyncd")
TRAINER = os.path.join(ROOT, "bazel-bin/tests/bench/bench_trainer")
CTL = os.path.join(ROOT, "bazel-bin/tools/gradsyncctl/gradsyncctl")
QUICK = bench_report.quick()
# The bucket phases the daemon reports (control.proto BucketStats), in order.
PHASES = ["wait_for_ready", "local_reduce", "collective", "write_back"]

SIZES = [("100 MB (4 x 25 MB buckets)", 100 << 20, 4, 5, 20), ("4 KB (1 bucket)", 4096, 1, 200, 2000)]


def collect(procs: list, stats: dict | None = None) -> dict:
    """Median over the trainers of their p10/p50/p90/p99 iteration times (µs)."""
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        m = re.search(r"p50_us=([\d.]+) p99_us=([\d.]+) mean_us=[\d.]+ p10_us=([\d.]+) "
                      r"p90_us=([\d.]+)", out)
        if p.returncode != 0 or not m:
            raise RuntimeError(f"bench_trainer failed: {out}")
        results.append([float(g) for g in m.groups()])
    return {k: statistics.median(r[i] for r in results)
            for i, k in enumerate(("p50", "p99", "p10", "p90"))} | {"stats": stats}


def spread(r: dict | None) -> str | None:
    """'p10-p90' of a result, for the tables."""
    return f"{r['p10']:.0f}-{r['p90']:.0f}" if r and "p10" in r else None


def daemon_phases(addr: str, token_file: str | None) -> dict | None:
    """p50 µs of bucket 0's phases and total, from `gradsyncctl stats --json`."""
    if not os.path.exists(CTL):
        return None
    cmd = [CTL, "--addr", addr] + (["--token-file", token_file] if token_file else [])
    out = subprocess.run(cmd + ["stats", "--json"], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        print(f"gradsyncctl stats failed: {out.stderr.strip()}", file=sys.stderr)
        return None
    buckets = json.loads(out.stdout).get("buckets", [])
    if not buckets:
        print(f"gradsyncctl stats at {addr}: no buckets", file=sys.stderr)
        return None
    b = buckets[0]
    return {k: float(b.get(k, {}).get("p50_us", 0.0)) for k in PHASES + ["total"]}


def free_port_number() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_daemons(nodes: int, tmp: str, prefix: str, extra: list, daemon: str | None = None,
                  local: int = 1) -> list:
    """N daemons on loopback (node 0 leads) of `local` trainers each, one
    socket each under tmp; returns once every socket exists."""
    port = free_port_number()
    token_file = f"{tmp}/token"
    with open(os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write("sync-bench-token\n")  # multi-node daemons need one (mode 0600)
    daemons = []
    for n in range(nodes):
        where = [f"--listen=127.0.0.1:{port}"] if n == 0 else [
            f"--leader=127.0.0.1:{port}", "--listen=127.0.0.1:0"]
        daemons.append(subprocess.Popen(
            [daemon or DAEMON, f"--socket={tmp}/s{n}", f"--num-nodes={nodes}", f"--node-rank={n}",
             f"--local-size={local}", f"--shm-prefix={prefix}{os.getpid()}x{n}", "--timeout-s=120",
             f"--job-token-file={token_file}",
             *extra, *where],
            stdout=subprocess.DEVNULL, stderr=open(f"{tmp}/d{n}.log", "w")))
    deadline = time.time() + 20
    while not all(os.path.exists(f"{tmp}/s{n}") for n in range(nodes)) and time.time() < deadline:
        time.sleep(0.01)
    daemons[0].leader_addr = f"127.0.0.1:{port}"  # for gradsyncctl
    daemons[0].token_file = token_file
    return daemons


def stop_daemons(daemons: list) -> None:
    for d in daemons:
        d.terminate()
    for d in daemons:
        d.wait(timeout=30)


def run_gradsync_nodes(nodes: int, nbytes: int, warmup: int, iters: int,
                       samples_out: str | None = None, daemon: str | None = None,
                       trainer: str | None = None, local: int = 1) -> dict:
    """N daemons (node 0 leads) with `local` bench_trainers each; one bucket of
    nbytes. Node 0's bucket phases in "stats"; node 0's samples to samples_out.
    One retry: at the end of a run a trainer that detached first can fail
    its peer node's last wait ("detached: gs_close"), a known race."""
    try:
        return run_gradsync_nodes_once(nodes, nbytes, warmup, iters, samples_out, daemon, trainer,
                                       local)
    except RuntimeError as e:
        print(f"sync_bench: retrying a failed run of {nodes} daemons, {nbytes} B: "
              f"{str(e)[-300:]}", file=sys.stderr)
        return run_gradsync_nodes_once(nodes, nbytes, warmup, iters, samples_out, daemon, trainer,
                                       local)


def run_gradsync_nodes_once(nodes: int, nbytes: int, warmup: int, iters: int,
                            samples_out: str | None, daemon: str | None,
                            trainer: str | None = None, local: int = 1) -> dict:
    tmp = tempfile.mkdtemp(prefix="gsbn.", dir="/tmp")
    cap_mb = nbytes / (1 << 20)
    daemons = []
    try:
        daemons = start_daemons(nodes, tmp, "gsbn",
                                [f"--bucket-cap-mb={cap_mb}", f"--first-bucket-cap-mb={cap_mb}"],
                                daemon, local)
        procs = [subprocess.Popen(
            [trainer or TRAINER, f"--socket={tmp}/s{n}", f"--bytes={nbytes}", "--tensors=1",
             f"--iters={iters}", f"--warmup={warmup}"]
            + ([f"--samples-out={samples_out}"] if samples_out and n == 0 and r == 0 else []),
            env={**os.environ, "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE, text=True)
            for n in range(nodes) for r in range(local)]
        result = collect(procs)
        result["stats"] = daemon_phases(daemons[0].leader_addr, daemons[0].token_file)
        return result
    finally:
        stop_daemons(daemons)
        shutil.rmtree(tmp, ignore_errors=True)


def run_join(nodes: int) -> float:
    """Seconds from starting one trainer per daemon (daemons already up) to
    every trainer having joined, formed the job and finished one 4 KB
    iteration: the rendezvous, layout agreement, Gloo connect and a
    collective."""
    tmp = tempfile.mkdtemp(prefix="gsbj.", dir="/tmp")
    daemons = []
    try:
        daemons = start_daemons(nodes, tmp, "gsbj", [])
        start = time.perf_counter()
        procs = [subprocess.Popen(
            [TRAINER, f"--socket={tmp}/s{n}", "--bytes=4096", "--tensors=1", "--iters=1",
             "--warmup=0"],
            env={**os.environ, "LOCAL_RANK": "0"}, stdout=subprocess.PIPE, text=True)
            for n in range(nodes)]
        collect(procs)
        return time.perf_counter() - start
    finally:
        stop_daemons(daemons)
        shutil.rmtree(tmp, ignore_errors=True)


def run_plain_gloo(nodes: int, sizes_bytes=(25_000_000, 100_000_000), iters: int = 5,
                   rounds: int = 2) -> dict:
    """Per size (bytes), gloo_allreduce_bench's plain_gloo row in µs:
    {"p50", "p10", "p90", "mean"} of single allreduces."""
    sizes_mb = ",".join(f"{b / 1e6:g}" for b in sizes_bytes)
    out = subprocess.run([GLOO_BENCH, f"--nodes={nodes}", f"--sizes_mb={sizes_mb}",
                          f"--warmup={1 if QUICK else 2}",
                          f"--iters={iters}", f"--rounds={rounds}"],
                         capture_output=True, text=True, timeout=900).stdout
    rows, header = {}, []
    for line in out.splitlines():
        f = line.split()
        if f and f[0] == "nodes":
            header = f
        elif header and len(f) >= 4 and f[2] == "plain_gloo":
            # The reference's own "vs_plain" is empty: index the tail from the end.
            col = dict(zip(header[:4] + header[-3:], f[:4] + f[-3:]))
            mb = float(col["size_MB"])
            nearest = min(sizes_bytes, key=lambda b: abs(b / 1e6 - mb))
            rows[nearest] = {"p50": float(col["p50_ms"]) * 1000, "p10": float(col["p10_ms"]) * 1000,
                             "p90": float(col["p90_ms"]) * 1000,
                             "mean": float(col["time_ms"]) * 1000}  # us
    return rows


def busbw(nbytes: int, n: int, us: float) -> float:
    return nbytes / (us / 1e6) / 1e9 * 2 * (n - 1) / n


def run_gradsync(nproc: int, nbytes: int, tensors: int, warmup: int, iters: int,
                 one_bucket: bool = False, samples_out: str | None = None) -> dict:
    """Median over trainers of their p50/p99 iteration time, in microseconds;
    the daemon's bucket phases in "stats"; rank 0's samples to samples_out."""
    tmp = tempfile.mkdtemp(prefix="gsb.", dir="/tmp")
    sock = os.path.join(tmp, "s")
    port = free_port_number()
    cap = nbytes / (1 << 20)
    caps = [f"--bucket-cap-mb={cap}", f"--first-bucket-cap-mb={cap}"] if one_bucket else []
    daemon = subprocess.Popen(
        [DAEMON, f"--socket={sock}", f"--listen=127.0.0.1:{port}", f"--local-size={nproc}",
         f"--shm-prefix=gsbench{os.getpid()}", "--timeout-s=120", *caps],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "daemon.log"), "w"))
    try:
        deadline = time.time() + 10
        while not os.path.exists(sock) and time.time() < deadline:
            time.sleep(0.01)
        procs = [subprocess.Popen(
            [TRAINER, f"--socket={sock}", f"--bytes={nbytes}", f"--tensors={tensors}",
             f"--iters={iters}", f"--warmup={warmup}"]
            + ([f"--samples-out={samples_out}"] if samples_out and r == 0 else []),
            env={**os.environ, "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE, text=True)
            for r in range(nproc)]
        result = collect(procs)
        result["stats"] = daemon_phases(f"127.0.0.1:{port}", None)
        return result
    finally:
        daemon.terminate()
        daemon.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)


# One process of torch.distributed's reference: every size of the spec in
# one process, so torch's start-up (seconds here) is paid once.
TORCH_WORKER = r"""
import json, sys, time, torch, torch.distributed as dist
torch.set_num_threads(1)
rank, world, port, spec = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + port, rank=rank, world_size=world)
for nbytes, warmup, iters, samples_out in spec:
    t = torch.ones(nbytes // 4)
    times = []
    for i in range(warmup + iters):
        dist.barrier()
        a = time.perf_counter()
        dist.all_reduce(t)
        t.div_(world)
        if i >= warmup:
            times.append((time.perf_counter() - a) * 1e6)
    if samples_out and rank == 0:
        with open(samples_out, "w") as f:
            f.write("".join("%.3f\n" % v for v in times))
    times.sort()
    print("result bytes=%d p50_us=%.2f p99_us=%.2f p10_us=%.2f p90_us=%.2f" % (
          nbytes, times[len(times) // 2], times[min(len(times) - 1, len(times) * 99 // 100)],
          times[len(times) // 10], times[min(len(times) - 1, len(times) * 9 // 10)]), flush=True)
dist.destroy_process_group()
"""


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torch_sizes(nproc: int, spec: list) -> dict:
    """torch gloo allreduce for each (nbytes, warmup, iters, samples_out) of
    spec in one group of nproc processes: {nbytes: {"p50", "p99"}} in µs
    (median over ranks); {} without torch."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return {}
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, "-c", TORCH_WORKER, str(r), str(nproc), port,
                               json.dumps(spec)],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for r in range(nproc)]
    per_size: dict = {}
    for p in procs:
        out, _ = p.communicate(timeout=900)
        if p.returncode != 0:
            raise RuntimeError(f"torch gloo worker failed with code {p.returncode}: {out}")
        for m in re.finditer(r"bytes=(\d+) p50_us=([\d.]+) p99_us=([\d.]+) p10_us=([\d.]+) "
                             r"p90_us=([\d.]+)", out):
            per_size.setdefault(int(m.group(1)), []).append([float(g) for g in m.groups()[1:]])
    return {b: {k: statistics.median(r[i] for r in v)
                for i, k in enumerate(("p50", "p99", "p10", "p90"))}
            for b, v in per_size.items()}


def run_torch(nproc: int, nbytes: int, warmup: int, iters: int) -> dict | None:
    return run_torch_sizes(nproc, [(nbytes, warmup, iters, None)]).get(nbytes)


def sweep_sizes() -> list:
    """Message sizes of the bandwidth sweep: 4 KB to 256 MB (64 MB with --quick)."""
    if QUICK:
        return [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]
    return [4 << (2 * k) for k in range(0, 9)]  # 4 KB, 16 KB, ..., 256 MB (x4)


def sweep_iters(nbytes: int) -> tuple:
    """(warmup, iters): many for small messages (the latency CDF needs
    them), a few for large ones (each takes ~0.1-1 s here)."""
    iters = max(3, min(2000 if not QUICK else 1000, int(4e8 / max(nbytes, 1))))
    return max(1, iters // 10), iters


def read_samples(path: str) -> list:
    with open(path) as f:
        return sorted(float(line) for line in f if line.strip())


def algbw_gbps(nbytes: int, us: float | None) -> float | None:
    return None if not us else nbytes / (us / 1e6) / 1e9


def plot_bandwidth(report, rows: list) -> None:
    fig, ax = bench_report.figure(
        "Allreduce bandwidth vs message size, 2 processes (higher is better)\n"
        "p50 of single iterations / allreduces for every series",
        "message size (bytes, log scale)", "algorithm bandwidth (GB/s) = bytes / time")
    sizes = [r[0] for r in rows]
    series = [(1, "gradsync local: 1 daemon, 2 trainers (shared memory)", "o-"),
              (2, "gradsync cross-node: 2 daemons on loopback", "s-"),
              (3, "torch.distributed gloo, 2 processes", "^--"),
              (4, "plain Gloo ring, 2 processes", "v--")]
    for col, label, style in series:
        pts = [(size, algbw_gbps(size, r[col])) for size, r in zip(sizes, rows) if r[col]]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes)
    ax.set_xticklabels([bench_report.size_label(v) for v in sizes], rotation=30)
    ax.legend()
    report.plot(fig, "sync_bandwidth_vs_size")


def plot_cdf(report, samples: dict) -> None:
    fig, ax = bench_report.figure("Latency CDF of one 4 KB iteration, 2 processes",
                                  "iteration time (µs, log scale)", "fraction of iterations ≤ x")
    for label, values in samples.items():
        if values:
            n = len(values)
            ax.step(values, [(i + 1) / n for i in range(n)], where="post",
                    label=f"{label} (p50 {values[n // 2]:.0f} µs, n={n})")
    ax.set_xscale("log")
    ax.set_ylim(0, 1.01)
    ax.legend(loc="lower right")
    report.plot(fig, "sync_latency_cdf_4kb")


def plot_phases(report, rows: list) -> None:
    """Horizontal stacked bars: each phase's share of the bucket's total p50."""
    colors = {"wait_for_ready": "#9ecae1", "local_reduce": "#3182bd", "collective": "#e6550d",
              "write_back": "#31a354", "other": "#bdbdbd"}
    fig, ax = bench_report.figure(
        "Where one bucket's time goes (daemon stats, p50 per phase)",
        "share of the bucket's time, first ready -> done (%)", "run", size=(9, 5))
    labels = []
    for y, (label, ph) in enumerate(rows):
        total = max(ph["total"], sum(ph[k] for k in PHASES), 1e-9)
        parts = [(k, ph[k]) for k in PHASES] + [("other", total - sum(ph[k] for k in PHASES))]
        left = 0.0
        for k, v in parts:
            width = 100 * v / total
            ax.barh(y, width, left=left, color=colors[k], label=k if y == 0 else None)
            left += width
        labels.append(f"{label}\n(total p50 {total:.0f} µs)")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels)
    ax.set_xlim(0, 100)
    ax.invert_yaxis()
    ax.legend(ncol=5, loc="upper center", bbox_to_anchor=(0.5, -0.15), fontsize="small")
    report.plot(fig, "sync_phase_breakdown")


def run_sweep(report, progress) -> None:
    sizes = sweep_sizes()
    tmp = tempfile.mkdtemp(prefix="gsbs.", dir="/tmp")
    paths = {k: os.path.join(tmp, f"{k}.txt") for k in ("local", "xnode", "torch")}
    progress.step("plain Gloo, every size")
    plain = run_plain_gloo(2, sizes, iters=3 if QUICK else 5, rounds=1 if QUICK else 2)
    progress.step("torch gloo, every size")
    torch_spec = []
    for nbytes in sizes:
        warmup, iters = sweep_iters(nbytes)
        small = nbytes == sizes[0]
        torch_spec.append((nbytes, warmup, max(3, iters // 2 if small else iters // 4),
                           paths["torch"] if small else None))
    torch_results = run_torch_sizes(2, torch_spec)
    reference = os.environ.get("GRADSYNC_BENCH_REFERENCE_DAEMON")
    xnode_rounds = max(1, int(os.environ.get("GRADSYNC_BENCH_XNODE_ROUNDS", "1")))
    rows, spreads, ref_rows, phases, cdf = [], [], [], [], {}
    for nbytes in sizes:
        label = bench_report.size_label(nbytes)
        warmup, iters = sweep_iters(nbytes)
        small = nbytes == sizes[0]
        progress.step(f"{label}: gradsync local")
        loc = run_gradsync(2, nbytes, 1, warmup, iters, one_bucket=True,
                           samples_out=paths["local"] if small else None)
        progress.step(f"{label}: gradsync 2 daemons")
        # With a reference binary the two alternate, round by round, so the
        # machine's drift hits both alike; each one's figure is the median
        # of its rounds' p50s (spread: the median p10 and p90).
        new_runs, ref_runs = [], []
        for rnd in range(xnode_rounds if reference else 1):
            new_runs.append(run_gradsync_nodes(
                2, nbytes, warmup, iters,
                samples_out=paths["xnode"] if small and rnd == 0 else None))
            if reference:
                ref_runs.append(run_gradsync_nodes(2, nbytes, warmup, iters, daemon=reference))
        xn = {k: statistics.median(r[k] for r in new_runs) for k in ("p50", "p99", "p10", "p90")}
        xn["stats"] = new_runs[0]["stats"]
        t = torch_results.get(nbytes)
        pg = plain.get(nbytes)
        p = pg["p50"] if pg else None
        rows.append([nbytes, loc["p50"], xn["p50"], t["p50"] if t else None, p,
                     algbw_gbps(nbytes, loc["p50"]), algbw_gbps(nbytes, xn["p50"]),
                     algbw_gbps(nbytes, t["p50"]) if t else None, algbw_gbps(nbytes, p)])
        spreads.append([label, spread(loc), spread(xn), spread(t), spread(pg),
                        xn["p50"] / t["p50"] if t else None, xn["p50"] / p if p else None])
        if reference:
            ref = {k: statistics.median(r[k] for r in ref_runs) for k in ("p50", "p10", "p90")}
            ref_rows.append([label, len(new_runs), xn["p50"], spread(xn), ref["p50"], spread(ref),
                             xn["p50"] / ref["p50"],
                             " ".join(f"{a['p50'] / b['p50']:.2f}"
                                      for a, b in zip(new_runs, ref_runs)),
                             t["p50"] if t else None, p])
        if small:
            cdf = {"gradsync local": read_samples(paths["local"]),
                   "gradsync 2 daemons": read_samples(paths["xnode"]),
                   "torch gloo": read_samples(paths["torch"]) if t else []}
        for name, r in (("local, 2 trainers", loc), ("2 daemons", xn)):
            if r["stats"] and (small or nbytes in (1 << 20, 64 << 20)):
                phases.append((f"{name}, {label}", r["stats"]))
    shutil.rmtree(tmp, ignore_errors=True)
    report.table(
        "Allreduce vs message size, 2 processes, one bucket (p50 µs; algbw GB/s)",
        ["bytes", "gradsync local µs", "gradsync 2 daemons µs", "torch gloo µs", "plain Gloo µs",
         "local GB/s", "2 daemons GB/s", "torch gloo GB/s", "plain Gloo GB/s"], rows,
        note="Every column is the p50 of single iterations: gradsync: first mark_ready -> "
             "gs_wait; torch gloo: barrier, all_reduce, divide (untimed barrier); plain Gloo: one "
             "gloo::allreduce (gloo_allreduce_bench). References measured in this run.")
    report.table(
        "Spread of the same runs (p10-p90 µs) and the 2-daemon ratios (p50 / p50)",
        ["bytes", "gradsync local", "gradsync 2 daemons", "torch gloo", "plain Gloo",
         "2 daemons / torch gloo", "2 daemons / plain Gloo"], spreads,
        note="Targets (docs/PERFORMANCE.md): 2 daemons <= 1.1x torch gloo at 4 KB-1 MB, "
             "<= 1.05x at 16 MB and more; <= 1.1x plain Gloo at every size.")
    if ref_rows:
        report.table(
            "2 daemons x 1 trainer: this build vs the reference gradsyncd, alternated "
            "(median of rounds' p50 µs)",
            ["bytes", "rounds", "this build p50", "p10-p90", "reference p50", "p10-p90",
             "this / reference", "per-round ratios", "torch gloo p50", "plain Gloo p50"],
            ref_rows, note=f"reference: {reference}")
    report.table("4 KB iteration latency percentiles (µs)", ["run", "p50", "p90", "p99", "max", "n"],
                 [[k, v[len(v) // 2], v[len(v) * 9 // 10], v[min(len(v) - 1, len(v) * 99 // 100)],
                   v[-1], len(v)] for k, v in cdf.items() if v])
    report.table("Bucket phases from the daemon's stats (p50 µs; bucket 0, one bucket per "
                 "iteration)", ["run"] + PHASES + ["total", "total / collective"],
                 [[label] + [ph[k] for k in PHASES + ["total"]]
                  + [ph["total"] / ph["collective"] if ph["collective"] else None]
                  for label, ph in phases],
                 note="total: first ready -> done; the rest of it (not in a phase) is the "
                      "scheduler's launch and completion posting. On one node the write-back "
                      "is fused into the local reduce.")
    plot_bandwidth(report, rows)
    plot_cdf(report, cdf)
    if phases:
        plot_phases(report, phases)


def ratio_cell(ratios: list) -> str:
    """'median (min-max)' of per-round ratios."""
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


def run_xnode_rounds(report) -> None:
    """--xnode-only: 2 daemons x 1 trainer against torch gloo and plain Gloo
    (and the reference build, given), every variant once per round, rounds
    back to back, so the machine's drift hits all alike. Per variant: the
    median of the rounds' p50s (min-max of the rounds' p50s); the ratios
    are taken within each round (median, min-max)."""
    sizes = [int(b) for b in os.environ.get("GRADSYNC_BENCH_XNODE_SIZES",
                                            "4096,65536,1048576").split(",")]
    rounds = max(1, int(os.environ.get("GRADSYNC_BENCH_XNODE_ROUNDS", "5")))
    local = max(1, int(os.environ.get("GRADSYNC_BENCH_XNODE_LOCAL", "1")))
    ref_daemon = os.environ.get("GRADSYNC_BENCH_REFERENCE_DAEMON")
    ref_trainer = os.environ.get("GRADSYNC_BENCH_REFERENCE_TRAINER")
    progress = bench_report.Progress("sync_bench --xnode-only", rounds * (2 + 2 * len(sizes)))
    p50 = {k: {b: [] for b in sizes} for k in ("this", "reference", "torch", "plain")}
    # Node 0's bucket total / collective phase per round (daemon stats, p50).
    phase_ratio = {k: {b: [] for b in sizes} for k in ("this", "reference")}

    def gradsync_round(key: str, b: int, **kw) -> None:
        warmup, iters = sweep_iters(b)
        r = run_gradsync_nodes(2, b, warmup, iters, local=local, **kw)
        p50[key][b].append(r["p50"])
        st = r.get("stats")
        if st and st.get("collective"):
            phase_ratio[key][b].append(st["total"] / st["collective"])

    for rnd in range(rounds):
        progress.step(f"round {rnd + 1}: torch gloo")
        torch_results = run_torch_sizes(
            2, [(b, *(lambda w, i: (w, max(3, i // 2)))(*sweep_iters(b)), None) for b in sizes])
        progress.step(f"round {rnd + 1}: plain Gloo")
        # As many allreduces as the largest size's gradsync run has (200 at most).
        plain = run_plain_gloo(2, sizes, iters=min(200, max(sweep_iters(b)[1] for b in sizes)),
                               rounds=1)
        for b in sizes:
            p50["torch"][b].append(torch_results[b]["p50"] if b in torch_results else None)
            p50["plain"][b].append(plain[b]["p50"] if b in plain else None)
            progress.step(f"round {rnd + 1}: {b} B, this build")
            gradsync_round("this", b)
            if ref_daemon:
                progress.step(f"round {rnd + 1}: {b} B, reference")
                gradsync_round("reference", b, daemon=ref_daemon, trainer=ref_trainer)
    variants = ["this", "reference", "torch", "plain"] if ref_daemon else ["this", "torch", "plain"]
    rows = []
    for b in sizes:
        row = [bench_report.size_label(b), rounds]
        for v in variants:
            vals = [x for x in p50[v][b] if x is not None]
            row.append(f"{statistics.median(vals):.0f} ({min(vals):.0f}-{max(vals):.0f})"
                       if vals else None)
        for v in variants[1:]:
            pairs = [a / c for a, c in zip(p50["this"][b], p50[v][b]) if c]
            row.append(ratio_cell(pairs) if pairs else None)
        rows.append(row)
    names = {"this": "this build", "reference": "reference build", "torch": "torch gloo",
             "plain": "plain Gloo"}
    report.table(
        f"2 daemons x {local} trainer(s) vs torch gloo and plain Gloo (2 processes), alternated "
        "in rounds (p50 µs: median of the rounds' p50s, min-max of the rounds)",
        ["bytes", "rounds"] + [names[v] for v in variants]
        + [f"this / {names[v]} (per round: median, min-max)" for v in variants[1:]], rows,
        note=f"reference: {ref_daemon} with trainer {ref_trainer or TRAINER}; load average "
             f"{os.getloadavg()[0]:.1f} at the end")
    builds = ["this", "reference"] if ref_daemon else ["this"]
    report.table(
        "Node 0's bucket total / its collective phase (daemon stats, p50; median, min-max of "
        "the rounds)",
        ["bytes"] + [names[v] for v in builds],
        [[bench_report.size_label(b)]
         + [ratio_cell(phase_ratio[v][b]) if phase_ratio[v][b] else None for v in builds]
         for b in sizes],
        note="the collective phase is the bucket's critical path from its first piece's "
             "collective to its last one's return (later sums and write-backs run inside it); "
             "builds before 2026-11-27 (latency4) counted only the daemon's wait for the "
             "collectives, so their figure is larger for the same overlap")


def main() -> int:
    global GLOO_BENCH
    GLOO_BENCH = os.path.join(ROOT, "bazel-bin/tests/bench/gloo_allreduce_bench")
    for path in (DAEMON, TRAINER, GLOO_BENCH):
        if not os.path.exists(path):
            print(f"missing {path}: run bazel build //daemon:gradsyncd //tools/gradsyncctl "
                  "//tests/bench:bench_trainer //tests/bench:gloo_allreduce_bench")
            return 1
    if "--xnode-only" in sys.argv:
        report = bench_report.Report("sync_bench_xnode")
        run_xnode_rounds(report)
        report.write()
        return 0
    report = bench_report.Report("sync_bench")
    procs_local = (2,) if QUICK else (2, 4)
    cross_nodes = () if QUICK else (2, 4)  # --quick: the sweep's 2-daemon column covers it
    join_nodes = (2, 4, 8) if QUICK else (2, 4, 8, 16)
    steps = ((len(SIZES) + 1) * len(procs_local) + 2 + 2 * len(sweep_sizes())
             + 3 * len(cross_nodes) + len(join_nodes))
    progress = bench_report.Progress("sync_bench", steps)

    rows = []
    sizes = [(label, nbytes, tensors, *((max(2, warmup // 2), max(10, iters // 2)) if QUICK
                                        else (warmup, iters)))
             for label, nbytes, tensors, warmup, iters in SIZES]
    for nproc in procs_local:
        progress.step(f"one node, torch gloo, {nproc} processes")
        torch_results = run_torch_sizes(nproc, [(nbytes, max(2, warmup // 2), max(5, iters // 4),
                                                 None) for _, nbytes, _, warmup, iters in sizes])
        for label, nbytes, tensors, warmup, iters in sizes:
            progress.step(f"one node, {label}, {nproc} processes")
            g = run_gradsync(nproc, nbytes, tensors, warmup, iters)
            t = torch_results.get(nbytes)
            rows.append([label, nproc, g["p50"], g["p99"], t["p50"] if t else None,
                         t["p99"] if t else None, g["p50"] / t["p50"] if t else None])
    report.table("One synchronized iteration on one node: gradsync vs torch.distributed (gloo)",
                 ["size", "processes", "gradsync p50 µs", "gradsync p99 µs", "torch gloo p50 µs",
                  "torch gloo p99 µs", "gradsync / torch (p50)"], rows,
                 note="Targets (docs/PERFORMANCE.md): 100 MB with 2 trainers <= 0.28x torch gloo, "
                      "with 4 <= 0.30x; 4 KB p50 <= 10 µs. 4 processes on 2 cores oversubscribe "
                      "(small-message latency jumps).")

    run_sweep(report, progress)

    rows = []
    for nodes in cross_nodes:
        progress.step(f"cross-node, {nodes} daemons: plain Gloo")
        plain = run_plain_gloo(nodes)
        for mb in (25, 100):
            progress.step(f"cross-node, {nodes} daemons, {mb} MB: gradsync and torch")
            nbytes = mb << 20
            g = run_gradsync_nodes(nodes, nbytes, 2, 8)
            t = run_torch(nodes, nbytes, 2, 5)
            pg = plain.get(mb * 1_000_000)
            p = pg["p50"] if pg else None
            rows.append([f"{mb} MB", nodes, g["p50"], busbw(nbytes, nodes, g["p50"]),
                         p, busbw(mb * 1_000_000, nodes, p) if p else None,
                         t["p50"] if t else None, busbw(nbytes, nodes, t["p50"]) if t else None,
                         busbw(nbytes, nodes, g["p50"]) / busbw(mb * 1_000_000, nodes, p)
                         if p else None])
    if rows:
        report.table("Across nodes on loopback: N daemons x 1 trainer, one bucket per iteration",
                     ["size", "nodes", "gradsync p50 µs", "busbw GB/s", "plain Gloo p50 µs",
                      "busbw GB/s", "torch gloo µs", "busbw GB/s", "gradsync busbw / plain Gloo"],
                     rows, note="Target: busbw >= 0.95 of plain Gloo with 2 daemons. gradsync's "
                                "time is a whole iteration (mark_ready -> gs_wait), plain Gloo's "
                                "one allreduce call; both p50s.")

    rows = []
    for nodes in join_nodes:
        progress.step(f"join + first iteration, {nodes} daemons")
        secs = run_join(nodes)
        rows.append([nodes, secs, secs / nodes])
    report.table("Join + first iteration: N daemons on loopback, one trainer each",
                 ["daemons", "seconds", "seconds per daemon"], rows,
                 note="Daemons already up, one run per count: a rough figure. The one to judge "
                      "is join_bench's (from daemon start, rounds alternated, spread printed; "
                      "target < 0.5 s with 16 daemons).")
    progress.finish()
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
