"""Config fields that name an entry of a registry: one source of truth.

A field that names a collective algorithm, a pipeline schedule, a topology, a node fabric or a
placement policy is checked against the registry the engines and builders use, looked up when
a value is validated (so a plugin registered later is accepted), with the message a
``Literal`` would give (allowed values, "did you mean").
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import Annotated, Any

from pydantic import BeforeValidator

__all__ = ["registered", "collective_ops", "algorithms", "schedules", "topologies",
           "node_fabrics", "placements", "tensor_parallel_modes", "TENSOR_PARALLEL_SCHEMES",
           "BUILTIN_TOPOLOGY_BUILDERS", "BUILTIN_TENSOR_PARALLEL", "recompute_modules",
           "nccl_versions"]

# One source of truth: a field that names an algorithm, a schedule, a topology, a node fabric
# or a placement policy is checked against the registry the engines and builders use (looked
# up when a value is validated, so a plugin registered later is accepted).
def collective_ops() -> tuple[str, ...]:
    from typing import get_args

    from .workloads.trace import CollectiveOp
    return get_args(CollectiveOp)


def algorithms() -> dict[str, tuple[str, ...]]:
    """Algorithms the engines know, per collective (``auto`` picks the cheapest)."""
    from .simulator.collectives import algorithms_for
    return {op: tuple(algorithms_for(op)) for op in collective_ops()}


def schedules() -> tuple[str, ...]:
    from .workloads.schedules import SCHEDULES
    return tuple(SCHEDULES)


#: Modules whose import registers the bundled topology and node-fabric builders in
#: :mod:`ddlsim.topologies.registry`. Loaded by name, as :data:`BUILTIN_FAMILIES
#: <ddlsim.workloads.registry.BUILTIN_FAMILIES>` are: the builders validate their own sections
#: with the config, and the config only looks their names up.
BUILTIN_TOPOLOGY_BUILDERS: tuple[str, ...] = (
    "ddlsim.topologies.direct", "ddlsim.topologies.fabrics", "ddlsim.topologies.intra")

#: Modules whose import registers the bundled tensor-parallel schemes (layer partitioners of
#: the decoder family) in :data:`TENSOR_PARALLEL_SCHEMES`, loaded by name.
BUILTIN_TENSOR_PARALLEL: tuple[str, ...] = (
    "ddlsim.workloads.decoder.partition.megatron_1d",
    "ddlsim.workloads.decoder.partition.summa_2d",
    "ddlsim.workloads.decoder.partition.tesseract_2_5d",
    "ddlsim.workloads.decoder.partition.agarwal_3d")

#: ``parallel.tensor_parallel.mode`` → the partitioner class that registered it
#: (:func:`ddlsim.workloads.decoder.partition.register_partitioner` fills it).
TENSOR_PARALLEL_SCHEMES: dict[str, Any] = {}


@cache
def _load(modules: tuple[str, ...]) -> None:
    """Import ``modules`` (once: their import registers them)."""
    for module in modules:
        importlib.import_module(module)


def _topology_registry(table: str) -> tuple[str, ...]:
    _load(BUILTIN_TOPOLOGY_BUILDERS)
    from .topologies import registry
    return tuple(getattr(registry, table))


def topologies() -> tuple[str, ...]:
    """Inter-node fabrics (``system.network.topology``)."""
    return _topology_registry("TOPOLOGIES")


def node_fabrics() -> tuple[str, ...]:
    """Fabrics inside a node (``system.intra_node.kind``)."""
    return _topology_registry("NODE_FABRICS")


def placements() -> tuple[str, ...]:
    from .topologies.placement import PLACEMENT_POLICIES
    return tuple(PLACEMENT_POLICIES)


def tensor_parallel_modes() -> dict[str, Any]:
    """Tensor-parallel schemes (``parallel.tensor_parallel.mode``) → their layer partitioner
    class, which says the grid fields the scheme takes (``check_grid``) and its ranks
    (``grid_size``); the bundled ones are loaded first."""
    _load(BUILTIN_TENSOR_PARALLEL)
    return dict(TENSOR_PARALLEL_SCHEMES)


def recompute_modules() -> tuple[str, ...]:
    """Megatron-Core's selectively recomputed modules (``train.recompute_modules``)."""
    from .workloads.decoder.recompute_modules import module_names
    return module_names()


def nccl_versions() -> tuple[str, ...]:
    """NCCL releases whose tuning model is tabulated (``system.collectives.nccl_version``)."""
    from .simulator.collectives.nccl.versions import version_names
    return version_names()


def registered(names: Any) -> Any:
    """A string that must be one of ``names()`` (a registry's keys), refused with pydantic's
    ``literal_error`` so that the message (allowed values, "did you mean") reads as for a
    ``Literal``."""
    from pydantic_core import PydanticCustomError

    def check(v: Any) -> Any:
        allowed = tuple(names())
        if isinstance(v, str) and v in allowed:
            return v
        quoted = [repr(a) for a in allowed]
        expected = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
        raise PydanticCustomError("literal_error", "Input should be {expected}",
                                  {"expected": expected})
    return Annotated[str, BeforeValidator(check)]
