"""Registries of topology builders (the graph builder they share is :mod:`.builder`).

Two open extension points, each one decorator keyed by the string users type:

* ``@register_node_fabric("nvswitch")`` — how the devices *inside* one compute node connect
  (``system.intra_node.kind``);
* ``@register_topology("fat_tree")`` — the fabric *between* nodes (``system.network.topology``).

Adding a topology is one new function plus its decorator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import ConfigError
from .builder import (FABRIC_KINDS, LINK_KINDS, NODE_KINDS, NODE_LOCAL_KINDS, GraphBuilder,
                      GraphRecord)

__all__ = ["register_node_fabric", "register_topology", "NODE_FABRICS", "TOPOLOGIES",
           "GraphBuilder", "GraphRecord", "NODE_KINDS", "LINK_KINDS", "NODE_LOCAL_KINDS", "FABRIC_KINDS",
           "lookup"]

#: name → ``fn(builder, node, devices, intra_spec) -> hub or None`` (see :mod:`.intra`).
NODE_FABRICS: dict[str, Callable[..., str | None]] = {}
#: name → ``fn(builder, spec, nics_by_node) -> router`` (see :mod:`.fabrics`, :mod:`.direct`).
TOPOLOGIES: dict[str, Callable[..., Any]] = {}


def _register(table: dict[str, Callable], what: str, name: str) -> Callable[[Callable], Callable]:
    def decorate(fn: Callable) -> Callable:
        if name in table:
            raise ValueError(f"{what} {name!r} is already registered (by {table[name].__name__})")
        table[name] = fn
        return fn
    return decorate


def register_node_fabric(name: str) -> Callable[[Callable], Callable]:
    """Register a builder of the fabric inside one compute node under ``name``."""
    return _register(NODE_FABRICS, "node fabric", name)


def register_topology(name: str) -> Callable[[Callable], Callable]:
    """Register a builder of the inter-node fabric under ``name``."""
    return _register(TOPOLOGIES, "topology", name)


def lookup(table: dict[str, Callable], field: str, name: str) -> Callable:
    """The builder registered as ``name``; a :class:`ConfigError` listing the names otherwise."""
    if name not in table:
        raise ConfigError(f"{field} = {name!r} is not a known builder; allowed: "
                          f"{', '.join(sorted(table))}")
    return table[name]
