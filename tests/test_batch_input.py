"""A micro-batch's input on the device (ddlsim/workloads/decoder/batch_input.py): Megatron-Core's
get_batch_on_this_tp_rank copies tokens, labels, loss mask, the dataset's [b, 1, s, s] bool
attention mask and position ids from pinned memory on the compute stream (at the device's
host link) and broadcasts the loading stage's share of them over TP; stacks whose batch
carries no mask load nothing; a device without a host link is charged no copy, and the
result says so."""

from __future__ import annotations

import warnings

import pytest

import ddlsim
from ddlsim.errors import ConfigError, DDLSimWarning
from ddlsim.workloads.decoder.batch_input import ROLES, batch_tensors, carries_mask
from ddlsim.workloads.gpt import build_gpt_workload

B, S = 2, 1024
BASE = {"model": "gpt2-124m", "system": {"preset": "dgx-h100", "nodes": 1},
        "train": {"micro_batch_size": B, "global_batch_size": 16, "seq_length": S}}
GEN5_BPS = 50.4e9      # dgx-h100's host_link (systems.yaml)


def _cfg(parallel: dict, stack: str = "megatron-core-2024", device: dict | None = None):
    system = {"preset": "dgx-h100", "nodes": 1, "software": stack}
    if device is not None:
        system["device"] = device
    return ddlsim.load_config({**BASE, "system": system, "parallel": parallel})


def _batch_ops(cfg) -> dict[str, list[list]]:
    """Per rank class, the batch ops of each forward block, in program order."""
    out = {}
    for c in build_gpt_workload(cfg).classes:
        out[c.name] = [[op.payload for op in blk.flat.ops if op.name.startswith("batch.")]
                       for blk in c.program.blocks.values() if blk.phase == "forward"]
    return out


def test_batch_bytes_by_hand():
    """int64 tokens, labels, position ids (8 B a token), fp32 loss mask (4 B), bool s x s."""
    sizes = batch_tensors(B, S)
    assert sizes == {"tokens": 8 * B * S, "labels": 8 * B * S, "loss_mask": 4 * B * S,
                     "position_ids": 8 * B * S, "attention_mask": B * S * S}
    assert batch_tensors(1, 4096)["attention_mask"] == 16_777_216   # 16.8 MB at seq 4096


@pytest.mark.parametrize("parallel, roles", [
    ({"tensor_model_parallel_size": 2}, ["one"]),
    ({"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2}, ["first", "last"]),
    ({"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 4},
     ["first", None, None, "last"]),
])
def test_loading_stages_copy_everything_and_broadcast_their_share(parallel, roles):
    cfg = _cfg(parallel)
    ops = _batch_ops(cfg)
    copy_s = sum(batch_tensors(B, S).values()) / GEN5_BPS
    classes = sorted(ops)
    assert len(classes) == len(roles)
    for name, role in zip(classes, roles):
        blocks = [blk for blk in ops[name] if blk]
        if role is None:            # a middle stage loads nothing
            assert not blocks
            continue
        assert blocks
        for blk in blocks:
            assert blk[0].name == "batch.h2d" and blk[0].seconds == pytest.approx(copy_s)
            assert [x.name for x in blk[1:]] == [f"batch.bcast.{t}" for t in ROLES[role]]
            assert all(x.op == "broadcast" and x.group == "tp" for x in blk[1:])
            assert [x.bytes for x in blk[1:]] == [batch_tensors(B, S)[t] for t in ROLES[role]]


def test_no_broadcast_at_tp1_and_nothing_without_the_mask():
    ops = _batch_ops(_cfg({}))
    assert [[x.name for x in blk] for blk in next(iter(ops.values())) if blk][0] == ["batch.h2d"]
    for stack, sp in (("megatron-lm-2021", False), ("torchtitan-2024", True)):  # tp_needs_sp
        ops = _batch_ops(_cfg({"tensor_model_parallel_size": 2, "sequence_parallel": sp},
                              stack))
        assert not any(blk for blocks in ops.values() for blk in blocks)


def test_one_device_pays_the_copy_once_per_micro_batch():
    """One GPU, no overlap: the iteration grows by (micro-batches) x (bytes / host link)."""
    with_mask = ddlsim.predict(_cfg({}), check_fit=False).iteration_time_s
    cfg = _cfg({})
    off = ddlsim.load_config({**BASE, "parallel": {}, "system": {
        "preset": "dgx-h100", "nodes": 1, "software": {
            "stack": "megatron-core-2024", "kernels": {"batch_attention_mask": "none"}}}})
    without = ddlsim.predict(off, check_fit=False).iteration_time_s
    micro_batches = 16 // B // cfg.parallel.data_parallel_size
    expected = micro_batches * sum(batch_tensors(B, S).values()) / GEN5_BPS
    assert with_mask - without == pytest.approx(expected, rel=1e-6)


def test_no_host_link_is_said_not_silent():
    cfg = _cfg({"tensor_model_parallel_size": 2}, device={"host_link": None})
    ops = _batch_ops(cfg)
    assert all(x.name != "batch.h2d" for blocks in ops.values() for blk in blocks for x in blk)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = ddlsim.predict(cfg, check_fit=False)
    assert "not charged" in result.extra["batch_input"]
    assert any(issubclass(w.category, DDLSimWarning) and "host_link" in str(w.message)
               for w in caught)


@pytest.mark.parametrize("value", ["-5 GB/s", "0 GB/s", "fast"])
def test_bad_host_link_names_the_field(value):
    with pytest.raises(ConfigError, match="host_link"):
        _cfg({}, device={"host_link": {"bandwidth_Bps": value}})


def test_search_tier_times_the_loading_as_the_exact_engine():
    """PP 1 and PP 2 at TP 2: the vectorised tier's pieces (emb1, emb, load_l) equal the
    exact engine's iteration."""
    from ddlsim.search.evaluate import evaluate_grid
    from ddlsim.search.spec import Constraints
    data = {**BASE, "system": {"preset": "dgx-h100", "nodes": 1,
                               "software": "megatron-core-2024"},
            "parallel": {"tensor_model_parallel_size": 2}}
    axes = {"parallel.tensor_model_parallel_size": [2],
            "parallel.pipeline_model_parallel_size": [1, 2]}
    frame = evaluate_grid(data, None, [], axes, Constraints()).frame
    for _, row in frame.iterrows():
        pp = int(row["parallel.pipeline_model_parallel_size"])
        cfg = _cfg({"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": pp,
                    "data_parallel_size": 8 // (2 * pp)})
        exact = ddlsim.predict(cfg, check_fit=False).iteration_time_s
        assert row["iteration_time_s"] == pytest.approx(exact, rel=1e-3)


def test_ranks_sharing_their_hosts_memory_have_no_copy_to_charge():
    # the seed wiki's CPU cluster (intra_node shared_memory, no host_link): no copy, no note
    cfg = ddlsim.load_config("examples/wiki-gpt2-9ranks-ddp.yaml")
    assert carries_mask(cfg.software) and cfg.system.device.host_link is None
    assert cfg.system.intra_node.kind == "shared_memory"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = ddlsim.predict(cfg, check_fit=False)
    assert "batch_input" not in result.extra
    assert not any("batch copy" in str(w.message) for w in caught)
