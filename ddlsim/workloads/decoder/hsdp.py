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
    """(family, ranks) of the group ZeRO-3 shards over: ``dp`` (``dp_cp`` under CP) of
    ``DP·CP`` ranks, or under HSDP ``dp_shard`` of ``DP/R · CP``."""
    p = cfg.parallel
    if not active(cfg):
        return ("dp_cp" if p.cp > 1 else "dp"), cfg.dp * p.cp
    return SHARD, cfg.dp // p.data_parallel_replicate_size * p.cp


def families(cfg: Any, mesh: Any) -> dict[str, GroupFamily]:
    """The ``dp_shard`` and ``dp_replicate`` families under HSDP (none otherwise): the data-
    parallel coordinate ``d = s + (D/R)·r`` (shard index ``s`` innermost, as torchtitan's
    mesh nests ``dp_shard`` inside ``dp_replicate``), context parallelism inside the shard."""
    if not active(cfg):
        return {}
    r = cfg.parallel.data_parallel_replicate_size
    grad = mesh.groups(("dp", "cp")) if cfg.parallel.cp > 1 else mesh.groups("dp")
    n, size = grad.shape          # members c + CP·d: one replica is a contiguous run
    shard = grad.reshape(n * r, size // r)
    replicas = grad.reshape(n, r, size // r).transpose(0, 2, 1).reshape(n * size // r, r)
    return {SHARD: GroupFamily(SHARD, "dp", shard), REPLICATE: GroupFamily(REPLICATE, "dp",
                                                                          replicas)}


def check_hsdp(cfg: Any) -> None:
    """What HSDP needs (ValueError, one paragraph naming the field and value)."""
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
    """(group, bytes) of the replicas' all-reduces after a unit's reduce-scatters
    ``reduces`` (group, input bytes) over ``shard_ranks`` ranks: each reduce-scatter's output."""
    return [(REPLICATE, n / shard_ranks) for _, n in reduces]


def replica_ops(sizes: list[float], deps: tuple[int, ...]) -> list[Op]:
    """The all-reduces over the replicas of ``sizes`` bytes each, on :data:`STREAM`, after
    the ops ``deps`` (the reduce-scatters they reduce)."""
    return [Op(Collective("grad.all_reduce.replicas", "all_reduce", REPLICATE, n), STREAM,
               deps=deps) for n in sizes]


def with_replica_wait(update: Block) -> Block:
    """``update`` with a wait for the replicas' all-reduces (:data:`STREAM`) before its
    optimizer step."""
    ops = list(update.ops)
    at = next((i for i, o in enumerate(ops) if getattr(o.payload, "kind", "") == "optimizer"),
              None)
    if at is None:
        raise ConfigError("HSDP: the update block has no optimizer step to hold back")
    moved = [Op(o.payload, o.stream, tuple(d + 1 if d >= at else d for d in o.deps), o.repeat)
             for o in ops[at:]]
    return Block(update.name, update.phase,
                 (*ops[:at], Op(Wait("wait.replicas", STREAM)), *moved))
