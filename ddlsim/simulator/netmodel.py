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
from collections import OrderedDict

import numpy as np

from .collectives import GroupNet

__all__ = ["family_net", "topology_of", "fair_rates"]

_TOPOLOGIES: OrderedDict[str, object] = OrderedDict()


def topology_of(system):
    """The topology graph of ``system``, built once per distinct system (a few kept)."""
    from ..topologies import from_system

    key = system.model_dump_json()
    topo = _TOPOLOGIES.get(key)
    if topo is None:
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
    n = len(lengths)
    rate = np.full(n, np.inf)
    flow_of = np.repeat(np.arange(n), lengths)
    if not len(flow_of):
        return rate
    cap = capacity_Bps.astype(np.float64).copy()
    live = np.ones(n, dtype=bool)
    m = np.asarray(mult, dtype=np.float64)
    while True:
        on = live[flow_of]
        load = np.bincount(link[on], weights=m[flow_of[on]], minlength=len(cap))
        used = load > 0
        if not used.any():
            break
        share = np.full(len(cap), np.inf)
        share[used] = cap[used] / load[used]
        level = share.min()
        tight = share <= level * (1 + 1e-12)
        hit = np.zeros(n, dtype=bool)
        hit[flow_of[on & tight[link]]] = True
        rate[hit] = level
        cap -= np.bincount(link[hit[flow_of]], weights=m[flow_of[hit[flow_of]]] * level,
                           minlength=len(cap))
        np.maximum(cap, 0.0, out=cap)
        live &= ~hit
    return rate


def _intra_flows(topo, dev: np.ndarray, node0: int) -> tuple[list, np.ndarray]:
    """Routes and multiplicities of the intra-node flows on node ``node0`` of one ring step
    of every row of ``dev`` (rows × p device ids)."""
    src, dst = dev.ravel(), np.roll(dev, -1, axis=1).ravel()
    node = topo.node_of_device
    keep = (src != dst) & (node[src] == node0) & (node[dst] == node0)
    pairs, mult, _ = _unique_pairs(src[keep], dst[keep])
    return [topo.route(int(a), int(b), 0) for a, b in pairs], mult.astype(float)


def _unique_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(np.stack([a, b], axis=1), axis=0, return_index=True, return_counts=True)``
    for non-negative integers, through one integer per pair (ordered as the pairs are): a
    1-D unique is far cheaper than ``axis=0``'s."""
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    span = int(b.max(initial=0)) + 1
    codes, first, counts = np.unique(a * span + b, return_index=True, return_counts=True)
    return np.stack([codes // span, codes % span], axis=1), counts, first


def _inter_flows(topo, dev: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                  np.ndarray]:
    """Node-to-node stripes of one ring step of every row: each flow leaving a node is one
    stripe per rail, NIC to NIC (:meth:`Topology.rail_stripes`); identical stripes of
    different rows are merged. Returns the stripes flat (edge ids, edges per stripe, as
    :func:`_fill` takes them), their multiplicities and the end-to-end device routes'
    latencies (the engine pays those)."""
    src, dst = dev.ravel(), np.roll(dev, -1, axis=1).ravel()
    node = topo.node_of_device
    keep = node[src] != node[dst]
    na, nb = node[src[keep]], node[dst[keep]]
    pairs, mult, first = _unique_pairs(na, nb)
    links, lengths, counts, lat = [], [], [], []
    for a, b in pairs.tolist():
        edges, per_rail, fabric_lat = topo.rail_stripes(a, b)
        links.append(edges)
        lengths.append(per_rail)
        counts.append(len(per_rail))
        lat.append(fabric_lat)
    # the hops inside the two nodes, alike on every node: on rail 0 or another (one more hop)
    i, (a, b) = int(first[0]), pairs[0].tolist()
    ends = (int(src[keep][i]), int(dst[keep][i]))
    rails = max(1, len(topo.nics_of_node[a]))
    inside = max(topo.path_latency_s(topo.route_rail(*ends, c))
                 - topo.path_latency_s(topo.rail_fabric_route(a, b, c)) for c in {0, 1 % rails})
    return (np.concatenate(links), np.concatenate(lengths), np.repeat(mult.astype(float), counts),
            np.asarray(lat) + inside)


def family_net(system, topo, devices: np.ndarray, members: np.ndarray) -> GroupNet:
    """The :class:`GroupNet` of the groups ``members`` (rows × p ranks) whose ranks sit on
    ``devices`` (device id per rank), measured on ``topo`` as the module describes.

    Returns
    -------
    GroupNet
        ``bw_intra_Bps``: the slowest intra-node flow's fair rate (the system's per-device
        bandwidth when no member shares a node); ``bw_node_Bps``: the slowest inter-node
        flow's rate × the node's NICs (its stripes); latencies: the slowest route's.
    """
    p = members.shape[1]
    dev = devices[members]
    nodes_of = topo.node_of_device[dev[0]]
    per_node = np.bincount(nodes_of)
    g, n_nodes = int(per_node.max()), int(np.count_nonzero(per_node))
    intra_bw, intra_lat = system.intra_node.bandwidth_Bps, system.intra_node.latency_s
    if p <= 1:
        return GroupNet(p, g, intra_lat, intra_bw, nodes=n_nodes)
    capacity = np.asarray(topo.edge_bandwidth_Bps)
    node = topo.node_of_device
    busiest = int(per_node.argmax())   # the first node (lowest id) holding the most
    local = (node[dev] == busiest).any(axis=1)  # rows on the node where row 0 has most ranks
    routes, mult = _intra_flows(topo, dev[local], busiest)
    if routes:
        rate = fair_rates(routes, mult, capacity)
        intra_bw = float(rate.min())
        intra_lat = max(topo.path_latency_s(r) for r in routes)
    bw_node, inter_lat = math.inf, 0.0
    if n_nodes > 1:
        link, lengths, mult, lat = _inter_flows(topo, dev)
        rails = len(topo.nics_of_node[int(nodes_of[0])]) or 1
        bw_node = float(_fill(link, lengths, mult, capacity).min()) * rails
        inter_lat = float(lat.max())
    return GroupNet(p, g, intra_lat, intra_bw, inter_lat, bw_node, n_nodes)
