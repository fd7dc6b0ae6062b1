"""``allreduce_hook``: a DDP communication hook that averages DDP's buckets
through gradsyncd, for users who keep ``DistributedDataParallel``.

    ddp = DistributedDataParallel(model, process_group=gloo_group)
    state = AllreduceHookState(ddp)          # registers with the daemon
    ddp.register_comm_hook(state, allreduce_hook)

Why the daemon's layout is per *parameter*, not per DDP bucket: gradsync
fixes its layout at registration, while DDP rebuilds its buckets after the
first iteration (from the order in which gradients became ready), so bucket
membership and sizes change. Each DDP parameter is therefore registered as
one gradsync tensor; the hook copies each bucket's flat buffer, parameter
by parameter, into the parameters' slots and marks them ready. Any
bucket composition, before or after a rebuild, maps onto the same layout.
The slots are the shared-memory arena for CPU models and the daemon's flat
device buffer for CUDA models (device-to-device copies on the current
stream; each mark records its readiness event there, with no host sync).

The daemon completes an iteration only when every tensor is marked, i.e.
after DDP's *last* bucket: DDP calls the hook once per bucket, strictly in
bucket order, during backward. The hook returns a not-yet-completed Future
for every bucket but the last; the last bucket's call marks any parameter
no bucket contained as unused, waits for the daemon, copies the averages
back into every bucket's buffer and completes all the Futures. DDP (1.13 and
2.x) only waits on the Futures in ``finalize_backward``, after the last
bucket's hook, so the earlier Futures are complete by then.

The value is already the average (gradsync divides by its world size), as
DDP expects from an allreduce hook.
"""
# No `from __future__ import annotations` here: DDP's register_comm_hook
# compares the hook's annotations with the real dist.GradBucket and
# torch.futures.Future[torch.Tensor] objects and rejects strings.
from typing import Dict, Iterable, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
import torch.nn.parallel

from ..client import Client
from ..errors import InvalidArgumentError
from ._common import StreamFollower, grad_tensor, tensor_spec, unique_named_parameters
from .broadcast import set_current_client

__all__ = ["AllreduceHookState", "allreduce_hook"]


def _ddp_named_parameters(module: torch.nn.Module) -> List[Tuple[str, torch.Tensor]]:
    """The parameters DDP synchronizes, in DDP's order: those requiring a
    gradient, minus the ones DDP was told to ignore, each once."""
    is_ddp = isinstance(module, torch.nn.parallel.DistributedDataParallel)
    inner = module.module if is_ddp else module
    ignored = set(getattr(module, "parameters_to_ignore", ()) or ()) if is_ddp else set()
    return [(n, p) for n, p in unique_named_parameters(inner.named_parameters())
            if p.requires_grad and n not in ignored]


class AllreduceHookState:
    """The state ``allreduce_hook`` needs: the daemon connection, each
    parameter's arena slot, and the buckets of the current iteration.

    Args:
        parameters: the ``DistributedDataParallel`` module (its parameters
            are taken the way DDP selects them), a plain module, or
            ``named_parameters`` pairs listing exactly DDP's parameters.
        client, socket_path, local_rank, connect_timeout_s: as for
            ``DistributedOptimizer``.
        wait_timeout_s: bound of the wait in the last bucket's hook; None:
            the daemon's ``--timeout-s``.
    """

    def __init__(self, parameters: Union[torch.nn.Module, Iterable[Tuple[str, torch.Tensor]]],
                 *, client: Optional[Client] = None, socket_path: Optional[str] = None,
                 local_rank: Optional[int] = None, connect_timeout_s: float = 30.0,
                 wait_timeout_s: Optional[float] = None) -> None:
        if isinstance(parameters, torch.nn.Module):
            named = _ddp_named_parameters(parameters)
        else:
            named = [(n, p) for n, p in unique_named_parameters(parameters) if p.requires_grad]
        named = [(n, p) for n, p in named if p.numel() > 0]
        if not named:
            raise InvalidArgumentError("no parameter requires a gradient: nothing to synchronize")
        self.names = [n for n, _ in named]
        # DDP hands the hook the parameters themselves (the same Python
        # objects); their storage address is the fallback key. The list keeps
        # them alive so that an id() can never be reused.
        self._params = [p for _, p in named]
        self._index_by_id: Dict[int, int] = {id(p): i for i, p in enumerate(self._params)}
        self._index_by_ptr: Dict[int, int] = {p.data_ptr(): i for i, p in enumerate(self._params)}
        self._numel = [p.numel() for p in self._params]
        self.wait_timeout_s = wait_timeout_s
        self._owns_client = client is None
        self.client = client if client is not None else Client(
            socket_path, local_rank, connect_timeout_s=connect_timeout_s)
        try:
            self.client.register([tensor_spec(n, p) for n, p in named])
            set_current_client(self.client)
            # Flat views of every parameter's slot in the daemon's buffers.
            self._slots = [grad_tensor(self.client, i, p, (p.numel(),))
                           for i, (_, p) in enumerate(named)]
            self._streams = StreamFollower(self.client)
        except BaseException:
            if self._owns_client:
                self.client.close()
            raise
        self._marked = [False] * len(named)
        # The GradsyncError (or other exception) that failed an iteration.
        # DDP's C++ reducer re-raises a hook's exception from backward() as
        # a RuntimeError carrying only its text; the original is kept here.
        self.error: Optional[BaseException] = None
        # Buckets handed to DDP but not completed yet: (future, buffer, slices).
        self._pending: List[Tuple[torch.futures.Future, torch.Tensor,
                                  List[Tuple[int, int, int]]]] = []
        self.iterations = 0  # completed (synchronized) iterations

    @property
    def rank(self) -> int:
        return self.client.rank

    @property
    def world_size(self) -> int:
        return self.client.world_size

    def index_of(self, p: torch.Tensor) -> int:
        """The gradsync tensor index of DDP parameter ``p``."""
        i = self._index_by_id.get(id(p))
        if i is None:
            i = self._index_by_ptr.get(p.data_ptr())
            if i is not None and self._numel[i] != p.numel():
                i = None
        if i is None:
            raise InvalidArgumentError(
                f"DDP bucket holds a parameter of shape {tuple(p.shape)} that was not registered "
                "with gradsync: build AllreduceHookState from the DistributedDataParallel "
                "module itself (or exactly its parameters)")
        return i

    def _bucket_slices(self, bucket: dist.GradBucket) -> List[Tuple[int, int, int]]:
        """(tensor index, offset, numel) of each parameter in the bucket's flat
        buffer: DDP lays the bucket out as its parameters' gradients one after
        the other, in ``bucket.parameters()`` order."""
        slices = []
        offset = 0
        for p in bucket.parameters():
            i = self.index_of(p)
            n = self._numel[i]
            slices.append((i, offset, n))
            offset += n
        if offset != bucket.buffer().numel():
            raise InvalidArgumentError(
                f"DDP bucket {bucket.index()} has {bucket.buffer().numel()} elements but its "
                f"parameters have {offset}: unexpected GradBucket layout")
        return slices

    def _on_bucket(self, bucket: dist.GradBucket) -> torch.futures.Future:
        buffer = bucket.buffer()
        slices = self._bucket_slices(bucket)
        for i, off, n in slices:
            if self._marked[i]:
                raise InvalidArgumentError(
                    f"parameter {self.names[i]!r} arrived in two DDP buckets in one iteration")
            self._slots[i].copy_(buffer[off:off + n])
            self._streams.before_mark(buffer.device)
            self.client.mark_ready(i)
            self._marked[i] = True
        fut: torch.futures.Future = torch.futures.Future()
        self._pending.append((fut, buffer, slices))
        if bucket.is_last():
            self._finish_iteration()
        return fut

    def _finish_iteration(self) -> None:
        # Parameters in no bucket (e.g. ignored by DDP after this state was
        # built) contribute zeros, so the iteration completes on every trainer.
        for i, marked in enumerate(self._marked):
            if not marked:
                self._streams.before_mark(self._slots[i].device)
                self.client.mark_unused(i)
        self.client.wait(self.wait_timeout_s)
        pending, self._pending = self._pending, []
        self._marked = [False] * len(self._marked)
        self.iterations += 1
        for fut, buffer, slices in pending:
            for i, off, n in slices:
                buffer[off:off + n].copy_(self._slots[i])
            fut.set_result(buffer)

    def _fail(self, error: BaseException) -> None:
        """Completes every pending Future with the error, so nothing in DDP
        can wait on them forever."""
        if self.error is None:
            self.error = error
        pending, self._pending = self._pending, []
        self._marked = [False] * len(self._marked)
        for fut, _, _ in pending:
            if not fut.done():
                fut.set_exception(error)

    def close(self) -> None:
        """Detaches from the daemon (if this state connected)."""
        if self._owns_client:
            self.client.close()


def allreduce_hook(state: AllreduceHookState,
                   bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: averages ``bucket`` over all gradsync trainers.

    Register with ``ddp.register_comm_hook(AllreduceHookState(ddp),
    allreduce_hook)``. Errors (a peer died, a timeout) are raised from the
    hook, so ``loss.backward()`` raises -- as a RuntimeError whose message
    starts with the gradsync class name (e.g. "PeerFailedError: ..."), since
    DDP's reducer does not keep Python exception types; ``state.error`` holds
    the original. Every pending bucket's Future is completed with the error
    first, so nothing in DDP waits on it forever.
    """
    try:
        return state._on_bucket(bucket)
    except BaseException as e:
        state._fail(e)
        raise
