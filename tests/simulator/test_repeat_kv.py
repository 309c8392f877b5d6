"""K and V repeated to the query heads before the attention core (``software.kernels.
repeat_kv``; ddlsim/simulator/kernels/repeat_kv.py): torchtitan's ``repeat_kv`` before SDPA
copies K and V to the query width (a kernel each), the flash kernel saves them at that width,
and the backward sums the copies' gradients (a reduction each)."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.api import memory_per_device
from ddlsim.simulator.kernels.repeat_kv import expands_kv, repeat_kv_kernels
from ddlsim.workloads.decoder.layerkernels import layer_kernels

S = 2048
LLAMA_8B = {"model": {"preset": "llama-3.1-8b"},      # 32 query heads, 8 K/V heads, d 128
            "parallel": {"zero_stage": 3, "data_parallel_size": 8},
            "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": S,
                      "dtype": "bf16", "recompute": "none"},
            "system": {"preset": "dgx-h100", "nodes": 1, "software": "torchtitan-2024"}}


def _cfg(software: dict | str = "torchtitan-2024", **train):
    d = {**LLAMA_8B, "train": {**LLAMA_8B["train"], **train},
         "system": {**LLAMA_8B["system"], "software": software}}
    stack = software if isinstance(software, str) else software["stack"]
    # ZeRO-3 is incidental here: rule no_zero3 (no sharding) on the older Megatron stacks,
    # and megatron-core-2025's FSDP2 refuses gradient accumulation fusion
    if stack in ("megatron-core-2024", "megatron-lm-2021", "megatron-core-2025"):
        d["parallel"] = {**d["parallel"], "zero_stage": 0}
    return ddlsim.load_config(d)


def _kernels(cfg, t: int = 1):
    return layer_kernels(cfg.model.shape(), cfg.software, 1, S, t, t > 1, "bf16")


def _memory(k):
    return [x.bytes for x in k if x.kind == "memory"]


def test_eager_torchtitan_copies_k_and_v_before_the_core_and_sums_their_gradients_after():
    lk = _kernels(_cfg())
    one = S * (32 + 8) * 128 * 2          # read the 8 heads, write the 32, bf16
    attn = lk["attn.qkv"]
    flash = [i for i, k in enumerate(attn) if k.kind == "flash"][0]
    assert [k.bytes for k in attn[flash - 2:flash]] == [one, one]
    bwd = lk["bwd.attn.proj"]
    flash_bwd = [i for i, k in enumerate(bwd) if k.kind == "flash"][0]
    assert [k.bytes for k in bwd[flash_bwd + 1:]] == [one, one]
    assert lk["repeat_kv"] == attn[flash - 2:flash]


def test_tensor_parallelism_splits_the_heads_of_the_copies():
    lk = _kernels(_cfg(), t=8)
    assert _memory(lk["repeat_kv"]) == [S * (4 + 1) * 128 * 2] * 2


def test_compiled_blocks_write_v_in_one_kernel_and_k_from_the_rotary_kernel():
    lk = _kernels(_cfg({"stack": "torchtitan-2024", "compile": True}))
    # V: read 8 heads, write 32; K: 32 - 8 more heads written by the rotary kernel
    assert _memory(lk["repeat_kv"]) == [S * ((32 + 8) + (32 - 8)) * 128 * 2]


@pytest.mark.parametrize("stack, attention, expected", [
    ("torchtitan-2024", None, True), ("torchtitan-2025", None, True),
    ("megatron-core-2024", None, False),              # TE takes num_gqa_groups
    ("megatron-core-2024", "fused_softmax", True),    # local DotProductAttention repeats
    ("megatron-core-2025", "unfused", True),
])
def test_which_stacks_repeat(stack, attention, expected):
    sw = {"stack": stack} if attention is None else {"stack": stack,
                                                     "kernels": {"attention": attention}}
    cfg = _cfg(sw)
    assert expands_kv(cfg.software, cfg.model.shape()) is expected
    assert bool(_kernels(cfg)["repeat_kv"]) is expected


def test_without_grouped_query_attention_nothing_is_repeated():
    d = {**LLAMA_8B, "model": {"preset": "llama-2-7b"}}     # 32 heads, 32 K/V heads
    cfg = ddlsim.load_config(d)
    assert not expands_kv(cfg.software, cfg.model.shape())
    assert _kernels(cfg)["repeat_kv"] == ()


def test_the_kernels_alone():
    assert [k.bytes for k in repeat_kv_kernels(10, 4, 1, 2, 2, "bf16", False)] == [200, 200]
    assert [k.bytes for k in repeat_kv_kernels(10, 4, 1, 2, 2, "bf16", True)] == [320]


def test_the_saved_k_and_v_take_the_query_width():
    # activations kept per layer, no recomputation: K and V at 32 heads, not 8
    sh = _cfg().model.shape()
    base = sh.layer_activation_bytes(1, S, 1, False, "none", flash=True)
    rep = sh.layer_activation_bytes(1, S, 1, False, "none", flash=True, repeat_kv=True)
    assert rep - base == 2 * 2 * S * (4096 - 1024)      # K and V, bf16, (a - g)·d more each
    # Megatron's selective recomputation checkpoints the core: its inputs stay unrepeated
    assert sh.layer_activation_bytes(1, S, 1, False, "selective", flash=True, repeat_kv=True) \
        == sh.layer_activation_bytes(1, S, 1, False, "selective", flash=True)


def _never(**train):
    return _cfg({"stack": "torchtitan-2024", "kernels": {"repeat_kv": "never"}}, **train)


def test_memory_and_time_of_a_torchtitan_run_grow_with_the_repeat():
    on, off = _cfg(), _never()
    layers = on.model.shape().layers
    grown = memory_per_device(on).activations - memory_per_device(off).activations
    assert grown == pytest.approx(layers * 2 * 2 * S * (4096 - 1024))
    assert ddlsim.predict(on).iteration_time_s > ddlsim.predict(off).iteration_time_s


def test_context_parallel_ring_runs_the_repeat_on_the_ranks_tokens():
    d = {"parallel": {"zero_stage": 3, "data_parallel_size": 4, "context_parallel_size": 2}}
    on = _cfg(recompute="full")
    on = ddlsim.load_config({**on.model_dump(mode="json", exclude_unset=True),
                             "parallel": d["parallel"]})
    off = ddlsim.load_config({**on.model_dump(mode="json", exclude_unset=True),
                              "system": {**LLAMA_8B["system"], "software": {
                                  "stack": "torchtitan-2024",
                                  "kernels": {"repeat_kv": "never"}}}})
    assert ddlsim.predict(on).iteration_time_s > ddlsim.predict(off).iteration_time_s


def test_a_value_outside_the_choices_is_refused():
    with pytest.raises(ddlsim.ConfigError, match="repeat_kv"):
        _cfg({"stack": "torchtitan-2024", "kernels": {"repeat_kv": "sometimes"}})
