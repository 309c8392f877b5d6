"""One network model for both engines: each group family's :class:`GroupNet` derived from the
topology graph, from the very links the discrete-event engine shares.

For a family of groups (every tensor-parallel group, every data-parallel group, …) the
analytical engine needs how fast one ring step goes inside a node (``bw_intra_Bps``) and
across nodes (``bw_node_Bps``), and the latency of each. They are measured on the graph:
every group of the family sends one ring step at once (member i → member i+1, node-major),
each flow routed as the discrete-event engine routes it (a flow leaving a node striped over
the node's NICs, one channel per rail, as NCCL lays out its channels), and the rates are the
max-min fair shares of the links (the engine's rule). To stay cheap at thousands of GPUs
the two parts are solved apart: the intra-node flows on the node where the first group has
most members (device to device, every group's flows there), and the inter-node stripes of every group at node level
(NIC to NIC, identical stripes merged). This is exact where the node-internal hops a stripe
takes to its NIC are not what limits it (NVSwitch and NVLink nodes, whose links are far
faster than a NIC); the discrete-event engine shares those hops too. So an NVLink mesh, a torus, a dragonfly,
a rail-optimised fabric or an oversubscribed fat tree changes a family's net exactly where its
flows cross them, and not at all for groups that stay under one leaf switch.

References: Bertsekas & Gallager, *Data Networks* (1992), §6.5.2 (max-min fairness,
progressive filling).
"""

from __future__ import annotations

import math
import weakref
from collections import OrderedDict

import numpy as np

from .collectives import GroupNet

__all__ = ["family_net", "p2p_node_bw", "topology_of", "fair_rates"]

_TOPOLOGIES: OrderedDict[str, object] = OrderedDict()
#: per topology, node-local flow pattern → (slowest fair rate, slowest latency)
_INTRA: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_INTRA_MAX = 4096
#: per topology, node pairs → their rail stripes (:func:`_stripes`)
_STRIPES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_STRIPES_MAX, _STRIPES_PAIRS = 256, 4096
#: per topology, (source device, destination device) → the latency a rail stripe between
#: them adds inside the two nodes (:func:`_inter_flows`)
_INSIDE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def topology_of(system, key: str | None = None):
    """The topology graph of ``system``, built once per distinct system (a few kept);
    ``key`` is ``system.model_dump_json()`` when the caller has it already."""
    key = system.model_dump_json() if key is None else key
    topo = _TOPOLOGIES.get(key)
    if topo is None:
        from ..topologies.build import from_system   # the module: not the package's lazy name
        topo = _TOPOLOGIES[key] = from_system(system)
        while len(_TOPOLOGIES) > 4:
            _TOPOLOGIES.popitem(last=False)
    _TOPOLOGIES.move_to_end(key)
    return topo


def fair_rates(routes: list[tuple[int, ...]], mult: np.ndarray,
               capacity_Bps: np.ndarray) -> np.ndarray:
    """Max-min fair rate of each flow (bytes/s) by progressive filling: raise every unfrozen
    flow's rate together until a link fills, freeze the flows crossing it, repeat. ``mult[f]``
    identical flows share row f. A flow on no link gets ``inf``."""
    lengths = np.fromiter((len(r) for r in routes), dtype=np.int64, count=len(routes))
    link = np.fromiter((e for r in routes for e in r), dtype=np.int64, count=int(lengths.sum()))
    return _fill(link, lengths, mult, capacity_Bps)


def _fill(link: np.ndarray, lengths: np.ndarray, mult: np.ndarray,
          capacity_Bps: np.ndarray) -> np.ndarray:
    """:func:`fair_rates` of flows given flat: flow f crosses the next ``lengths[f]`` edge
    ids of ``link``."""
    # numpy's ufunc methods (minimum.reduce, logical_or.reduce, nonzero) in place of the
    # Python wrappers (min, any, flatnonzero): the same results, without ~2 us of wrapper
    # per call (p2p_node_bw fills once per pipeline family of a search grid)
    n = len(lengths)
    rate = np.empty(n)
    rate.fill(np.inf)
    if not len(link):
        return rate
    flow_of = np.arange(n).repeat(lengths)
    cap = np.asarray(capacity_Bps, dtype=np.float64)  # read; each round's left is new
    w = np.asarray(mult, dtype=np.float64)[flow_of]
    live = np.ones(n, dtype=bool)
    on = None  # every flow, in the first round
    while True:
        load = np.bincount(link if on is None else link[on],
                           weights=w if on is None else w[on], minlength=len(cap))
        used = (load != 0).nonzero()[0]   # a boolean's positions: far cheaper than a float's
        if not len(used):
            break
        share = cap[used] / load[used]
        level = np.minimum.reduce(share)
        tight = np.zeros(len(cap), dtype=bool)
        tight[used[share <= level * (1 + 1e-12)]] = True
        hit = np.zeros(n, dtype=bool)
        hit[flow_of[tight[link] if on is None else on & tight[link]]] = True
        rate[hit] = level
        live &= ~hit
        if not np.logical_or.reduce(live):   # every flow frozen (often in round one): done
            break
        crossed = hit[flow_of]
        cap = cap - np.bincount(link[crossed], weights=w[crossed] * level, minlength=len(cap))
        np.maximum(cap, 0.0, out=cap)
        on = live[flow_of]
    return rate


def _slowest_rate(link: np.ndarray, lengths: np.ndarray, mult: np.ndarray,
                  capacity_Bps: np.ndarray) -> float:
    """The smallest of :func:`_fill`'s rates, without its later rounds: progressive filling's
    first level is its smallest rate (each later level shares out what the earlier left, no
    less; a link within 1e-12 of the first level is frozen with it), so this is the first
    round's level, bit for bit: the least capacity / load over the links in use (``inf``
    when none is)."""
    if not len(link):
        return math.inf
    cap = np.asarray(capacity_Bps, dtype=np.float64)
    load = np.bincount(link, weights=np.asarray(mult, dtype=np.float64).repeat(lengths),
                       minlength=len(cap))
    used = (load != 0).nonzero()[0]
    return float(np.minimum.reduce(cap[used] / load[used])) if len(used) else math.inf


def _intra_part(topo, src: np.ndarray, dst: np.ndarray, on_node: np.ndarray
                ) -> tuple[float, float] | None:
    """(slowest fair rate, slowest route latency) of the flows ``src[i] → dst[i]`` (device
    ids, one ring step of every group) where ``on_node[i]`` (both ends on the busiest node);
    None when none is. Remembered per topology by the flows (source, destination) sorted,
    as Python ints (a node's devices send one flow each: a handful; a grid's meshes repeat
    a few node-local patterns)."""
    keep = on_node & (src != dst)
    flows = tuple(sorted(zip(src[keep].tolist(), dst[keep].tolist())))
    if not flows:
        return None
    memo = _INTRA.setdefault(topo, {})
    got = memo.get(flows)
    if got is None:
        pairs, mult, _ = _unique_pairs(*np.array(flows, dtype=np.int64).T)
        routes = [topo.route(int(a), int(b), 0) for a, b in pairs]
        lengths = np.fromiter((len(r) for r in routes), dtype=np.int64, count=len(routes))
        link = np.fromiter((e for r in routes for e in r), dtype=np.int64,
                           count=int(lengths.sum()))
        got = (_slowest_rate(link, lengths, mult, topo.edge_bandwidth_Bps),
               max(topo.path_latency_s(r) for r in routes))
        if len(memo) >= _INTRA_MAX:
            memo.clear()
        memo[flows] = got
    return got


def cache_clear() -> None:
    """Forget the node-local fair shares and the stripes :func:`family_net` remembers (for
    timing a cold run)."""
    _INTRA.clear()
    _STRIPES.clear()
    _INSIDE.clear()


def _stripes(topo, pairs: np.ndarray) -> tuple[np.ndarray, ...]:
    """:meth:`Topology.rail_stripes_flat` of the node pairs ``pairs`` (rows), remembered per
    topology for a few thousand pairs or fewer: the families of a search's meshes repeat
    the same node pairs (a ring over the same nodes) with other multiplicities. Arrays
    read-only."""
    if len(pairs) > _STRIPES_PAIRS:
        return topo.rail_stripes_flat(pairs[:, 0], pairs[:, 1])
    memo = _STRIPES.setdefault(topo, {})
    key = pairs.tobytes()
    got = memo.get(key)
    if got is None:
        got = topo.rail_stripes_flat(pairs[:, 0], pairs[:, 1])
        for a in got:
            a.setflags(write=False)
        if len(memo) >= _STRIPES_MAX:
            memo.clear()
        memo[key] = got
    return got


def _unique_pairs(a: np.ndarray, b: np.ndarray, span: int | None = None
                  ) -> tuple[np.ndarray, np.ndarray, int]:
    """The distinct pairs ``(a[i], b[i])`` of non-negative integers in lexicographic order,
    how often each occurs, and the index of the first occurrence of the smallest pair: as
    ``np.unique(np.stack([a, b], axis=1), axis=0, return_counts=True)``, through one integer
    per pair (a 1-D unique is far cheaper than ``axis=0``'s), counted by ``np.bincount`` when
    the codes span 65,536 or fewer (ring steps on one node, or between 256 nodes): cheaper
    than sorting them. ``span``: a bound the caller knows (every ``a[i]`` and ``b[i]`` below
    it: node ids and the node count), which spares taking the bounds (four reductions; the
    codes keep their order, so the same pairs, counts and first index)."""
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    if not len(a):
        return np.empty((0, 2), dtype=np.int64), np.empty(0, dtype=np.int64), 0
    if span is not None and span * span <= 1 << 16:
        codes = a * span + b
        every = np.bincount(codes)
        u = (every != 0).nonzero()[0]
        pairs = np.empty((len(u), 2), dtype=np.int64)
        pairs[:, 0], pairs[:, 1] = np.divmod(u, span)
        return pairs, every[u], int(codes.argmin())
    lo, hi = np.minimum.reduce, np.maximum.reduce   # as .min(), .max(): without a wrapper
    a_lo, b_lo = int(lo(a)), int(lo(b))
    span = int(hi(b)) - b_lo + 1
    codes = (a - a_lo) * span + (b - b_lo)
    if (int(hi(a)) - a_lo + 1) * span <= max(1 << 16, 4 * len(codes)):
        every = np.bincount(codes)
        u = (every != 0).nonzero()[0]
        counts = every[u]
    else:
        u, counts = np.unique(codes, return_counts=True)
    pairs = np.empty((len(u), 2), dtype=np.int64)   # as np.stack's, without its checks
    pairs[:, 0], pairs[:, 1] = np.divmod(u, span)
    pairs[:, 0] += a_lo
    pairs[:, 1] += b_lo
    return pairs, counts, int(codes.argmin())


def _inter_flows(topo, src: np.ndarray, dst: np.ndarray, na: np.ndarray, nb: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Node-to-node stripes of the flows ``src[i] → dst[i]`` (device ids, one ring step of
    every group, on nodes ``na[i] → nb[i]``) that leave their node: each is one stripe per
    rail, NIC to NIC (:meth:`Topology.rail_stripes`); identical stripes of different groups
    are merged. Returns the stripes flat (edge ids, edges per stripe, as :func:`_fill` takes
    them), their multiplicities and the end-to-end device routes' latencies (the engine pays
    those)."""
    leave = (na != nb).nonzero()[0]
    pairs, mult, first = _unique_pairs(na[leave], nb[leave], topo.num_nodes)
    links, lengths, counts, lat = _stripes(topo, pairs)
    at = int(leave[first])   # the first flow of the smallest node pair
    ends = (int(src[at]), int(dst[at]))
    return links, lengths, mult.astype(float).repeat(counts), lat + _inside(topo, ends)


def _inside(topo, ends: tuple[int, int]) -> float:
    """The latency a rail stripe between the devices ``ends`` adds to its NIC-to-NIC route
    inside the two nodes, alike on every node: the larger on rail 0 or another (one more
    hop); remembered per topology and device pair."""
    memo = _INSIDE.setdefault(topo, {})
    got = memo.get(ends)
    if got is None:
        a, b = (int(topo.node_of_device[e]) for e in ends)
        rails = max(1, len(topo.nics_of_node[a]))
        if len(memo) >= _INTRA_MAX:
            memo.clear()
        got = memo[ends] = max(topo.path_latency_s(topo.route_rail(*ends, c))
                               - topo.path_latency_s(topo.rail_fabric_route(a, b, c))
                               for c in {0, 1 % rails})
    return got


def _ring_step(dev: np.ndarray) -> np.ndarray:
    """The receivers of one ring step of the groups ``dev`` (rows × p device ids): member
    i → member i + 1, the last → the first, flat in row order (as ``dev[:, np.r_[1:p, 0]]``,
    without ``np.r_``'s cost: ~20 us a call, paid per family net of a search grid)."""
    return np.concatenate((dev[:, 1:], dev[:, :1]), axis=1).ravel()


def p2p_node_bw(topo, devices: np.ndarray, members: np.ndarray) -> float:
    """Bytes/s of the slowest point-to-point transfer between nodes when every group of
    ``members`` (rows × p ranks on ``devices``) sends one ring step at once (member i →
    member i + 1), each transfer through the receiver's rail(s) only, as NCCL's send/recv
    runs (:meth:`Topology.p2p_rails`; its bytes split evenly over them): the max-min fair
    rates of the NIC-to-NIC routes, identical ones merged, times the rails a transfer uses.
    ``inf`` when no transfer leaves its node. Like :func:`family_net`, the hops inside the
    nodes are not what limits it (they are NVLink/NVSwitch or PCIe, far faster than a NIC)."""
    p = members.shape[1]
    if p <= 1:
        return math.inf
    dev = devices[members]
    src, dst = dev.ravel(), _ring_step(dev)
    node = topo.node_of_device
    keep = node[src] != node[dst]
    if not keep.any():
        return math.inf
    table, count = topo.p2p_rail_table
    dst = dst[keep]
    k = count[dst]
    rails = table[dst.repeat(k), np.arange(int(k.sum())) - (np.cumsum(k) - k).repeat(k)]
    na, nb = node[src[keep]].repeat(k), node[dst].repeat(k)
    n_rail, n_node = int(np.maximum.reduce(table, axis=None)) + 1, len(node)
    # distinct (source node, rail) × (rails used, destination node), with their counts
    pairs, mult, _ = _unique_pairs(na * n_rail + rails, k.repeat(k) * n_node + nb)
    links, lengths = topo.rail_routes_flat(pairs[:, 0] // n_rail, pairs[:, 1] % n_node,
                                           pairs[:, 0] % n_rail)
    rate = _fill(links, lengths, mult.astype(float), np.asarray(topo.edge_bandwidth_Bps))
    return float(np.minimum.reduce(rate * (pairs[:, 1] // n_node)))


def family_net(system, topo, devices: np.ndarray, members: np.ndarray, nccl: object = None
               ) -> GroupNet:
    """The :class:`GroupNet` of the groups ``members`` (rows × p ranks) whose ranks sit on
    ``devices`` (device id per rank), measured on ``topo`` as the module describes;
    ``nccl``: its ``nccl`` field (NCCL's view of the machine, :class:`.nccl.NcclEnv`).

    Returns
    -------
    GroupNet
        ``bw_intra_Bps``: the slowest intra-node flow's fair rate (the system's per-device
        bandwidth when no member shares a node); ``bw_node_Bps``: the slowest inter-node
        flow's rate × the node's NICs (its stripes); latencies: the slowest route's.
    """
    p = members.shape[1]
    dev = devices[members]
    node = topo.node_of_device
    nodes_of = node[dev[0]]
    per_node = np.bincount(nodes_of)
    g, n_nodes = int(np.maximum.reduce(per_node)), int(np.count_nonzero(per_node))
    intra_bw, intra_lat = system.intra_node.bandwidth_Bps, system.intra_node.latency_s
    if p <= 1:
        return GroupNet(p, g, intra_lat, intra_bw, nodes=n_nodes, nccl=nccl)
    busiest = int(per_node.argmax())   # the first node (lowest id) holding the most
    src = dev.ravel()
    dst = _ring_step(dev)  # one ring step: member i → member i + 1
    na, nb = node[src], node[dst]
    intra = _intra_part(topo, src, dst, (na == busiest) & (nb == busiest))  # on that node
    if intra is not None:
        intra_bw, intra_lat = intra
    bw_node, inter_lat = math.inf, 0.0
    if n_nodes > 1:
        link, lengths, mult, lat = _inter_flows(topo, src, dst, na, nb)
        rails = len(topo.nics_of_node[int(nodes_of[0])]) or 1
        bw_node = _slowest_rate(link, lengths, mult, topo.edge_bandwidth_Bps) * rails
        inter_lat = float(np.maximum.reduce(lat))
    return GroupNet(p, g, intra_lat, intra_bw, inter_lat, bw_node, n_nodes, nccl)
