"""What a workload family gives the vectorised tier: per-stage costs for arrays of plans.

Every registered family is searchable (plan by plan, :mod:`.exact`); a family whose grids run
to millions of plans may also register a :class:`VectorFamily` under the names of its
``model.architecture`` values with :func:`register_vector_family`. The pipeline, overlap and
update closed forms (:mod:`.pipeline`) are shared; the plans' rules are the config's own
(:mod:`.planconfig`, :mod:`ddlsim.stackrules`); the family supplies the costs of its stages
(:class:`StageCosts`) and its memory per device.

The costs are those of :class:`ddlsim.simulator.costs.CostModel`: a family builds its pieces
with its own builder and times them with :mod:`ddlsim.simulator.analytical.arrays` (the
decoders: :mod:`.blocks`), collectives by :func:`ddlsim.search.collforms.collective_seconds`,
``CostModel.collective`` on arrays (tested equal in ``tests/test_search_costs.py``).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np

from ..errors import ConfigError

__all__ = ["StageCosts", "VectorFamily", "register_vector_family", "vector_family"]


class StageCosts(NamedTuple):
    """Per plan (arrays), in seconds; stages are the first, the middle ones and the last
    (with one stage, "first" is the whole model and the others equal it).

    ``fwd_*`` / ``bwd_*``: one micro-batch's forward / backward over all of the stage's model
    chunks, on the compute stream (point-to-point transfers excluded).
    ``bwd_chunk``: one chunk's backward on a middle stage (the drain's step).
    ``p2p_s``: the pipeline's point-to-point time summed over the ``PP − 1`` hops;
    ``wrap_s``: the hop from the last stage to the first.
    ``tail_first``, ``tail_last``: data-parallel communication still running after the last
    backward's compute ends. ``update_first``, ``update_last``: the update block after it.
    ``whole``: NaN, or a plan's iteration time when the family times it with its own
    closed form (e.g. ZeRO-3's per-layer prefetch).
    ``blocking``: the pipeline's P2P blocks (receives posted after the compute before them:
    Megatron without ``overlap_p2p_comm``, which it turns off without interleaving).
    ``tied_sync``: seconds of a collective between the first and the last stage before
    their update blocks (the tied embedding's gradient all-reduce), 0 where none: both
    stages meet there, then run their updates (:func:`.pipeline.iteration_time`).
    ``stage_hops``: None, or the seconds of the hops each stage receives over, shape (plans,
    k, 2): per row a stage's (activation hop, gradient hop), the first stage's in row 0
    (none, hop 0 → 1), the last stage's in row 1 (hop PP − 2 → PP − 1, none), each distinct
    middle stage's after them, −inf where none (None: every hop ``p2p_s / (PP − 1)``).
    Where they differ (a hop leaving its node), a stage waits for its own
    (:func:`.pipeline.iteration_time`).
    ``fwd_chunk``: None, or one chunk's forward on a middle stage (the interleaved schedule's
    step, :func:`.pipeline.interleaved_ends`; None: ``fwd_mid / v``, which PP 2 lacks).
    ``stage_hop_s``: None, or the seconds of each hop s → s + 1 in order, shape (plans,
    max PP − 1), 0 past a plan's last (None: every hop ``p2p_s / (PP − 1)``); the interleaved
    schedule's fill and drain under blocking P2P take each stage's own receive.
    """

    fwd_first: np.ndarray
    fwd_mid: np.ndarray
    fwd_last: np.ndarray
    bwd_first: np.ndarray
    bwd_mid: np.ndarray
    bwd_last: np.ndarray
    bwd_chunk: np.ndarray
    p2p_s: np.ndarray
    wrap_s: np.ndarray
    tail_first: np.ndarray
    tail_last: np.ndarray
    update_first: np.ndarray
    update_last: np.ndarray
    whole: np.ndarray
    blocking: np.ndarray | bool = False
    tied_sync: np.ndarray | float = 0.0
    stage_hops: np.ndarray | None = None
    fwd_chunk: np.ndarray | None = None
    stage_hop_s: np.ndarray | None = None


class VectorFamily(Protocol):
    """The vectorised form of a workload family."""

    def prepare(self, cfg) -> object:
        """Scalars of one context's base config (model shape, system constants); raise
        :class:`ConfigError` for a model the vectorised form does not cover."""

    def costs(self, ctx: object, plans, nets) -> StageCosts:
        """Stage costs of ``plans`` (one context), ``nets`` from :func:`.netcost.mesh_networks`."""

    def memory(self, ctx: object, plans) -> tuple[np.ndarray, np.ndarray]:
        """(bytes on the most loaded device, its capacity) per plan."""

    # optional: ``memory_floor(ctx, plans)`` -> (bytes no larger than :meth:`memory`'s, to
    # the last bit, the capacity) per plan, cheaper to compute: a search whose plans must fit
    # rejects the plans over capacity on it before computing :meth:`memory` for the others


_FAMILIES: dict[str, VectorFamily] = {}


def register_vector_family(*architectures: str):
    """Class decorator: register an instance for each ``model.architecture`` name."""
    def wrap(cls):
        for name in architectures:
            _FAMILIES[name] = cls()
        return cls
    return wrap


def vector_family(architecture: str) -> VectorFamily:
    """The vectorised family of ``architecture`` (the bundled ones register when
    :mod:`ddlsim.search` is imported), or a one-paragraph ConfigError."""
    try:
        return _FAMILIES[architecture]
    except KeyError:
        raise ConfigError(f"model.architecture = {architecture!r} has no vectorised form, so "
                          f"ddlsim search cannot evaluate it; families with one: "
                          f"{', '.join(sorted(_FAMILIES))}. Use ddlsim sweep (the exact "
                          "engine) for this model") from None
