"""The communication of one iteration as an MPI profiler (mpiP, a PMPI wrapper) reports it.

Computed from the workload trace alone (no engine): every collective and point-to-point op of
every rank's program is counted over all steps, ``repeat`` and :class:`~ddlsim.workloads.trace.Loop`
counts included, and turned into MPI buffer sizes (docs/comm.md):

=================  ===========================  ==============================
op (MPI name)      send_bytes (per call)        recv_bytes (per call)
=================  ===========================  ==============================
allreduce          B                            B
allgather          B/p                          B   (B: the gathered output)
reduce_scatter     B   (the full input)         B/p
alltoall           B   (everything sent)        B
alltoallv          Σ_j b_j; by sender: p·b_i    p·b_i (member i; every member sends b);
                                               by sender: Σ_j b_j
bcast              root: B, others: 0           root: 0, others: B
reduce             B                            root: B, others: 0
gather             B/p                          root: B, others: 0
scatter            root: B, others: 0           B/p
barrier            0                            0
send / recv        B / 0                        0 / B
=================  ===========================  ==============================

``B`` is the trace's ``bytes`` (the nccl-tests convention, docs/trace.md), ``p`` the group size.

Blocking or not: an op on the ``compute`` stream blocks the rank's program (``allreduce``,
``send``); an op on any other stream runs beside it until a ``Wait`` joins that stream, the
trace's form of a non-blocking call and its ``MPI_Wait``, and is named as MPI's non-blocking
call: ``isend``, ``irecv``, ``iallreduce``, ``iallgather``, ``ireduce_scatter``,
``ialltoall(v)``, ``ibcast``, ``ireduce``, ``igather``, ``iscatter``, ``ibarrier``. Buffer sizes
are those of the blocking form.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from .errors import DDLSimError
from .workloads.trace import P2P, Collective, Loop, Program, StepTable, Workload

__all__ = ["MPI_NAMES", "BLOCKING_STREAM", "mpi_name", "MAX_RANK_ROWS", "CommProfileError", "comm_profile"]

#: The trace's collective names → MPI's.
MPI_NAMES = {"all_reduce": "allreduce", "all_gather": "allgather",
             "reduce_scatter": "reduce_scatter", "all_to_all": "alltoall",
             "broadcast": "bcast", "reduce": "reduce", "gather": "gather",
             "scatter": "scatter", "barrier": "barrier"}
#: The stream whose ops block the program; ops on other streams are non-blocking (``i…``).
BLOCKING_STREAM = "compute"
#: ``--per rank`` refuses to print more rows than this.
MAX_RANK_ROWS = 100_000
_ROOTED = ("bcast", "reduce", "gather", "scatter")
RANK_COLUMNS = ["rank", "op", "group", "group_size", "peer", "root", "calls", "send_bytes",
                "recv_bytes"]
CLASS_COLUMNS = ["class", "ranks", "op", "group", "group_size", "peer", "root", "role", "calls",
                 "send_bytes", "recv_bytes"]


class CommProfileError(DDLSimError, ValueError):
    """The profile asked for cannot be produced (too many rows, a rank outside a group)."""


@dataclass
class _Entry:
    """One (op, group, relative peer, root member) of a class: calls and bytes per rank."""

    calls: int = 0
    nbytes: float = 0.0
    send: np.ndarray | None = field(default=None)  # alltoallv: bytes per group member
    recv: np.ndarray | None = field(default=None)


def block_counts(program: Program) -> dict[str, int]:
    """How many times each block of ``program`` is issued in one iteration (a
    :class:`StepTable` is counted with numpy, never step by step)."""
    steps = program.steps
    if isinstance(steps, StepTable):
        n = np.bincount(steps.block, minlength=len(steps.names))
        return {name: int(k) for name, k in zip(steps.names, n.tolist()) if k}
    return dict(Counter(s.block for s in steps))


def mpi_name(base: str, stream: str) -> str:
    """MPI's name of a call: ``base`` (``allreduce``, ``send``, …) as is on the blocking
    stream, with MPI's ``i`` prefix of the non-blocking form on any other stream."""
    return base if stream == BLOCKING_STREAM else f"i{base}"


def _base(op: str) -> str:
    """The blocking name of an MPI name (``iallreduce`` → ``allreduce``)."""
    return op[1:] if op.startswith("i") else op


def _walk(ops, times: int, out: dict) -> None:
    """Add the communication ops of ``ops`` issued ``times`` times each (× repeat, × loop
    count) to ``out``."""
    for op in ops:
        p, k = op.payload, times * op.repeat
        if isinstance(p, Loop):
            _walk(p.body, k * p.count, out)
        elif isinstance(p, P2P):
            e = out.setdefault((mpi_name(p.kind, op.stream), p.group, p.peer, None), _Entry())
            e.calls += k
            e.nbytes += k * p.bytes
        elif isinstance(p, Collective):
            name = MPI_NAMES[p.op]
            if p.split_bytes is not None:
                name = "alltoallv"
            root = p.root if name in _ROOTED else None
            e = out.setdefault((mpi_name(name, op.stream), p.group, None, root), _Entry())
            e.calls += k
            e.nbytes += k * p.bytes
            if p.split_bytes is not None:
                vec = k * np.asarray(p.split_bytes, dtype=float)
                each, per = np.full(len(vec), vec.sum()), len(vec) * vec
                send, recv = (each, per) if p.split_by == "receiver" else (per, each)
                e.send = send if e.send is None else e.send + send
                e.recv = recv if e.recv is None else e.recv + recv


def class_entries(program: Program) -> dict[tuple, _Entry]:
    """The communication of one rank of a class: ``(op, group, peer, root) → _Entry``, with
    ``peer`` the relative member offset (send/recv) and ``root`` the root's member index."""
    out: dict[tuple, _Entry] = {}
    for name, count in block_counts(program).items():
        _walk(program.blocks[name].ops, count, out)
    return out


def _positions(workload: Workload, family: str) -> tuple[np.ndarray, np.ndarray]:
    """Per global rank: the index of its group in ``family`` and its member index (−1: none)."""
    m = workload.groups[family].members
    g = np.full(workload.world_size, -1, dtype=np.int64)
    i = np.full(workload.world_size, -1, dtype=np.int64)
    g[m.ravel()] = np.repeat(np.arange(m.shape[0]), m.shape[1])
    i[m.ravel()] = np.tile(np.arange(m.shape[1]), m.shape[0])
    return g, i


def _buffers(key: tuple, e: _Entry, p: int, member: np.ndarray, is_root: np.ndarray):
    """Send and receive bytes per rank (arrays over the class's ranks) of one entry."""
    op, B = _base(key[0]), e.nbytes
    one = np.ones(len(member))
    if op == "alltoallv":
        return e.send[member], e.recv[member]
    send = {"allgather": B / p, "gather": B / p, "barrier": 0.0, "recv": 0.0,
            "bcast": np.where(is_root, B, 0.0), "scatter": np.where(is_root, B, 0.0)}
    recv = {"reduce_scatter": B / p, "scatter": B / p, "barrier": 0.0, "send": 0.0,
            "bcast": np.where(is_root, 0.0, B), "reduce": np.where(is_root, B, 0.0),
            "gather": np.where(is_root, B, 0.0)}
    return send.get(op, B) * one, recv.get(op, B) * one


def _class_frames(workload: Workload, per: str, pos: dict):
    """Yield one column dict per (class, entry) over the class's ranks (``per="rank"``) or
    summed per role (``per="class"``)."""
    for c in workload.classes:
        ranks = np.asarray(c.ranks, dtype=np.int64)
        for key, e in class_entries(c.program).items():
            op, fam, peer, root = key
            if fam not in pos:
                pos[fam] = _positions(workload, fam)
            g, i = pos[fam][0][ranks], pos[fam][1][ranks]
            if (g < 0).any():
                raise CommProfileError(f"rank {int(ranks[g < 0][0])} of class {c.name!r} is in "
                                       f"no group of family {fam!r}")
            members = workload.groups[fam].members
            p = members.shape[1]
            is_root = i == (root % p) if root is not None else np.zeros(len(ranks), bool)
            send, recv = _buffers(key, e, p, i, is_root)
            calls = np.full(len(ranks), e.calls, dtype=np.int64)
            if per == "rank":
                yield {"rank": ranks, "op": op, "group": fam, "group_size": p,
                       "peer": members[g, (i + peer) % p] if peer is not None else None,
                       "root": members[g, root % p] if root is not None else None,
                       "calls": calls, "send_bytes": send, "recv_bytes": recv}
                continue
            for role, mask in _roles(op, is_root):
                if mask.any():
                    yield {"class": c.name, "ranks": int(mask.sum()), "op": op, "group": fam,
                           "group_size": p, "peer": peer, "root": root, "role": role,
                           "calls": int(calls[mask].sum()), "send_bytes": float(send[mask].sum()),
                           "recv_bytes": float(recv[mask].sum())}


def _roles(op: str, is_root: np.ndarray):
    if _base(op) in _ROOTED:
        return (("root", is_root), ("member", ~is_root))
    return (("", np.ones(len(is_root), bool)),)


def count_rank_rows(workload: Workload) -> int:
    """An upper bound of the rows of ``--per rank`` (ranks × distinct ops of their class)."""
    return sum(len(c.ranks) * len(class_entries(c.program)) for c in workload.classes)


def comm_profile(workload: Workload, per: str = "rank", max_rows: int = MAX_RANK_ROWS):
    """The communication of one iteration, one row per rank (or class) and MPI operation.

    Parameters
    ----------
    workload : the trace (:func:`ddlsim.api.build_workload`).
    per : ``"rank"``: one row per (rank, op, group, peer, root), peers and roots as global
        ranks; ``"class"``: one row per (rank class, op, group, relative peer, root member
        index, role), calls and bytes summed over the class's ranks that play the role.
    max_rows : ``per="rank"`` refuses workloads with more rows than this.

    Returns
    -------
    pandas.DataFrame
        Columns :data:`RANK_COLUMNS` or :data:`CLASS_COLUMNS`; ``calls`` per iteration,
        ``send_bytes`` and ``recv_bytes`` in bytes (the convention in the module docstring).
    """
    import pandas as pd

    if per not in ("rank", "class"):
        raise CommProfileError(f"per {per!r} is not allowed; choose rank or class")
    if per == "rank":
        n = count_rank_rows(workload)
        if n > max_rows:
            raise CommProfileError(
                f"--per rank would print about {n:,} rows ({workload.world_size:,} ranks), more "
                f"than the {max_rows:,} allowed; use --per class (one row per rank class and op)")
    parts = [pd.DataFrame(d) if per == "rank" else d
             for d in _class_frames(workload, per, {})]
    cols = RANK_COLUMNS if per == "rank" else CLASS_COLUMNS
    if per == "class":
        frame = pd.DataFrame(parts, columns=cols)
        for col in ("peer", "root"):
            frame[col] = frame[col].astype("Int64")
        return frame.reset_index(drop=True)
    if not parts:
        return pd.DataFrame(columns=cols)
    frame = pd.concat(parts, ignore_index=True)
    for col in ("peer", "root"):
        frame[col] = frame[col].astype("Int64")
    keys = cols[:6]
    frame = frame.groupby(keys, dropna=False, sort=False, as_index=False)[cols[6:]].sum()
    return frame.sort_values(["rank", "group", "op", "peer", "root"],
                             kind="stable").reset_index(drop=True)[cols]


def _integral(frame):
    """``frame`` with byte columns as integers where every value is a whole number."""
    frame = frame.copy()
    for col in ("send_bytes", "recv_bytes"):
        v = frame[col].to_numpy(dtype=float)
        if np.all(np.isfinite(v)) and np.all(v == np.round(v)):
            frame[col] = v.astype(np.int64)
    return frame


def render_profile(frame, fmt: str, *, per: str, world_size: int) -> str:
    """The profile as text: ``table`` (aligned columns), ``csv`` or ``json`` (``{"per",
    "world_size", "rows"}``, missing peers and roots as null)."""
    frame = _integral(frame)
    if fmt == "csv":
        return frame.to_csv(index=False, lineterminator="\n")
    if fmt == "json":
        from .report import dumps_json
        rows = [{k: _plain(v) for k, v in r.items()}
                for r in frame.astype(object).to_dict(orient="records")]
        return dumps_json({"per": per, "world_size": world_size, "rows": rows})
    if frame.empty:
        return "no communication\n"
    shown = frame.astype(object).where(frame.notna(), "-")
    return shown.to_string(index=False) + "\n"


def _plain(v):
    """A JSON value: pandas' missing value as None, numpy scalars as Python numbers."""
    import pandas as pd

    if v is None or v is pd.NA:
        return None
    return v.item() if isinstance(v, np.generic) else v
