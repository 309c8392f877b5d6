"""What a topology is built from: a :class:`TopologySpec`, read from a system preset, a
:class:`~ddlsim.config.SystemConfig` or a mapping.

A topology spec is the hardware half of a system section (``nodes``, ``devices_per_node``,
``intra_node``, ``nics_per_node``, ``nic``, ``network``) plus a few fabric knobs a run config
does not need (``network.levels``, ``network.spines``, ``intra_node.link_bandwidth_Bps``, …).
A full system section is accepted as is: its compute-only keys (``device``,
``compute_efficiency``, ``placement``) are ignored here. Values with units (``"200 Gb/s"``,
``"2 us"``) are converted to SI at this boundary, as :mod:`ddlsim.config` does.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, ValidationError,
                      field_validator, model_validator)

from ..config import (Bandwidth, IntraNodeSpec, LinkSpec, NetworkSpec, SystemConfig,
                      check_shape, count_type, reject_bool, resolve_section)
from ..config import format_validation_error as config_errors
from ..errors import ConfigError
from .registry import NODE_FABRICS, TOPOLOGIES

__all__ = ["TopologySpec", "NodeFabricSpec", "FabricSpec", "parse_spec", "SYSTEM_ONLY_KEYS"]

#: Keys of a system section that say nothing about the graph; ignored when building one.
SYSTEM_ONLY_KEYS = ("device", "compute_efficiency", "placement", "collectives", "software",
                    "first_touch")


def _registered(name: str, registry: dict, what: str) -> str:
    """``name`` if a builder is registered under it, else an error listing the names."""
    from . import direct, fabrics, intra  # noqa: F401  (the builders register on import)
    if name not in registry:
        raise ValueError(f"not a registered {what}; allowed: {', '.join(sorted(registry))}")
    return name


class NodeFabricSpec(IntraNodeSpec):
    """:class:`~ddlsim.config.IntraNodeSpec` with any registered ``kind`` and, for NVLink ring
    and mesh, an optional per-link bandwidth (default: the device's bandwidth split evenly)."""

    kind: str = "nvswitch"
    link_bandwidth_Bps: Bandwidth | None = None

    @field_validator("kind")
    @classmethod
    def _check_kind(cls, kind: str) -> str:
        return _registered(kind, NODE_FABRICS, "node fabric")


class FabricSpec(NetworkSpec):
    """:class:`~ddlsim.config.NetworkSpec` with any registered ``topology`` and fabric knobs.

    ``link_bandwidth_Bps`` is the bandwidth of switch-to-switch (router-to-router) links,
    default derived from the NIC bandwidth (and, for trees, the oversubscription).
    """

    topology: str = "fat_tree"
    link_bandwidth_Bps: Bandwidth | None = None
    levels: Annotated[Literal[2, 3], BeforeValidator(reject_bool)] | None = Field(
        default=None, description="fat tree: 2 or 3; auto")
    spines: count_type("devices") | None = Field(
        default=None, description="uplinks per leaf: spines (2 levels) or aggregation switches "
                                  "per pod (3 levels)")
    leaves_per_pod: count_type("devices") | None = None
    routers_per_group: count_type("devices") | None = None
    global_links: count_type("devices") = Field(default=1, description="dragonfly links per "
                                                                       "pair of groups")

    @field_validator("topology")
    @classmethod
    def _check_topology(cls, topology: str) -> str:
        return _registered(topology, TOPOLOGIES, "topology")


class TopologySpec(BaseModel):
    """The hardware of a cluster that the graph is built from (bandwidths per direction)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True,
                              allow_inf_nan=False)

    name: str = "custom"
    nodes: count_type("devices")
    devices_per_node: count_type("devices_per_node")
    intra_node: NodeFabricSpec
    nics_per_node: count_type("nics_per_node") = 1
    nic: LinkSpec
    network: FabricSpec = Field(default_factory=FabricSpec)
    source: str | None = None

    @model_validator(mode="after")
    def _check(self) -> "TopologySpec":
        check_shape(self)  # the same rules as a run config's system section
        net = self.network
        if net.topology == "dragonfly":
            per = net.routers_per_group or math.isqrt(self.nodes - 1) + 1
            groups = -(-self.nodes // per)
            smallest = self.nodes - (groups - 1) * per
            if groups > 1 and net.global_links > smallest:
                raise ValueError(f"network.global_links = {net.global_links} exceeds the routers "
                                 f"of the smallest dragonfly group ({smallest}); allowed: "
                                 f"1..{smallest}")
        return self


def parse_spec(spec: dict[str, Any] | SystemConfig | TopologySpec) -> TopologySpec:
    """A validated :class:`TopologySpec` from a mapping, a system config or a spec.

    A mapping may name a system preset and override some of its fields
    (``{"preset": "dgx-a100", "nodes": 16}``); nested mappings merge key by key, as
    :mod:`ddlsim.config` merges sections.

    Raises
    ------
    ConfigError
        Naming the field, the value given and what is allowed.
    """
    if isinstance(spec, TopologySpec):
        return spec
    if isinstance(spec, SystemConfig):
        return TopologySpec.model_validate(spec.model_dump(exclude=set(SYSTEM_ONLY_KEYS)))
    if not isinstance(spec, dict):
        raise ConfigError(f"a topology spec must be a mapping, a SystemConfig or a preset name; "
                          f"got {type(spec).__name__} {spec!r}")
    data = {k: v for k, v in resolve_section("system", spec).items() if k not in SYSTEM_ONLY_KEYS}
    try:
        return TopologySpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None


def format_validation_error(exc: ValidationError, where: str = "system") -> str:
    """One clause per problem: ``system.network.oversubscription: … (got 0.5)``."""
    return config_errors(exc, where, TopologySpec)
