"""Separate projections (``software.kernels.separate_projections``): torchtitan's wq/wk/wv and
w1/w3 run one GEMM each, and autograd sums their input gradients
(ddlsim/simulator/kernels/autograd.py; docs/compute.md, "Separate projections")."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.simulator.kernels.autograd import input_grad_sum_kernels
from ddlsim.workloads.decoder.layerkernels import layer_kernels

LLAMA_8B = {"model": {"preset": "llama-3.1-8b"},
            "parallel": {"zero_stage": 3, "data_parallel_size": 8},
            "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 2048,
                      "dtype": "bf16"},
            "system": {"preset": "dgx-h100", "nodes": 1, "software": "torchtitan-2024"}}


def _kernels(stack: str, compile_: bool = False, t: int = 1):
    d = {**LLAMA_8B, "system": {**LLAMA_8B["system"],
                                "software": {"stack": stack, "compile": compile_}}}
    if stack in ("megatron-core-2024", "megatron-lm-2021"):   # rule no_zero3: no sharding
        d["parallel"] = {**d["parallel"], "zero_stage": 0}
    cfg = ddlsim.load_config(d)
    return layer_kernels(cfg.model.shape(), cfg.software, 1, 2048, t, t > 1, "bf16")


@pytest.mark.parametrize("consumers, compiled, expected", [
    (1, False, []),                         # one module: nothing to sum
    (3, False, [3 * 10 * 2, 3 * 10 * 2]),   # two adds, each reads two and writes one
    (2, False, [3 * 10 * 2]),
    (3, True, [4 * 10 * 2]),                # one fused kernel: reads three, writes one
    (2, True, [3 * 10 * 2]),
])
def test_input_gradient_sum_bytes(consumers, compiled, expected):
    ks = input_grad_sum_kernels(consumers, 10, 2, "bf16", compiled)
    assert [k.bytes for k in ks] == expected
    assert all(k.kind == "memory" for k in ks)


def test_torchtitan_runs_one_gemm_per_projection_and_sums_their_gradients():
    lk = _kernels("torchtitan-2024")
    M, h = 2048, 4096
    assert [k.shape for k in lk["attn.qkv"] if k.kind == "gemm"] == \
        [(M, 4096, h), (M, 1024, h), (M, 1024, h)]
    assert [k.shape for k in lk["mlp.fc1"]] == [(M, 14336, h)] * 2
    # backward: two GEMMs per projection, then the eager adds over [M, h] bf16
    sums = [k.bytes for k in lk["bwd.attn.qkv"] if k.kind == "memory"]
    assert sums == [3 * M * h * 2] * 2
    assert [k.bytes for k in lk["bwd.mlp.fc1"] if k.kind == "memory"] == [3 * M * h * 2]
    assert sum(k.kind == "gemm" for k in lk["bwd.attn.qkv"]) == 6


def test_compiled_blocks_sum_in_one_kernel():
    lk = _kernels("torchtitan-2024", compile_=True)
    M, h = 2048, 4096
    assert [k.bytes for k in lk["bwd.attn.qkv"] if k.kind == "memory"] == [4 * M * h * 2]
    assert [k.bytes for k in lk["bwd.mlp.fc1"] if k.kind == "memory"] == [3 * M * h * 2]


def test_under_sequence_parallelism_the_gathered_input_is_summed():
    # TP 8 with SP: the projections read the all-gathered [b·s, h]; each GEMM has N/8
    lk = _kernels("torchtitan-2024", t=8)
    M, h = 2048, 4096
    assert [k.shape for k in lk["attn.qkv"] if k.kind == "gemm"] == \
        [(M, 512, h), (M, 128, h), (M, 128, h)]
    # the sums between DTensor's layout copies of the re-gathered input and of the
    # reduce-scatter's input (kernels/dtensor.py: 2 · M·h · 2 bytes each, eager)
    copy = 2 * M * h * 2
    assert [k.bytes for k in lk["bwd.attn.qkv"] if k.kind == "memory"] == \
        [copy] + [3 * M * h * 2] * 2 + [copy]


def test_megatron_keeps_fused_qkv_and_fc1_without_sums():
    lk = _kernels("megatron-core-2024")
    assert [k.shape for k in lk["attn.qkv"] if k.kind == "gemm"] == [(2048, 6144, 4096)]
    assert [k.shape for k in lk["mlp.fc1"]] == [(2048, 28672, 4096)]
    assert not [k for k in lk["bwd.attn.qkv"] + lk["bwd.mlp.fc1"] if k.kind == "memory"]


def test_separate_projections_take_longer_than_one_fused_gemm():
    # the same layer, the stack's flag overridden: more launches and input re-reads
    def step(flag: bool) -> float:
        d = {**LLAMA_8B, "system": {**LLAMA_8B["system"], "software": {
            "stack": "torchtitan-2024", "kernels": {"separate_projections": flag}}}}
        return ddlsim.predict(ddlsim.load_config(d)).iteration_time_s
    assert step(True) > step(False)


def test_a_non_boolean_flag_is_refused():
    d = {**LLAMA_8B, "system": {**LLAMA_8B["system"], "software": {
        "stack": "torchtitan-2024", "kernels": {"separate_projections": "yes"}}}}
    with pytest.raises(ddlsim.ConfigError, match="separate_projections"):
        ddlsim.load_config(d)
