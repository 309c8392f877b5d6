"""HSDP: replicas of FSDP shards (``parallel.data_parallel_replicate_size``, torchtitan's
``data_parallel_replicate_degree``; ddlsim/workloads/decoder/hsdp.py)."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

import ddlsim
from ddlsim.api import build_workload
from ddlsim.workloads.trace import Collective

#: Llama 3.1 8B cut to 4 layers, FSDP over 16 H100s (2 nodes), torchtitan of 2025
BASE = {"model": {"preset": "llama-3.1-8b", "num_hidden_layers": 4},
        "parallel": {"zero_stage": 3, "data_parallel_size": 16},
        "train": {"micro_batch_size": 1, "global_batch_size": 32, "seq_length": 2048,
                  "recompute": "full"},
        "system": {"preset": "dgx-h100", "nodes": 2, "software": "torchtitan-2025"}}
#: parameters of one Llama 3.1 8B layer (attention, SwiGLU, two RMSNorm weights)
LAYER = 2 * 4096 ** 2 + 2 * 1024 * 4096 + 3 * 4096 * 14336 + 2 * 4096


def config(replicas=1, stack=None, **parallel):
    d = copy.deepcopy(BASE)
    d["parallel"].update(parallel, data_parallel_replicate_size=replicas)
    if stack is not None:
        d["system"]["software"] = stack
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ddlsim.load_config(d)


def collectives(cfg, op: str, group: str) -> list[tuple[float, int]]:
    """(bytes, repeat) of every ``op`` on ``group`` in the blocks of stage 0's program."""
    out = []
    for block in build_workload(cfg).classes[0].program.blocks.values():
        for o in block.flat.ops:
            if isinstance(o.payload, Collective) and (o.payload.op, o.payload.group) == (op, group):
                out.append((o.payload.bytes, o.repeat))
    return out


def test_the_shard_groups_nest_inside_the_replicas_as_torchtitans_mesh():
    """torchtitan's mesh pp, dp_replicate, dp_shard, cp, tp (outermost first): 16 data-
    parallel ranks as 2 replicas of 8 shards are the two nodes, each replica a node."""
    wl = build_workload(config(2))
    assert wl.groups["dp_shard"].members.tolist() == [list(range(8)), list(range(8, 16))]
    assert wl.groups["dp_replicate"].members.tolist() == [[i, i + 8] for i in range(8)]


def test_context_parallelism_is_inside_the_shard_group():
    wl = build_workload(config(2, data_parallel_size=4, context_parallel_size=2,
                               tensor_model_parallel_size=2, sequence_parallel=True))
    # ranks t + 2·(c + 2·d): a shard group is 2 data-parallel ranks × 2 CP ranks
    assert wl.groups["dp_shard"].members[0].tolist() == [0, 2, 4, 6]
    assert wl.groups["dp_replicate"].members[0].tolist() == [0, 8]


def test_the_groups_follow_the_mesh_coordinates_under_any_rank_order():
    """rank_order tp-dp-cp: rank = d + 4·c. Replica 0 is d in {0, 1} with both CP ranks."""
    wl = build_workload(_order_config())
    assert sorted(map(sorted, wl.groups["dp_shard"].members.tolist())) == [[0, 1, 4, 5],
                                                                           [2, 3, 6, 7]]
    assert sorted(map(sorted, wl.groups["dp_replicate"].members.tolist())) == [
        [0, 2], [1, 3], [4, 6], [5, 7]]


def _order_config():
    d = copy.deepcopy(BASE)
    d["parallel"].update(data_parallel_size=4, context_parallel_size=2,
                         data_parallel_replicate_size=2, rank_order="tp-dp-cp-ep-pp")
    d["train"]["global_batch_size"] = 8
    d["system"]["nodes"] = 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ddlsim.load_config(d)


def test_gradients_are_reduce_scattered_in_the_shard_then_all_reduced_over_replicas():
    """Per layer and micro-batch: a reduce-scatter of the layer's fp32 gradients over the 8
    ranks of a replica, then an all-reduce of the rank's shard (1/8) over the 2 replicas."""
    cfg = config(2)
    rs = collectives(cfg, "reduce_scatter", "dp_shard")
    ar = collectives(cfg, "all_reduce", "dp_replicate")
    layer = LAYER * 4                                     # fp32 reduction (grad_reduce_dtype)
    # and the edge units (fsdp_edges.py): the embedding, 128,256 x 4096, and the head, the
    # output layer of that size with the final norm's 4096
    emb, head = 128256 * 4096 * 4, (128256 * 4096 + 4096) * 4
    assert sorted({b for b, _ in rs}) == [pytest.approx(x) for x in (layer, emb, head)]
    assert sorted({b for b, _ in ar}) == [pytest.approx(x / 8) for x in (layer, emb, head)]
    assert len(ar) == len(rs) == 4 + 2                    # one per layer of the backward
    assert not collectives(config(1), "all_reduce", "dp_replicate")


def test_under_pipelining_each_reduce_scatter_of_the_stage_is_all_reduced_once():
    """PP 2: stage 0 reduce-scatters its 2 layers and its embedding after its last backward
    (.fsdp), and all-reduces each output (a quarter: 4 ranks a replica) over the replicas."""
    cfg = config(2, pipeline_model_parallel_size=2, data_parallel_size=8)
    rs = collectives(cfg, "reduce_scatter", "dp_shard")
    ar = collectives(cfg, "all_reduce", "dp_replicate")
    assert len(rs) == len(ar) == 3
    assert sorted(4 * b for b, _ in ar) == pytest.approx(sorted(b for b, _ in rs))


def test_model_states_are_sharded_over_the_shard_group_only():
    hsdp = ddlsim.memory_per_device(config(2))
    fsdp8 = ddlsim.memory_per_device(config(1, data_parallel_size=8))
    fsdp16 = ddlsim.memory_per_device(config(1))
    for part in ("weights", "gradients", "optimizer"):
        assert getattr(hsdp, part) == getattr(fsdp8, part) > getattr(fsdp16, part)


@pytest.mark.parametrize("pp", [1, 2])
def test_both_engines_time_hsdp_alike_and_the_step_is_on_twice_the_shard(pp):
    kw = {"pipeline_model_parallel_size": 2, "data_parallel_size": 8} if pp > 1 else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one, two = (ddlsim.predict(config(r, **kw)) for r in (1, 2))
        des = ddlsim.predict(config(2, **kw), engine="des")
    assert des.iteration_time_s == pytest.approx(two.iteration_time_s, rel=0.02)
    # the optimizer steps on twice the shard (its launch cost once)
    assert two.breakdown.optimizer_s == pytest.approx(2 * one.breakdown.optimizer_s, rel=1e-3)


@pytest.mark.parametrize("change, match", [
    ({"zero_stage": 1}, "needs zero_stage = 3"),
    ({"data_parallel_replicate_size": 3}, "must divide data_parallel_size = 16"),
    ({"data_parallel_replicate_size": 16}, "leaves one rank per replica"),
])
def test_bad_hsdp_plans_are_refused_by_name(change, match):
    with pytest.raises(ddlsim.ConfigError, match=match):
        config(**{"replicas": change.pop("data_parallel_replicate_size", 2), **change})


def test_megatron_cannot_replicate_shards():
    with pytest.raises(ddlsim.ConfigError, match="rule no_hsdp"):
        config(2, stack="megatron-core-2025")
