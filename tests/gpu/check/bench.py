"""GPU benchmark: one synchronized iteration of gradsync vs the same
gradients averaged in-process by torch DDP (NCCL) and by plain
``ncclAllReduce`` calls (torch.distributed.all_reduce on the NCCL backend).

    bench.py gradsync OUT_JSON SIZE_BYTES   # under python3 -m gradsync.run --nproc N
    bench.py torch OUT_JSON SIZE_BYTES      # one process: DDP and plain NCCL
    bench.py table DIR                      # prints the table from DIR/*.json

The gradients: 4 fp32 tensors of SIZE/4 bytes each (buckets of the daemon's
default 25 MB cap). An iteration writes every gradient on the current
stream (the "backward"), marks it ready, and waits for the average; its time
is host wall time until the average is usable, p50 over the timed
iterations after warm-up. One GPU: gradsync can put several trainers on it
(device-side local sum); DDP and plain NCCL cannot (one rank per GPU), so
they run one rank.
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


def bench_torch(out: str, size: int) -> None:
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl", rank=0, world_size=1)
    device = torch.device("cuda", 0)
    results: Dict[str, float] = {}

    # The same backward, gradients averaged by DDP's reducer (NCCL).
    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ps = torch.nn.ParameterList(
                [torch.nn.Parameter(torch.zeros(n, device=device)) for n in tensor_numels(size)])

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
    results["torch DDP (NCCL)"] = p50_ms(times[WARMUP:])

    # Plain ncclAllReduce of the same gradients (no bucketing, no overlap).
    grads = [torch.zeros(n, device=device) for n in tensor_numels(size)]
    times = []
    for it in range(WARMUP + ITERS):
        start = time.perf_counter()
        for g in reversed(grads):
            g.fill_(float(it + 1))
            dist.all_reduce(g)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    results["plain ncclAllReduce"] = p50_ms(times[WARMUP:])
    dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump({"what": "torch", "world": 1, "size": size, "results": results}, f)


def human(size: int) -> str:
    return f"{size // 1024} KB" if size < 1 << 20 else f"{size // (1 << 20)} MB"


def table(directory: str) -> None:
    rows: Dict[int, Dict[str, float]] = {}
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(directory, name)) as f:
            r = json.load(f)
        row = rows.setdefault(r["size"], {})
        if r["what"] == "gradsync":
            row[f"gradsync, {r['world']} trainer(s)"] = r["p50_ms"]
        else:
            row.update(r["results"])
    cap = 25 << 20
    print("| size | what | p50 ms / iteration | vs plain NCCL | added per bucket |")
    print("|---|---|---:|---:|---:|")
    for size in sorted(rows):
        row = rows[size]
        buckets = max(1, -(-size // cap))
        plain = row.get("plain ncclAllReduce")
        for what, ms in sorted(row.items()):
            ratio = f"{ms / plain:.2f}x" if plain else "-"
            added = (f"{(ms - plain) * 1e3 / buckets:.0f} µs"
                     if plain and what.startswith("gradsync") else "")
            print(f"| {human(size)} ({buckets} bucket{'s' if buckets > 1 else ''}) | {what} | "
                  f"{ms:.3f} | {ratio} | {added} |")


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    mode = sys.argv[1]
    if mode == "table":
        table(sys.argv[2])
        return 0
    if not torch.cuda.is_available():
        print("bench: no CUDA device", file=sys.stderr)
        return 2
    size = int(sys.argv[3])
    (bench_gradsync if mode == "gradsync" else bench_torch)(sys.argv[2], size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
