#!/usr/bin/env python3
"""Where one cross-node iteration's time goes, hop by hop.

Runs sync_bench's 2 daemons x 1 trainer (one bucket) with
$GRADSYNC_HOP_TRACE set, so the trainers, the daemons and their Gloo
workers record each hop on the machine's monotonic clock
(common/hop_trace.h), then prints, per hop, the median time since the
previous hop of the same node (and the nodes' skew where both nodes pass
the same point). Iterations are aligned by order: the k-th record of a
hop on a node belongs to iteration k (one tensor, one bucket, one
collective per iteration).

  hop_report.py [--bytes=4096] [--iters=2000] [--warmup=100] [--daemon=PATH]
  hop_report.py --dir=DIR   (report on traces already written there)
"""
import argparse
import collections
import glob
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# In iteration order; each hop's time is measured from the one before it.
HOPS = ["trainer_mark", "daemon_mark_seen", "daemon_launch", "daemon_issue", "worker_received",
        "worker_gloo_start", "worker_gloo_done", "daemon_done_received", "daemon_posted",
        "trainer_woken"]


def load(directory: str) -> dict:
    """{(hop, node): [ns, ...]} in record order."""
    series = collections.defaultdict(list)
    for path in sorted(glob.glob(os.path.join(directory, "hops.*.tsv"))):
        with open(path) as f:
            for line in f:
                hop, node, ns = line.split("\t")
                series[(hop, int(node))].append(int(ns))
    return series


def report(series: dict, skip: int) -> str:
    nodes = sorted({node for (_, node) in series if node >= 0})
    n = min(len(series[(h, node)]) for h in HOPS for node in nodes)
    if n <= skip:
        raise SystemExit(f"hop_report: {n} aligned iterations, fewer than the {skip} skipped")
    out = [f"iterations {n - skip} (first {skip} skipped), nodes {nodes}; "
           "median (p10-p90) µs since the previous hop on the same node"]
    header = f"{'hop':<22}" + "".join(f"{'node ' + str(node):>24}" for node in nodes)
    out.append(header)
    for prev, hop in zip(HOPS, HOPS[1:]):
        row = f"{prev + ' ->':<22}\n{'  ' + hop:<22}"
        cells = []
        for node in nodes:
            a, b = series[(prev, node)], series[(hop, node)]
            d = sorted((b[k] - a[k]) / 1000 for k in range(skip, n))
            cells.append(f"{d[len(d) // 2]:9.1f} ({d[len(d) // 10]:.0f}-{d[len(d) * 9 // 10]:.0f})")
        out.append(row + "".join(f"{c:>24}" for c in cells))
    total = []
    for node in nodes:
        a, b = series[("trainer_mark", node)], series[("trainer_woken", node)]
        total.append(statistics.median((b[k] - a[k]) / 1000 for k in range(skip, n)))
    out.append(f"{'mark -> woken':<22}" + "".join(f"{t:24.1f}" for t in total))
    if len(nodes) == 2:
        out.append("skew between the nodes (node 1 - node 0), median (p10-p90) µs:")
        for hop in ("trainer_mark", "daemon_issue", "worker_gloo_start", "worker_gloo_done",
                    "trainer_woken"):
            a, b = series[(hop, nodes[0])], series[(hop, nodes[1])]
            d = sorted((b[k] - a[k]) / 1000 for k in range(skip, n))
            out.append(f"  {hop:<20} {d[len(d) // 2]:9.1f} ({d[len(d) // 10]:.0f}-"
                       f"{d[len(d) * 9 // 10]:.0f})")
        # Gloo's own time, from the later node's start: the exchange itself.
        g = sorted((min(series[("worker_gloo_done", m)][k] for m in nodes)
                    - max(series[("worker_gloo_start", m)][k] for m in nodes)) / 1000
                   for k in range(skip, n))
        out.append(f"  gloo from the later start to the first done: {g[len(g) // 2]:.1f} "
                   f"({g[len(g) // 10]:.0f}-{g[len(g) * 9 // 10]:.0f})")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--bytes", type=int, default=4096)
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--daemon", default=None, help="another gradsyncd (default: this build's)")
    p.add_argument("--dir", default=None, help="report on the traces in DIR, run nothing")
    args = p.parse_args()
    directory = args.dir
    if directory is None:
        import sync_bench
        directory = tempfile.mkdtemp(prefix="gshops.", dir="/tmp")
        os.environ["GRADSYNC_HOP_TRACE"] = directory
        r = sync_bench.run_gradsync_nodes(2, args.bytes, args.warmup, args.iters,
                                          daemon=args.daemon)
        print(f"trace in {directory}; bench p50 {r.get('p50')} µs, phases {r.get('stats')}")
    print(report(load(directory), skip=args.warmup))
    return 0


if __name__ == "__main__":
    sys.exit(main())
