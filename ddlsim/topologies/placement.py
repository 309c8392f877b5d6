"""Rank placement: which device each rank of a job runs on."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:
    from .graph import Topology

__all__ = ["place_ranks", "PLACEMENT_POLICIES"]


def _consecutive(topo: Topology, num_ranks: int) -> np.ndarray:
    """Rank r on device r: fill node 0, then node 1, … (``mpirun --map-by core`` order)."""
    return np.arange(num_ranks, dtype=np.int64)


def _round_robin(topo: Topology, num_ranks: int) -> np.ndarray:
    """Rank r on node r mod N, slot r div N: consecutive ranks on different nodes
    (``mpirun --map-by node``)."""
    r = np.arange(num_ranks, dtype=np.int64)
    return (r % topo.num_nodes) * topo.devices_per_node + r // topo.num_nodes


#: policy name → placement function
PLACEMENT_POLICIES: dict[str, Callable[[Topology, int], np.ndarray]] = {
    "consecutive": _consecutive, "round_robin": _round_robin}


def place_ranks(topology: Topology, num_ranks: int,
                policy: str | Sequence[int] = "consecutive") -> np.ndarray:
    """Device id of every rank.

    Parameters
    ----------
    topology : Topology
    num_ranks : int
        Ranks of the job, 1..``topology.num_devices``.
    policy : {"consecutive", "round_robin"} or list of int
        ``consecutive`` fills node 0's devices first (9 ranks on 5 two-device nodes: ranks 0, 1
        on node 0, …, rank 8 on node 4); ``round_robin`` deals ranks to nodes in turn; a list
        gives each rank's device id explicitly (one per rank, in range, no repeats).

    Returns
    -------
    np.ndarray
        int64 device ids, index = rank.
    """
    devices = topology.num_devices
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, (int, np.integer)):
        raise ConfigError(f"num_ranks = {num_ranks!r} must be an integer")
    if not 1 <= num_ranks <= devices:
        raise ConfigError(f"num_ranks = {num_ranks} does not fit: the topology "
                          f"{topology.name!r} has {devices} devices; allowed: 1..{devices}")
    if isinstance(policy, str):
        if policy not in PLACEMENT_POLICIES:
            raise ConfigError(f"placement = {policy!r} is not a policy; allowed: "
                              f"{', '.join(PLACEMENT_POLICIES)} or a list of device ids")
        placed = PLACEMENT_POLICIES[policy](topology, int(num_ranks))
    else:
        placed = _explicit(policy, int(num_ranks), devices)
    placed.flags.writeable = False
    return placed


def _explicit(policy: Sequence[int], num_ranks: int, devices: int) -> np.ndarray:
    """Validate an explicit rank → device list."""
    values = list(policy)
    if len(values) != num_ranks:
        raise ConfigError(f"placement lists {len(values)} devices but there are "
                          f"{num_ranks} ranks; give one device id per rank")
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, (int, np.integer))]
    if bad:
        raise ConfigError(f"placement entry {bad[0]!r} is not a device id (an integer)")
    out = [v for v in values if not 0 <= v < devices]
    if out:
        raise ConfigError(f"placement names device {out[0]}, but the topology has devices "
                          f"0..{devices - 1}")
    seen: dict[int, int] = {}
    for rank, device in enumerate(values):
        if device in seen:
            raise ConfigError(f"placement puts ranks {seen[device]} and {rank} both on device "
                              f"{device}; each rank needs its own device")
        seen[device] = rank
    return np.asarray(values, dtype=np.int64)
