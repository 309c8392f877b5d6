"""The search tier follows the overlap options (docs/overlap.md): on small grids with
``tp_comm_overlap`` bulk/pipelined and ZeRO-1's overlapped parameter gather, its iteration
times equal the exact engine's. Without a pipeline the closed forms are exact (the layer is
``exposed chunks + max(GEMM + SM margin, overlapped rest)`` per GEMM, the update adds the
first bucket and the delay of the rest past the first forward), so the bound is rounding;
with two stages the pipeline form's own approximations apply (≤ 1 %, the agreement target)."""

from __future__ import annotations

import numpy as np
import pytest

import ddlsim
from ddlsim.config import build_config
from ddlsim.search.evaluate import evaluate_grid
from ddlsim.search.run import plan_overrides
from ddlsim.search.spec import Constraints

BASE = {"model": "gpt3-13b",
        "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 2048},
        "system": {"preset": "dgx-h100", "nodes": 2}}
AXES = {"parallel.tensor_model_parallel_size": [4, 8],
        "parallel.pipeline_model_parallel_size": [1, 2],
        "parallel.sequence_parallel": [True],
        "parallel.zero_stage": [0, 1, 3],
        "train.recompute": ["selective", "full"]}


@pytest.mark.parametrize("mode", ["off", "bulk", "pipelined"])
def test_search_tier_times_the_overlaps_as_the_exact_engine(mode):
    """With and without SP: without it the stack's userbuffers do not apply and the async
    backward all-reduce does (``off``: the async overlap alone, with SP and without)."""
    software = {"stack": "megatron-core-2024", "what_if": True,   # its ZeRO-3: a what-if
                "overlap": {"tp_comm_overlap": mode}}
    data = {**BASE, "system": {**BASE["system"], "software": software}}
    axes = {**AXES, "parallel.sequence_parallel": [True, False]}
    frame = evaluate_grid(data, None, [], axes, Constraints()).frame
    columns = [c for c in frame.columns if "." in c]
    assert len(frame) > 32 and (~frame["parallel.sequence_parallel"]).sum() > 16
    for i in range(len(frame)):
        cfg = build_config(data, plan_overrides(frame.iloc[i], columns))
        exact = ddlsim.predict(cfg, check_fit=False).iteration_time_s
        rel = 1e-9 if cfg.parallel.pp == 1 else 0.01
        assert frame["iteration_time_s"].iloc[i] == pytest.approx(exact, rel=rel), \
            (mode, cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.zero_stage, cfg.train.recompute)
    assert np.isfinite(frame["iteration_time_s"]).all()


def test_search_tier_memory_counts_the_gathered_layers():
    """ZeRO-3 with zero3_prefetch_layers = 3 holds 4 gathered layers: the search tier's
    memory equals ddlsim.memory_per_device's."""
    data = {**BASE, "parallel": {"zero_stage": 3, "tensor_model_parallel_size": 2},
            "system": {**BASE["system"], "software": {"stack": "megatron-core-2024",
                                                      "what_if": True,
                                                      "overlap": {"zero3_prefetch_layers": 3}}}}
    cfg = build_config(data, [])
    assert _search_memory(cfg) == pytest.approx(ddlsim.memory_per_device(cfg).total, rel=1e-12)


def _search_memory(cfg) -> float:
    """The search tier's memory per device of the one plan ``cfg``."""
    from ddlsim.search.family import vector_family
    from ddlsim.search.plans import enumerate_plans, VECTOR_FIELDS

    fields = {p: getattr(getattr(cfg, p.split(".")[0]), p.split(".")[1]) for p in VECTOR_FIELDS}
    fields["parallel.schedule"] = cfg.parallel.schedule
    plans = enumerate_plans({}, fields, cfg.system.num_devices)
    family = vector_family("gpt")
    return family.memory(family.prepare(cfg), plans)[0][0]


@pytest.mark.parametrize("stack, prefetch", [("deepspeed-2021", 0), ("deepspeed-2021", 1),
                                             ("deepspeed", 1), ("deepspeed", 2)])
def test_search_tier_times_module_hook_zero3_as_the_exact_engine(stack, prefetch):
    """ZeRO-3 from module hooks (deepspeed-2021: one gather per tensor, with the memory
    passes; deepspeed: one per module), with the recomputation's re-gathers, on the search
    tier equals the exact engine, gathered on demand and one layer ahead."""
    software = {"stack": stack, "overlap": {"zero3_prefetch_modules": prefetch}}
    # fp16: DeepSpeed v0.3.13 runs ZeRO in fp16 only (deepspeed-2021 rule zero_needs_fp16);
    # its selective plans are rejected (no_selective_recompute), the others compared
    data = {**BASE, "train": {**BASE["train"], "dtype": "fp16"},
            "system": {**BASE["system"], "software": software}}
    axes = {"parallel.tensor_model_parallel_size": [1, 4],
            "parallel.zero_stage": [3],
            "train.micro_batch_size": [1, 2],
            "train.recompute": ["none", "selective", "full"]}
    frame = evaluate_grid(data, None, [], axes, Constraints()).frame
    columns = [c for c in frame.columns if "." in c]
    assert len(frame) >= 6
    for i in range(len(frame)):
        cfg = build_config(data, plan_overrides(frame.iloc[i], columns))
        assert cfg.software.zero3_gather in ("per_tensor", "per_module")
        exact = ddlsim.predict(cfg, check_fit=False).iteration_time_s
        assert frame["iteration_time_s"].iloc[i] == pytest.approx(exact, rel=1e-9), \
            (cfg.parallel.tp, cfg.train.micro_batch_size, cfg.train.recompute)


def test_search_tier_memory_counts_the_list_gather_buffer():
    """ZeRO-3 from module hooks holds the module computing and the one gathered ahead (at
    most the output layer and the last MLP GEMM), and per tensor (deepspeed-2021) a second flat copy of the
    largest tensor: the search tier's memory equals ddlsim.memory_per_device's."""
    data = {**BASE, "parallel": {"zero_stage": 3, "tensor_model_parallel_size": 2},
            "train": {**BASE["train"], "dtype": "fp16"},   # deepspeed-2021: ZeRO in fp16 only
            "system": {**BASE["system"], "software": "deepspeed-2021"}}
    cfg = build_config(data, [])
    total = ddlsim.memory_per_device(cfg).total
    assert _search_memory(cfg) == pytest.approx(total, rel=1e-12)
    h = cfg.model.hidden_size
    plain = ddlsim.memory_per_device(build_config(
        {**data, "system": {**BASE["system"], "software": "deepspeed"}}, [])).total
    # the same stacks but for PyTorch 1.8's second buffer of the 4h x h MLP weight (TP 2)
    assert total - plain == pytest.approx(4 * h * h / 2 * 2, rel=1e-12)
    held = ddlsim.memory_per_device(cfg).buffers   # the gathered parameters, alone here
    # at the backward's start: the output layer (the tied V x h / 2, kept from its forward:
    # decoder/zero3_edges.py) and fc2 gathered ahead of it, and the copy
    vh = cfg.model.shape().vocab * h / 2
    assert held == pytest.approx((vh + 4 * h * h / 2) * 2 + 4 * h * h / 2 * 2, rel=1e-12)


def test_search_rejects_zero3_plans_that_set_overlap_grad_reduce():
    """A grid sweeping parallel.overlap_grad_reduce and ZeRO stages: its ZeRO-3 plans with the
    option on are rejected with the reason the exact engine gives, the others evaluated."""
    axes = {"parallel.zero_stage": [0, 3], "parallel.overlap_grad_reduce": [True, False],
            "parallel.tensor_model_parallel_size": [8]}
    # ZeRO-3 under DeepSpeed (the default stack, megatron-core-2024, shards no parameters)
    data = {**BASE, "system": {**BASE["system"], "software": "deepspeed"}}
    grid = evaluate_grid(data, None, [], axes, Constraints())
    reason = [r for r in grid.rejected if "overlap_grad_reduce" in r]
    assert reason and "ZeRO-3" in reason[0]
    frame = grid.frame
    zero3_on = frame[(frame["parallel.zero_stage"] == 3)
                     & (frame["parallel.overlap_grad_reduce"] == True)]  # noqa: E712
    assert zero3_on.empty and not frame[frame["parallel.zero_stage"] == 3].empty
