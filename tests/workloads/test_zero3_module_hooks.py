"""ZeRO-3 from module hooks (the deepspeed-2021 and deepspeed stacks, docs/overlap.md): which
tensors a layer gathers and reduce-scatters, derived by hand from DeepSpeed's rules, the trace's
units, and the errors."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.config import build_config
from ddlsim.errors import ConfigError
from ddlsim.software import SoftwareSpec, resolve_software
from ddlsim.workloads.decoder.zero3 import list_host_seconds, module_fetches
from ddlsim.workloads.decoder.zero3_fetch import gather_host_split
from ddlsim.workloads.models.decoder import DecoderShape

GPT3 = DecoderShape(layers=96, hidden=12288, heads=96, ffn=4 * 12288, vocab=51200,
                    max_positions=2048)
H = 12288
QKV, PROJ, FC = 3 * H * H, H * H, 4 * H * H


def _flat(fetches, field):
    return tuple(n for f in fetches for n in getattr(f, field))


def test_gpt3_layer_gathers_its_four_weights_and_keeps_the_small_tensors():
    """Biases and LayerNorms (≤ 49,152 elements) are under the 1e5 persistence threshold: the
    forward gathers the four weight matrices, one per GEMM module; every tensor's gradient is
    reduce-scattered, the norms' with the GEMM after them."""
    sw = resolve_software("deepspeed-2021")
    fetches = module_fetches(GPT3, 1, sw, full_recompute=False)
    assert [f.module for f in fetches] == [1, 2, 4, 5]
    assert _flat(fetches, "forward") == (QKV, PROJ, FC, FC)
    assert _flat(fetches, "backward") == (QKV, PROJ, FC, FC)
    assert _flat(fetches, "recompute") == ()
    assert len(_flat(fetches, "reduce")) == 12
    assert sum(_flat(fetches, "reduce")) == GPT3.dense_layer_params
    assert len(fetches[0].reduce) == 4          # LayerNorm weight and bias, QKV weight, bias


def test_full_recompute_regathers_all_but_the_modules_reused_within_the_distance():
    """Under full recomputation each module is gathered for the recomputed forward and again
    for its backward, except the second MLP GEMM (reused at distance 0). The first MLP
    GEMM's distance is twice the second's 604 M elements, over the 1e9 limit; with a limit of
    1.3e9 it is kept too."""
    sw = resolve_software("deepspeed-2021")
    fetches = module_fetches(GPT3, 1, sw, full_recompute=True)
    assert _flat(fetches, "recompute") == (QKV, PROJ, FC, FC)
    assert _flat(fetches, "backward") == (QKV, PROJ, FC)
    wider = resolve_software(SoftwareSpec(stack="deepspeed-2021",
                                          overlap={"zero3_max_reuse_distance": 1_300_000_000}))
    assert _flat(module_fetches(GPT3, 1, wider, True), "backward") == (QKV, PROJ)


def test_tensor_parallel_shards_the_weights_and_replicates_the_norms():
    sw = resolve_software("deepspeed-2021")
    fetches = module_fetches(GPT3, 8, sw, full_recompute=False)
    assert _flat(fetches, "forward") == (QKV / 8, PROJ / 8, FC / 8, FC / 8)
    assert sum(_flat(fetches, "reduce")) == sum(sum(m) for m in GPT3.layer_modules(8))
    assert sum(sum(m) for m in GPT3.layer_modules(8)) * 8 > GPT3.dense_layer_params


def test_per_tensor_trace_overlaps_one_module_and_waits_for_the_reduce_scatters():
    """deepspeed-2021's backward on one layer of GPT-3 1.3B: units per module part, each
    module's gather issued one unit ahead, the compute of a unit after the reduce-scatters
    of the unit before it (the device synchronisation), the passes where DeepSpeed runs them."""
    data = {"model": "gpt3-1.3b", "parallel": {"zero_stage": 3},
            "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 2048,
                      "recompute": "full", "dtype": "fp16"},   # DeepSpeed v0.3.13: ZeRO in fp16
            "system": {"preset": "dgx-a100", "nodes": 2, "software": "deepspeed-2021"}}
    w = ddlsim.build_workload(build_config(data, []))
    ops = w.classes[0].program.blocks["F0"].flat.ops
    names = [o.payload.name for o in ops]
    # the first layer: QKV (+ core) gathered with the projection's weight ahead of it, each
    # gather's buffer zero-filled and waited for, then issued by the host, whose copy-out
    # launches follow the NCCL launch, beside the all-gather (PyTorch 1.8's post lambda)
    # (after the embedding's unit: its word and position tables, zero3_edges.py, issued first)
    first = names.index("fwd.attn.qkv")
    issue = ["zero3.zero_fill", "zero3.host_gather", "param.all_gather", "zero3.fetch_passes",
             "zero3.host_copy_out"]
    assert names[1:7] == ["zero3.zero_fill", "zero3.host_gather"] \
        + ["param.all_gather.embedding"] * 2 + ["zero3.fetch_passes", "zero3.host_copy_out"]
    assert names[7:12] == issue and names[12] == "embedding"
    assert [ops[i].stream for i in range(7, 12)] == ["host", "host", "dp", "dp", "host"]
    assert ops[8].deps == (7,) and ops[9].deps == ops[10].deps == ops[11].deps == (8,)
    # the embedding waits for its gathers and the host's issue of QKV's, copy-out included;
    # the projection's fill and issue follow the embedding's compute
    assert ops[12].deps == (3, 4, 5, 11) and names[13:18] == issue
    # QKV waits for its gather and for the host's issue of the projection's
    assert ops[first].deps == (9, 10, 17)
    assert names[first + 1:first + 6] == issue
    assert ops[first + 1].deps == (first,)        # fc1's fill and issue: after QKV's compute
    assert ops[first + 2].deps == (first + 1,)
    assert ops[first + 6].deps == (15, 16, first + 5)
    back = w.classes[0].program.blocks["B0"].flat.ops
    names = [o.payload.name for o in back]
    fc2, fc1 = names.index("bwd.mlp.fc2"), names.index("bwd.mlp.fc1")
    # fc2's gradient passes (compute stream), the host's issue of its two reduce-scatters
    # (beside the compute), the reduce-scatters, then fc1 after them
    assert names[fc2 + 1:fc1] == ["zero3.reduce_passes", "zero3.host_reduce"] \
        + ["grad.reduce_scatter"] * 2
    assert back[fc2 + 1].stream == "compute" and back[fc2 + 2].stream == "host"
    assert back[fc2 + 2].deps == () and back[fc2 + 3].deps == (fc2 + 1, fc2 + 2)
    assert back[fc1].deps == (fc2 + 3, fc2 + 4)
    # GPT-3 1.3B's modules are all reused within 1e9 elements: no backward re-gathers
    forward = w.classes[0].program.blocks["F0"].flat.ops
    assert names.count("param.all_gather") == sum(
        o.payload.name == "param.all_gather" for o in forward) == 4 * 24


def test_per_tensor_gathers_cost_more_than_per_layer_ones():
    """The same ZeRO-3 plan: one collective per tensor, gathered on demand, with the memory
    passes, is slower than today's DeepSpeed's per-module gathers one layer ahead."""
    data = {"model": "gpt3-13b", "parallel": {"zero_stage": 3},
            "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 2048,
                      "recompute": "full", "dtype": "fp16"},   # DeepSpeed v0.3.13: ZeRO in fp16
            "system": {"preset": "dgx-a100", "nodes": 2}}
    times = {}
    for stack in ("deepspeed", "deepspeed-2021"):
        cfg = build_config({**data, "system": {**data["system"], "software": stack}}, [])
        times[stack] = ddlsim.predict(cfg, check_fit=False).iteration_time_s
    assert times["deepspeed-2021"] > 1.05 * times["deepspeed"]


def test_thresholds_without_module_hooks_are_refused():
    with pytest.raises(ConfigError, match="zero3_persistence_threshold = 10 applies to ZeRO-3 "
                                          "gathers from module hooks only.*stack "
                                          "'megatron-core-2024'"):
        resolve_software(SoftwareSpec(stack="megatron-core-2024",
                                      overlap={"zero3_persistence_threshold": 10}))


def test_host_fields_without_per_tensor_gathers_are_refused():
    with pytest.raises(ConfigError, match="zero3_host_copy = 1e-05 s applies to per-tensor "
                                          "ZeRO-3 gathers only.*stack 'deepspeed'"):
        resolve_software(SoftwareSpec(stack="deepspeed", overlap={"zero3_host_copy": 1e-5}))
    with pytest.raises(ValueError, match="expected a time .*got True"):
        SoftwareSpec(stack="deepspeed-2021", overlap={"zero3_host_python_op": True})
    with pytest.raises(ValueError, match="5 s is above the plausible maximum 1 s"):
        SoftwareSpec(stack="deepspeed-2021", overlap={"zero3_host_copy": 5.0})
    # a time with its unit is read at the edge
    spec = SoftwareSpec(stack="deepspeed-2021", overlap={"zero3_host_copy": "20 us"})
    assert resolve_software(spec).zero3_host_copy == pytest.approx(20e-6)


def test_list_collectives_host_time_counts_the_code_s_operations():
    """deepspeed-2021: 2 us per Python op, 10 us per copy_; a gather on 8 ranks is
    8 × (narrow + get_rank) + 2 (narrow, view) and 8 copy-outs + 3 launches (zeros, own
    copy_, NCCL), plus 234 us per call: 380 us in all, DeepSpeed #1069's profile; a
    reduce-scatter 8 × (view + narrow) and 8 flattening copies + the NCCL launch."""
    sw = resolve_software("deepspeed-2021")
    assert list_host_seconds(sw, 8, 1, gather=True) == pytest.approx(380e-6)
    assert list_host_seconds(sw, 8, 1, gather=True) == pytest.approx(
        18 * 2e-6 + 11 * 1e-5 + 234e-6)
    assert list_host_seconds(sw, 8, 2, gather=False) == pytest.approx(
        2 * (16 * 2e-6 + 9 * 1e-5))
    # linear in the ranks: 1,536 ranks cost 1536 × 14 us per gather, plus the call's 268 us
    assert list_host_seconds(sw, 1536, 1, gather=True) == pytest.approx(
        1536 * 14e-6 + 268e-6)
    assert list_host_seconds(resolve_software("deepspeed"), 1536, 1, gather=True) == 0


def test_gather_host_time_splits_at_the_nccl_launch():
    """PyTorch 1.8's ProcessGroupNCCL::collective runs allgather's copy-out loop (its post
    lambda) after the NCCL launch: of a gather's host time, one copy_ per rank comes after
    the launch, the rest (Python's loop, the fill, the own copy, the launch) before it."""
    sw = resolve_software("deepspeed-2021")
    before, after = gather_host_split(sw, 1536, 2)
    assert after == pytest.approx(2 * 1536 * 1e-5)
    assert before == pytest.approx(2 * (1536 * 2 * 2e-6 + 2 * 2e-6 + 3 * 1e-5 + 234e-6))
    assert before + after == pytest.approx(list_host_seconds(sw, 1536, 2, gather=True))
    assert gather_host_split(resolve_software("deepspeed"), 1536, 1) == (0.0, 0.0)


def test_the_host_issue_of_every_gather_after_the_first_is_exposed():
    """Every fetch synchronises the device, so the host's issue of a prefetched gather
    happens with the device idle: the forward pays each one (all but the two issued before
    the embedding, which it hides)."""
    data = {"model": "gpt3-1.3b", "parallel": {"zero_stage": 3},
            "train": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 2048,
                      "recompute": "full", "dtype": "fp16"},   # DeepSpeed v0.3.13: ZeRO in fp16
            "system": {"preset": "dgx-a100", "nodes": 4, "software": "deepspeed-2021"}}
    free = {**data, "system": {**data["system"], "software": {
        "stack": "deepspeed-2021", "overlap": {"zero3_host_python_op": 0.0,
                                               "zero3_host_copy": 0.0,
                                               "zero3_host_gather_call": 0.0}}}}
    cfg = build_config(data, [])
    ops = ddlsim.build_workload(cfg).classes[0].program.blocks["F0"].flat.ops
    issues = [o.payload.seconds for o in ops if o.payload.name == "zero3.host_gather"]
    copies = [o.payload.seconds for o in ops if o.payload.name == "zero3.host_copy_out"]
    # the layers' modules, and the embedding's two tables and the output layer (tied: the
    # embedding's weight fetched again) before and after them (zero3_edges.py); the issue
    # until the NCCL launch, then one copy-out launch per rank (10 us each) beside it
    assert len(issues) == len(copies) == 4 * 24 + 2
    assert issues[1] + copies[1] == pytest.approx(
        list_host_seconds(cfg.software, 32, 1, gather=True))
    assert copies[1] == pytest.approx(32 * 1e-5) and copies[0] == pytest.approx(2 * 32 * 1e-5)
    assert issues[0] + copies[0] == pytest.approx(
        list_host_seconds(cfg.software, 32, 2, gather=True))
    slower = (ddlsim.predict(cfg, check_fit=False).iteration_time_s
              - ddlsim.predict(build_config(free, []), check_fit=False).iteration_time_s)
    assert slower >= sum(issues[2:]) * (1 - 1e-9)


def test_todays_deepspeed_gathers_each_module_once_coalesced():
    """The deepspeed stack (DeepSpeed >= 0.6): one gather per module with a fetched tensor,
    the same re-gathers under recomputation, one reduce-scatter per module."""
    sw = resolve_software("deepspeed")
    assert sw.zero3_gather == "per_module"
    fetches = module_fetches(GPT3, 1, sw, full_recompute=True)
    assert _flat(fetches, "forward") == (QKV, PROJ, FC, FC)
    assert _flat(fetches, "backward") == (QKV, PROJ, FC)
    assert _flat(fetches, "reduce") == (2 * H + QKV + 3 * H, PROJ + H, 2 * H + FC + 4 * H,
                                        FC + H)
    # a huge QKV bias (3h >= 1e5) is fetched with its weight, in the same collective
    wide = DecoderShape(layers=2, hidden=40960, heads=320, ffn=4 * 40960, vocab=51200,
                        max_positions=2048)
    h = 40960
    assert module_fetches(wide, 1, sw, False)[0].forward == (3 * h * h + 3 * h,)


def test_per_tensor_gathers_of_moe_layers_are_refused():
    # DeepSpeed v0.3.13 has no MoE layers of its own (deepspeed/moe came later: rule no_moe),
    # so the stack has no moe: defaults; as a what-if the plan names how its MoE layers run,
    # and the per-tensor gathers' own limit still refuses them
    data = {"model": "mixtral-8x7b",
            "parallel": {"zero_stage": 3, "moe": {"token_dispatcher_type": "alltoall",
                                                  "grouped_gemm": False,
                                                  "permute_fusion": False}},
            "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 1024,
                      "dtype": "fp16"},
            "system": {"preset": "dgx-h100", "nodes": 2,
                       "software": {"stack": "deepspeed-2021", "what_if": True}}}
    cfg = build_config(data, [])
    with pytest.raises(ConfigError, match="per_tensor' is modelled for dense decoder layers"):
        ddlsim.predict(cfg, check_fit=False)


def test_presets_lists_how_each_stack_gathers_under_zero3():
    from typer.testing import CliRunner

    from ddlsim.cli import app
    res = CliRunner().invoke(app, ["presets", "software"], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    row = next(line for line in res.output.splitlines() if "deepspeed-2021" in line)
    assert "per tensor, 1 module ahead; kept under 1e+05 elements" in row
    assert "zero3_persistence_threshold=0" not in res.output


def test_thresholds_are_counts_written_as_deepspeed_configs_write_them():
    """``1e5`` (a float in YAML) is the whole number 100,000; a fraction or a boolean is
    refused with the field named."""
    sw = resolve_software(SoftwareSpec(stack="deepspeed-2021",
                                       overlap={"zero3_persistence_threshold": 1e5}))
    assert sw.zero3_persistence_threshold == 100_000
    for bad, why in ((1.5, "fractional part"), (True, "boolean"), (-1, "greater than or equal")):
        with pytest.raises(ValueError, match=why):
            SoftwareSpec(stack="deepspeed-2021", overlap={"zero3_max_reuse_distance": bad})
