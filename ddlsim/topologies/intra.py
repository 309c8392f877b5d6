"""Fabrics inside one compute node (``system.intra_node.kind``).

Each builder links the node's devices and returns the *hub* the node's NICs hang off, or
``None`` when each NIC links straight to its devices over PCIe (GPUDirect RDMA), as in NVLink
systems. ``intra_node.bandwidth_Bps`` is per device per direction; ``latency_s`` is one
device-to-device message, so a path through a hub pays half of it on each of its two links.
"""

from __future__ import annotations

from .registry import GraphBuilder, register_node_fabric
from .spec import NodeFabricSpec

__all__ = ["add_star", "nvswitch", "nvlink_ring", "nvlink_mesh", "pcie", "shared_memory"]


def add_star(b: GraphBuilder, hub: str, devices: list[str], spec: NodeFabricSpec,
             link_kind: str) -> None:
    """Link every device to ``hub`` at the device's bandwidth, half the latency each way."""
    for dev in devices:
        b.add_link(dev, hub, bandwidth_Bps=spec.bandwidth_Bps, latency_s=spec.latency_s / 2,
                   link_kind=link_kind)


@register_node_fabric("nvswitch")
def nvswitch(b: GraphBuilder, node: int, devices: list[str], spec: NodeFabricSpec) -> None:
    """Every device ↔ one NVSwitch vertex: full bandwidth to any peer (DGX A100/H100, DGX-2).

    The NVSwitch planes of a real node are merged into one vertex; NICs link to the devices.
    """
    hub = b.add_node(f"node{node}/nvswitch", "nvswitch", node=node)
    add_star(b, hub, devices, spec, "nvlink")
    return None


@register_node_fabric("nvlink_ring")
def nvlink_ring(b: GraphBuilder, node: int, devices: list[str], spec: NodeFabricSpec) -> None:
    """Device *i* ↔ device *i*+1 (mod n); each link gets ``link_bandwidth_Bps`` or half the
    device's bandwidth (a device drives two ring links; one link when n = 2)."""
    n = len(devices)
    peers = 1 if n == 2 else 2
    link_bw = spec.link_bandwidth_Bps or spec.bandwidth_Bps / peers
    for i in range(n if n > 2 else n - 1):
        b.add_link(devices[i], devices[(i + 1) % n], bandwidth_Bps=link_bw,
                   latency_s=spec.latency_s, link_kind="nvlink")
    return None


@register_node_fabric("nvlink_mesh")
def nvlink_mesh(b: GraphBuilder, node: int, devices: list[str], spec: NodeFabricSpec) -> None:
    """All-to-all direct links; each gets ``link_bandwidth_Bps`` or the device's bandwidth split
    evenly over its n − 1 peers. (DGX-1's hybrid cube mesh is approximated as all-to-all.)"""
    n = len(devices)
    link_bw = spec.link_bandwidth_Bps or spec.bandwidth_Bps / max(n - 1, 1)
    for i in range(n):
        for j in range(i + 1, n):
            b.add_link(devices[i], devices[j], bandwidth_Bps=link_bw, latency_s=spec.latency_s,
                       link_kind="nvlink")
    return None


@register_node_fabric("pcie")
def pcie(b: GraphBuilder, node: int, devices: list[str], spec: NodeFabricSpec) -> str:
    """Devices ↔ a PCIe switch ↔ the host CPU; the NICs sit on the PCIe switch too, so
    device ↔ NIC traffic is peer-to-peer through the switch."""
    hub = b.add_node(f"node{node}/pcie", "pcie_switch", node=node)
    host = b.add_node(f"node{node}/host", "host", node=node)
    add_star(b, hub, devices, spec, "pcie")
    b.add_link(hub, host, bandwidth_Bps=spec.bandwidth_Bps, latency_s=0.0, link_kind="pcie")
    return hub


@register_node_fabric("shared_memory")
def shared_memory(b: GraphBuilder, node: int, devices: list[str], spec: NodeFabricSpec) -> str:
    """Devices (CPU sockets running one rank each) ↔ the host's memory; NICs hang off the host.

    A message between two ranks of the node is one copy through shared memory.
    """
    host = b.add_node(f"node{node}/host", "host", node=node)
    add_star(b, host, devices, spec, "shm")
    return host
