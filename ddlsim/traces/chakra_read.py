"""Read Chakra execution traces (one ``.et`` file per rank) into a ddlsim workload; the
rules are in :mod:`ddlsim.traces.chakra` and docs/traces.md."""

from __future__ import annotations

import heapq
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..workloads.trace import (Block, Collective, Compute, GroupFamily, Op, P2P, Program,
                               RankClass, Step, Workload, WorkloadMeta)
from .chakra import OP_OF
from .chakra_schema import COLLECTIVES, NODE_TYPES, read_delimited, schema

__all__ = ["read_chakra", "find_chakra_files"]

_TYPE_NAME = {v: k for k, v in NODE_TYPES.items()}
_COLL_NAME = {v: k for k, v in COLLECTIVES.items()}


def find_chakra_files(source: str | Path) -> tuple[list[Path], Path | None]:
    """The per-rank files of a Chakra ET set, rank order, and its group file if any.

    ``source`` is a directory holding ``PREFIX.RANK.et`` files (one prefix) or one such file
    (its siblings of the same prefix are taken); the group file is ``PREFIX.comm_groups.json``.
    """
    source = Path(source)
    if source.is_dir():
        files = sorted(source.glob("*.et"))
    elif source.is_file():
        m = re.fullmatch(r"(.+)\.\d+\.et", source.name)
        files = sorted(source.parent.glob(f"{m.group(1)}.*.et")) if m else [source]
    else:
        raise ConfigError(f"Chakra trace {str(source)!r}: no such file or directory")
    ranked: dict[str, dict[int, Path]] = {}
    for f in files:
        m = re.fullmatch(r"(.+)\.(\d+)\.et", f.name)
        if m:
            ranked.setdefault(m.group(1), {})[int(m.group(2))] = f
    if len(ranked) != 1:
        found = sorted(ranked) or [f.name for f in files]
        raise ConfigError(f"Chakra trace {str(source)!r}: expected files PREFIX.RANK.et of one "
                          f"prefix, found {found[:5]}")
    (prefix, by_rank), = ranked.items()
    missing = sorted(set(range(max(by_rank) + 1)) - set(by_rank))
    if missing:
        raise ConfigError(f"Chakra trace {str(source)!r}: ranks {missing[:5]} have no "
                          f"{prefix}.RANK.et file; ranks must be 0 … N-1")
    groups = next(iter(by_rank.values())).parent / f"{prefix}.comm_groups.json"
    return [by_rank[r] for r in range(len(by_rank))], groups if groups.is_file() else None


def _attrs(node) -> dict:
    out = {}
    for a in node.attr:
        kind = a.WhichOneof("value")
        if kind is None:
            continue
        v = getattr(a, kind)
        out[a.name] = list(v.values) if kind.endswith("_list") else v
    return out


def _nodes(path: Path) -> list:
    s = schema()
    from google.protobuf.message import DecodeError
    try:
        raw = list(read_delimited(path.read_bytes(), str(path)))
    except OSError as e:
        raise ConfigError(f"Chakra trace {str(path)!r}: cannot be read ({e.strerror})") from None
    if not raw:
        raise ConfigError(f"Chakra trace {str(path)!r}: empty; expected a GlobalMetadata "
                          "message then nodes")
    try:
        return [s["Node"].FromString(b) for b in raw[1:]]
    except DecodeError as e:
        raise ConfigError(f"Chakra trace {str(path)!r}: a node is not a Chakra Node ({e})") from None


def _ordered(nodes: list, where: str) -> list:
    """``nodes`` in an order where every dependency comes first (file order where free)."""
    index = {n.id: i for i, n in enumerate(nodes)}
    if len(index) != len(nodes):
        raise ConfigError(f"Chakra trace {where}: node ids repeat")
    waiting = [0] * len(nodes)
    users: list[list[int]] = [[] for _ in nodes]
    for i, n in enumerate(nodes):
        for d in {*n.ctrl_deps, *n.data_deps}:
            if d not in index:
                raise ConfigError(f"Chakra trace {where}: node {n.id} ({n.name!r}) depends on "
                                  f"node {d}, which the file does not hold")
            waiting[i] += 1
            users[index[d]].append(i)
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        raise ConfigError(f"Chakra trace {where}: the dependencies form a cycle")
    return order


@dataclass
class _Families:
    """Process groups found, turned into ddlsim group families."""

    world: int
    table: dict                                         # pg_name -> ranks
    found: dict = field(default_factory=dict)           # family -> {tuple(ranks)}
    kinds: dict = field(default_factory=dict)

    def collective(self, a: dict, rank: int, where: str) -> str:
        """The family of a collective's (or a send/recv's) process group on ``rank``."""
        pg = a.get("pg_name")
        if pg is None or pg == "":
            ranks = tuple(range(self.world))
        elif str(pg) in self.table:
            ranks = tuple(sorted(int(r) for r in self.table[str(pg)]))
        else:
            raise ConfigError(f"Chakra trace {where}: pg_name {pg!r} is not in the group file "
                              f"(ids {sorted(self.table)[:5]}); give --comm-groups")
        if rank not in ranks:
            raise ConfigError(f"Chakra trace {where}: rank {rank} runs a collective on group "
                              f"{pg!r} = {list(ranks)[:8]}, which does not hold it")
        name = str(a.get("ddlsim_group") or f"pg.{pg or 'world'}")
        self.found.setdefault(name, set()).add(ranks)
        self.kinds[name] = a.get("ddlsim_group_kind", "world" if not pg else "dp")
        return name

    def pair(self, a: int, b: int) -> str:
        lo, hi = min(a, b), max(a, b)
        name = f"p2p.{lo}.{hi}"
        self.found.setdefault(name, set()).add((lo, hi))
        self.kinds[name] = "pp"
        return name

    def families(self) -> dict[str, GroupFamily]:
        out = {}
        for name, groups in sorted(self.found.items()):
            rows = sorted(groups)
            if len({len(r) for r in rows}) > 1 or len({x for r in rows for x in r}) != \
                    sum(len(r) for r in rows):
                raise ConfigError(f"process groups of {name!r} are not disjoint groups of one "
                                  f"size: {[list(r) for r in rows][:4]}")
            out[name] = GroupFamily(name, self.kinds[name], np.array(rows, dtype=np.int64))
        return out


def _int(a: dict, key: str, default: int, node, where: str) -> int:
    """An integer attribute (``default`` when absent)."""
    v = a.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"Chakra trace {where}: node {node.id} ({node.name!r}) has {key} = "
                          f"{v!r}; expected an integer")
    return v


def _size(a: dict, key: str, node, where: str) -> float:
    """A non-negative finite number attribute (0 when absent)."""
    v = a.get(key, 0)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ConfigError(f"Chakra trace {where}: node {node.id} ({node.name!r}) has {key} = "
                          f"{v!r}; expected a number >= 0")
    return float(v)


def _op(node, a: dict, rank: int, fams: _Families, where: str):
    """The ddlsim payload of one node."""
    kind = _TYPE_NAME.get(node.type, "INVALID_NODE")
    name = node.name or f"node{node.id}"
    if kind == "COMM_COLL_NODE":
        ctype = _COLL_NAME.get(_int(a, "comm_type", -1, node, where))
        if ctype is None:
            raise ConfigError(f"Chakra trace {where}: node {node.id} ({name!r}) has comm_type "
                              f"{a.get('comm_type')!r}; allowed: {sorted(COLLECTIVES.values())}")
        family = fams.collective(a, rank, where)
        members = sorted(next(g for g in fams.found[family] if rank in g))
        root = _int(a, "ddlsim_root", members[0], node, where)
        return Collective(name, OP_OF[ctype], family, _size(a, "comm_size", node, where),
                          root=members.index(root) if root in members else 0,
                          algorithm=a.get("ddlsim_algorithm") or None)
    if kind in ("COMM_SEND_NODE", "COMM_RECV_NODE"):
        send = kind == "COMM_SEND_NODE"
        peer = _int(a, "comm_dst" if send else "comm_src", -1, node, where)
        if not 0 <= peer < fams.world or peer == rank:
            raise ConfigError(f"Chakra trace {where}: node {node.id} ({name!r}) sends to or "
                              f"receives from rank {peer}; allowed: another rank of 0 … "
                              f"{fams.world - 1}")
        tag = a.get("ddlsim_tag") or str(a.get("comm_tag", 0))
        if not a.get("pg_name"):  # a pair of ranks of its own
            return P2P(name, "send" if send else "recv", fams.pair(rank, peer), 1,
                       _size(a, "comm_size", node, where), tag)
        family = fams.collective(a, rank, where)  # within a process group: a relative peer
        members = sorted(next(g for g in fams.found[family] if rank in g))
        if peer not in members:
            raise ConfigError(f"Chakra trace {where}: node {node.id} ({name!r}) names peer "
                              f"{peer} outside its group {a['pg_name']!r} = {members[:8]}")
        return P2P(name, "send" if send else "recv", family,
                   members.index(peer) - members.index(rank),
                   _size(a, "comm_size", node, where), tag)
    seconds = a.get("ddlsim_seconds", node.duration_micros * 1e-6)
    flops, nbytes = _size(a, "num_ops", node, where), _size(a, "tensor_size", node, where)
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds >= 0):
        raise ConfigError(f"Chakra trace {where}: node {node.id} ({name!r}) lasts "
                          f"{seconds!r} s; expected a finite duration >= 0")
    if "ddlsim_seconds" not in a and node.duration_micros == 0 and flops > 0:
        seconds = None  # no measured duration: ddlsim's roofline of num_ops / tensor_size
    return Compute(name, flops, nbytes, kind=a.get("ddlsim_kind", "gemm"), seconds=seconds)


def _block(nodes: list, rank: int, fams: _Families, where: str) -> tuple[Block, int]:
    """One rank's nodes as one block; streams chain dependent nodes (see module doc)."""
    ops: list[Op] = []
    index: dict[int, int] = {}
    stream_of: list[str] = []
    last: dict[str, int] = {}
    others = 0
    for node in _ordered(nodes, where):
        a = _attrs(node)
        deps = tuple(sorted({index[d] for d in (*node.ctrl_deps, *node.data_deps)}))
        others += _TYPE_NAME.get(node.type) not in ("COMP_NODE", "COMM_COLL_NODE",
                                                      "COMM_SEND_NODE", "COMM_RECV_NODE")
        stream = a.get("ddlsim_stream")
        if stream is None:
            stream = next((stream_of[d] for d in deps if last[stream_of[d]] == d),
                          None) or ("compute" if "compute" not in last else f"et.{len(last)}")
        index[node.id] = len(ops)
        ops.append(Op(_op(node, a, rank, fams, where), stream, deps))
        stream_of.append(stream)
        last[stream] = len(ops) - 1
    return Block("et", "other", _joined(ops)), others


def _joined(ops: list[Op]) -> tuple[Op, ...]:
    """``ops`` and, when a receive has no dependant, a zero-length op after every such
    receive: a rank's iteration ends when its data has arrived, as an ET's run ends when all
    its nodes are done (in ddlsim a receive's transfer delays only the ops depending on it)."""
    used = {d for op in ops for d in op.deps}
    sinks = tuple(i for i, op in enumerate(ops)
                  if i not in used and type(op.payload) is P2P and op.payload.kind == "recv")
    if not sinks:
        return tuple(ops)
    return (*ops, Op(Compute("et.received", 0.0, seconds=0.0), "compute", sinks))


def read_chakra(source: str | Path, comm_groups: str | Path | None = None) -> Workload:
    """Read a set of Chakra ETs (``PREFIX.RANK.et``) into a workload, one rank class per rank.

    Parameters
    ----------
    source : the directory holding the files, or one of them.
    comm_groups : ``{"pg_name": [ranks]}`` JSON; default ``PREFIX.comm_groups.json`` beside
        the files, if there is one.

    Returns
    -------
    Workload
        Its ``meta.model`` is the files' prefix; memory is unknown (empty).
    """
    files, found = find_chakra_files(source)
    path = Path(comm_groups) if comm_groups is not None else found
    table = {}
    if path is not None:
        try:
            table = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ConfigError(f"Chakra group file {str(path)!r}: cannot be read as JSON ({e})") from None
        if not isinstance(table, dict) or not all(isinstance(v, list) for v in table.values()):
            raise ConfigError(f"Chakra group file {str(path)!r}: expected {{\"id\": [ranks]}}")
    fams = _Families(len(files), {str(k): v for k, v in table.items()})
    classes, others = [], 0
    for rank, f in enumerate(files):
        block, n = _block(_nodes(f), rank, fams, repr(str(f)))
        others += n
        classes.append(RankClass(f"rank{rank}", (rank,), Program({"et": block}, (Step("et"),))))
    prefix = re.sub(r"\.\d+\.et$", "", files[0].name)
    wl = Workload(f"chakra:{prefix}", len(files), fams.families(), tuple(classes),
                  WorkloadMeta(model=prefix, architecture="chakra"))
    wl.validate()
    return wl
