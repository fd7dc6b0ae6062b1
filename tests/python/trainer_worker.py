"""A trainer process for the Python tests.

conftest.Cluster starts trainers as multiprocessing processes forked from a
forkserver that has imported torch once (``child``), which keeps the suite
fast on two cores; ``python3 trainer_worker.py ARGS`` runs one by hand.

Modes:
  optimizer  train a gs_testlib model with gradsync.torch.DistributedOptimizer
  ddp        train with DistributedDataParallel (gloo), first plain, then
             with gradsync.torch.allreduce_hook; save both results
  replicas   unseeded BatchNorm replicas: plain DDP, then DistributedOptimizer
  optimizer-state  a checkpoint loaded on rank 0 only, then broadcast

Results go to --out (torch.save). A GradsyncError ends the process with
exit code 10 + its status and a "GRADSYNC_ERROR <class>: <message>" line on
stderr, so tests can tell which error a trainer saw.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from typing import Dict, List, Optional

import torch

import gs_testlib as lib

import gradsync
import gradsync.torch as gst

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def run_optimizer(args: argparse.Namespace) -> dict:
    dtype = DTYPES[args.dtype]
    model = lib.make_model(args.model, dtype)
    world_changes = []  # on_world_change's calls, with the iteration each came after
    opt = gst.DistributedOptimizer(
        lib.make_sgd(model), model.named_parameters(), find_unused_parameters=True,
        connect_timeout_s=args.connect_timeout_s, wait_timeout_s=args.wait_timeout_s,
        on_world_change=lambda old, new, r: world_changes.append((opt.iteration, old, new, r)))
    rank, world = opt.rank, opt.world_size
    jobs = [(opt.iteration, opt.world_size, opt.rank)]  # before the first step, then per step
    assert rank == int(os.environ["LOCAL_RANK"]) + args.rank_offset, (rank, args.rank_offset)
    params = [p for p in model.parameters() if p.requires_grad]
    grad_ptrs = [p.grad.data_ptr() for p in params]
    arena = {opt.client.buffer_address(i) for i in range(len(params))}
    unused_per_step = []

    def on_step(step: int) -> None:
        unused_per_step.append(list(opt.unused_parameters))
        jobs.append((opt.iteration, opt.world_size, opt.rank))
        if rank == args.drift_rank and step + 1 == args.drift_at:
            # A replica that drifts (as after a nondeterministic kernel).
            with torch.no_grad():
                dict(model.named_parameters())["fc2.weight"][0, 0] += 1e-3
        if args.set_grad_none_at == step:
            # Something (e.g. torch 2.x's model.zero_grad()) drops the views:
            # the next backward must still land in the arena.
            for p in params:
                p.grad = None
        maybe_hang(args, rank, step)

    if args.nan_at is not None and rank == args.nan_rank:
        # A NaN in this rank's first sample of that step: every gradient
        # of this trainer turns NaN in that step's backward.
        clean_batch = lib.batch

        def poisoned(step: int, micro: int, size: int, dt: torch.dtype):
            x, y = clean_batch(step, micro, size, dt)
            if step == args.nan_at:
                x = x.clone()
                x[rank * (size // world), 0] = float("nan")
            return x, y

        lib.batch = poisoned

    steps = args.steps
    joining = contextlib.nullcontext()
    if args.join_steps:
        # Uneven inputs: this rank has join_steps[rank] batches, then joins.
        steps = [int(n) for n in args.join_steps.split(",")][rank]
        joining = gst.join(opt, divide_by_initial_world_size=not args.join_divide_by_active)
    with joining:
        losses = lib.train(model, opt, steps=steps, global_batch=args.batch, rank=rank,
                           world=world, accumulate=args.accumulate, dtype=dtype,
                           no_sync=opt.no_sync, on_step=on_step)
    views_kept = [p.grad.data_ptr() for p in params] == grad_ptrs
    result = {
        "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "losses": losses,
        "unused": unused_per_step,
        "names": list(opt.parameter_names),
        "views_kept": views_kept,
        "grads_in_arena": set(grad_ptrs) == arena,
        "rank": rank,
        "world": world,
        "jobs": jobs,
        "world_changes": world_changes,
        "membership_changes": opt.membership_changes,
        "skipped_steps": opt.skipped_steps,
    }
    opt.close()
    return result


def maybe_hang(args: argparse.Namespace, rank: int, step: int) -> None:
    """--hang-at/--hang-rank: stop before a step, to be killed by the test."""
    if args.hang_at is not None and rank == args.hang_rank and step + 1 == args.hang_at:
        print("HANG", flush=True)
        time.sleep(3600)


class Reordered(torch.nn.Module):
    """Layers declared in a different order than forward uses them, so DDP's
    rebuilt buckets (from the observed gradient order) differ from its
    initial ones; big enough for several 1 MB / 0.5 MB buckets."""

    def __init__(self, gate_unused_sometimes: bool) -> None:
        super().__init__()
        self.gate_unused_sometimes = gate_unused_sometimes
        self.head = torch.nn.Linear(512, 1)
        self.b2 = torch.nn.Linear(512, 512)
        self.b1 = torch.nn.Linear(512, 512)
        self.a = torch.nn.Linear(lib.DIM, 512)
        self.gate = torch.nn.Parameter(torch.full((lib.DIM,), 0.1))

    def forward(self, x: torch.Tensor, step: int) -> torch.Tensor:
        h = torch.tanh(self.b2(torch.tanh(self.b1(torch.tanh(self.a(x))))))
        out = self.head(h)
        if not (self.gate_unused_sometimes and step % 4 == 1):
            out = out + (x @ self.gate).unsqueeze(1)
        return out


def run_ddp(args: argparse.Namespace) -> dict:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = int(os.environ["LOCAL_RANK"])
    world = args.world
    dist.init_process_group("gloo", init_method="file://" + args.store, rank=rank,
                            world_size=world)
    find_unused = args.ddp_find_unused

    def train(with_gradsync: bool) -> dict:
        torch.manual_seed(0)
        model = Reordered(gate_unused_sometimes=find_unused)
        ddp = DDP(model, bucket_cap_mb=0.5, find_unused_parameters=find_unused)
        layouts = []
        state = None
        if with_gradsync:
            state = gst.AllreduceHookState(ddp, wait_timeout_s=args.wait_timeout_s)

            def recording_hook(st, bucket):  # (DDP rejects string annotations)
                while len(layouts) <= st.iterations:
                    layouts.append([])
                layouts[st.iterations].append(
                    [st.names[st.index_of(p)] for p in bucket.parameters()])
                return gst.allreduce_hook(st, bucket)

            # The library's hook itself must pass DDP's signature check.
            ddp.register_comm_hook(state, recording_hook if args.record_buckets
                                   else gst.allreduce_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        # DDP's forward takes the step through kwargs.
        lib.train(_StepModule(ddp), opt, steps=args.steps, global_batch=args.batch,
                  rank=rank, world=world,
                  on_step=lambda step: maybe_hang(args, rank, step) if with_gradsync else None)
        out = {"state": {k: v.detach().clone() for k, v in model.state_dict().items()},
               "layouts": layouts}
        if state is not None:
            out["iterations"] = state.iterations
            state.close()
        return out

    plain = train(False)
    hooked = train(True)
    dist.destroy_process_group()
    return {"plain": plain, "gradsync": hooked, "rank": rank}


class BatchNormNet(torch.nn.Module):
    """A small model with BatchNorm (running statistics are buffers)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.bn = torch.nn.BatchNorm1d(16)
        self.fc2 = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def _replica_batch(step: int, rank: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def run_replicas(args: argparse.Namespace) -> dict:
    """Unseeded replicas (a different seed per rank, as a DDP user would
    leave them): plain DDP, then DistributedOptimizer(module=...) from the
    same per-rank initial state, both for --steps SGD steps."""
    import copy

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = int(os.environ["LOCAL_RANK"]) + args.rank_offset
    torch.manual_seed(100 + rank)
    model = BatchNormNet()
    initial = copy.deepcopy(model)

    def train(module: torch.nn.Module, opt) -> None:
        for step in range(args.steps):
            opt.zero_grad()
            x, y = _replica_batch(step, rank)
            torch.nn.functional.mse_loss(module(x), y).backward()
            opt.step()

    dist.init_process_group("gloo", init_method="file://" + args.store, rank=rank,
                            world_size=args.world)
    plain = copy.deepcopy(initial)
    ddp = DDP(plain)
    train(ddp, torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9))
    dist.destroy_process_group()

    opt = gst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   model.named_parameters(), module=model,
                                   broadcast_buffers=not args.no_broadcast_buffers)
    train(model, opt)
    out = {"rank": rank,
           "initial": {k: v.detach().clone() for k, v in initial.state_dict().items()},
           "plain": {k: v.detach().clone() for k, v in plain.state_dict().items()},
           "gradsync": {k: v.detach().clone() for k, v in model.state_dict().items()}}
    opt.close()
    return out


class ManyBuffers(torch.nn.Module):
    """Buffers of every kind the packed broadcast must lay out: several
    dtypes and sizes, a 0-dim counter, an empty one and a non-contiguous
    view. The forward records what it sees (after broadcast_buffers)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 1)
        self.register_buffer("f32", torch.zeros(3, 5))
        self.register_buffer("f64", torch.zeros(7, dtype=torch.float64))
        self.register_buffer("f16", torch.zeros(3, dtype=torch.float16))
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))
        self.register_buffer("i8", torch.zeros(5, dtype=torch.int8))
        self.register_buffer("flags", torch.zeros(3, dtype=torch.bool))
        self.register_buffer("empty", torch.zeros(0, 4))
        self.register_buffer("strided", torch.zeros(4, 6)[:, ::2])
        self.seen: List[Dict[str, torch.Tensor]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append({k: v.clone() for k, v in self.named_buffers()})
        return self.fc(x)


def run_buffers(args: argparse.Namespace) -> dict:
    """broadcast_buffers over ManyBuffers: before each forward every rank
    sets its buffers to values of its own (rank, step); the forward must see
    rank 0's, every step."""
    rank = int(os.environ["LOCAL_RANK"])
    model = ManyBuffers()
    opt = gst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   model.named_parameters(), module=model)
    mine = []
    for step in range(args.steps):
        g = torch.Generator().manual_seed(1000 * step + rank)
        with torch.no_grad():
            for b in model.buffers():
                b.copy_(torch.randint(0, 100, b.shape, generator=g).to(b.dtype))
        mine.append({k: v.clone() for k, v in model.named_buffers()})
        opt.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
    opt.close()
    return {"rank": rank, "set": mine, "seen": model.seen}


def run_optimizer_state(args: argparse.Namespace) -> dict:
    """A checkpoint (model and Adam state after 3 local steps) loaded on
    rank 0 only, then broadcast_parameters + broadcast_optimizer_state, then
    --steps synchronized steps."""
    import copy

    rank = int(os.environ["LOCAL_RANK"])

    def make():
        torch.manual_seed(0)
        return BatchNormNet()

    # The checkpoint, computed identically on every rank so each can check
    # what it received; only rank 0 loads it.
    source = make()
    source_opt = torch.optim.Adam(source.parameters(), lr=0.01)
    for step in range(3):
        source_opt.zero_grad()
        x, y = _replica_batch(50 + step, 0)
        torch.nn.functional.mse_loss(source(x), y).backward()
        source_opt.step()
    checkpoint = {"model": source.state_dict(), "opt": source_opt.state_dict()}

    torch.manual_seed(7 + rank)  # unseeded: every rank starts elsewhere
    model = BatchNormNet()
    opt = gst.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                   model.named_parameters(), module=model)
    if rank == 0:
        model.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["opt"])
    gst.broadcast_parameters(model.state_dict(), root_rank=0)
    gst.broadcast_optimizer_state(opt, root_rank=0)
    # A copy: state_dict() holds the live tensors, which the steps change.
    after_broadcast = copy.deepcopy(opt.state_dict())
    for step in range(args.steps):
        opt.zero_grad()
        x, y = _replica_batch(step, rank)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    out = {"rank": rank, "checkpoint": checkpoint, "after_broadcast": after_broadcast,
           "final": {k: v.detach().clone() for k, v in model.state_dict().items()}}
    opt.close()
    return out


def run_elastic_join(args: argparse.Namespace) -> dict:
    """An elastic job that a node joins while it runs: Adam and BatchNorm
    (parameters, optimizer state and buffers all matter), each rank on its
    own batches. Every trainer waits before step --gate-step until
    --gate-file exists (the test joins the node meanwhile); a joiner starts
    at the job's iteration with the state DistributedOptimizer handed it.
    With --die-at, this trainer SIGKILLs itself before that step (having
    marked nothing of it), for a replacement to take its place."""
    torch.manual_seed(7 + int(os.environ["LOCAL_RANK"]) + args.rank_offset)
    model = BatchNormNet()  # unseeded per rank: only the hand-over makes them equal
    opt = gst.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                   model.named_parameters(), module=model)
    job = opt.client.job_info()
    for step in range(job.iteration, args.steps):
        if step == args.die_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if step == args.gate_step:
            while not os.path.exists(args.gate_file):
                time.sleep(0.05)
        opt.zero_grad()
        x, y = _replica_batch(step, opt.rank)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    after = opt.client.job_info()
    out = {"rank": opt.rank, "start_iteration": job.iteration,
           "joined_running_job": job.joined_running_job, "nodes_joined": after.nodes_joined,
           "trainers_joined": after.trainers_joined, "catch_up_root": after.catch_up_root,
           "membership_changes": after.membership_changes, "world_size": after.world_size,
           # Buffers: each rank's last forward updated its own (DDP syncs
           # them before the next forward), so parameters are what must match.
           "final": {k: v.detach().clone() for k, v in model.named_parameters()},
           "opt_state": copy_state(opt.state_dict())}
    opt.close()
    return out


def copy_state(state: dict) -> dict:
    import copy
    return copy.deepcopy(state)


class _StepModule:
    """Adapts ``model(x, step)`` calls to a DDP module's forward."""

    def __init__(self, ddp: torch.nn.Module) -> None:
        self.ddp = ddp

    def __call__(self, x: torch.Tensor, step: int) -> torch.Tensor:
        return self.ddp(x, step)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["optimizer", "ddp", "replicas", "optimizer-state",
                                       "buffers", "elastic-join"],
                    default="optimizer")
    ap.add_argument("--no-broadcast-buffers", action="store_true")
    ap.add_argument("--rank-offset", type=int, default=0,
                    help="replicas mode: the node's first global rank")
    ap.add_argument("--model", choices=sorted(lib.MODELS), default="mlp")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=24, help="global batch")
    ap.add_argument("--accumulate", type=int, default=1)
    ap.add_argument("--set-grad-none-at", type=int, default=None)
    ap.add_argument("--hang-at", type=int, default=None, help="hang before this step")
    ap.add_argument("--hang-rank", type=int, default=-1)
    ap.add_argument("--connect-timeout-s", type=float, default=20.0)
    ap.add_argument("--wait-timeout-s", type=float, default=None)
    ap.add_argument("--world", type=int, default=2, help="ddp mode: process group size")
    ap.add_argument("--store", default="", help="ddp mode: FileStore path")
    ap.add_argument("--ddp-find-unused", action="store_true")
    ap.add_argument("--record-buckets", action="store_true",
                    help="ddp mode: record each iteration's bucket layout")
    ap.add_argument("--join-steps", default="",
                    help="uneven inputs: steps per rank (comma-separated), then gradsync.torch.join")
    ap.add_argument("--join-divide-by-active", action="store_true")
    ap.add_argument("--drift-rank", type=int, default=-1,
                    help="optimizer mode: this rank perturbs fc2.weight after step --drift-at")
    ap.add_argument("--drift-at", type=int, default=-1)
    ap.add_argument("--nan-at", type=int, default=None,
                    help="optimizer mode: a NaN in --nan-rank's input at this step")
    ap.add_argument("--nan-rank", type=int, default=-1)
    ap.add_argument("--gate-file", default="", help="elastic-join mode: wait for this file")
    ap.add_argument("--gate-step", type=int, default=-1, help="... before this step")
    ap.add_argument("--die-at", type=int, default=-1,
                    help="elastic-join mode: SIGKILL this trainer before this step")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    try:
        result = {"optimizer": run_optimizer, "ddp": run_ddp, "replicas": run_replicas,
                  "optimizer-state": run_optimizer_state, "buffers": run_buffers,
                  "elastic-join": run_elastic_join}[args.mode](args)
    except gradsync.GradsyncError as e:
        print(f"GRADSYNC_ERROR {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 10 + int(e.status) if e.status is not None else 9
    except RuntimeError as e:
        # An error raised inside a DDP comm hook may reach backward()'s
        # caller wrapped in a RuntimeError: report what it wraps.
        print(f"RUNTIME_ERROR {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return 8
    torch.save(result, args.out)
    return 0


def child(argv: List[str], env: Dict[str, str], log_path: str) -> None:
    """multiprocessing target: output to ``log_path``, ``env`` set, then main()."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.environ.update(env)
    code = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


if __name__ == "__main__":
    sys.exit(main())
