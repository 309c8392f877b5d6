"""MPI call logs (one JSON Lines file per rank) replayed as ddlsim traces.

A PMPI-style log records every MPI call a rank makes with its start and end time; the time
between the end of one call and the start of the next is the rank's own work (compute, as the
run measured it), the calls are the communication. :func:`read_mpilog` turns the logs of all
ranks into a :class:`~ddlsim.workloads.trace.Workload` whose compute ops have those measured
durations (``Compute.seconds``) and whose calls are ddlsim collectives and sends/receives, so
the run can be predicted on another network (:func:`ddlsim.traces.replay.predict_workload`).
:mod:`ddlsim.traces.mpirecord` writes such logs for mpi4py programs.

The format (docs/traces.md), ``PREFIX.RANK.jsonl``, one JSON object per line:

* first line ``{"ddlsim_mpilog": 1, "rank": r, "size": n}``;
* a communicator, before its first use: ``{"comm": "NAME", "ranks": [global ranks]}``
  (``world`` is every rank and needs no line);
* a call: ``{"call": OP, "t0": s, "t1": s, "bytes": B, "comm": "NAME"}`` with, where they
  apply, ``"root"`` (global rank), ``"peer"`` (global rank of a send's destination or a
  receive's source), ``"tag"``, and ``"nb": true`` for a non-blocking call, whose completion
  a later ``{"call": "wait", "t0": s, "t1": s}`` waits for. OP is one of :data:`CALLS`;
  ``bytes`` follows ddlsim's trace convention (nccl-tests: all-gather's gathered output,
  reduce-scatter's full input, all-to-all's total sent; docs/trace.md), so
  ``MPI_Allgather(sendcount c)`` on p ranks logs ``p·c·size``.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..workloads.trace import (Block, Collective, Compute, GroupFamily, Op, P2P, Program,
                               RankClass, Step, Wait, Workload, WorkloadMeta)

__all__ = ["CALLS", "read_mpilog", "measured_span"]

#: call name in a log -> ddlsim collective op (send, recv and wait are handled apart)
CALLS = {"allreduce": "all_reduce", "reduce": "reduce", "bcast": "broadcast",
         "allgather": "all_gather", "reduce_scatter": "reduce_scatter",
         "alltoall": "all_to_all", "gather": "gather", "scatter": "scatter",
         "barrier": "barrier", "send": None, "recv": None, "wait": None}


def _records(path: Path) -> tuple[dict, list[dict]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"MPI log {str(path)!r}: cannot be read ({e})") from None
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"MPI log {str(path)!r} line {i}: not JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise ConfigError(f"MPI log {str(path)!r} line {i}: expected a JSON object")
        out.append((i, rec))
    if not out or out[0][1].get("ddlsim_mpilog") != 1:
        raise ConfigError(f"MPI log {str(path)!r}: the first line must be "
                          '{"ddlsim_mpilog": 1, "rank": r, "size": n}')
    return out[0][1], out[1:]


def _files(source: Path) -> list[Path]:
    files = sorted(source.glob("*.jsonl")) if source.is_dir() else [source] \
        if source.is_file() else []
    if not files:
        raise ConfigError(f"MPI log {str(source)!r}: no PREFIX.RANK.jsonl files there")
    by_rank = {}
    for f in files:
        m = re.fullmatch(r".+\.(\d+)\.jsonl", f.name)
        if m is None:
            raise ConfigError(f"MPI log {str(f)!r}: name it PREFIX.RANK.jsonl")
        by_rank[int(m.group(1))] = f
    if sorted(by_rank) != list(range(len(by_rank))):
        missing = sorted(set(range(max(by_rank) + 1)) - set(by_rank))
        raise ConfigError(f"MPI log {str(source)!r}: ranks {missing[:5]} have no file; ranks "
                          "must be 0 … N-1")
    return [by_rank[r] for r in range(len(by_rank))]


def _number(rec: dict, key: str, where: str, minimum: float = 0.0) -> float:
    v = rec.get(key)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= minimum \
            or not math.isfinite(v):
        raise ConfigError(f"{where}: {key} = {v!r}; expected a finite number >= {minimum:g}")
    return float(v)


class _Comms:
    """Communicators by name over all ranks, as ddlsim group families."""

    def __init__(self, world: int):
        self.world = world
        self.groups: dict[str, set[tuple[int, ...]]] = {"world": {tuple(range(world))}}

    def declare(self, rec: dict, rank: int, where: str) -> tuple[str, tuple[int, ...]]:
        ranks = rec.get("ranks")
        if not (isinstance(ranks, list) and ranks and all(
                isinstance(r, int) and 0 <= r < self.world for r in ranks)):
            raise ConfigError(f"{where}: communicator {rec.get('comm')!r} has ranks {ranks!r}; "
                              f"expected a list of ranks of 0 … {self.world - 1}")
        if rank not in ranks:
            raise ConfigError(f"{where}: rank {rank} declares communicator {rec['comm']!r} = "
                              f"{ranks[:8]}, which does not hold it")
        members = tuple(sorted(ranks))
        self.groups.setdefault(str(rec["comm"]), set()).add(members)
        return str(rec["comm"]), members

    def families(self) -> dict[str, GroupFamily]:
        out = {}
        for name, rows in sorted(self.groups.items()):
            rows = sorted(rows)
            flat = [r for row in rows for r in row]
            if len({len(r) for r in rows}) > 1 or len(set(flat)) != len(flat):
                raise ConfigError(f"communicator {name!r}: its instances on different ranks "
                                  f"are not disjoint groups of one size: {rows[:4]}; give each "
                                  "communicator of another shape its own name")
            out[name] = GroupFamily(name, "world", np.array(rows, dtype=np.int64))
        return out


def _rank_ops(records: list, rank: int, comms: _Comms, where: str,
              until: float | None = None) -> list[Op]:
    """One rank's calls as ops: measured gaps as compute, blocking calls in order, each after
    the previous op; non-blocking calls on stream ``nb``, joined by ``wait``; with ``until``
    (a window's end marker), the gap up to it as the last compute. The rank ends with a
    zero-length op after everything (a receive's data must have arrived)."""
    ops: list[Op] = []
    mine: dict[str, tuple[int, ...]] = {"world": tuple(range(comms.world))}
    sent: dict[tuple, int] = {}
    pending: set[str] = set()  # streams of non-blocking calls not yet waited for
    last_end = None
    for line, rec in records:
        at = f"{where} line {line}"
        if "call" not in rec:
            if "comm" not in rec:
                raise ConfigError(f"{at}: expected a call or a communicator record")
            name, members = comms.declare(rec, rank, at)
            mine[name] = members
            continue
        call = rec["call"]
        if call not in CALLS:
            raise ConfigError(f"{at}: call {call!r} is not known; allowed: {', '.join(CALLS)}")
        t0, t1 = _number(rec, "t0", at, float("-inf")), _number(rec, "t1", at, float("-inf"))
        if t1 < t0 or (last_end is not None and t0 < last_end - 1e-9):
            raise ConfigError(f"{at}: t0 = {t0}, t1 = {t1} after a call that ended at "
                              f"{last_end}; calls of a rank must follow each other in time")
        if last_end is not None and t0 > last_end:
            ops.append(Op(Compute("compute", 0.0, kind="elementwise", seconds=t0 - last_end),
                          deps=(len(ops) - 1,) if ops else ()))
        last_end = t1
        after = (len(ops) - 1,) if ops else ()
        if call == "wait":
            ops += _waits(rec, pending, after, at)
            continue
        payload = _payload(rec, call, rank, mine, sent, at)
        stream = "compute"
        if rec.get("nb"):
            stream = f"nb.{rec['req']}" if "req" in rec else "nb"
            pending.add(stream)
        ops.append(Op(payload, stream, after))
    if until is not None and last_end is not None and until > last_end:
        ops.append(Op(Compute("compute", 0.0, kind="elementwise", seconds=until - last_end),
                      deps=(len(ops) - 1,)))
    for stream in sorted(pending):  # never waited for in the log: joined at its end
        ops.append(Op(Wait("end." + stream, stream), deps=(len(ops) - 1,)))
    if ops:
        ops.append(Op(Compute("end", 0.0, seconds=0.0), deps=(len(ops) - 1,)))
    return ops


def _waits(rec: dict, pending: set[str], after: tuple, at: str) -> list[Op]:
    """A ``wait`` as joins of the streams of the requests it names (``"reqs"``), or of
    every non-blocking call not yet waited for."""
    if "reqs" in rec:
        ids = rec["reqs"]
        if not isinstance(ids, list):
            raise ConfigError(f"{at}: reqs = {ids!r}; expected a list of request ids")
        streams = [f"nb.{i}" for i in ids if f"nb.{i}" in pending]
    else:
        streams = sorted(pending)
    pending.difference_update(streams)
    if not streams:  # nothing of the log's to wait for: the wait is a point in time
        return [Op(Compute("wait", 0.0, seconds=0.0), deps=after)]
    return [Op(Wait("wait", s), deps=after) for s in streams]


def _payload(rec: dict, call: str, rank: int, mine: dict, sent: dict, at: str):
    comm = str(rec.get("comm", "world"))
    if comm not in mine:
        raise ConfigError(f"{at}: communicator {comm!r} is used before a "
                          '{"comm": …, "ranks": […]} line declares it')
    members = mine[comm]
    nbytes = _number(rec, "bytes", at) if call != "barrier" or "bytes" in rec else 0.0
    if CALLS[call] is not None:
        root = rec.get("root", members[0])
        if root not in members or isinstance(root, bool):
            raise ConfigError(f"{at}: root {root} is not in communicator {comm!r} {members[:8]}")
        return Collective(call, CALLS[call], comm, nbytes, root=members.index(root))
    peer = rec.get("peer")
    if isinstance(peer, bool) or not isinstance(peer, int) or peer not in members or peer == rank:
        raise ConfigError(f"{at}: {call} peer = {peer!r}; expected another rank of "
                          f"communicator {comm!r} {members[:8]}")
    tag = rec.get("tag", 0)
    if not isinstance(tag, (int, str)) or isinstance(tag, bool):
        raise ConfigError(f"{at}: tag = {tag!r}; expected an integer")
    src, dst = (rank, peer) if call == "send" else (peer, rank)
    key = (comm, src, dst, tag)
    seq = sent[key] = sent.get(key, -1) + 1  # MPI's non-overtaking order on (pair, tag)
    return P2P(call, call, comm, members.index(peer) - members.index(rank), nbytes,
               f"{key[3]}#{seq}")


def _windowed(records: list, window: tuple[str, int, int] | None, where: str
              ) -> tuple[list, float | None]:
    """The records from the ``first``-th call ``name`` (counting from 0) up to, not
    including, the ``last``-th (communicator lines before it kept), and the ``last``-th's
    start time."""
    if window is None:
        return records, None
    name, first, last = window
    marks = [k for k, (_, r) in enumerate(records) if r.get("call") == name]
    if not 0 <= first < last or last >= len(marks):
        raise ConfigError(f"{where}: window {name}:{first}:{last} needs calls {name!r} number "
                          f"{first} < {last} (from 0); the log has {len(marks)}")
    lo, hi = marks[first], marks[last]
    return [(i, r) for k, (i, r) in enumerate(records)
            if lo <= k < hi or ("call" not in r and k < lo)], float(records[hi][1]["t0"])


def read_mpilog(source: str | Path, window: tuple[str, int, int] | None = None) -> Workload:
    """Read the MPI call logs ``PREFIX.RANK.jsonl`` of every rank into a workload.

    Parameters
    ----------
    source : the directory holding the logs (or the log of a single-rank run).
    window : ``(call, first, last)``: replay only from the ``first``-th ``call`` (from 0) of
        each rank up to the ``last``-th, e.g. ``("barrier", 2, 4)`` for two iterations that
        each start with a barrier, leaving out start-up and warm-up.

    Returns
    -------
    Workload
        One rank class per rank, one block of its calls and measured gaps.
    """
    files = _files(Path(source))
    comms = _Comms(len(files))
    classes = []
    for rank, f in enumerate(files):
        head, records = _records(f)
        if head.get("rank") != rank or head.get("size") != len(files):
            raise ConfigError(f"MPI log {str(f)!r}: header says rank {head.get('rank')!r} of "
                              f"{head.get('size')!r}; the files hold {len(files)} ranks and "
                              f"this is rank {rank}")
        where = f"MPI log {str(f)!r}"
        kept, until = _windowed(records, window, where)
        ops = _rank_ops(kept, rank, comms, where, until)
        block = Block("calls", "other", tuple(ops))
        classes.append(RankClass(f"rank{rank}", (rank,), Program({"calls": block},
                                                                 (Step("calls"),))))
    wl = Workload(f"mpilog:{Path(source).name}", len(files), comms.families(), tuple(classes),
                  WorkloadMeta(model=Path(source).name, architecture="mpilog"))
    wl.validate()
    return wl


def measured_span(source: str | Path, window: tuple[str, int, int] | None = None) -> float:
    """The logged run's span: the largest, over ranks, of its last call's end less its first
    call's start (s) (each rank's own clock); with a ``window``, from the start of its first
    marker call to the start of its last (see :func:`read_mpilog`)."""
    spans = []
    for f in _files(Path(source)):
        _, records = _records(f)
        if window is not None:
            name, first, last = window
            marks = [r["t0"] for _, r in records if r.get("call") == name]
            _windowed(records, window, f"MPI log {str(f)!r}")  # checks the marks exist
            spans.append(marks[last] - marks[first])
            continue
        times = [(r["t0"], r["t1"]) for _, r in records if "call" in r]
        if times:
            spans.append(max(t for _, t in times) - min(t for t, _ in times))
    return max(spans, default=0.0)
