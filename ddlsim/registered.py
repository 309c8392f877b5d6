"""Config fields that name an entry of a registry: one source of truth.

A field that names a collective algorithm, a pipeline schedule, a topology, a node fabric or a
placement policy is checked against the registry the engines and builders use, looked up when
a value is validated (so a plugin registered later is accepted), with the message a
``Literal`` would give (allowed values, "did you mean").
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator

__all__ = ["registered", "collective_ops", "algorithms", "schedules", "topologies",
           "node_fabrics", "placements", "tensor_parallel_modes"]

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


def _topology_registry(table: str) -> tuple[str, ...]:
    from .topologies import direct, fabrics, intra  # noqa: F401  (builders register on import)
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
    (``grid_size``)."""
    from .workloads.decoder.partition import partitioners
    return partitioners()


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
