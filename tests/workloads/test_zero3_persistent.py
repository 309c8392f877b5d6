"""deepspeed-2021: the gather of the persistent parameters after every optimizer step
(DeepSpeed v0.3.13 stage3.py ``_post_step`` → partition_parameters.py ``_allgather_params``),
its counted host operations derived by hand, and where the trace puts it."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.config import build_config
from ddlsim.software import resolve_software
from ddlsim.workloads.decoder.zero3_fetch import (list_host_seconds, persistent_gather_seconds,
                                                  persistent_tensors)
from ddlsim.workloads.models.decoder import DecoderShape

H = 12288
GPT3 = DecoderShape(layers=96, hidden=H, heads=96, ffn=4 * H, vocab=51200, max_positions=2048)


def test_gpt3_keeps_its_norms_and_biases_persistent():
    """Per layer two LayerNorms (weight, bias), the QKV bias (3h), the output bias (h) and
    the two MLP biases (4h, h): 8 tensors under 1e5 elements; the last stage adds the final
    LayerNorm's two. With TP 8 the column-parallel biases are split, the others replicated."""
    sw = resolve_software("deepspeed-2021")
    assert persistent_tensors(GPT3, 1, sw, 96, True) == {H: 6 * 96 + 2, 3 * H: 96, 4 * H: 96}
    assert persistent_tensors(GPT3, 1, sw, 2, False) == {H: 12, 3 * H: 2, 4 * H: 2}
    assert persistent_tensors(GPT3, 8, sw, 1, False) == {H: 6, 3 * H / 8: 1, 4 * H / 8: 1}


def test_host_seconds_count_the_code_s_loops():
    """One 12,288-element tensor on 8 ranks: 8 slices of 1,536, each narrow + view + narrow
    and a copy_ (24 Python ops, 8 copies); the torch.empty it is copied into and its own
    slice's narrow + copy_; per rank the flat buffer's narrow and PyTorch's copy-out (8 + 8):
    34 Python ops at 2 us, 17 copies at 10 us, and the call's 234 us. A 5-element tensor on 8
    ranks has slices of 1: 5 hold elements."""
    sw = resolve_software("deepspeed-2021")
    assert persistent_gather_seconds(sw, {H: 1}, 8) == pytest.approx(
        34 * 2e-6 + 17 * 1e-5 + 234e-6)
    assert persistent_gather_seconds(sw, {5: 1}, 8) == pytest.approx(
        (5 * 3 + 2 + 8) * 2e-6 + (5 + 1 + 8) * 1e-5 + 234e-6)
    # GPT-3 175B on 1,536 ranks: 770 tensors, each split into 1,536 slices (12288 / 1536 = 8)
    many = persistent_gather_seconds(sw, persistent_tensors(GPT3, 1, sw, 96, True), 1536)
    assert many == pytest.approx((770 * 1536 * 3 + 2 * 770 + 1536) * 2e-6
                                 + (770 * 1536 + 770 + 1536) * 1e-5 + 234e-6)
    assert persistent_gather_seconds(resolve_software("deepspeed"), {H: 1}, 8) == 0.0


def _config(software: str, accumulation: int) -> dict:
    return {"model": "gpt3-1.3b", "parallel": {"zero_stage": 3},
            "train": {"micro_batch_size": 1, "global_batch_size": 32 * accumulation,
                      "seq_length": 2048, "recompute": "full",
                      "dtype": "fp16"},   # DeepSpeed v0.3.13 runs ZeRO in fp16 only
            "system": {"preset": "dgx-a100", "nodes": 4, "software": software}}


@pytest.mark.parametrize("accumulation", [1, 2])
def test_the_update_block_pays_it_once_per_iteration_after_the_step(accumulation):
    """One op per iteration (not per micro-batch), on the host after the optimizer step, and
    the compute stream waits for it; with two micro-batches the second forward's fetches of
    the persistent tensors too; today's DeepSpeed (coalesced gathers) has none."""
    cfg = build_config(_config("deepspeed-2021", accumulation), [])
    program = ddlsim.build_workload(cfg).classes[0].program
    update = program.blocks["update"].flat.ops
    names = [o.payload.name for o in update]
    at = names.index("zero3.persistent_gather")
    assert names[at - 1] == "optimizer" and update[at].stream == "host"
    assert update[at].deps == (at - 1,)
    assert update[-1].payload.name == "zero3.persistent_gather" and update[-1].stream == "compute"
    expected = persistent_gather_seconds(
        cfg.software, persistent_tensors(cfg.model.shape(), 1, cfg.software, 24, True), 32)
    assert update[at].payload.seconds == pytest.approx(expected)
    # the later micro-batches' forwards fetch each persistent tensor on its own (194 here:
    # 8 per layer and the final norm's 2), one list-form gather each, charged after it
    fetch = [o for o in update if o.payload.name == "zero3.persistent_fetch"]
    gathers = [o for o in update if o.payload.name == "persistent.all_gather"]
    if accumulation == 1:
        assert not fetch and not gathers
    else:
        assert fetch[0].payload.seconds == pytest.approx(
            (accumulation - 1) * list_host_seconds(cfg.software, 32, 194, gather=True))
        assert sum(o.repeat for o in gathers) == (accumulation - 1) * 194
        assert all(o.stream == "dp" and o.payload.group == "dp" for o in gathers)
        assert update[-2].payload.name == "zero3.persistent_fetch"
        assert update[-2].stream == "compute"
    for block in program.blocks.values():
        if block.name != "update":
            assert "zero3.persistent_gather" not in [o.payload.name for o in block.flat.ops]
    today = build_config(_config("deepspeed", accumulation), [])
    ops = ddlsim.build_workload(today).classes[0].program.blocks["update"].flat.ops
    assert "zero3.persistent_gather" not in [o.payload.name for o in ops]

