"""``gradsync.Client``: a thin ctypes layer over the C ABI (client/gradsync.h).

One Client per trainer process and daemon job. The per-iteration protocol:

    client = Client()                      # gs_connect
    client.register([TensorSpec("w", DType.FLOAT32, 1024), ...])
    buf = client.buffer(0)                 # writable, in shared memory
    ... write the gradient into buf ...
    client.mark_ready(0)                   # or client.mark_unused(0)
    client.wait()                          # buf now holds the average

Every non-OK status becomes a ``GradsyncError`` subclass carrying the
daemon's message. The object is safe to call from several threads (a lock
serializes calls; the blocking calls release the GIL), but the protocol
itself is sequential: mark everything, then wait.
"""
from __future__ import annotations

import ctypes
import dataclasses
import enum
import os
import threading
import weakref
from typing import Iterable, List, Optional, Sequence, Tuple, Union

from . import _lib, trainer_malloc
from .errors import Status, StateError, InvalidArgumentError, error_for_status

__all__ = ["Client", "DType", "JobInfo", "TensorSpec"]


class DType(enum.IntEnum):
    """``gs_dtype``."""

    FLOAT32 = 0
    FLOAT64 = 1
    FLOAT16 = 2
    BFLOAT16 = 3

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @classmethod
    def parse(cls, value: Union["DType", str, int]) -> "DType":
        """Accepts a DType, its number, or a name like "float32" / "bf16"."""
        if isinstance(value, DType):
            return value
        if isinstance(value, int):
            return cls(value)
        key = str(value).lower().replace("torch.", "")
        try:
            return _NAMES[key]
        except KeyError:
            raise InvalidArgumentError(
                f"unsupported dtype {value!r}: gradsync supports float32, float64, "
                "float16 and bfloat16") from None


_ITEMSIZE = {DType.FLOAT32: 4, DType.FLOAT64: 8, DType.FLOAT16: 2, DType.BFLOAT16: 2}
_NAMES = {
    "float32": DType.FLOAT32, "float": DType.FLOAT32, "f32": DType.FLOAT32,
    "float64": DType.FLOAT64, "double": DType.FLOAT64, "f64": DType.FLOAT64,
    "float16": DType.FLOAT16, "half": DType.FLOAT16, "f16": DType.FLOAT16,
    "bfloat16": DType.BFLOAT16, "bf16": DType.BFLOAT16,
}


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One gradient of the layout (``gs_tensor_spec``).

    Attributes:
        name: unique in the layout; the daemon uses it in error messages.
        dtype: element type.
        numel: element count, >= 1.
        device: -1 for CPU (the buffer lives in the shared-memory arena),
            >= 0 for a CUDA ordinal.
        cuda_ptr: the CUDA gradient's address (CUDA tensors only).
    """

    name: str
    dtype: DType
    numel: int
    device: int = -1
    cuda_ptr: Optional[int] = None

    @property
    def nbytes(self) -> int:
        return self.numel * DType.parse(self.dtype).itemsize


@dataclasses.dataclass(frozen=True)
class JobInfo:
    """What a trainer sees of its job after its last ``wait()``
    (``gs_get_job_info``).

    Attributes:
        iteration: synchronized iterations the job completed, the same on
            every trainer of every node (0 before the first ``wait()``).
        world_size: how many trainers the last iteration's gradients were
            averaged over: the job's world size, or the trainers still active
            once some joined with ``divide_by_initial_world_size=False``.
        rank: this trainer's global rank in that iteration.
        check_replicas_due: gradsyncd runs with ``--check-replicas-every``
            and this iteration is one to check: call ``check_replicas()``
            after the optimizer step (DistributedOptimizer does).
        membership_changes: how many times an elastic job's members changed
            (the survivors of a node's death re-formed) in the iterations
            completed so far; 0 in a fixed job, and unchanged by trainers
            that join (``world_size`` alone shrinks then).
        nodes_joined: how many times nodes joined the running elastic job
            right after an iteration completed so far (it grows after that
            iteration's ``wait()``): every trainer then hands its state to
            the joiners' trainers with a broadcast from ``catch_up_root``
            before its next iteration.
        joined_running_job: this trainer's node joined the job while it
            ran, or it took back the local rank (and rank) of a trainer that
            died on a node that stayed: ``iteration`` started at the job's
            count, and it receives the job's state (a broadcast from
            ``catch_up_root``) before its first iteration.
        trainers_joined: how many times trainers restarted on nodes that
            stayed joined the running elastic job right after an iteration
            completed so far: every trainer then hands its state to them as
            for ``nodes_joined``.
        catch_up_root: the rank that state comes from: the lowest rank alive
            and a member before the joiners came (rank 0's trainer may be the
            one that died and rejoins).
    """

    iteration: int
    world_size: int
    rank: int
    check_replicas_due: bool = False
    membership_changes: int = 0
    nodes_joined: int = 0
    joined_running_job: bool = False
    trainers_joined: int = 0
    catch_up_root: int = 0


SpecLike = Union[TensorSpec, Tuple[str, Union[DType, str, int], int]]


def _close_handle(lib: ctypes.CDLL, handle: int, owner_pid: int) -> None:
    """Finalizer: detaches from the daemon, unless we are a fork()ed child.

    A child created by fork() (e.g. a DataLoader worker) inherits the handle;
    if it called gs_close it would detach its *parent's* session.
    """
    if handle and os.getpid() == owner_pid:
        lib.gs_close(handle)


class Client:
    """A connection of one trainer to its node's gradsyncd.

    Args:
        socket_path: the daemon's unix socket; None: ``$GRADSYNC_SOCKET``,
            else the default (``gradsync.daemon.default_socket()``).
        local_rank: this trainer's rank on the node; None: ``$LOCAL_RANK``,
            else 0.
        connect_timeout_s: how long to wait for the daemon to answer.
        library: path of libgradsync.so (None: see ``gradsync.find_library``).

    Raises:
        UnavailableError: no daemon answers on the socket in time.
        StateError: the local rank is taken, or a previous job is still
            closing on this daemon.
    """

    def __init__(self, socket_path: Optional[str] = None, local_rank: Optional[int] = None,
                 *, connect_timeout_s: float = 30.0, library: Optional[str] = None) -> None:
        self._lib = _lib.load_library(library)
        self._mu = threading.Lock()
        self._specs: List[TensorSpec] = []
        self._buffers: List[Optional[ctypes.Array]] = []
        self._rank = -1
        self._world_size = 0
        self._handle: Optional[int] = None
        opts = _lib.ConnectOptionsC(
            socket_path=os.fsencode(socket_path) if socket_path else None,
            local_rank=-1 if local_rank is None else int(local_rank),
            timeout_ms=max(1, int(connect_timeout_s * 1000)),
            size=ctypes.sizeof(_lib.ConnectOptionsC),
        )
        handle = ctypes.c_void_p()
        st = self._lib.gs_connect(ctypes.byref(opts), ctypes.byref(handle))
        if st != Status.OK:
            message = self._message(handle.value)
            if handle.value:
                self._lib.gs_close(handle.value)
            raise error_for_status(st, message, "gs_connect")
        self._handle = handle.value
        self._finalizer = weakref.finalize(self, _close_handle, self._lib, self._handle,
                                           os.getpid())
        # A trainer's steps reuse the heap memory the previous step freed,
        # however it was launched (gradsync.trainer_malloc).
        trainer_malloc.keep_freed_memory_in_process()

    # -- helpers ---------------------------------------------------------------

    def _message(self, handle: Optional[int]) -> str:
        if not handle:
            return ""
        raw = self._lib.gs_last_error(handle)
        return raw.decode("utf-8", "replace") if raw else ""

    def _live_handle(self) -> int:
        if self._handle is None:
            raise StateError("the client is closed", operation="gradsync.Client")
        return self._handle

    def _check(self, st: int, operation: str) -> None:
        if st != Status.OK:
            raise error_for_status(st, self._message(self._handle), operation)

    # -- setup -----------------------------------------------------------------

    def register(self, tensors: Iterable[SpecLike]) -> None:
        """Sends the gradient layout (``gs_register``).

        Blocks until every local trainer registered the same layout and the
        job's world is formed (up to the daemon's timeout). Raises
        MismatchError naming the first difference if the layouts differ, and
        InvalidArgumentError if ``$WORLD_SIZE`` (torchrun's) is not the
        job's world size (libgradsync's gs_register checks it).
        """
        specs = [t if isinstance(t, TensorSpec) else TensorSpec(t[0], DType.parse(t[1]), int(t[2]))
                 for t in tensors]
        if not specs:
            raise InvalidArgumentError("the layout is empty: register at least one tensor",
                                       operation="gs_register")
        array = (_lib.TensorSpecC * len(specs))()
        names = []  # keeps the encoded names alive during the call
        for i, s in enumerate(specs):
            name = s.name.encode("utf-8")
            names.append(name)
            array[i].name = name
            array[i].dtype = int(DType.parse(s.dtype))
            array[i].numel = int(s.numel)
            array[i].device = int(s.device)
            array[i].cuda_ptr = s.cuda_ptr
        with self._mu:
            handle = self._live_handle()
            self._check(self._lib.gs_register(handle, array, len(specs)), "gs_register")
            rank, world = ctypes.c_int(), ctypes.c_int()
            self._check(self._lib.gs_world(handle, ctypes.byref(rank), ctypes.byref(world)),
                        "gs_world")
            self._specs = specs
            self._buffers = [None] * len(specs)
            self._rank, self._world_size = rank.value, world.value

    @property
    def registered(self) -> bool:
        return bool(self._specs)

    @property
    def rank(self) -> int:
        """This trainer's global rank (known after register)."""
        self._require_registered("rank")
        return self._rank

    @property
    def world_size(self) -> int:
        """Number of trainers in the whole job (all nodes), after register."""
        self._require_registered("world_size")
        return self._world_size

    def job_info(self) -> JobInfo:
        """The job's iteration count, world size and this trainer's rank as of
        the last ``wait()`` (``gs_get_job_info``; read from shared memory the
        wait already consumed, no call to the daemon). After register."""
        self._require_registered("job_info")
        info = _lib.JobInfoC(size=ctypes.sizeof(_lib.JobInfoC))
        with self._mu:
            self._check(self._lib.gs_get_job_info(self._live_handle(), ctypes.byref(info)),
                        "gs_get_job_info")
        return JobInfo(iteration=int(info.iteration), world_size=int(info.world_size),
                       rank=int(info.rank), check_replicas_due=bool(info.check_replicas_due),
                       membership_changes=int(info.membership_changes),
                       nodes_joined=int(info.nodes_joined),
                       joined_running_job=bool(info.joined_running_job),
                       trainers_joined=int(info.trainers_joined),
                       catch_up_root=int(info.catch_up_root))

    def check_replicas(self, hashes: Sequence[int]) -> None:
        """Sends this trainer's parameter fingerprint, one 64-bit hash per
        registered tensor in registration order, when ``job_info()`` says a
        check is due (``gs_check_replicas``); returns once every local
        trainer's were compared.

        Raises:
            MismatchError: the replicas differ (the job failed), naming the
                first differing tensor and the trainers on each side;
            StateError: no check is due.
        """
        array = (ctypes.c_uint64 * len(hashes))(*[int(h) & 0xFFFFFFFFFFFFFFFF for h in hashes])
        with self._mu:
            self._check(self._lib.gs_check_replicas(self._live_handle(), array, len(hashes)),
                        "gs_check_replicas")

    @property
    def specs(self) -> Sequence[TensorSpec]:
        return tuple(self._specs)

    @property
    def num_tensors(self) -> int:
        return len(self._specs)

    def _require_registered(self, what: str) -> None:
        if not self._specs:
            raise StateError(f"{what} is known after register()", operation="gradsync.Client")

    # -- buffers ---------------------------------------------------------------

    def buffer_address(self, index: int) -> int:
        """Address of gradient ``index``'s buffer (``gs_grad_buffer``): shared
        memory for a CPU tensor, a device pointer for a CUDA tensor (into the
        daemon's flat device buffer, or the ``cuda_ptr`` it was registered with)."""
        self._require_registered("buffer_address")
        if not 0 <= index < len(self._specs):
            raise InvalidArgumentError(
                f"tensor index {index} is out of range ({len(self._specs)} tensors registered)",
                operation="gs_grad_buffer")
        addr = self._lib.gs_grad_buffer(self._live_handle(), index)
        if not addr:
            raise InvalidArgumentError(
                f"tensor {index} '{self._specs[index].name}' has no buffer: "
                f"{self.last_error() or 'gs_grad_buffer returned NULL'}", operation="gs_grad_buffer")
        return addr

    def buffer(self, index: int) -> ctypes.Array:
        """CPU tensor ``index``'s shared-memory buffer, as a writable ctypes byte array.

        The array supports the buffer protocol (memoryview, numpy.frombuffer,
        torch.frombuffer) and is valid until ``close()``. Objects built on it
        keep this Client alive (so its finalizer cannot unmap memory they
        still point to); after an explicit ``close()`` they must not be used.
        """
        if 0 <= index < len(self._specs) and self._specs[index].device >= 0:
            raise InvalidArgumentError(
                f"tensor {index} '{self._specs[index].name}' is a CUDA tensor: its buffer is "
                "device memory (buffer_address(), or gradsync.torch's views)",
                operation="gs_grad_buffer")
        with self._mu:
            cached = self._buffers[index] if 0 <= index < len(self._buffers) else None
            if cached is not None:
                return cached
            addr = self.buffer_address(index)
            nbytes = self._specs[index].nbytes
            # A subclass (not the plain array type) so the instance can hold a
            # reference back to this Client: tensors viewing the memory keep
            # the buffer object, hence the mapping, alive.
            slot_type = type("GradsyncBuffer", (ctypes.c_ubyte * nbytes,), {})
            buf = slot_type.from_address(addr)
            buf._gradsync_client = self  # type: ignore[attr-defined]
            self._buffers[index] = buf
            return buf

    # -- the iteration ---------------------------------------------------------

    def mark_ready(self, index: int) -> None:
        """Gradient ``index`` is final for this iteration (``gs_mark_ready``)."""
        with self._mu:
            self._check(self._lib.gs_mark_ready(self._live_handle(), index), "gs_mark_ready")

    def mark_unused(self, index: int) -> None:
        """Gradient ``index`` was not produced: it contributes zeros and its
        buffer is zeroed (``gs_mark_unused``)."""
        with self._mu:
            self._check(self._lib.gs_mark_unused(self._live_handle(), index), "gs_mark_unused")

    def wait(self, timeout_s: Optional[float] = None) -> None:
        """Waits until every bucket of this iteration is reduced (``gs_wait``).

        Args:
            timeout_s: None: the daemon's timeout (plus a little grace, so the
                daemon's diagnosis arrives first).

        Raises:
            GradsyncTimeoutError: naming the tensors this trainer has not
                marked, if any; PeerFailedError: another trainer or the
                daemon failed.
        """
        ms = -1 if timeout_s is None else max(0, int(timeout_s * 1000))
        with self._mu:
            self._check(self._lib.gs_wait(self._live_handle(), ms), "gs_wait")

    @property
    def iteration_skipped(self) -> bool:
        """True when the iteration the last ``wait()`` completed must not be
        applied (``gs_iteration_skipped``): its gradients hold a NaN or Inf
        and gradsyncd runs ``--nonfinite=skip``. Every trainer of the job
        gets the same answer for the same iteration."""
        with self._mu:
            return bool(self._lib.gs_iteration_skipped(self._live_handle()))

    def set_cuda_stream(self, stream: Optional[int]) -> None:
        """CUDA tensors: the stream (a ``cudaStream_t`` as an int, e.g.
        ``torch.cuda.current_stream().cuda_stream``) on which later marks
        record their readiness events and unused gradients are zeroed; None or
        0: the legacy default stream (``gs_set_cuda_stream``). Mark a gradient
        after queueing its last write on that stream: the daemon waits for
        that work, the host never does."""
        with self._mu:
            self._check(self._lib.gs_set_cuda_stream(self._live_handle(), stream or None),
                        "gs_set_cuda_stream")

    def set_sync(self, enabled: bool) -> None:
        """``enabled=False``: following iterations post nothing and gradients
        accumulate in the buffers; the next synced iteration reduces the sum.
        Only valid between iterations (``gs_set_sync``)."""
        with self._mu:
            self._check(self._lib.gs_set_sync(self._live_handle(), 1 if enabled else 0),
                        "gs_set_sync")

    def broadcast(self, address: int, nbytes: int, root_rank: int = 0,
                  timeout_s: Optional[float] = None) -> None:
        """Makes ``nbytes`` bytes at ``address`` equal, on every trainer of the
        job, to the root rank's (``gs_broadcast``): host memory, or in a job
        whose gradients are CUDA tensors a device pointer on their GPU
        (copied device to device; every trainer passes the same kind). Between
        iterations only; every trainer calls it with the same ``nbytes`` and
        ``root_rank``. ``timeout_s``: how long to wait for the other
        trainers; None: the daemon's timeout.

        Raises:
            StateError: a trainer is mid-iteration; MismatchError: trainers
                passed different sizes or roots; PeerFailedError: another
                trainer, node or the daemon failed meanwhile.
        """
        ms = -1 if timeout_s is None else max(1, int(timeout_s * 1000))
        with self._mu:
            self._check(self._lib.gs_broadcast(self._live_handle(), address or None, nbytes,
                                               root_rank, ms), "gs_broadcast")

    def join(self, divide_by_initial_world_size: bool = True) -> None:
        """Uneven inputs (DDP's Join): this trainer is out of data. Between
        iterations only. From now on the job counts it as contributing zeros;
        blocks until every trainer of the job has joined (``gs_join``).
        Afterwards no more iterations: close the client.

        Args:
            divide_by_initial_world_size: True (DDP's default): later averages
                still divide by the world size; False: by the trainers still
                active in each iteration. Every trainer must pass the same.
        """
        with self._mu:
            self._check(self._lib.gs_join(self._live_handle(),
                                          1 if divide_by_initial_world_size else 0), "gs_join")

    @property
    def last_error(self) -> str:
        """The C library's message for the last failure ("" if none)."""
        return self._message(self._handle)

    # -- teardown --------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._handle is None

    def close(self) -> None:
        """Detaches from the daemon (``gs_close``; idempotent).

        While the job runs, the other trainers then get PeerFailedError: close
        after the last ``wait()``. Buffers become invalid.
        """
        with self._mu:
            if self._handle is None:
                return
            self._handle = None
            self._buffers = []
            self._finalizer()  # runs gs_close once, and never again at exit

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._handle is None:
            return "gradsync.Client(closed)"
        if not self._specs:
            return "gradsync.Client(connected)"
        return (f"gradsync.Client(rank={self._rank}, world_size={self._world_size}, "
                f"tensors={len(self._specs)})")
