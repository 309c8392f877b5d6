"""Direct (router-based) fabrics: one router per compute node, routers linked to each other.

Router-to-router links get ``network.link_bandwidth_Bps``, default the NIC bandwidth; every
hop leaving a router pays ``network.switch_latency_s``.
"""

from __future__ import annotations

import itertools
import math

from ..errors import ConfigError
from .fabrics import link_nic
from .registry import GraphBuilder, register_topology
from .routing import GraphRouter, TorusRouter
from .spec import TopologySpec

__all__ = ["torus", "dragonfly", "torus_shape"]


def torus_shape(nodes: int, dims: tuple[int, ...] | None) -> tuple[int, ...]:
    """``dims`` checked against ``nodes``, or the most square 2-D shape a × b = nodes."""
    if dims is None:
        a = max(d for d in range(1, math.isqrt(nodes) + 1) if nodes % d == 0)
        return (nodes // a, a)
    if math.prod(dims) != nodes:
        raise ConfigError(f"network.torus_dims = {list(dims)} holds {math.prod(dims)} nodes but "
                          f"the system has nodes = {nodes}; their product must equal nodes")
    return tuple(dims)


def _link_routers(b: GraphBuilder, spec: TopologySpec, u: str, v: str) -> None:
    bw = spec.network.link_bandwidth_Bps or spec.nic.bandwidth_Bps
    b.add_link(u, v, bandwidth_Bps=bw, link_kind="fabric")


def _add_routers(b: GraphBuilder, spec: TopologySpec, nics_by_node: list[list[str]],
                 **attrs_of: list[object]) -> list[str]:
    routers = []
    for n, nics in enumerate(nics_by_node):
        attrs = {key: values[n] for key, values in attrs_of.items()}
        routers.append(b.add_node(f"router{n}", "router", **attrs))
        for nic in nics:
            link_nic(b, nic, routers[-1], spec)
    return routers


@register_topology("torus")
def torus(b: GraphBuilder, spec: TopologySpec, nics_by_node: list[list[str]]) -> TorusRouter:
    """A 2-D or 3-D (any-D) torus, ``network.torus_dims``, node *n* at the row-major coordinate
    of *n*; wrap-around links close every ring (a dimension of size 2 has one link)."""
    dims = torus_shape(spec.nodes, spec.network.torus_dims)
    coords = list(itertools.product(*(range(d) for d in dims)))
    routers = _add_routers(b, spec, nics_by_node, coord=coords)
    of_coord = dict(zip(coords, routers))
    for coord, router in of_coord.items():
        for axis, size in enumerate(dims):
            if size > 1:
                nxt = coord[:axis] + ((coord[axis] + 1) % size,) + coord[axis + 1:]
                _link_routers(b, spec, router, of_coord[nxt])
    b.attrs["fabric"] = {"topology": "torus", "torus_dims": list(dims)}
    return TorusRouter(dims, of_coord)


@register_topology("dragonfly")
def dragonfly(b: GraphBuilder, spec: TopologySpec, nics_by_node: list[list[str]]) -> GraphRouter:
    """Groups of ``routers_per_group`` routers (default ⌈√nodes⌉), all-to-all inside a group;
    ``global_links`` links between every pair of groups, spread over the groups' routers
    (Kim et al., ISCA 2008). Routed by the generic shortest-path ECMP router."""
    per_group = spec.network.routers_per_group or math.isqrt(spec.nodes - 1) + 1
    groups = [list(range(g, min(g + per_group, spec.nodes)))
              for g in range(0, spec.nodes, per_group)]
    smallest = min(len(g) for g in groups)
    if len(groups) > 1 and spec.network.global_links > smallest:
        raise ConfigError(f"network.global_links = {spec.network.global_links} exceeds the "
                          f"routers of the smallest group ({smallest}); allowed: 1..{smallest}")
    group_of = [n // per_group for n in range(spec.nodes)]
    routers = _add_routers(b, spec, nics_by_node, group=group_of)
    for members in groups:
        for u, v in itertools.combinations(members, 2):
            _link_routers(b, spec, routers[u], routers[v])
    for (g1, a), (g2, c) in itertools.combinations(enumerate(groups), 2):
        for j in range(spec.network.global_links):
            _link_routers(b, spec, routers[a[(g2 + j) % len(a)]], routers[c[(g1 + j) % len(c)]])
    b.attrs["fabric"] = {"topology": "dragonfly", "groups": len(groups),
                               "routers_per_group": per_group,
                               "global_links": spec.network.global_links}
    u, v, _, lat, _ = b.arrays()
    kind = b.columns()[0]
    code = kind[b.index[routers[0]]]
    router = (kind[u] == code) & (kind[v] == code)
    fabric = {r: [] for r in routers}
    for x, y, t in zip(u[router].tolist(), v[router].tolist(), lat[router].tolist()):
        fabric[b.names[x]].append((b.names[y], t))
    return GraphRouter(fabric)
