"""HSDP: replicas of FSDP shards, as PyTorch FSDP2 runs them on a 2-D mesh.

torchtitan's ``data_parallel_replicate_degree`` × ``data_parallel_shard_degree``
(``parallel.data_parallel_replicate_size`` ``R`` with ``data_parallel_size`` ``D``) passes
``fully_shard`` the mesh ``(dp_replicate, dp_shard_cp)`` (torchtitan 9dec370
``parallelisms/parallelize_llama.py`` lines 82-85, 07c00d9 ``models/llama3/infra/
parallelize.py`` lines 97-100; the mesh ``pp, dp_replicate, dp_shard, cp, tp``, outermost
first: 9dec370 ``parallelisms/parallel_dims.py`` ``build_mesh`` lines 48-52): a layer's parameters are sharded over the ``D/R · CP``
ranks of one replica (the data-parallel coordinate's inner factor, context parallelism
innermost) and replicated over the ``R`` replicas. Per layer and pass FSDP2

* all-gathers the parameters over the shard group (``dp_shard``), as FSDP does;
* reduce-scatters the gradients over the shard group, then all-reduces the reduce-scatter's
  output (the rank's shard, in the reduce dtype) over the replicas (``dp_replicate``) on its
  own stream, after the reduce-scatter (``foreach_reduce``: ``all_reduce_stream.wait_stream(
  reduce_scatter_stream)``, then ``dist.all_reduce(reduce_output, group=all_reduce_group)``;
  pytorch ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``, read at 010ae4a8;
  ``torch/distributed/_composable/fsdp/`` before 2025).

torchtitan never turns the all-reduce off during gradient accumulation (neither commit calls
``set_requires_all_reduce`` or ``set_requires_gradient_sync``), so every micro-batch's backward all-reduces each layer's shard; under
pipelining the gradients are reduced once, after the stage's last backward (:mod:`.fsdp`),
and all-reduced there too. The optimizer steps on the shard (``1/(D/R · CP)`` of the
stage); the model states are sharded over the shard group only. The all-reduces run on the
``dp.replicate`` stream, which the update waits for before the optimizer step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ConfigError
from ..trace import Block, Collective, GroupFamily, Op, Wait

__all__ = ["SHARD", "REPLICATE", "STREAM", "active", "shard_group", "families", "check_hsdp",
           "replica_reduces", "replica_ops", "with_replica_wait"]

#: the group families: FSDP's shard group and the replicas of one shard
SHARD, REPLICATE = "dp_shard", "dp_replicate"
#: the stream of the replicas' all-reduces (FSDP2's ``all_reduce_stream``)
STREAM = "dp.replicate"


def active(cfg: Any) -> bool:
    """Whether the plan replicates FSDP shards (``data_parallel_replicate_size`` above 1)."""
    return cfg.parallel.data_parallel_replicate_size > 1


def shard_group(cfg: Any) -> tuple[str, int]:
    """The group ZeRO-3 shards over.

    Parameters
    ----------
    cfg : RunConfig
        The run (its ``data_parallel_size`` derived).

    Returns
    -------
    tuple of (str, int)
        The family and its ranks: ``dp`` (``dp_cp`` under CP) of ``DP·CP`` ranks, or under
        HSDP ``dp_shard`` of ``DP/R · CP``.
    """
    p = cfg.parallel
    if not active(cfg):
        return ("dp_cp" if p.cp > 1 else "dp"), cfg.dp * p.cp
    return SHARD, cfg.dp // p.data_parallel_replicate_size * p.cp


def families(cfg: Any, mesh: Any) -> dict[str, GroupFamily]:
    """The HSDP group families of the plan.

    The data-parallel coordinate is ``d = s + (D/R)·r``: the shard index ``s`` inner to the
    replica index ``r``, as torchtitan's mesh nests ``dp_shard`` inside ``dp_replicate``;
    context parallelism joins the shard group (``dp_shard_cp``). Ranks are read from their
    mesh coordinates, so any ``parallel.rank_order`` places them.

    Parameters
    ----------
    cfg : RunConfig
        The run.
    mesh : DeviceMesh
        Its mesh (``cfg.mesh``).

    Returns
    -------
    dict
        ``dp_shard`` (groups of ``D/R · CP`` ranks) and ``dp_replicate`` (groups of ``R``
        ranks), both of kind ``dp``; empty without HSDP.
    """
    if not active(cfg):
        return {}
    r, cp = cfg.parallel.data_parallel_replicate_size, cfg.parallel.cp
    grad = mesh.groups(("dp", "cp")) if cp > 1 else mesh.groups("dp")
    n, size = grad.shape
    shard = size // (r * cp)                       # data-parallel ranks of one replica
    d = mesh.coords(grad, ("dp",))[..., 0]
    c = mesh.coords(grad, ("cp",))[..., 0] if cp > 1 else np.zeros_like(d)
    replica, inside = d // shard, c + cp * (d % shard)
    by_replica = np.take_along_axis(grad, np.argsort(replica * shard * cp + inside, axis=1), 1)
    by_inside = np.take_along_axis(grad, np.argsort(inside * r + replica, axis=1), 1)
    return {SHARD: GroupFamily(SHARD, "dp", by_replica.reshape(n * r, size // r)),
            REPLICATE: GroupFamily(REPLICATE, "dp", by_inside.reshape(n * size // r, r))}


def check_hsdp(cfg: Any) -> None:
    """Check what HSDP needs: ZeRO-3, ``R`` dividing ``data_parallel_size``, more than one
    rank per replica, a dense model and FSDP2's per-layer units.

    Parameters
    ----------
    cfg : RunConfig
        The run, during its validation (``data_parallel_size`` may be unset yet).

    Raises
    ------
    ValueError
        One paragraph naming the field, its value and what would do.
    """
    p = cfg.parallel
    r = p.data_parallel_replicate_size
    if r == 1:
        return
    head = f"parallel.data_parallel_replicate_size = {r} (HSDP: replicas of FSDP shards)"
    # the family's check runs before the config derives an unset data_parallel_size
    dp = p.data_parallel_size or cfg.system.num_devices // (p.tp * p.cp * p.pp)
    if p.zero_stage != 3:
        raise ValueError(f"{head} needs zero_stage = 3 (got {p.zero_stage}); replicas without "
                         "sharding are plain data parallelism: data_parallel_size with "
                         "data_parallel_replicate_size 1")
    if dp % r:
        raise ValueError(f"{head} must divide data_parallel_size = {dp} (the data-parallel "
                         "ranks are replicas × shards)")
    if dp // r * p.cp == 1:
        raise ValueError(f"{head} with data_parallel_size = {dp} leaves one rank per "
                         "replica: nothing is sharded. Use zero_stage 0 (DDP) with "
                         "data_parallel_replicate_size 1, or fewer replicas")
    if getattr(cfg.model, "num_local_experts", 0):
        raise ValueError(f"{head} is modelled for dense decoders; this model has experts "
                         "(their gradients sync over the expert-data-parallel group)")
    if cfg.software.zero3_gather != "per_layer":
        raise ValueError(f"{head} is FSDP2's (per-layer units); the stack "
                         f"{cfg.software.name!r} gathers {cfg.software.zero3_gather!r}")


def replica_reduces(reduces: list[tuple[str, float]], shard_ranks: int) -> list:
    """The all-reduces over the replicas that follow a unit's reduce-scatters.

    Parameters
    ----------
    reduces : list of (str, float)
        The reduce-scatters: group and input bytes.
    shard_ranks : int
        Ranks of the shard group.

    Returns
    -------
    list of (str, float)
        ``dp_replicate`` and the bytes of each reduce-scatter's output (input / ranks).
    """
    return [(REPLICATE, n / shard_ranks) for _, n in reduces]


def replica_ops(sizes: list[float], deps: tuple[int, ...]) -> list[Op]:
    """The all-reduces over the replicas as trace ops.

    Parameters
    ----------
    sizes : list of float
        Bytes of each all-reduce.
    deps : tuple of int
        Indices (in the block) of the reduce-scatters they follow.

    Returns
    -------
    list of Op
        One ``all_reduce`` on ``dp_replicate`` per size, on :data:`STREAM`.
    """
    return [Op(Collective("grad.all_reduce.replicas", "all_reduce", REPLICATE, n), STREAM,
               deps=deps) for n in sizes]


def with_replica_wait(update: Block) -> Block:
    """An update block whose optimizer step waits for the replicas' all-reduces.

    Parameters
    ----------
    update : Block
        The stage's update block.

    Returns
    -------
    Block
        ``update`` with a :class:`Wait` on :data:`STREAM` before its optimizer op (the deps
        after it shifted).
    """
    ops = list(update.ops)
    at = next((i for i, o in enumerate(ops) if getattr(o.payload, "kind", "") == "optimizer"),
              None)
    if at is None:
        raise ConfigError("HSDP: the update block has no optimizer step to hold back")
    moved = [Op(o.payload, o.stream, tuple(d + 1 if d >= at else d for d in o.deps), o.repeat)
             for o in ops[at:]]
    return Block(update.name, update.phase,
                 (*ops[:at], Op(Wait("wait.replicas", STREAM)), *moved))
