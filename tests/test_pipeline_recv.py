"""The receive buffers torch.distributed.pipelining allocates per micro-batch and keeps
(``pipeline_recv.pipeline_recv_bytes``): an input buffer on every stage but the first and an
output-gradient buffer on every stage but the last, one per micro-batch, less the in-flight
inputs the layers already count. Megatron's stacks count none. Bytes by hand."""

from __future__ import annotations

import dataclasses

import pytest

import ddlsim
from searchmemory import assert_search_memory_is_exact, pp4_config
from ddlsim.workloads.framework_memory import FRAMEWORKS
from ddlsim.workloads.pipeline_recv import pipeline_recv_bytes

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

S, H = 2048, 4096                     # llama-3.1-8b
OUT = 2 * S * H / 2                   # micro-batch 1, TP 2 with SP, CP 1, 16-bit


def _recv(fm, pp, vpp, chunks, m, first, last, sp=True, cp=1):
    return pipeline_recv_bytes(fm, 1, S, H, 2, sp, cp, pp, vpp, chunks, m, first, last, 2)


def test_one_buffer_per_micro_batch_and_direction_less_the_inputs_in_flight():
    fm = FRAMEWORKS["torchtitan"]
    # 1F1B, PP 4, 8 micro-batches. Stage 0: no input buffers, 8 output-gradient buffers
    assert _recv(fm, 4, 1, 4, 8, True, False) == 8 * OUT
    # a middle stage with 3 forwards in flight: 8 + 8 buffers, 3 of them the layers' inputs
    assert _recv(fm, 4, 1, 3, 8, False, False) == 13 * OUT
    # the last stage: 8 input buffers, one in flight; no gradient comes from a next stage
    assert _recv(fm, 4, 1, 1, 8, False, True) == 7 * OUT
    # interleaved, two chunks on the first rank (stages 0 and 4), 6 forwards in flight:
    # stage 4's 8 input buffers (3 in flight) and both chunks' 8 gradient buffers
    assert _recv(fm, 4, 2, 6, 8, True, False) == (8 - 3 + 16) * OUT
    # without SP the buffer is the whole sequence; CP splits it; no pipeline, no buffers
    assert _recv(fm, 4, 1, 4, 8, True, False, sp=False) == 16 * OUT
    assert _recv(fm, 4, 1, 4, 8, True, False, cp=2) == 4 * OUT
    assert _recv(fm, 1, 1, 1, 8, True, True) == 0.0


def test_both_torchtitan_stacks_count_them_and_megatron_none():
    assert FRAMEWORKS["torchtitan-2025"].pipeline_recv_buffers
    assert "_prepare_forward_infra" in FRAMEWORKS["torchtitan"].sources[
        "pipeline_recv_buffers"]
    assert _recv(FRAMEWORKS["megatron"], 4, 1, 4, 8, True, False) == 0.0


def _cfg(stack: str) -> dict:
    """The shared plan at this file's sequence length."""
    return pp4_config(stack, S)


def test_each_stage_counts_them_as_communication_buffers(monkeypatch):
    run = ddlsim.load_config(_cfg("torchtitan-2024"))
    kept = {m.stage: (m.buffers, m.activations) for m in run.family.memory(run)}
    monkeypatch.setitem(FRAMEWORKS, "torchtitan", dataclasses.replace(
        FRAMEWORKS["torchtitan"], pipeline_recv_buffers=False))
    without = {m.stage: (m.buffers, m.activations) for m in run.family.memory(run)}
    # 1F1B on PP 4: stage 0 holds 4 forwards, stage 3 one; activations unchanged
    assert kept[0][0] - without[0][0] == pytest.approx(8 * OUT, rel=1e-12)
    assert kept[1][0] - without[1][0] == pytest.approx(13 * OUT, rel=1e-12)
    assert kept[3][0] - without[3][0] == pytest.approx(7 * OUT, rel=1e-12)
    assert all(kept[s][1] == without[s][1] for s in kept)


def test_the_search_tiers_memory_counts_them_as_the_exact_one(monkeypatch):
    """The vectorised tier calls the same rule, checked on Megatron-Core plans with the rule
    switched on (a what-if: torchtitan's plans are searched by the exact engine)."""
    assert_search_memory_is_exact(monkeypatch, _cfg("megatron-core-2024"), pipeline_recv_buffers=True)


@pytest.mark.parametrize("dtype, elem", [("fp32", 4), ("bf16", 2)])
def test_a_buffer_holds_the_runs_compute_dtype(monkeypatch, dtype, elem):
    """The stage's output crosses in the run's compute dtype: 4 B an element in an fp32 run."""
    from ddlsim.workloads.decoder import memory as decoder_memory
    seen = []

    def spy(*args):
        seen.append(args[-1])
        return pipeline_recv_bytes(*args)
    monkeypatch.setattr(decoder_memory, "pipeline_recv_bytes", spy)
    cfg = _cfg("torchtitan-2024")
    cfg["train"]["dtype"] = dtype
    ddlsim.memory_per_device(ddlsim.load_config(cfg))
    assert seen and set(seen) == {elem}


def test_the_search_tier_counts_an_fp32_runs_buffers_as_the_exact_one(monkeypatch):
    cfg = _cfg("megatron-core-2024")
    cfg["train"]["dtype"] = "fp32"
    assert_search_memory_is_exact(monkeypatch, cfg, pipeline_recv_buffers=True)
