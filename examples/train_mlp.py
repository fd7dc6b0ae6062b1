#!/usr/bin/python3
"""Trains a small MLP, data-parallel through gradsync (DistributedOptimizer).

The task is synthetic but learnable: 16-dimensional Gaussian inputs
labelled (4 classes) by a fixed random "teacher" network. Every step draws
one global batch, the same on every trainer; each trainer computes the loss
on its 1/N shard, DistributedOptimizer averages the gradients through
gradsyncd, so every replica takes exactly the step one process would take
on the whole batch. Rank 0 prints the loss on a fixed held-out set as it
falls; at the end every rank prints a checksum of its weights (identical).

Run with 2 trainers (starts a gradsyncd if none is running), from the
repository root after `bazel build //client:libgradsync.so //daemon:gradsyncd`:

    PYTHONPATH=client/python /usr/bin/python3 -m gradsync.run --nproc 2 examples/train_mlp.py

`--single` trains in one process without gradsync (the reference).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

try:
    import gradsync.torch as gs_torch
except ImportError:  # run from a checkout without PYTHONPATH
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                    "client", "python"))
    import gradsync.torch as gs_torch

DIM, CLASSES = 16, 4


def teacher_labels(x: torch.Tensor) -> torch.Tensor:
    """Labels from a fixed random two-layer network: learnable, not linear."""
    g = torch.Generator().manual_seed(1234)
    w1 = torch.randn(DIM, 32, generator=g) / DIM ** 0.5
    w2 = torch.randn(32, CLASSES, generator=g)
    return (torch.tanh(x @ w1) @ w2).argmax(dim=1)


def batch(step: int, size: int, seed: int) -> tuple:
    """Global batch `step`: identical on every trainer."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(size, DIM, generator=g)
    return x, teacher_labels(x)


def make_model(hidden: int) -> torch.nn.Module:
    # The same start as --single; gradsync itself needs no common seed (the
    # DistributedOptimizer starts every trainer from rank 0's weights).
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(DIM, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, CLASSES))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=128, help="global batch per step")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--single", action="store_true", help="one process, whole batch, no gradsync")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    model = make_model(args.hidden)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    rank, world = 0, 1
    if not args.single:
        opt = gs_torch.DistributedOptimizer(opt, model.named_parameters(), module=model)
        rank, world = opt.rank, opt.world_size
    # LR schedulers work on the DistributedOptimizer like on any optimizer.
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    if args.batch % world:
        print(f"--batch {args.batch} is not divisible by {world} trainers", file=sys.stderr)
        return 2
    shard = args.batch // world
    x_eval, y_eval = batch(-1, 2048, args.seed)

    def evaluate() -> tuple:
        with torch.no_grad():
            logits = model(x_eval)
            return F.cross_entropy(logits, y_eval).item(), \
                (logits.argmax(1) == y_eval).float().mean().item()

    if rank == 0:
        loss, acc = evaluate()
        print(f"{world} trainer(s), {sum(p.numel() for p in model.parameters())} parameters, "
              f"global batch {args.batch}", flush=True)
        print(f"step {0:4d}  eval loss {loss:.4f}  accuracy {acc:.3f}", flush=True)
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        x, y = batch(step, args.batch, args.seed)
        x, y = x[rank * shard:(rank + 1) * shard], y[rank * shard:(rank + 1) * shard]
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        schedule.step()
        if rank == 0 and (step % args.log_every == 0 or step == args.steps):
            loss, acc = evaluate()
            print(f"step {step:4d}  eval loss {loss:.4f}  accuracy {acc:.3f}", flush=True)
    elapsed = time.perf_counter() - start
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"rank {rank}: {args.steps} steps in {elapsed:.2f} s, weights checksum {checksum:.12f}",
          flush=True)
    if not args.single:
        opt.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
