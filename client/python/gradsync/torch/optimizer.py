"""``DistributedOptimizer``: data-parallel training through gradsyncd,
Horovod-style (wrap the optimizer, keep the model as it is).

How one iteration flows:

* At construction every parameter's gradient is registered with the daemon.
  ``p.grad`` is replaced by a tensor *viewing the buffer the daemon reduces*
  (like DDP's ``gradient_as_bucket_view``): the shared-memory arena on CPU,
  the daemon's flat device buffer on CUDA (mapped through CUDA IPC; every
  bucket is one contiguous range of it). ``zero_grad()`` sets ``.grad`` to
  None, so autograd hands its fresh gradient over and the hook copies it
  into the buffer; later backward passes of the step (``no_sync()``,
  ``backward_passes_per_step``) accumulate straight into the buffer.
* During ``loss.backward()`` a hook per parameter fires as soon as autograd
  has accumulated that parameter's gradient, and marks it ready: the daemon
  starts reducing a bucket while backward is still computing earlier
  layers (overlap). On CUDA the mark records an interprocess event on
  ``torch.cuda.current_stream()`` (never a host synchronization); the daemon
  waits for that event before it reduces.
* ``step()`` marks the parameters that got no gradient as unused (they
  contribute zeros), waits for the daemon, which has written the average
  over all trainers into the same buffers, and then runs the wrapped
  optimizer's step.

``no_sync()`` disables the hooks: gradients simply keep accumulating in the
arena, and the next synchronized backward reduces the accumulated sum.
Nothing is sent to the daemon meanwhile (the C ABI's ``gs_set_sync(0)``
would do the same, but it requires every tensor to be marked in every
micro-iteration; not marking at all is simpler and cheaper).
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch

from ..client import Client, JobInfo
from ..errors import InvalidArgumentError, StateError
from ._common import (StreamFollower, grad_tensor, register_grad_ready_hook, tensor_spec,
                      unique_named_parameters)
from .broadcast import (broadcast_object, broadcast_optimizer_state, broadcast_tensors,
                        set_current_client)
from .coalesced import CoalescedBroadcast, job_device

__all__ = ["DistributedOptimizer"]

log = logging.getLogger("gradsync.torch")


class DistributedOptimizer(torch.optim.Optimizer):
    """Wraps ``optimizer`` so that ``step()`` uses gradients averaged over all
    trainers of the job by gradsyncd.

    Args:
        optimizer: any torch optimizer over the model's parameters.
        named_parameters: ``model.named_parameters()``; names identify tensors
            in the daemon's error messages and must be identical on every
            trainer. None: names are made up from the optimizer's parameter
            order (``group0.param3``).
        find_unused_parameters: log (warning, once per change) the names of
            parameters that got no gradient in a synchronized iteration.
            Unused parameters are always handled (marked unused: zero
            gradient), with or without this option; their names are always
            available as ``unused_parameters`` after ``step()``.
        backward_passes_per_step: how many ``backward()`` calls produce one
            step's gradient outside ``no_sync()`` (a gradient is marked ready
            after its last one).
        client: an existing connected, not yet registered ``gradsync.Client``;
            None: connect with ``socket_path`` / ``local_rank`` (default:
            ``$GRADSYNC_SOCKET``, ``$LOCAL_RANK``).
        connect_timeout_s: how long to wait for the daemon to answer.
        wait_timeout_s: bound of each ``step()``'s wait; None: the daemon's
            ``--timeout-s``.
        module: the model. Its buffers (BatchNorm's running statistics)
            join the parameters broadcast at construction, and are kept in
            step (``broadcast_buffers``). None: parameters only.
        broadcast_buffers: DDP's argument of the same name (default True, as
            DDP): before each forward of ``module`` that starts a
            synchronized iteration (grad enabled, outside ``no_sync()``),
            every trainer's buffers take rank 0's values. Needs ``module``.
        on_world_change: called as ``on_world_change(old_world, new_world,
            rank)`` after a synchronization whose world size (the trainers
            the gradients were averaged over) differs from the previous
            one's, before the wrapped optimizer steps: where a data sampler
            re-shards (torchelastic users do it on a membership change).
            More can be added with ``on_world_change()``. An exception it
            raises propagates out of ``step()``/``synchronize()``.

    Like DDP's constructor, construction makes every replica start from
    rank 0's parameters (and ``module``'s buffers): no common seed is
    needed. Every trainer of the job constructs it at the same point.

    Semantics worth knowing:

    * ``zero_grad()`` sets ``.grad`` to None (``set_to_none=True``, torch
      2.x's default): the next backward's fresh gradient is copied into the
      arena by the hook, and ``.grad`` is the arena's view again from then
      on (after ``step()`` / ``synchronize()`` always). That copy costs less
      than zeroing the arena and adding into it (one read and one write of
      the gradient instead of a write, two reads and a write).
      ``zero_grad(set_to_none=False)`` zeroes the views in place instead,
      and ``.grad`` then never leaves the arena. A parameter without a
      gradient in an iteration gets a zero gradient, so momentum and weight
      decay still apply to it, as in single-process training whose gradients
      were zeroed rather than set to None. If something else sets
      ``p.grad = None`` or assigns a new tensor, it is copied back into the
      arena the next time the gradient is marked.
    * Only one DistributedOptimizer (one registered layout) per process.
    * ``step(closure)`` evaluates the closure once, then synchronizes:
      fine for SGD/Adam-like optimizers, not for LBFGS.
    * Gradients read between ``backward()`` and ``step()`` are local and may
      be partly averaged already; call ``synchronize()`` first (e.g. before
      gradient clipping); ``step()`` then does not synchronize again.
    * Under ``gradsyncd --check-replicas-every N``, ``step()`` hashes the
      registered parameters after the wrapped optimizer's step of every
      N-th synchronized iteration and the daemons compare them across every
      trainer of every node: ``MismatchError`` names the first parameter
      that differs and the trainers and nodes on each side.
    * ``close()`` gives every parameter a private copy of its gradient and
      detaches from the daemon; ``.grad`` tensors saved elsewhere before then
      must not be used afterwards.
    """

    def __init__(self, optimizer: torch.optim.Optimizer,
                 named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]] = None, *,
                 find_unused_parameters: bool = False,
                 backward_passes_per_step: int = 1,
                 client: Optional[Client] = None,
                 socket_path: Optional[str] = None,
                 local_rank: Optional[int] = None,
                 connect_timeout_s: float = 30.0,
                 wait_timeout_s: Optional[float] = None,
                 module: Optional[torch.nn.Module] = None,
                 broadcast_buffers: bool = True,
                 on_world_change: Optional[Callable[[int, int, int], None]] = None) -> None:
        # torch.optim.Optimizer.__init__ is deliberately not called: this
        # object *shares* the wrapped optimizer's param_groups, state and
        # defaults (properties below) instead of owning copies, so LR
        # schedulers and state_dict() act on the real optimizer.
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise InvalidArgumentError(
                f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if isinstance(optimizer, DistributedOptimizer):
            raise InvalidArgumentError("the optimizer is already a DistributedOptimizer")
        if backward_passes_per_step < 1:
            raise InvalidArgumentError("backward_passes_per_step must be >= 1")
        self._optimizer = optimizer
        self._find_unused = find_unused_parameters
        self._passes_per_step = backward_passes_per_step
        self._wait_timeout_s = wait_timeout_s
        self._entries = self._select_parameters(optimizer, named_parameters)
        self._names = [n for n, _ in self._entries]
        self._params = [p for _, p in self._entries]
        n = len(self._params)

        # CUDA parameters use the flat-buffer mode (no cuda_ptr): the daemon
        # owns the device memory, so its lifetime never depends on torch's
        # caching allocator.
        specs = [tensor_spec(name, p) for name, p in self._entries]

        self._owns_client = client is None
        self._client = client if client is not None else Client(
            socket_path, local_rank, connect_timeout_s=connect_timeout_s)
        original_grads = [p.grad for p in self._params]
        self._streams = StreamFollower(self._client)
        try:
            self._client.register(specs)
            set_current_client(self._client)
            # The tensors that must be each p.grad: views of the daemon's buffers.
            self._grads: List[torch.Tensor] = []
            for i, p in enumerate(self._params):
                g = grad_tensor(self._client, i, p)
                if p.grad is not None:
                    g.copy_(p.grad)  # keep a gradient the caller already has
                else:
                    g.zero_()
                p.grad = g
                self._grads.append(g)
            # DDP's constructor: every replica starts from rank 0's state.
            self._module = module
            self._buffers = ([b for _, b in module.named_buffers()]
                             if module is not None else [])
            start = list(self._params)
            if module is not None:
                registered = {id(p) for p in start}
                start += [p for p in module.parameters() if id(p) not in registered]
            # A joiner (its node joined, or it took back a dead trainer's
            # local rank) gets the running job's state from the catch-up
            # root, which the members broadcast from.
            joining = self._client.job_info()
            root = joining.catch_up_root if joining.joined_running_job else 0
            broadcast_tensors(start + self._buffers, root, client=self._client)
            # What a joiner gets (the broadcast above is the first part of it).
            self._start_tensors = start
            if joining.joined_running_job:
                self._hand_over_state(root, first_part_done=True)
                # A check due at the iteration this trainer starts at runs in
                # the grown world: the members check once they handed over
                # this state, and so does every joiner.
                if joining.check_replicas_due:
                    self._check_replicas()
        except BaseException:
            # Leave the model as it was: no .grad may point into a mapping
            # that close() is about to remove.
            for p, original in zip(self._params, original_grads):
                p.grad = original
            if self._owns_client:
                self._client.close()
            raise

        # Per-iteration bookkeeping (Python lists: the hooks index them).
        self._marked = [False] * n      # marked ready this iteration
        self._passes = [0] * n          # backward passes seen this iteration
        self._touched = [False] * n     # got a gradient since the last sync
        self._num_marked = 0
        self._sync_enabled = True
        self._synchronized = False      # synchronize() ran, step() pending
        self._skipped_steps = 0         # --nonfinite=skip: optimizer steps not taken
        self._unused: Tuple[str, ...] = ()
        self._closed = False
        self._buffers_paused = False    # inside gradsync.torch.join
        # The job as of the last synchronization (registration's before one).
        self._job: JobInfo = self._client.job_info()
        self._nodes_joined = self._job.nodes_joined
        self._trainers_joined = self._job.trainers_joined
        self._world_callbacks: List[Callable[[int, int, int], None]] = []
        self._check_pending = False     # --check-replicas-every: after this step
        if on_world_change is not None:
            self.on_world_change(on_world_change)
        self._hooks = [register_grad_ready_hook(p, self._make_hook(i))
                       for i, p in enumerate(self._params)]
        # Laid out once: each forward's broadcast then allocates nothing.
        self._buffer_sync = (CoalescedBroadcast(self._buffers, job_device(self._client))
                             if broadcast_buffers and self._buffers else None)
        if self._buffer_sync is not None:
            self._hooks.append(module.register_forward_pre_hook(self._before_forward))

    def _before_forward(self, module: torch.nn.Module, inputs: Any) -> None:
        """``broadcast_buffers``: DDP syncs buffers before a forward whose
        backward will be synchronized; here only at an iteration boundary
        (nothing marked yet), where gs_broadcast is allowed."""
        if (self._closed or self._buffers_paused or not self._sync_enabled
                or not torch.is_grad_enabled() or self._num_marked != 0):
            return
        self._buffer_sync(self._client, 0)

    # -- construction helpers ----------------------------------------------

    @staticmethod
    def _select_parameters(optimizer: torch.optim.Optimizer,
                           named_parameters: Optional[Iterable[Tuple[str, torch.Tensor]]]
                           ) -> List[Tuple[str, torch.Tensor]]:
        """The (name, param) pairs to register: the optimizer's parameters that
        require a gradient, in ``named_parameters`` order (forward order for
        ``model.named_parameters()``, which the daemon's initial bucket order
        reverses to follow backward)."""
        opt_params = [p for group in optimizer.param_groups for p in group["params"]]
        if named_parameters is None:
            named = []
            for g, group in enumerate(optimizer.param_groups):
                named += [(f"group{g}.param{j}", p) for j, p in enumerate(group["params"])]
        else:
            named = list(named_parameters)
        named = unique_named_parameters(named)
        in_optimizer = {id(p) for p in opt_params}
        entries = [(name, p) for name, p in named
                   if id(p) in in_optimizer and p.requires_grad and p.numel() > 0]
        named_ids = {id(p) for _, p in named}
        missing = [p for p in opt_params if id(p) not in named_ids and p.requires_grad]
        if missing:
            shapes = ", ".join(str(tuple(p.shape)) for p in missing[:5])
            raise InvalidArgumentError(
                f"{len(missing)} parameter(s) of the optimizer are not in named_parameters "
                f"(shapes {shapes}): their gradients would not be synchronized")
        if not entries:
            raise InvalidArgumentError("no parameter requires a gradient: nothing to synchronize")
        return entries

    def _make_hook(self, i: int) -> Callable[[], None]:
        def hook() -> None:
            self._on_gradient(i)
        return hook

    # -- the per-parameter hook ---------------------------------------------

    def _adopt(self, i: int) -> None:
        """Makes sure ``p.grad`` is the registered tensor again: if something
        replaced it (``p.grad = None`` then a fresh backward, an out-of-place
        accumulation), the new gradient is copied into the arena."""
        p, g = self._params[i], self._grads[i]
        current = p.grad
        if current is g:
            return
        if current is None:
            g.zero_()
        else:
            g.copy_(current)
        p.grad = g

    def _on_gradient(self, i: int) -> None:
        """Autograd finished accumulating parameter i's gradient."""
        if self._closed:
            return
        self._adopt(i)
        self._touched[i] = True
        if not self._sync_enabled:
            return  # no_sync: accumulate only
        self._passes[i] += 1
        if self._passes[i] < self._passes_per_step:
            return
        if self._marked[i]:
            raise StateError(
                f"the gradient of {self._names[i]!r} was computed again before step(): "
                f"{self._passes[i]} backward passes in this iteration with "
                f"backward_passes_per_step={self._passes_per_step} (accumulate under "
                "no_sync(), or raise backward_passes_per_step)", operation="DistributedOptimizer")
        self._streams.before_mark(self._grads[i].device)
        self._client.mark_ready(i)
        self._marked[i] = True
        self._num_marked += 1

    # -- the public API ----------------------------------------------------

    @property
    def client(self) -> Client:
        return self._client

    @property
    def rank(self) -> int:
        """This trainer's global rank in the gradsync job (as of the last
        synchronization)."""
        return self._job.rank

    @property
    def world_size(self) -> int:
        """How many trainers the last synchronization averaged the gradients
        over: the job's world size, or fewer once trainers joined with
        ``divide_by_initial_world_size=False``. Before the first: the job's."""
        return self._job.world_size

    @property
    def iteration(self) -> int:
        """Synchronized iterations the job completed (the same on every
        trainer of every node; ``no_sync()`` iterations are not counted)."""
        return self._job.iteration

    @property
    def membership_changes(self) -> int:
        """How many times the elastic job's members changed (the survivors
        of a node's death re-formed) by the last synchronization; 0 in a
        fixed job. A change also changes ``world_size`` (on_world_change)."""
        return self._job.membership_changes

    def on_world_change(self, callback: Callable[[int, int, int], None]
                        ) -> Callable[[int, int, int], None]:
        """Adds a callback ``callback(old_world, new_world, rank)`` run after a
        synchronization that changed ``world_size`` (see the constructor's
        argument of the same name); returns it, so it works as a decorator."""
        if not callable(callback):
            raise InvalidArgumentError(
                f"on_world_change takes a callable, got {type(callback).__name__}")
        self._world_callbacks.append(callback)
        return callback

    @property
    def parameter_names(self) -> Sequence[str]:
        """Registered parameters, in registration order."""
        return tuple(self._names)

    @property
    def unused_parameters(self) -> Tuple[str, ...]:
        """Names of the parameters that got no gradient in the last
        synchronized iteration (marked unused: zero gradient)."""
        return self._unused

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Gradient accumulation: backward passes inside accumulate locally
        and send nothing; the next synchronized iteration averages the sum.
        ``step()`` inside the block steps on local gradients."""
        previous = self._sync_enabled
        self._sync_enabled = False
        try:
            yield
        finally:
            self._sync_enabled = previous

    def join(self, divide_by_initial_world_size: bool = True) -> None:
        """This trainer is out of data (see ``gradsync.torch.join``): call
        after its last ``step()``; blocks until every trainer joined."""
        if self._closed:
            raise StateError("the DistributedOptimizer is closed", operation="join")
        self._client.join(divide_by_initial_world_size)

    def synchronize(self) -> None:
        """Completes this iteration: marks parameters without a gradient as
        unused, then waits until the daemon has written the averaged
        gradients into ``.grad``. ``step()`` calls it unless it already ran."""
        if self._closed:
            raise StateError("the DistributedOptimizer is closed", operation="synchronize")
        if self._num_marked < len(self._params):
            unused = []
            for i in range(len(self._params)):
                if self._marked[i]:
                    continue
                self._adopt(i)
                self._streams.before_mark(self._grads[i].device)
                if self._touched[i]:
                    # A gradient accumulated (under no_sync, or in fewer than
                    # backward_passes_per_step passes): it is real.
                    self._client.mark_ready(i)
                else:
                    self._client.mark_unused(i)  # zeroes the buffer
                    unused.append(self._names[i])
                self._marked[i] = True
                self._num_marked += 1
            self._report_unused(tuple(unused))
        elif self._unused:
            self._report_unused(())
        try:
            self._client.wait(self._wait_timeout_s)
        finally:
            # Whatever happened, the next iteration starts from clean marks
            # (after an error the job is over anyway: errors are sticky).
            n = len(self._params)
            self._marked = [False] * n
            self._passes = [0] * n
            self._touched = [False] * n
            self._num_marked = 0
        self._synchronized = True
        previous, self._job = self._job, self._client.job_info()
        self._check_pending = self._job.check_replicas_due
        if self._job.world_size != previous.world_size:
            log.info("world size changed from %d to %d at iteration %d (rank %d)",
                     previous.world_size, self._job.world_size, self._job.iteration,
                     self._job.rank)
            for callback in list(self._world_callbacks):
                callback(previous.world_size, self._job.world_size, self._job.rank)

    def _report_unused(self, unused: Tuple[str, ...]) -> None:
        if self._find_unused and unused != self._unused and unused:
            log.warning("parameters without a gradient in this iteration (marked unused, zero "
                        "gradient): %s", ", ".join(unused))
        self._unused = unused

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Synchronizes (unless ``synchronize()`` already ran or inside
        ``no_sync()``), then steps the wrapped optimizer."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        synced = self._sync_enabled
        if synced and not self._synchronized:
            self.synchronize()
        self._synchronized = False
        if synced and self._client.iteration_skipped:
            # Non-finite gradients somewhere in the job (gradsyncd
            # --nonfinite=skip): every trainer skips this step alike, like
            # AMP's GradScaler, so the replicas stay equal.
            if self._skipped_steps == 0:
                log.warning("skipped an optimizer step: the job's gradients held a NaN or Inf "
                            "(gradsyncd --nonfinite=skip; its log and stats name the trainer); "
                            "see skipped_steps for the count")
            self._skipped_steps += 1
            self._hand_over_if_nodes_joined()
            return loss
        self._optimizer.step()
        # Joiners first get this step's state, then every trainer, theirs
        # too, checks the replicas in the grown world (in this order on every
        # node: both are collectives).
        self._hand_over_if_nodes_joined()
        if self._check_pending:
            self._check_pending = False
            self._check_replicas()
        return loss

    def _hand_over_if_nodes_joined(self) -> None:
        """Nodes, or trainers restarted on nodes that stayed, join the
        running elastic job before the next iteration
        (``JobInfo.nodes_joined`` or ``trainers_joined`` grew with this
        step's synchronization): they get this step's state from
        ``JobInfo.catch_up_root``."""
        job = self._job
        if job.nodes_joined == self._nodes_joined and job.trainers_joined == self._trainers_joined:
            return
        who = "nodes" if job.nodes_joined != self._nodes_joined else "trainers"
        self._nodes_joined = job.nodes_joined
        self._trainers_joined = job.trainers_joined
        log.info("%s joined the job after iteration %d: handing over the state from rank %d",
                 who, job.iteration, job.catch_up_root)
        self._hand_over_state(job.catch_up_root, first_part_done=False)

    def _hand_over_state(self, root: int, *, first_part_done: bool) -> None:
        """Every trainer's part of a joiner's catch-up, from rank `root`
        (the lowest rank alive and a member before it joined): parameters and
        buffers, the optimizer state, then the iteration count, which must
        be this trainer's. A joiner's constructor did the first part already
        (its start-up broadcast is the same call)."""
        if not first_part_done:
            broadcast_tensors(self._start_tensors + self._buffers, root, client=self._client)
        broadcast_optimizer_state(self._optimizer, root, client=self._client)
        mine = self._client.job_info().iteration
        theirs = broadcast_object(mine, root, client=self._client)
        if theirs != mine:
            raise StateError(f"rank {root} is at iteration {theirs}, this trainer at {mine}: the "
                             f"job's state cannot be handed over", operation="step")

    def _check_replicas(self) -> None:
        """gradsyncd ``--check-replicas-every``: one 64-bit hash of each
        registered parameter's bytes, after the step that updated it; the
        daemon compares them across the trainers (MismatchError names the
        first differing parameter and the trainers on each side)."""
        hashes = []
        for p in self._params:
            t = p.detach()
            if t.device.type != "cpu":
                t = t.cpu()
            t = t.contiguous()
            data = ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())
            hashes.append(int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little"))
        self._client.check_replicas(hashes)

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps not taken because the job's gradients were not
        finite (gradsyncd ``--nonfinite=skip``)."""
        return self._skipped_steps

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        """Drops the gradients: ``set_to_none`` True or None (the default)
        sets each ``.grad`` to None, to be refilled in the arena by the next
        backward; False zeroes the arena's views in place. A gradient already
        marked in this iteration (the daemon may be reducing it) is zeroed in
        place either way and keeps its view. After ``close()`` this is the
        wrapped optimizer's zero_grad."""
        if self._closed:
            if set_to_none is None:
                self._optimizer.zero_grad()
            else:
                self._optimizer.zero_grad(set_to_none=set_to_none)
            return
        to_zero = []
        for i, p in enumerate(self._params):
            if self._marked[i]:
                self._adopt(i)
                to_zero.append(self._grads[i])
                continue
            self._touched[i] = False  # nothing accumulated any more
            if set_to_none is False:
                self._adopt(i)
                to_zero.append(self._grads[i])
            else:
                p.grad = None
        if to_zero and hasattr(torch, "_foreach_zero_"):
            torch._foreach_zero_(to_zero)
        else:
            for g in to_zero:
                g.zero_()
        # Parameters of the wrapped optimizer that are not registered (no
        # grad required or empty) are treated as torch would.
        registered = {id(p) for p in self._params}
        for group in self._optimizer.param_groups:
            for p in group["params"]:
                if id(p) in registered or p.grad is None:
                    continue
                if set_to_none is False:
                    p.grad.detach_()
                    p.grad.zero_()
                else:
                    p.grad = None

    def close(self) -> None:
        """Removes the hooks, gives each parameter a private copy of its
        gradient and detaches from the daemon (if this object connected)."""
        if self._closed:
            return
        self._closed = True
        for h in self._hooks:
            h.remove()
        self._hooks = []
        cloned_on = set()
        for p, g in zip(self._params, self._grads):
            if p.grad is g:  # a view of memory the daemon is about to release
                p.grad = g.clone()
                if g.device.type == "cuda":
                    cloned_on.add(g.device)
        # The clones are queued on torch's current stream, which gs_close does
        # not drain (it drains the stream the last gradient was marked on):
        # they must have read the daemon's buffer before it is unmapped.
        for device in cloned_on:
            torch.cuda.current_stream(device).synchronize()
        self._grads = []
        if self._owns_client:
            self._client.close()

    # -- torch.optim.Optimizer surface, shared with the wrapped optimizer ----

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer

    @property
    def param_groups(self) -> List[Dict[str, Any]]:  # type: ignore[override]
        return self._optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: List[Dict[str, Any]]) -> None:
        self._optimizer.param_groups = value

    @property
    def state(self) -> Dict[Any, Any]:  # type: ignore[override]
        return self._optimizer.state

    @state.setter
    def state(self, value: Dict[Any, Any]) -> None:
        self._optimizer.state = value

    @property
    def defaults(self) -> Dict[str, Any]:  # type: ignore[override]
        return self._optimizer.defaults

    @defaults.setter
    def defaults(self, value: Dict[str, Any]) -> None:
        self._optimizer.defaults = value

    def state_dict(self) -> Dict[str, Any]:
        return self._optimizer.state_dict()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self._optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        raise StateError("DistributedOptimizer cannot add parameter groups: the gradient "
                         "layout is fixed when it is registered with the daemon; build the "
                         "DistributedOptimizer after adding every group",
                         operation="add_param_group")

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes not found normally: anything specific to
        # the wrapped optimizer (and torch-version-specific internals).
        if name == "_optimizer":
            raise AttributeError(name)
        return getattr(self._optimizer, name)

    def __getstate__(self) -> Dict[str, Any]:
        raise TypeError("a DistributedOptimizer holds a live daemon connection and cannot be "
                        "pickled; save optimizer.state_dict() instead")

    def __repr__(self) -> str:
        inner = repr(self._optimizer).replace("\n", "\n    ")
        return f"DistributedOptimizer(\n    {inner}\n)"
