"""Assemble a :class:`Topology` from a spec, a system config or a preset name."""

from __future__ import annotations

from typing import Any

import numpy as np

from pydantic import ValidationError

from ..config import SystemConfig
from ..errors import ConfigError
from . import direct, fabrics, intra  # noqa: F401  (register the builders)
from .graph import Topology
from .builder import NODE_KINDS, renamed_value
from .registry import NODE_FABRICS, TOPOLOGIES, GraphBuilder, lookup
from .spec import TopologySpec, format_validation_error, parse_spec

__all__ = ["build_topology", "from_system", "from_spec", "device_name", "nic_name"]


def device_name(node: int, local: int) -> str:
    """Vertex name of device ``local`` of compute node ``node``: ``node3/dev5``."""
    return f"node{node}/dev{local}"


def nic_name(node: int, local: int) -> str:
    """Vertex name of NIC ``local`` of compute node ``node``: ``node3/nic5``."""
    return f"node{node}/nic{local}"


def build_topology(spec: str | dict[str, Any] | SystemConfig | TopologySpec | Topology) -> Topology:
    """Build the cluster graph of a preset name, a system/topology mapping or a config.

    Parameters
    ----------
    spec
        A system preset name (``"dgx-a100"``, ``"cpu-10gbe"``, …); a mapping in the shape of a
        system section, optionally naming a preset to override
        (``{"preset": "dgx-a100", "nodes": 16, "network": {"oversubscription": 2}}``) and
        optionally with the extra fabric keys of :class:`~.spec.TopologySpec`; a
        :class:`~ddlsim.config.SystemConfig`; a :class:`~.spec.TopologySpec`; or a
        :class:`Topology` (returned as is).

    Raises
    ------
    ConfigError
        Naming the field, the value and what is allowed.
    """
    if isinstance(spec, Topology):
        return spec
    if isinstance(spec, str):
        return from_system(_system_preset(spec))
    return from_spec(parse_spec(spec))


def from_system(system: SystemConfig) -> Topology:
    """The graph of a validated :class:`~ddlsim.config.SystemConfig` (any preset or custom)."""
    return from_spec(parse_spec(system))


def from_spec(spec: TopologySpec) -> Topology:
    """Build nodes (devices, node fabric, NICs), then the inter-node fabric, then validate."""
    node_fabric = lookup(NODE_FABRICS, "intra_node.kind", spec.intra_node.kind)
    fabric = lookup(TOPOLOGIES, "network.topology", spec.network.topology)
    b = GraphBuilder(switch_latency_s=spec.network.switch_latency_s)
    nics_by_node = _add_nodes(b, spec, node_fabric)
    router = fabric(b, spec, nics_by_node)
    b.attrs["spec"] = spec
    return Topology(b.graph, name=spec.name, router=router)


def _add_nodes(b: GraphBuilder, spec: TopologySpec, node_fabric) -> list[list[str]]:
    """Every compute node (:func:`_add_node`); returns each node's NIC names. Nodes are
    copies of node 0 (:meth:`GraphBuilder.add_copies`, no Python call per vertex or link)
    when nodes 1 and N−1 built alone are node 0 renamed, as every node fabric builds them."""
    template = _node_template(spec, node_fabric) if spec.nodes > 2 else None
    if template is None:
        return [_add_node(b, spec, n, node_fabric) for n in range(spec.nodes)]
    base = b.add_copies(template, spec.nodes, _prefix).tolist()
    kind = template.columns()[0]
    nic = [i for i, k in enumerate(kind.tolist()) if k == NODE_KINDS.index("nic")]
    return [[b.names[first + i] for i in nic] for first in base]


def _prefix(node: int) -> str:
    """What the names of compute node ``node``'s vertices start with."""
    return f"node{node}/"


def _node_template(spec: TopologySpec, node_fabric) -> GraphBuilder | None:
    """Node 0 built alone, when nodes 1 and N−1 built alone are the same graph renamed."""
    def alone(node: int) -> GraphBuilder:
        one = GraphBuilder(switch_latency_s=spec.network.switch_latency_s)
        _add_node(one, spec, node, node_fabric)
        return one

    template = alone(0)
    if not all(name.startswith("node0/") for name in template.names):
        return None
    for node in (1, spec.nodes - 1):
        if not _same_renamed(template, alone(node), node):
            return None
    return template


def _same_renamed(template: GraphBuilder, other: GraphBuilder, node: int) -> bool:
    """Whether ``other`` is ``template`` with its vertices renamed into compute node ``node``."""
    if other.names != [_prefix(node) + name[6:] for name in template.names]:
        return False
    (k0, n0, l0), (k1, n1, l1) = template.columns(), other.columns()
    if not (np.array_equal(k0, k1) and np.array_equal(l0, l1) and (n0 == 0).all()
            and (n1 == node).all()):
        return False
    own = {name: name[6:] for name in template.names}
    extra = {key: {i: renamed_value(v, _prefix(node), own) for i, v in values.items()}
             for key, values in template.extra.items()}
    return extra == other.extra and template.nics == other.nics and all(
        np.array_equal(a, c) for a, c in zip(template.arrays(), other.arrays()))


def _add_node(b: GraphBuilder, spec: TopologySpec, node: int, node_fabric) -> list[str]:
    """Devices, their fabric and NICs of one compute node; returns the NIC names."""
    dpn, k = spec.devices_per_node, spec.nics_per_node
    devices = [b.add_node(device_name(node, i), "device", node=node, local=i) for i in range(dpn)]
    hub = node_fabric(b, node, devices, spec.intra_node)
    nics = [b.add_node(nic_name(node, j), "nic", node=node, local=j, rail=j) for j in range(k)]
    for i, dev in enumerate(devices):
        mine = _nics_of(i, dpn, nics)
        b.add_node(dev, "device", nics=tuple(mine))
        if hub is None:
            for nic in mine:
                b.add_link(dev, nic, bandwidth_Bps=spec.nic.bandwidth_Bps, link_kind="pcie")
    if hub is not None:
        for nic in nics:
            b.add_link(hub, nic, bandwidth_Bps=spec.nic.bandwidth_Bps, link_kind="pcie")
    return nics


def _nics_of(local: int, devices: int, nics: list[str]) -> list[str]:
    """The NICs device ``local`` uses: its share of them, or the one it shares with
    ``devices / len(nics)`` neighbours (device i → NIC i when there is one NIC per device)."""
    k = len(nics)
    if k >= devices:
        per = k // devices
        return nics[local * per:(local + 1) * per]
    return [nics[local // (devices // k)]]


def _system_preset(name: str) -> SystemConfig:
    from ..presets import get_preset  # local import, as ddlsim.config does

    try:
        return SystemConfig.model_validate(get_preset("system", name))
    except ValidationError as exc:
        raise ConfigError(f"system preset {name!r} is invalid: "
                          f"{format_validation_error(exc)}") from None
