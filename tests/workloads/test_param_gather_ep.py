"""The distributed optimizer's overlapped parameter gather under expert parallelism
(``decoder/param_gather.py``, "Expert parallelism"): Megatron-Core's dense and expert buffers,
each with its own bucket chain, each but its first bucket gathered beside the first forward."""

import copy

import pytest

import ddlsim
from ddlsim.workloads.decoder.builder import StageBuilder

#: Mixtral 8x7B on 64 H100s, TP 1, PP 4 interleaved (2 chunks), EP 4, expert TP 1, ZeRO-1:
#: DP 16 over the dense parameters, expert DP 64 / (4 · 4 · 1) = 4 over the experts'
MIXTRAL = {"model": "mixtral-8x7b",
           "parallel": {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 4,
                        "schedule": "interleaved", "virtual_pipeline_model_parallel_size": 2,
                        "expert_model_parallel_size": 4, "expert_tensor_parallel_size": 1,
                        "zero_stage": 1, "overlap_grad_reduce": True},
           "train": {"micro_batch_size": 1, "global_batch_size": 256, "seq_length": 4096,
                     "dtype": "bf16"},
           "system": {"preset": "dgx-h100", "nodes": 8,
                      "software": {"stack": "megatron-core-2025"}}}


def _cfg(on: bool, **parallel):
    data = copy.deepcopy(MIXTRAL)
    data["parallel"].update(overlap_param_gather=on, **parallel)
    return ddlsim.load_config(data)


def _gathers(block, group: str) -> list[tuple[str, str, float]]:
    return [(o.payload.name, o.stream, o.payload.bytes) for o in block.ops
            if getattr(o.payload, "op", None) == "all_gather" and o.payload.group == group]


def test_an_explicit_overlap_with_expert_parallelism_is_modelled_not_refused():
    """Refused ("not modelled with expert parallelism") until 2026-11-30; now the plan runs,
    faster than with the gather exposed, in both engines."""
    on, off = _cfg(True), _cfg(False)
    for engine in ("analytical", "des"):
        fast, slow = ddlsim.predict(on, engine), ddlsim.predict(off, engine)
        assert fast.iteration_time_s < slow.iteration_time_s
        assert fast.breakdown.exposed_comm_s["dp"] < slow.breakdown.exposed_comm_s["dp"]


def test_each_buffer_leaves_its_first_bucket_exposed_and_the_rest_beside_the_forward():
    """Stage 1 of 4 (no embedding or head): the update block gathers one bucket of each
    buffer (Megatron-Core's max(40e6, 1e6 · DP 16) = 40e6 parameters, bf16); F0.pg gathers
    the rest of chunk 0's share of each, the dense one over the gradient group on ``dp``, the
    experts' over ``edp`` on ``edp``, and after them the later chunk's; F1.pg waits for both
    streams. Each buffer's bytes add up to its whole gather."""
    cfg = _cfg(True)
    wl = ddlsim.build_workload(cfg)
    blocks = wl.classes[1].program.blocks
    b = StageBuilder.from_config(cfg, cfg.model.shape())
    bucket = 40e6 * 2
    expert = b.stage_expert_params(1) * 2
    dense = (b.stage_params(1) * 2) - expert
    update = blocks["update"]
    assert [g[2] for g in _gathers(update, "dp")] == [bucket]
    assert [g[2] for g in _gathers(update, "edp")] == [bucket]
    pg = blocks["F0.pg"]
    (d_name, d_stream, d_now), (d_later_name, _, d_later) = _gathers(pg, "dp")
    (e_name, e_stream, e_now), (e_later_name, _, e_later) = _gathers(pg, "edp")
    assert (d_stream, e_stream) == ("dp", "edp")
    assert d_later_name.endswith("later_chunks") and e_later_name.endswith("later_chunks")
    assert bucket + d_now + d_later == pytest.approx(dense, rel=1e-12)
    assert bucket + e_now + e_later == pytest.approx(expert, rel=1e-12)
    # the experts' chunk 0 holds half the stage's MoE layers (8 layers, 2 chunks of 4)
    assert e_later == pytest.approx(expert / 2, rel=1e-12)
    waits = [o.payload.stream for o in blocks["F1.pg"].ops[:2]]
    assert waits == ["dp", "edp"]


def test_the_first_forward_sends_only_after_both_gathers():
    """F0.pg's first send depends on the waits for both streams."""
    blocks = ddlsim.build_workload(_cfg(True)).classes[0].program.blocks
    ops = blocks["F0.pg"].ops
    waits = [i for i, o in enumerate(ops) if type(o.payload).__name__ == "Wait"
             and o.payload.name.startswith("params.")]
    assert [ops[i].payload.stream for i in waits] == ["dp", "edp"]
    send = next(o for o in ops if getattr(o.payload, "kind", None) == "send")
    assert set(waits) <= set(send.deps)


def test_without_expert_parallelism_nothing_moves_to_an_expert_stream():
    """EP 1 with expert TP = TP: one layout, one buffer; the gather as for a dense model."""
    cfg = _cfg(True, expert_model_parallel_size=1, expert_tensor_parallel_size=None,
               pipeline_model_parallel_size=2, schedule="1f1b",
               virtual_pipeline_model_parallel_size=None)
    blocks = ddlsim.build_workload(cfg).classes[0].program.blocks
    assert not _gathers(blocks["F0.pg"], "edp")
    assert [s for _, s, _ in _gathers(blocks["F0.pg"], "dp")] == ["dp"]
