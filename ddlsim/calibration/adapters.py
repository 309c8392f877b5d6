"""A small interface over a communication library, so the benchmark body is one plain function.

:class:`CommAdapter` is what :func:`~ddlsim.calibration.comm_bench.run_comm_benchmark` needs:
rank and size, barrier, device synchronisation, an element-wise max over ranks, an object
all-gather (for host names), splitting into sub-communicators, and ``make_op`` which prepares
buffers for one (operation, size) and returns a callable that runs it once.

Two implementations: :class:`MpiAdapter` (mpi4py, launched by ``mpirun``/``srun``) and
:class:`TorchAdapter` (``torch.distributed`` with NCCL or Gloo, launched by ``torchrun``).
Buffers are float32; message sizes are rounded down to whole elements (and, for the
all-gather family, to whole per-rank chunks) and the size actually moved is reported.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .schema import CalibrationError, check_op

__all__ = ["OpCall", "CommAdapter", "MpiAdapter", "TorchAdapter", "buffer_layout",
           "pingpong_partner", "mpi_library"]

ITEMSIZE = 4  # float32


@dataclass(frozen=True)
class OpCall:
    """One prepared operation: ``run()`` executes it once; the measured time × ``time_scale``
    is the time of one operation (0.5 for a ping-pong round trip → one-way time)."""

    run: Callable[[], None]
    nbytes: int
    time_scale: float = 1.0


@runtime_checkable
class CommAdapter(Protocol):
    """What the benchmark needs from a communicator (see the module docstring)."""

    backend: str
    library: str
    library_version: str

    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    def hostname(self) -> str: ...
    def barrier(self) -> None: ...
    def synchronize(self) -> None: ...
    def allgather_obj(self, obj: Any) -> list: ...
    def reduce_max(self, values: np.ndarray) -> np.ndarray: ...
    def split(self, colors: Sequence[int]) -> "CommAdapter": ...
    def supports(self, op: str) -> bool: ...
    def make_op(self, op: str, nbytes: int) -> OpCall: ...
    def close(self) -> None: ...


def buffer_layout(op: str, nbytes: int, ranks: int) -> tuple[int, int, int]:
    """(send elements, receive elements, bytes moved) for a float32 buffer of ~``nbytes``.

    The all-gather family needs ``nbytes`` to be a whole number of per-rank chunks (nccl-tests
    does the same), so the size is rounded down to a multiple of ``4·ranks`` bytes (at least one
    element per rank).
    """
    check_op(op)
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        chunk = max(1, int(nbytes) // (ITEMSIZE * ranks))
        send, recv = {"all_gather": (chunk, chunk * ranks),
                      "reduce_scatter": (chunk * ranks, chunk),
                      "all_to_all": (chunk * ranks, chunk * ranks)}[op]
        return send, recv, chunk * ranks * ITEMSIZE
    elems = max(1, int(nbytes) // ITEMSIZE)
    return elems, elems, elems * ITEMSIZE


def pingpong_partner(rank: int, size: int) -> tuple[int, bool] | None:
    """Partner of ``rank`` in the ping-pong and whether it starts: rank i < n/2 pairs with
    i + n/2 (so with consecutive placement the pairs cross nodes); an odd last rank idles."""
    half = size // 2
    if rank < half:
        return rank + half, True
    if rank < 2 * half:
        return rank - half, False
    return None


def mpi_library(banner: str) -> tuple[str, str]:
    """(library, version) from ``MPI_Get_library_version``'s banner: ``"Open MPI v5.0.3,
    package: …"`` → ("Open MPI", "Open MPI v5.0.3"); ``"MPICH Version: 4.2.0 …"`` →
    ("MPICH", "MPICH 4.2.0"); otherwise the first line as both."""
    first = (banner.strip().splitlines() or ["MPI"])[0].split(",")[0].strip()
    if " v" in first:
        return first.rsplit(" v", 1)[0], first
    if "Version:" in first:
        name, _, ver = first.partition("Version:")
        return name.strip(), f"{name.strip()} {ver.strip()}"
    return first, first


def _noop() -> None:
    return None


# ------------------------------------------------------------------------------------- mpi4py
class MpiAdapter:
    """mpi4py communicator. Build with :meth:`world` inside a program started by ``mpirun``."""

    backend = "mpi"

    def __init__(self, comm: Any):
        from mpi4py import MPI

        self._MPI, self.comm = MPI, comm
        self.library, self.library_version = mpi_library(MPI.Get_library_version())

    @classmethod
    def world(cls) -> "MpiAdapter":
        """The adapter over ``MPI.COMM_WORLD`` (importing mpi4py initialises MPI)."""
        try:
            from mpi4py import MPI
        except ImportError as exc:
            raise CalibrationError("the mpi backend needs mpi4py: pip install 'ddlsim[mpi]' "
                                   f"({exc})") from None
        return cls(MPI.COMM_WORLD)

    @property
    def rank(self) -> int:
        return self.comm.Get_rank()

    @property
    def size(self) -> int:
        return self.comm.Get_size()

    def hostname(self) -> str:
        return self._MPI.Get_processor_name() or socket.gethostname()

    def barrier(self) -> None:
        self.comm.Barrier()

    def synchronize(self) -> None:  # host memory: nothing in flight after a blocking call
        return None

    def allgather_obj(self, obj: Any) -> list:
        return self.comm.allgather(obj)

    def reduce_max(self, values: np.ndarray) -> np.ndarray:
        send = np.ascontiguousarray(values, dtype=np.float64)
        out = np.empty_like(send)
        self.comm.Allreduce(send, out, op=self._MPI.MAX)
        return out

    def split(self, colors: Sequence[int]) -> "MpiAdapter":
        return MpiAdapter(self.comm.Split(int(colors[self.rank]), self.rank))

    def supports(self, op: str) -> bool:
        return check_op(op) in ("all_reduce", "reduce", "broadcast", "all_gather",
                                "reduce_scatter", "all_to_all", "sendrecv", "exchange")

    def close(self) -> None:  # mpi4py finalizes MPI at exit
        return None

    def make_op(self, op: str, nbytes: int) -> OpCall:
        MPI, c = self._MPI, self.comm
        n_send, n_recv, moved = buffer_layout(op, nbytes, self.size)
        s = np.ones(n_send, dtype=np.float32)
        r = np.zeros(n_recv, dtype=np.float32)
        if op == "sendrecv":
            return self._pingpong(s, r, moved)
        if op == "exchange":
            return self._exchange(s, r, moved)
        run = {"all_reduce": lambda: c.Allreduce(s, r, op=MPI.SUM),
               "reduce": lambda: c.Reduce(s, r, op=MPI.SUM, root=0),
               "broadcast": lambda: c.Bcast(s, root=0),
               "all_gather": lambda: c.Allgather(s, r),
               "reduce_scatter": lambda: c.Reduce_scatter_block(s, r, op=MPI.SUM),
               "all_to_all": lambda: c.Alltoall(s, r)}[op]
        return OpCall(run, moved)

    def _pingpong(self, s: np.ndarray, r: np.ndarray, moved: int) -> OpCall:
        pair, c = pingpong_partner(self.rank, self.size), self.comm
        if pair is None:
            return OpCall(_noop, moved, 0.5)
        peer, first = pair

        def run() -> None:
            if first:
                c.Send(s, dest=peer, tag=7)
                c.Recv(r, source=peer, tag=7)
            else:
                c.Recv(r, source=peer, tag=7)
                c.Send(s, dest=peer, tag=7)
        return OpCall(run, moved, 0.5)

    def _exchange(self, s: np.ndarray, r: np.ndarray, moved: int) -> OpCall:
        """A ring shift: ``Irecv`` from the previous rank, blocking ``Send`` to the next,
        ``Wait`` (comm_only/resnet50.cpp's ``run_ring``, spcl/DNN-cpp-proxies); every rank
        transfers at once, on 2 ranks both directions of one pair."""
        c, n, me = self.comm, self.size, self.rank
        nxt, prev = (me + 1) % n, (me - 1) % n

        def run() -> None:
            req = c.Irecv(r, source=prev, tag=8)
            c.Send(s, dest=nxt, tag=8)
            req.Wait()
        return OpCall(run, moved)


# ------------------------------------------------------------------------- torch.distributed
class TorchAdapter:
    """``torch.distributed`` process group (``nccl`` on GPUs, ``gloo`` on CPUs).

    Build with :meth:`from_env` inside a program started by ``torchrun`` (which sets
    ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``).
    """

    #: Operations some torch versions lack on Gloo (reduce-scatter before ~2.6): probed once,
    #: collectively, and skipped — never emulated — when they raise.
    _PROBED = {"gloo": ("reduce_scatter",), "nccl": ()}

    def __init__(self, backend: str, group: Any, global_ranks: Sequence[int], device: Any):
        import torch
        import torch.distributed as dist

        self._torch, self._dist = torch, dist
        self.backend, self.group, self.device = backend, group, device
        self.global_ranks = list(global_ranks)
        self._support: dict[str, bool] = {}
        self.library = backend.upper() if backend == "nccl" else "Gloo"
        if backend == "nccl":
            ver = torch.cuda.nccl.version()
            ver = ".".join(map(str, ver)) if isinstance(ver, tuple) else str(ver)
            self.library_version = f"NCCL {ver} (torch {torch.__version__})"
        else:
            self.library_version = f"Gloo (torch {torch.__version__})"

    @classmethod
    def from_env(cls, backend: str) -> "TorchAdapter":
        """Initialise the default process group from torchrun's environment variables."""
        try:
            import torch
            import torch.distributed as dist
        except ImportError as exc:
            raise CalibrationError(f"the {backend} backend needs PyTorch: pip install "
                                   f"'ddlsim[torch]' ({exc})") from None
        if "RANK" not in os.environ:
            raise CalibrationError(f"--backend {backend} must run under torchrun (RANK is not "
                                   "set), e.g. torchrun --nproc-per-node 8 -m ddlsim.calibration "
                                   f"comm --backend {backend}")
        device = torch.device("cpu")
        if backend == "nccl":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group(backend=backend)
        return cls(backend, None, range(dist.get_world_size()), device)

    def close(self) -> None:
        """Tear down the default process group (Gloo aborts at exit when it is left up)."""
        if self.group is None and self._dist.is_initialized():
            self._dist.barrier()
            self._dist.destroy_process_group()

    @property
    def rank(self) -> int:
        return self._dist.get_rank(group=self.group)

    @property
    def size(self) -> int:
        return self._dist.get_world_size(group=self.group)

    def hostname(self) -> str:
        return socket.gethostname()

    def barrier(self) -> None:
        self._dist.barrier(group=self.group)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            self._torch.cuda.synchronize(self.device)

    def allgather_obj(self, obj: Any) -> list:
        out: list = [None] * self.size
        self._dist.all_gather_object(out, obj, group=self.group)
        return out

    def reduce_max(self, values: np.ndarray) -> np.ndarray:
        t = self._torch.as_tensor(np.asarray(values, dtype=np.float64), device=self.device)
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX, group=self.group)
        return t.cpu().numpy()

    def split(self, colors: Sequence[int]) -> "TorchAdapter":
        mine, keep = int(colors[self.rank]), None
        for color in sorted(set(int(c) for c in colors)):  # every rank creates every group
            members = [g for g, c in zip(self.global_ranks, colors) if int(c) == color]
            group = self._dist.new_group(ranks=members)
            if color == mine:
                keep = (group, members)
        return TorchAdapter(self.backend, keep[0], keep[1], self.device)

    def supports(self, op: str) -> bool:
        """Collective (every rank must call it in the same order) for probed operations."""
        if check_op(op) not in self._PROBED.get(self.backend, ()):
            return True
        if op not in self._support:
            try:
                self.make_op(op, ITEMSIZE * self.size).run()
                ok = True
            except (RuntimeError, NotImplementedError, ValueError):
                ok = False
            self._support[op] = all(self.allgather_obj(ok))
        return self._support[op]

    def make_op(self, op: str, nbytes: int) -> OpCall:
        torch, d, g = self._torch, self._dist, self.group
        n_send, n_recv, moved = buffer_layout(op, nbytes, self.size)
        s = torch.ones(n_send, dtype=torch.float32, device=self.device)
        r = torch.zeros(n_recv, dtype=torch.float32, device=self.device)
        root = self.global_ranks[0]
        if op == "sendrecv":
            return self._pingpong(s, r, moved)
        if op == "exchange":
            return self._exchange(s, r, moved)
        # newer torch renames the tensor variants *_single (same arguments)
        gather = getattr(d, "all_gather_single", None) or d.all_gather_into_tensor
        scatter = getattr(d, "reduce_scatter_single", None) or d.reduce_scatter_tensor
        run = {"all_reduce": lambda: d.all_reduce(s, group=g),
               "reduce": lambda: d.reduce(s, dst=root, group=g),
               "broadcast": lambda: d.broadcast(s, src=root, group=g),
               "all_gather": lambda: gather(r, s, group=g),
               "reduce_scatter": lambda: scatter(r, s, group=g),
               "all_to_all": lambda: d.all_to_all_single(r, s, group=g)}[op]
        return OpCall(run, moved)

    def _pingpong(self, s: Any, r: Any, moved: int) -> OpCall:
        pair, d = pingpong_partner(self.rank, self.size), self._dist
        if pair is None:
            return OpCall(_noop, moved, 0.5)
        peer, first = self.global_ranks[pair[0]], pair[1]

        def run() -> None:
            if first:
                d.send(s, dst=peer, group=self.group)
                d.recv(r, src=peer, group=self.group)
            else:
                d.recv(r, src=peer, group=self.group)
                d.send(s, dst=peer, group=self.group)
        return OpCall(run, moved, 0.5)

    def _exchange(self, s: Any, r: Any, moved: int) -> OpCall:
        """A ring shift, as :meth:`MpiAdapter._exchange`: every rank sends to the next and
        receives from the previous at once."""
        d, n, me = self._dist, self.size, self.rank
        nxt, prev = self.global_ranks[(me + 1) % n], self.global_ranks[(me - 1) % n]

        def run() -> None:
            req = d.irecv(r, src=prev, group=self.group)
            d.send(s, dst=nxt, group=self.group)
            req.wait()
        return OpCall(run, moved)
