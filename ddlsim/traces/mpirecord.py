"""Record the MPI calls of an mpi4py program as ddlsim MPI logs (:mod:`ddlsim.traces.mpilog`).

The PMPI idea (wrap every call, time it, pass it on) done in Python: the communicator
``MPI.COMM_WORLD`` is replaced by a :class:`LoggedComm` that times each call it forwards, and
``MPI.Request`` by a subclass whose waits are logged. Run a program under it with::

    mpirun -n 4 python -m ddlsim.traces.mpirecord OUTDIR -m ddlsim.reference.train run.yaml
    mpirun -n 4 python -m ddlsim.traces.mpirecord OUTDIR script.py ARGS…

Each rank writes ``OUTDIR/mpilog.RANK.jsonl`` when the program ends. Times are
``time.perf_counter()`` (one clock for every process of a Linux machine). Communicators made
by ``Split``, ``Split_type``, ``Dup`` and ``Create`` are logged too, named after their parent
and the order of creation. Only the calls listed in :data:`WRAPPED` are logged; any other
attribute is the real communicator's, unlogged.
"""

from __future__ import annotations

import json
import pickle
import sys
import time
from pathlib import Path

__all__ = ["CallLog", "LoggedComm", "install", "WRAPPED", "main"]


class CallLog:
    """The records of one rank, written by :meth:`save`."""

    def __init__(self, rank: int, size: int):
        self.lines = [{"ddlsim_mpilog": 1, "rank": rank, "size": size}]

    def add(self, **record) -> None:
        self.lines.append(record)

    def save(self, path: Path) -> None:
        path.write_text("".join(json.dumps(r) + "\n" for r in self.lines), encoding="utf-8")


def _nbytes(buf) -> int | None:
    from mpi4py import MPI
    if buf is None or buf is MPI.IN_PLACE:
        return None
    if isinstance(buf, (list, tuple)):
        buf = buf[0]
    return int(memoryview(buf).nbytes)


def _pickled(obj) -> int:
    return len(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL))


#: call -> (log name, bytes from (args, kwargs, size, result)), as docs/traces.md sizes them
WRAPPED = {
    "Allreduce": ("allreduce", lambda a, p, r: _nbytes(a[1])),
    "Iallreduce": ("allreduce", lambda a, p, r: _nbytes(a[1])),
    "Reduce": ("reduce", lambda a, p, r: _nbytes(a[0]) or _nbytes(a[1])),
    "Ireduce": ("reduce", lambda a, p, r: _nbytes(a[0]) or _nbytes(a[1])),
    "Bcast": ("bcast", lambda a, p, r: _nbytes(a[0])),
    "Ibcast": ("bcast", lambda a, p, r: _nbytes(a[0])),
    "Allgather": ("allgather", lambda a, p, r: _nbytes(a[1])),
    "Iallgather": ("allgather", lambda a, p, r: _nbytes(a[1])),
    "Reduce_scatter_block": ("reduce_scatter", lambda a, p, r: _nbytes(a[0]) or _nbytes(a[1])),
    "Ireduce_scatter_block": ("reduce_scatter", lambda a, p, r: _nbytes(a[0]) or _nbytes(a[1])),
    "Alltoall": ("alltoall", lambda a, p, r: _nbytes(a[0]) or _nbytes(a[1])),
    "Gather": ("gather", lambda a, p, r: p * _nbytes(a[0]) if _nbytes(a[0]) else _nbytes(a[1])),
    "Scatter": ("scatter", lambda a, p, r: p * _nbytes(a[1]) if _nbytes(a[1]) else _nbytes(a[0])),
    "Barrier": ("barrier", lambda a, p, r: 0),
    "Send": ("send", lambda a, p, r: _nbytes(a[0])),
    "Isend": ("send", lambda a, p, r: _nbytes(a[0])),
    "allreduce": ("allreduce", lambda a, p, r: _pickled(r)),
    "bcast": ("bcast", lambda a, p, r: _pickled(r)),
    "allgather": ("allgather", lambda a, p, r: p * _pickled(a[0])),
    "barrier": ("barrier", lambda a, p, r: 0),
    "send": ("send", lambda a, p, r: _pickled(a[0])),
}
#: call -> position of ``root`` among its positional arguments (mpi4py's signatures)
_ROOTED = {"Reduce": 3, "Ireduce": 3, "Bcast": 1, "Ibcast": 1, "Gather": 2, "Scatter": 2,
           "bcast": 1}
_MAKERS = ("Split", "Split_type", "Dup", "Create")


class LoggedComm:
    """A communicator that logs the calls of :data:`WRAPPED` and passes everything on."""

    def __init__(self, comm, name: str, log: CallLog):
        from mpi4py import MPI
        self._comm, self._name, self._log, self._made = comm, name, log, 0
        world = MPI.COMM_WORLD if not isinstance(MPI.COMM_WORLD, LoggedComm) \
            else MPI.COMM_WORLD._comm
        self._ranks = [int(r) for r in comm.Get_group().Translate_ranks(
            list(range(comm.Get_size())), world.Get_group())]

    def __getattr__(self, attr):
        real = getattr(self._comm, attr)
        if attr in WRAPPED:
            return self._logged(attr, real)
        if attr in _MAKERS:
            return self._maker(real)
        if attr in ("Recv", "recv"):
            return self._recv(attr, real)
        return real

    def _record(self, call: str, t0: float, t1: float, nbytes, **extra) -> None:
        self._log.add(call=call, t0=t0, t1=t1, bytes=int(nbytes or 0), comm=self._name, **extra)

    def _logged(self, attr: str, real):
        name, size_of = WRAPPED[attr]

        def call(*args, **kwargs):
            t0 = time.perf_counter()
            result = real(*args, **kwargs)
            t1 = time.perf_counter()
            extra = {}
            if attr in _ROOTED:
                at = _ROOTED[attr]
                extra["root"] = self._ranks[kwargs.get("root", args[at] if len(args) > at else 0)]
            if name == "send":
                dest = kwargs.get("dest", args[1] if len(args) > 1 else None)
                extra.update(peer=self._ranks[dest], tag=kwargs.get("tag", args[2] if len(args) > 2 else 0))
            if attr.startswith("I"):
                extra["nb"] = True
            self._record(name, t0, t1, size_of(args, self._comm.Get_size(), result), **extra)
            return _Request.wrap(result, self._log) if attr.startswith("I") else result
        return call

    def _recv(self, attr: str, real):
        from mpi4py import MPI

        def call(*args, **kwargs):
            status = kwargs.pop("status", None) or MPI.Status()
            t0 = time.perf_counter()
            result = real(*args, status=status, **kwargs)
            t1 = time.perf_counter()
            nbytes = status.Get_count(MPI.BYTE) if attr == "Recv" else _pickled(result)
            self._record("recv", t0, t1, nbytes, peer=self._ranks[status.Get_source()],
                         tag=status.Get_tag())
            return result
        return call

    def _maker(self, real):
        def make(*args, **kwargs):
            new = real(*args, **kwargs)
            self._made += 1
            from mpi4py import MPI
            if new == MPI.COMM_NULL:
                return new
            logged = LoggedComm(new, f"{self._name}.{self._made}", self._log)
            self._log.add(comm=logged._name, ranks=logged._ranks)
            return logged
        return make


class _Request:
    """Builds the logged ``MPI.Request`` subclass once mpi4py is imported."""

    cls = None

    @classmethod
    def install(cls, log: CallLog):
        from mpi4py import MPI
        base = MPI.Request

        class LoggedRequest(base):
            def Wait(self, status=None):
                t0 = time.perf_counter()
                out = base.Wait(self, status)
                log.add(call="wait", t0=t0, t1=time.perf_counter())
                return out

            @classmethod
            def Waitall(klass, requests, statuses=None):
                t0 = time.perf_counter()
                out = base.Waitall(requests, statuses)
                log.add(call="wait", t0=t0, t1=time.perf_counter())
                return out

        cls.cls = LoggedRequest
        MPI.Request = LoggedRequest

    @classmethod
    def wrap(cls, request, log):
        return cls.cls(request)


def install() -> CallLog:
    """Replace ``MPI.COMM_WORLD`` and ``MPI.Request`` by logged ones; returns the rank's log."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    log = CallLog(world.Get_rank(), world.Get_size())
    _Request.install(log)
    MPI.COMM_WORLD = LoggedComm(world, "world", log)
    return log


def main(argv: list[str] | None = None) -> int:
    """``python -m ddlsim.traces.mpirecord OUTDIR (-m MODULE | SCRIPT) ARGS…``."""
    import runpy
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2 or (argv[1] == "-m" and len(argv) < 3):
        print("usage: python -m ddlsim.traces.mpirecord OUTDIR (-m MODULE | SCRIPT) ARGS…",
              file=sys.stderr)
        return 2
    out = Path(argv[0])
    module = argv[2] if argv[1] == "-m" else None
    target = module or argv[1]
    rest = argv[3:] if module else argv[2:]
    out.mkdir(parents=True, exist_ok=True)
    log = install()
    sys.argv = [target, *rest]
    code = 0
    try:
        if module:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    log.save(out / f"mpilog.{log.lines[0]['rank']}.jsonl")
    return code


if __name__ == "__main__":
    sys.exit(main())
