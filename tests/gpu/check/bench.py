"""GPU benchmark on the one GPU, every contender with 2 real NCCL ranks (two
processes with distinct NCCL_HOSTID over NCCL_SOCKET_IFNAME=lo, so NCCL
runs its network transport with kernels on both ranks):

    bench.py gradsync OUT_JSON SIZE_BYTES   # under gradsync.run, 2 nodes x 1 trainer
    bench.py torch OUT_JSON SIZE_BYTES...   # one of 2 ranks (RANK, WORLD_SIZE=2):
                                            # torch DDP (NCCL) and plain ncclAllReduce
    bench.py table DIR [JSON_OUT]           # prints the table from DIR/*.json

The gradients: 4 fp32 tensors of SIZE/4 bytes each (buckets of 25 MB, the
daemon's and DDP's default cap). An iteration writes every gradient on the
current stream (the "backward"), has it averaged, and ends when the average
is usable on the host's side; its time is host wall time, p50 over the timed
iterations after warm-up. "Plain ncclAllReduce" is torch.distributed's
all_reduce on the NCCL backend over one flat buffer, one call per 25 MB
(as many calls as buckets), no copies or overlap: the floor. "Added per
bucket" is (gradsync - plain) / buckets.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Dict, List

import torch

WARMUP, ITERS, TENSORS = 5, 30, 4
CAP = 25 << 20


def tensor_numels(size: int) -> List[int]:
    return [max(1, size // 4 // TENSORS)] * TENSORS


def p50_ms(times: List[float]) -> float:
    return statistics.median(times) * 1e3


def bench_gradsync(out: str, size: int) -> None:
    import gradsync.torch as gs_torch
    device = torch.device("cuda", torch.cuda.current_device())
    params = [torch.nn.Parameter(torch.zeros(n, device=device)) for n in tensor_numels(size)]
    opt = gs_torch.DistributedOptimizer(torch.optim.SGD(params, lr=0.0),
                                        [(f"g{i}", p) for i, p in enumerate(params)])
    times = []
    for it in range(WARMUP + ITERS):
        start = time.perf_counter()
        # "backward": each gradient written on the current stream, in reverse
        # order, each marked ready by the optimizer's hook as it is final.
        loss = sum((p * float(it + 1)).sum() for p in reversed(params))
        loss.backward()
        opt.synchronize()  # waits for the daemon: the average is in .grad
        times.append(time.perf_counter() - start)
        opt.step()  # lr 0: ends the iteration, outside the timed part
        opt.zero_grad()
    if opt.rank == 0:
        with open(out, "w") as f:
            json.dump({"what": "gradsync", "world": opt.world_size, "size": size,
                       "p50_ms": p50_ms(times[WARMUP:])}, f)
    opt.close()


def bench_torch(out: str, sizes: List[int]) -> None:
    import torch.distributed as dist
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("nccl", rank=rank, world_size=world)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    results: Dict[int, Dict[str, float]] = {}
    for size in sizes:
        row = results.setdefault(size, {})

        # The same backward, gradients averaged by DDP's reducer (NCCL).
        class Model(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.ps = torch.nn.ParameterList(
                    [torch.nn.Parameter(torch.zeros(n, device=device))
                     for n in tensor_numels(size)])

            def forward(self, k: float) -> torch.Tensor:
                return sum((p * k).sum() for p in reversed(list(self.ps)))

        ddp = torch.nn.parallel.DistributedDataParallel(Model(), device_ids=[0])
        times = []
        for it in range(WARMUP + ITERS):
            start = time.perf_counter()
            ddp(float(it + 1)).backward()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            ddp.zero_grad()
        row["torch DDP (NCCL)"] = p50_ms(times[WARMUP:])
        del ddp

        # Plain ncclAllReduce of the same bytes, already flat: one call per
        # 25 MB slice, as many calls as gradsync and DDP have buckets, with no
        # copy into buckets and no overlap. One call per tensor instead would
        # pay NCCL's per-call latency four times at 4 KB and flatter the others.
        flat = torch.zeros(sum(tensor_numels(size)), device=device)
        slices = list(torch.split(flat, CAP // 4))
        times = []
        for it in range(WARMUP + ITERS):
            start = time.perf_counter()
            flat.fill_(float(it + 1))
            for piece in slices:
                dist.all_reduce(piece)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        row["plain ncclAllReduce"] = p50_ms(times[WARMUP:])
        print(f"torch rank {rank}: {size} bytes done", flush=True)
    dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"what": "torch", "world": world,
                       "results": {str(k): v for k, v in results.items()}}, f)


def human(size: int) -> str:
    return f"{size // 1024} KB" if size < 1 << 20 else f"{size // (1 << 20)} MB"


def table(directory: str, json_out: str = "") -> None:
    rows: Dict[int, Dict[str, float]] = {}
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(directory, name)) as f:
            r = json.load(f)
        if r["what"] == "gradsync":
            rows.setdefault(r["size"], {})[f"gradsync ({r['world']} ranks)"] = r["p50_ms"]
        else:
            for size, res in r["results"].items():
                rows.setdefault(int(size), {}).update(
                    {f"{k} ({r['world']} ranks)": v for k, v in res.items()})
    print("| size | what | p50 ms / iteration | vs plain NCCL | added per bucket vs plain |")
    print("|---|---|---:|---:|---:|")
    summary = []
    for size in sorted(rows):
        row = rows[size]
        buckets = max(1, -(-size // CAP))
        plain = next((v for k, v in row.items() if k.startswith("plain")), None)
        for what, ms in sorted(row.items()):
            ratio = f"{ms / plain:.2f}x" if plain else "-"
            added = (ms - plain) * 1e3 / buckets if plain and what.startswith("gradsync") else None
            print(f"| {human(size)} ({buckets} bucket{'s' if buckets > 1 else ''}) | {what} | "
                  f"{ms:.3f} | {ratio} | {'' if added is None else f'{added:.0f} µs'} |")
            summary.append({"size": size, "buckets": buckets, "what": what, "p50_ms": ms,
                            "added_us_per_bucket": added})
    if json_out:
        with open(json_out, "w") as f:
            json.dump(summary, f, indent=1)


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    mode = sys.argv[1]
    if mode == "table":
        table(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "")
        return 0
    if not torch.cuda.is_available():
        print("bench: no CUDA device", file=sys.stderr)
        return 2
    if mode == "gradsync":
        bench_gradsync(sys.argv[2], int(sys.argv[3]))
    else:
        bench_torch(sys.argv[2], [int(s) for s in sys.argv[3:]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
