"""The rails a point-to-point transfer between nodes crosses, as NCCL's send/recv picks them.

NCCL runs a send/recv between nodes on the NIC local to a GPU (``ncclTopoGetNetDev`` with no
collective graph → ``ncclTopoGetLocalNet``, NCCL ``src/graph/search.cc`` and ``topo.cc``), not
striped over every NIC of the node as a collective's channels are. With PXN (on by default
since NCCL 2.12) the sender goes over NVLink to the GPU with the receiver's local index and out
through that GPU's NIC, so both ends use the receiver's rail. The NICs local to a GPU are
shared among the GPUs local to them, each using ``⌈NICs / GPUs⌉`` of them
(``NCCL_NETDEVS_POLICY=AUTO``). NCCL 2.9 (2021, no PXN) did the same from the sender's side:
one of the NICs closest to the sender, picked round-robin by the receiver's device index
(``src/transport/net.cc``, ``ncclTopoGetLocalNet`` in ``src/graph/topo.cc``), the same rail
whenever sender and receiver have the same local index, as in Megatron's pipelines.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .graph import Topology

__all__ = ["rails_of", "rail_table"]


def rails_of(topo: Topology, dst_device: int) -> tuple[int, ...]:
    """The rails (NIC positions in ``topo.nics_of_node``) a transfer to ``dst_device`` from
    another node crosses; ``(0,)`` on a node with no NIC."""
    node = int(topo.node_of_device[dst_device])
    nics = topo._node_nics[node]
    local = topo._dev_nics[dst_device]
    if not nics or not local:
        return (0,)
    first_dev = node * topo.devices_per_node        # devices are node-major
    sharers = [d for d in range(first_dev, first_dev + topo.devices_per_node)
               if topo._dev_nics[d] == local]
    each = -(-len(local) // len(sharers))
    first = sharers.index(dst_device) * each
    chosen = [local[(first + i) % len(local)] for i in range(each)]
    return tuple(sorted({nics.index(n) for n in chosen}))


def rail_table(topo: Topology) -> tuple[np.ndarray, np.ndarray]:
    """:func:`rails_of` of every device as arrays: (devices × most rails) rail ids, padded
    with −1, and the count per device. The rails of a device follow from where its NICs sit
    among its node's, so :func:`rails_of` runs on one node of each distinct layout and the
    others take its rows."""
    per_node = topo.devices_per_node
    layout = _layouts(topo)
    if layout is None:
        nodes, of_node = np.arange(topo.num_nodes), np.arange(topo.num_nodes)
    else:
        _, nodes, of_node = np.unique(layout, axis=0, return_index=True, return_inverse=True)
    rails = [rails_of(topo, d) for n in nodes.tolist()
             for d in range(n * per_node, (n + 1) * per_node)]
    width = max((len(r) for r in rails), default=1)
    rows = np.full((len(rails), width), -1, dtype=np.int64)
    for i, r in enumerate(rails):
        rows[i, :len(r)] = r
    counts = np.array([len(r) for r in rails], dtype=np.int64).reshape(len(nodes), per_node)
    rows = rows.reshape(len(nodes), per_node, width)
    pick = np.asarray(of_node).ravel()
    return (rows[pick].reshape(topo.num_devices, width), counts[pick].ravel())


def _layouts(topo: Topology) -> np.ndarray | None:
    """Per node, the positions of its devices' NICs among its NICs (one row per node), or
    None where devices list different numbers of NICs or NICs of another node."""
    counts = set(np.unique(topo._dev_nics.counts()).tolist())
    node_nics = topo._node_nics
    if len(counts) != 1 or len({len(n) for n in node_nics}) != 1 or 0 in counts:
        return None
    nics = topo._dev_nics.flat.reshape(topo.num_devices, -1)   # devices × NICs each
    of_node = np.array(node_nics, dtype=np.int64)               # nodes × NICs
    position = np.full(len(topo._names), -1, dtype=np.int64)
    position[of_node] = np.arange(of_node.shape[1])
    owner = np.full(len(topo._names), -1, dtype=np.int64)
    owner[of_node] = np.arange(topo.num_nodes)[:, None]
    if (owner[nics] != np.asarray(topo.node_of_device)[:, None]).any():
        return None
    return position[nics].reshape(topo.num_nodes, -1)
