"""Where things sit in a :class:`~.graph.Topology`: compute nodes and their devices, each
device's NICs, each node's NICs, node-local links (the local router's adjacency), and the
checks that every device can leave its node."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ConfigError
from .builder import NODE_KINDS, NODE_LOCAL_KINDS

if TYPE_CHECKING:
    from .graph import Topology

__all__ = ["LocalLinks", "NicSet", "DeviceNics", "node_counts", "nics_by_node",
           "nics_of_devices", "check_nics"]

_NIC = NODE_KINDS.index("nic")
_LOCAL_CODES = np.array([NODE_KINDS.index(k) for k in NODE_LOCAL_KINDS])


class LocalLinks(Mapping):
    """Successors ``(vertex id, latency)`` of each node-local vertex over the links inside its
    own node, read from the edge arrays on first use (the local router's adjacency)."""

    def __init__(self, topo: Topology, vnode: np.ndarray):
        self._topo, self._node = topo, vnode
        self._local = np.isin(topo._vkind, _LOCAL_CODES)
        self._memo: dict[int, list[tuple[int, float]]] = {}

    def __getitem__(self, v: int) -> list[tuple[int, float]]:
        got = self._memo.get(v)
        if got is None:
            if not self._local[v]:
                raise KeyError(v)
            t = self._topo
            lo, hi = int(t._offsets[v]), int(t._offsets[v + 1])
            out = t._v[lo:hi]
            keep = self._local[out] & (self._node[out] == self._node[v])
            lat = t.edge_latency_s[lo:hi]
            got = self._memo[v] = list(zip(out[keep].tolist(), lat[keep].tolist()))
        return got

    def __iter__(self):
        return iter(np.flatnonzero(self._local).tolist())

    def __len__(self) -> int:
        return int(self._local.sum())


class NicSet:
    """The NIC vertex ids, as a container (``v in nics``)."""

    def __init__(self, vkind: np.ndarray):
        self._vkind = vkind

    def __contains__(self, v: int) -> bool:
        return bool(self._vkind[v] == _NIC)


def node_counts(node_of_device: np.ndarray) -> tuple[int, int]:
    nodes, counts = np.unique(node_of_device, return_counts=True)
    if not np.array_equal(nodes, np.arange(len(nodes))):
        raise ConfigError(f"device 'node' attributes must number the compute nodes 0..N-1; "
                          f"got {nodes.tolist()}")
    if len(set(counts.tolist())) != 1:
        raise ConfigError(f"every compute node must hold the same number of devices; got "
                          f"{dict(zip(nodes.tolist(), counts.tolist()))}")
    return len(nodes), int(counts[0])


def nics_by_node(vkind: np.ndarray, vnode: np.ndarray, num_nodes: int) -> list[tuple[int, ...]]:
    """NIC vertex ids of every compute node, in vertex order."""
    nics = np.flatnonzero(vkind == _NIC)
    nics = nics[np.argsort(vnode[nics], kind="stable")]
    counts = np.bincount(vnode[nics], minlength=num_nodes)
    if len(counts) == num_nodes and (counts == counts[0]).all():  # as many on every node
        return list(map(tuple, nics.reshape(num_nodes, -1).tolist()))
    cuts = np.searchsorted(vnode[nics], np.arange(1, num_nodes))
    return [tuple(part.tolist()) for part in np.split(nics, cuts)]


class DeviceNics(Sequence):
    """Each device's NIC vertex ids (``nics[d]``: a tuple), held flat: the NICs of device
    ``d`` are ``flat[start[d]:start[d + 1]]`` (a cluster of 131,072 devices needs no tuple
    per device until one is asked for; each is kept once made, as routing asks again)."""

    def __init__(self, flat: np.ndarray, start: np.ndarray):
        self.flat, self.start = flat, start
        self._made: dict[int, tuple[int, ...]] = {}

    def __len__(self) -> int:
        return len(self.start) - 1

    def __getitem__(self, d: int) -> tuple[int, ...]:
        got = self._made.get(d)
        if got is None:
            if not -len(self) <= d < len(self):
                raise IndexError(d)
            i = int(d) % len(self)
            got = self._made[d] = tuple(self.flat[self.start[i]:self.start[i + 1]].tolist())
        return got

    def __iter__(self):
        flat, cuts = self.flat.tolist(), self.start.tolist()
        return (tuple(flat[a:b]) for a, b in zip(cuts[:-1], cuts[1:]))

    def counts(self) -> np.ndarray:
        """NICs per device."""
        return np.diff(self.start)


def nics_of_devices(builder, devices: np.ndarray, vnode: np.ndarray,
                    by_node: list[tuple[int, ...]]) -> DeviceNics:
    """Each device's ``nics`` attribute (as vertex ids), else every NIC of its node."""
    position = np.full(len(vnode), -1, dtype=np.int64)
    position[devices] = np.arange(len(devices))
    width = np.fromiter(map(len, by_node), dtype=np.int64, count=len(by_node))
    node_start = np.zeros(len(by_node) + 1, dtype=np.int64)
    np.cumsum(width, out=node_start[1:])
    node_flat = np.fromiter(itertools.chain.from_iterable(by_node), dtype=np.int64,
                            count=int(node_start[-1]))
    group = np.full(len(devices), -1, dtype=np.int64)    # -1: its node's NICs
    row = np.zeros(len(devices), dtype=np.int64)
    groups = builder.nic_groups()
    for g, (ids, _) in enumerate(groups):   # later groups win
        p = position[ids]
        mine = p >= 0
        group[p[mine]], row[p[mine]] = g, np.flatnonzero(mine)
    counts = width[vnode[devices]]
    for g, (_, nics) in enumerate(groups):
        counts[group == g] = nics.shape[1]
    start = np.zeros(len(devices) + 1, dtype=np.int64)
    np.cumsum(counts, out=start[1:])
    flat = np.empty(int(start[-1]), dtype=np.int64)
    own = np.flatnonzero(group < 0)             # a node's NICs, copied into place
    node = vnode[devices[own]]
    ranks = _ranks(counts[own])
    flat[np.repeat(start[own], counts[own]) + ranks] = node_flat[
        np.repeat(node_start[node], counts[own]) + ranks]
    for g, (_, nics) in enumerate(groups):
        d = np.flatnonzero(group == g)
        if len(d) and nics.shape[1]:
            flat[start[d][:, None] + np.arange(nics.shape[1])] = nics[row[d]]
    return DeviceNics(flat, start)


def _ranks(counts: np.ndarray) -> np.ndarray:
    """0, 1, … counts[i] − 1 for each i, concatenated."""
    return np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)


def check_nics(topo: Topology) -> None:
    if topo.num_nodes == 1:
        return
    linked = np.bincount(topo._u[topo._fabric[topo._v]], minlength=len(topo._names)) > 0
    count, flat = topo._dev_nics.counts(), topo._dev_nics.flat
    bad = count == 0
    if len(flat):
        bad[count > 0] |= ~np.logical_and.reduceat(linked[flat], (np.cumsum(count) - count)
                                                   [count > 0])
    for d in np.flatnonzero(bad)[:1].tolist():
        nics = topo._dev_nics[d]
        if not nics:
            raise ConfigError(f"device {topo.devices[d]!r} has no NIC; with "
                              f"{topo.num_nodes} nodes every device needs one to leave its node")
        for nic in nics:
            if not topo._attach(nic):
                raise ConfigError(f"NIC {topo._names[nic]!r} is not linked to any switch or "
                                  "router")
