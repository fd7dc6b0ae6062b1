"""PyTorch on a GPU through gradsyncd equals one process on the whole batch.

    torch_equivalence.py trainer OUT_DIR      # under python3 -m gradsync.run (any nodes x N)
    torch_equivalence.py trainer-ddp OUT_DIR  # the same through DDP and allreduce_hook
    torch_equivalence.py reference OUT_DIR    # one process, whole batch, no gradsync
    torch_equivalence.py compare OUT_DIR      # every trainer's weights vs the reference

A small MLP on CUDA, SGD with momentum, 20 steps. Every trainer takes its
1/N shard of the same global batch; DistributedOptimizer (or DDP with
gradsync's communication hook, over a gloo process group that only carries
DDP's start-up broadcast) averages the gradients through the daemons (flat
device buffer, CUDA IPC, readiness events on torch's current stream); the
weights must then equal single-process training on the whole batch, and
every trainer's weights must be identical. Under DistributedOptimizer each
trainer builds its model from its own seed (RANK): the optimizer's
construction must make every replica start from rank 0's parameters (a
device-to-device gs_broadcast), as DDP's constructor does.
"""
from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F

STEPS, BATCH, DIM, HIDDEN, CLASSES = 20, 96, 32, 256, 8
# fp32 on a GPU: the shard-mean sum and the whole-batch mean round differently.
RTOL, ATOL = 1e-4, 1e-6


def make_model(device: torch.device, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(DIM, HIDDEN), torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, CLASSES)).to(device)


def global_batch(step: int, device: torch.device):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, DIM, generator=g)
    y = torch.randint(0, CLASSES, (BATCH,), generator=g)
    return x.to(device), y.to(device)


def train(out_dir: str, how: str) -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    # Rank 0's seed is the reference's: the others must be made equal to it.
    seed = int(os.environ.get("RANK", "0")) if how == "optimizer" else 0
    model = make_model(device, seed)
    net = model
    closer = None
    rank, world = 0, 1
    if how == "ddp":
        import torch.distributed as dist
        import gradsync.torch as gs_torch
        dist.init_process_group("gloo", rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
        state = gs_torch.AllreduceHookState(net)
        net.register_comm_hook(state, gs_torch.allreduce_hook)
        rank, world, closer = state.rank, state.world_size, state.close
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if how == "optimizer":
        import gradsync.torch as gs_torch
        opt = gs_torch.DistributedOptimizer(opt, model.named_parameters())
        rank, world, closer = opt.rank, opt.world_size, opt.close
    shard = BATCH // world
    for step in range(STEPS):
        x, y = global_batch(step, device)
        x, y = x[rank * shard:(rank + 1) * shard], y[rank * shard:(rank + 1) * shard]
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
    state_dict = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    name = f"{how}-rank{rank}.pt" if how != "reference" else "reference.pt"
    torch.save({"world": world, "state": state_dict}, os.path.join(out_dir, name))
    if closer is not None:
        closer()
    if how == "ddp":
        torch.distributed.destroy_process_group()
    print(f"{how} {'rank ' + str(rank) if how != 'reference' else ''}: {STEPS} steps on "
          f"{torch.cuda.get_device_name(device)}, world {world}", flush=True)


def compare(out_dir: str) -> int:
    ref = torch.load(os.path.join(out_dir, "reference.pt"))["state"]
    ranks = sorted(f for f in os.listdir(out_dir) if "-rank" in f)
    if not ranks:
        print("no trainer wrote its weights", flush=True)
        return 1
    failed = 0
    firsts = {}  # per way of training: its first rank's weights, which the others must equal
    for f in ranks:
        how = f.split("-rank")[0]
        got = torch.load(os.path.join(out_dir, f))
        first_name, first = firsts.setdefault(how, (f, got["state"]))
        for k, want in ref.items():
            diff = (got["state"][k] - want).abs().max().item()
            scale = want.abs().max().item()
            ok = torch.allclose(got["state"][k], want, rtol=RTOL, atol=ATOL)
            same = torch.equal(got["state"][k], first[k])
            print(f"{f[:-3]} (world {got['world']}) {k:10s} max |diff| {diff:.3g} "
                  f"(max |ref| {scale:.3g}) {'ok' if ok else 'DIFFERS'}"
                  f"{'' if same else ', differs from ' + first_name[:-3]}", flush=True)
            failed += (not ok) + (not same)
    print("equal to single-process training" if failed == 0 else f"{failed} mismatches",
          flush=True)
    return 1 if failed else 0


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] not in ("trainer", "trainer-ddp", "reference",
                                                 "compare"):
        print(__doc__, file=sys.stderr)
        return 2
    mode, out_dir = sys.argv[1], sys.argv[2]
    if mode == "compare":
        return compare(out_dir)
    if not torch.cuda.is_available():
        print("torch_equivalence: no CUDA device", file=sys.stderr)
        return 2
    train(out_dir, {"trainer": "optimizer", "trainer-ddp": "ddp"}.get(mode, "reference"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
