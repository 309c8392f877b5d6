"""Chakra execution traces (MLCommons Chakra ET, the input of ASTRA-sim): write ddlsim's trace
as one ET per rank, and read ETs back into a ddlsim :class:`~ddlsim.workloads.trace.Workload`.

Writing (:func:`export_chakra`): every op a rank issues in one iteration becomes a node, in
issue order. A compute op is a ``COMP_NODE`` whose ``duration_micros`` is ddlsim's time for it
(the cost model of the run's system); a collective a ``COMM_COLL_NODE`` (``comm_type``,
``comm_size`` = ddlsim's nccl-tests bytes, ``pg_name`` naming a process group of
``PREFIX.comm_groups.json``, ``{"id": [ranks]}`` as ASTRA-sim's
``--comm-group-configuration`` reads it); a send/recv a ``COMM_SEND_NODE``/``COMM_RECV_NODE``
(``comm_src``, ``comm_dst``, ``comm_size``, ``comm_tag``). ddlsim's streams become
dependencies: each node's ``data_deps`` (the list ASTRA-sim's feeder waits for) hold the
previous node of its stream and the nodes of its op's ``deps``; a ``Wait`` becomes a zero-length
``COMP_NODE`` after the last node of the stream it waits for. ``ddlsim_*`` attributes keep
what Chakra has no field for (exact seconds, the stream, the group family), so a file read
back gives the same prediction.

Reading (:func:`read_chakra`) inverts this, and reads ETs from other tools: every rank is its
own rank class; a node runs after its dependencies (ops are put on streams so that a chain
of dependent nodes shares one stream, which keeps ddlsim's stream order equal to the
dependencies); a collective runs on the ranks of its ``pg_name`` (all ranks without one). A
``COMP_NODE`` takes its ``duration_micros`` (or, with none, ddlsim's roofline of its
``num_ops``/``tensor_size`` on the system it is predicted on). docs/traces.md lists the rules.
"""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path

from ..errors import ConfigError
from ..workloads.trace import Collective, Compute, P2P, Wait, Workload
from .chakra_schema import COLLECTIVES, NODE_TYPES, schema, write_delimited

__all__ = ["export_chakra", "COLLECTIVE_OF", "OP_OF"]

#: ddlsim collective op -> Chakra CollectiveCommType
COLLECTIVE_OF = {"all_reduce": "ALL_REDUCE", "reduce": "REDUCE", "all_gather": "ALL_GATHER",
                 "gather": "GATHER", "scatter": "SCATTER", "broadcast": "BROADCAST",
                 "all_to_all": "ALL_TO_ALL", "reduce_scatter": "REDUCE_SCATTER",
                 "barrier": "BARRIER"}
#: Chakra CollectiveCommType -> ddlsim collective op (REDUCE_SCATTER_BLOCK is a reduce-scatter)
OP_OF = {**{v: k for k, v in COLLECTIVE_OF.items()}, "REDUCE_SCATTER_BLOCK": "reduce_scatter"}
SCHEMA_VERSION = "ddlsim-chakra-0.0.4"


def group_ids(workload: Workload) -> dict[tuple[str, int], int]:
    """(family, group index) -> process-group id (1, 2, …; families in name order)."""
    ids, n = {}, 0
    for fam in sorted(workload.groups):
        for g in range(workload.groups[fam].members.shape[0]):
            n += 1
            ids[(fam, g)] = n
    return ids


def p2p_tag(tag: str, microbatch: int) -> int:
    """The ``comm_tag`` of a send/recv: CRC-32 of ``tag#microbatch`` in 31 bits, the same on
    both ends."""
    return zlib.crc32(f"{tag}#{microbatch}".encode()) & 0x7FFFFFFF


class _RankWriter:
    """The nodes of one rank, in issue order."""

    def __init__(self, workload: Workload, rank: int, cost, gids: dict):
        self.s = schema()
        self.wl, self.rank, self.cost, self.gids = workload, rank, cost, gids
        self.nodes: list = []
        self.last: dict[str, int] = {}  # stream -> id of its last node

    def _attr(self, name: str, **value):
        return self.s["AttributeProto"](name=name, **value)

    def _node(self, name: str, kind: str, stream: str, deps: list[int], attrs: list,
              duration_s: float | None = None) -> int:
        node = self.s["Node"](id=len(self.nodes), name=name, type=NODE_TYPES[kind])
        before = [self.last[stream]] if stream in self.last else []
        node.data_deps.extend(sorted({*deps, *before}))  # ASTRA-sim's feeder reads data_deps
        if duration_s is not None:
            node.duration_micros = round(duration_s * 1e6)
            attrs.append(self._attr("ddlsim_seconds", double_val=duration_s))
        attrs += [self._attr("is_cpu_op", bool_val=False),
                  self._attr("ddlsim_stream", string_val=stream)]
        node.attr.extend(attrs)
        self.nodes.append(node)
        self.last[stream] = node.id
        return node.id

    def _group(self, family: str) -> tuple[int, list[int]]:
        fam = self.wl.groups[family]
        g = int((fam.members == self.rank).any(axis=1).argmax())
        return g, [int(r) for r in fam.members[g]]

    def op(self, op, deps: list[int], microbatch: int) -> int:
        p, stream = op.payload, op.stream
        if type(p) is Compute:
            seconds = self.cost.compute(p) * op.repeat
            return self._node(p.name, "COMP_NODE", stream, deps, [
                self._attr("num_ops", int64_val=int(p.flops * op.repeat)),
                self._attr("tensor_size", uint64_val=int(p.bytes * op.repeat)),
                self._attr("ddlsim_kind", string_val=p.kind)], seconds)
        if type(p) is Wait:
            after = [self.last[p.stream]] if p.stream in self.last else []
            return self._node(p.name, "COMP_NODE", stream, deps + after, [], 0.0)
        last = -1
        for k in range(op.repeat):
            last = self._comm(p, stream, deps if k == 0 else [], microbatch)
        return last

    def _comm(self, p, stream: str, deps: list[int], microbatch: int) -> int:
        g, members = self._group(p.group)
        fam = self.wl.groups[p.group]
        common = [self._attr("comm_size", int64_val=int(round(p.bytes))),
                  self._attr("ddlsim_group", string_val=p.group),
                  self._attr("ddlsim_group_kind", string_val=fam.kind)]
        if type(p) is Collective:
            if p.split_bytes is not None:
                raise ConfigError(f"op {p.name!r}: an uneven all-to-all (split_bytes) has no "
                                  "Chakra form; this version exports even collectives only")
            attrs = [self._attr("comm_type", int64_val=COLLECTIVES[COLLECTIVE_OF[p.op]]),
                     self._attr("pg_name", string_val=str(self.gids[(p.group, g)])),
                     self._attr("ddlsim_root", int64_val=members[p.root % len(members)])]
            if p.algorithm:
                attrs.append(self._attr("ddlsim_algorithm", string_val=p.algorithm))
            return self._node(p.name, "COMM_COLL_NODE", stream, deps, common + attrs)
        me = members.index(self.rank)
        peer = members[(me + p.peer) % len(members)]
        src, dst = (self.rank, peer) if p.kind == "send" else (peer, self.rank)
        attrs = [self._attr("comm_src", int32_val=src), self._attr("comm_dst", int32_val=dst),
                 self._attr("pg_name", string_val=str(self.gids[(p.group, g)])),
                 self._attr("comm_tag", int32_val=p2p_tag(p.tag, microbatch)),
                 self._attr("ddlsim_tag", string_val=f"{p.tag}#{microbatch}")]
        kind = "COMM_SEND_NODE" if p.kind == "send" else "COMM_RECV_NODE"
        return self._node(p.name, kind, stream, deps, common + attrs)


def _rank_nodes(workload: Workload, rank: int, cost, gids: dict) -> list:
    w = _RankWriter(workload, rank, cost, gids)
    cls = next(c for c in workload.classes if rank in c.ranks)
    for step in cls.program.steps:
        block = cls.program.blocks[step.block].flat
        ids: list[int] = []
        for op in block.ops:
            ids.append(w.op(op, [ids[d] for d in op.deps], step.microbatch))
    return w.nodes


def export_chakra(workload: Workload, cost, directory: str | Path, prefix: str = "ddlsim",
                  *, force: bool = False, max_nodes: int = 5_000_000) -> list[Path]:
    """Write ``workload`` as Chakra ETs: ``DIRECTORY/PREFIX.RANK.et`` per rank and
    ``DIRECTORY/PREFIX.comm_groups.json``.

    Parameters
    ----------
    workload : the trace (:func:`ddlsim.build_workload`).
    cost : its cost model (compute durations come from it).
    directory : created if missing; existing files are replaced only with ``force``.
    prefix : file name prefix.
    max_nodes : refuse an export of more nodes than this (all ranks together).

    Returns
    -------
    list of Path
        The files written, ranks in order, then the group file.
    """
    from ..textio import check_output, write_output
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", prefix):
        raise ConfigError(f"prefix {prefix!r}: use letters, digits, '.', '_' or '-'")
    directory = Path(directory)
    paths = [directory / f"{prefix}.{r}.et" for r in range(workload.world_size)]
    groups = directory / f"{prefix}.comm_groups.json"
    for p in (*paths, groups):
        check_output(p, force, what="Chakra output file")
    gids = group_ids(workload)
    first = _rank_nodes(workload, 0, cost, gids)
    if len(first) * workload.world_size > max_nodes:
        raise ConfigError(f"exporting {workload.world_size} ranks of about {len(first)} nodes "
                          f"each exceeds max_nodes = {max_nodes}; raise it or export a smaller "
                          "plan")
    directory.mkdir(parents=True, exist_ok=True)
    s = schema()
    meta = s["GlobalMetadata"](version=SCHEMA_VERSION, attr=[
        s["AttributeProto"](name="schema", string_val=SCHEMA_VERSION),
        s["AttributeProto"](name="ddlsim_workload", string_val=workload.name),
        s["AttributeProto"](name="ddlsim_world_size", int64_val=workload.world_size)])
    import io
    for rank, path in enumerate(paths):
        buf = io.BytesIO()
        write_delimited(buf, meta)
        for node in first if rank == 0 else _rank_nodes(workload, rank, cost, gids):
            write_delimited(buf, node)
        write_output(path, buf.getvalue(), force=force, what="Chakra output file")
    table = {str(i): [int(r) for r in workload.groups[f].members[g]] for (f, g), i in gids.items()}
    write_output(groups, json.dumps(table, indent=1) + "\n", force=force,
                 what="Chakra output file")
    return [*paths, groups]
