"""What torch.distributed.pipelining's schedule holds beside the layers' activations
(``allocator.pipeline_held_bytes``): each stage's output per micro-batch in flight
(``fwd_cache``) and, on the last stage, every micro-batch's logits until ``step()`` returns
(``output_chunks``; torch before pytorch#165822), the current one's beside its loss's backward
(which the eager loss rules count without them), not where a compiled loss counts them. Megatron frees its outputs after the send
(``deallocate_output_tensor``). Bytes by hand."""

from __future__ import annotations

import dataclasses

import pytest

import ddlsim
from searchmemory import assert_search_memory_is_exact, pp4_config
from ddlsim.workloads.allocator import pipeline_held_bytes
from ddlsim.workloads.framework_memory import FRAMEWORKS

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

S, H, V = 2048, 4096, 128256          # llama-3.1-8b
OUT, LOGITS = 2 * S * H / 2, 2 * S * V / 2     # micro-batch 1, TP 2 with SP, CP 1, 16-bit


def _cfg(stack: str) -> dict:
    """The shared plan at this file's sequence length."""
    return pp4_config(stack, S)


def test_stage_outputs_in_flight_and_the_last_stages_earlier_logits():
    fm = FRAMEWORKS["torchtitan-2025"]
    # stage 0 of 1F1B on PP 4: 4 forwards in flight, each holding its output
    assert pipeline_held_bytes(fm, 1, S, H, V, 2, True, 1, 4, 1, 4, 8, False) == 4 * OUT
    # the last stage: all 8 micro-batches' logits, the current one's beside its eager loss's
    # backward; 7 where the compiled loss's rule counts the current one's
    assert pipeline_held_bytes(fm, 1, S, H, V, 2, True, 1, 4, 1, 1, 8, True) == 8 * LOGITS
    assert pipeline_held_bytes(fm, 1, S, H, V, 2, True, 1, 4, 1, 1, 8, True,
                               compiled=True) == 7 * LOGITS
    # interleaved, two chunks per rank: half the last rank's 6 forwards are another stage's
    assert pipeline_held_bytes(fm, 1, S, H, V, 2, True, 1, 4, 2, 6, 8, True) == \
        3 * OUT + 8 * LOGITS
    # no pipelining; without SP the output is whole; CP splits both
    assert pipeline_held_bytes(fm, 1, S, H, V, 2, True, 1, 1, 1, 1, 8, True) == 0.0
    assert pipeline_held_bytes(fm, 1, S, H, V, 2, False, 1, 4, 1, 4, 8, False) == 8 * OUT
    assert pipeline_held_bytes(fm, 1, S, H, V, 2, True, 2, 4, 1, 1, 8, True) == 4 * LOGITS


def test_torch_before_153383_keeps_every_stages_outputs_to_the_steps_end():
    fm = FRAMEWORKS["torchtitan"]
    # stage 0 of 1F1B on PP 4 with 8 micro-batches: all 8 outputs, not the 4 in flight
    assert pipeline_held_bytes(fm, 1, S, H, V, 2, True, 1, 4, 1, 4, 8, False) == 8 * OUT
    # the last stage holds no stage output of its own, only the logits (no compiled-loss
    # rule in torchtitan 2024: the current one's counted even when compiled)
    assert pipeline_held_bytes(fm, 1, S, H, V, 2, True, 1, 4, 1, 1, 8, True) == 8 * LOGITS
    assert pipeline_held_bytes(fm, 1, S, H, V, 2, True, 1, 4, 1, 1, 8, True,
                               compiled=True) == 8 * LOGITS
    # interleaved, two chunks per rank: the last rank's other chunk, 8 micro-batches
    assert pipeline_held_bytes(fm, 1, S, H, V, 2, True, 1, 4, 2, 6, 8, True) == \
        8 * OUT + 8 * LOGITS
    # the same with m = pp: as many as in flight on stage 0 of 1F1B
    assert pipeline_held_bytes(fm, 1, S, H, V, 2, True, 1, 4, 1, 4, 4, False) == 4 * OUT


def test_megatron_frees_its_pipeline_outputs():
    assert pipeline_held_bytes(FRAMEWORKS["megatron"], 1, S, H, V, 2, True, 1, 4, 1, 4, 8,
                               False) == 0.0


def test_each_stage_of_a_torchtitan_plan_counts_them(monkeypatch):
    run = ddlsim.load_config(_cfg("torchtitan-2024"))
    held = {m.stage: m.activations for m in run.family.memory(run)}
    monkeypatch.setitem(FRAMEWORKS, "torchtitan", dataclasses.replace(
        FRAMEWORKS["torchtitan"], pipeline_holds_outputs=False))
    without = {m.stage: m.activations for m in run.family.memory(run)}
    # 1F1B: torch before pytorch#153383 keeps all 8 outputs of stage 0, not the 4 in flight
    assert held[0] - without[0] == pytest.approx(8 * OUT, rel=1e-12)
    assert held[3] - without[3] == pytest.approx(8 * LOGITS, rel=1e-12)


def test_the_search_tiers_memory_counts_them_as_the_exact_one(monkeypatch):
    """torchtitan's plans are searched by the exact engine; the vectorised tier calls the same
    rule, checked on Megatron-Core plans with the rule switched on (a what-if)."""
    assert_search_memory_is_exact(monkeypatch, _cfg("megatron-core-2024"), pipeline_holds_outputs=True)
