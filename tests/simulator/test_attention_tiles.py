"""A fused attention kernel's tiles on the SMs (ddlsim/simulator/kernels/attention_tiles.py)
and the measured curves scaled by them (attention_measured.py)."""

from __future__ import annotations

import csv
from importlib import resources

import pytest

import ddlsim
from ddlsim.simulator.kernels import attention_kernels, kernel_device, kernel_time
from ddlsim.simulator.kernels.attention_measured import measured_efficiency
from ddlsim.simulator.kernels.attention_tiles import (schedule_utilisation, tile_schedule,
                                                      tile_utilisation, tile_works)

GPU, SMS = "h100-sxm5", 132     # the table's GPU and its SM count


def test_causal_tiles_visit_the_blocks_at_or_below_the_diagonal():
    # FlashAttention-2 at head dim 128: forward 128 x 64 tiles, backward 64 x 128
    fwd, bwd = tile_schedule("flash2", "fwd", 128), tile_schedule("flash2", "bwd", 128)
    assert (fwd.block_q, fwd.block_k, fwd.ctas_per_sm) == (128, 64, 2)
    assert tile_works(fwd, "fwd", 512, 512, True) == (2, 4, 6, 8)      # 2(i+1) key blocks
    assert tile_works(bwd, "bwd", 512, 512, True) == (8, 6, 4, 2)      # 8 - 2j query blocks
    assert tile_works(fwd, "fwd", 512, 512, False) == (8, 8, 8, 8)
    # 256 keys before the square (bottom-right): each query tile sees them too
    assert tile_works(fwd, "fwd", 256, 512, True) == (6, 8)


def test_greedy_and_static_hand_outs_by_hand():
    # greedy: 4 | 3 -> 3+2 | 4+1: both end at 5, no slot idles; static: 4+2 | 3+1
    assert schedule_utilisation([4, 3, 2, 1], 2, "greedy") == pytest.approx(10 / 2 / 5)
    assert schedule_utilisation([4, 3, 2, 1], 2, "static") == pytest.approx(10 / 2 / 6)
    # light first (a grid): 2 | 4, 2+6 | 4+8: the heaviest tile ends alone at 12
    assert schedule_utilisation([2, 4, 6, 8], 2, "greedy") == pytest.approx(20 / 2 / 12)


def test_equal_tiles_pay_for_their_last_wave():
    # non-causal FlashAttention-2, 17 pairs of 16 tiles = 272 on 264 slots: two waves
    assert tile_utilisation("flash2", "fwd", False, 128, 17, 2048, 2048, SMS) == \
        pytest.approx(272 / (264 * 2))


def test_cudnn_at_32_pairs_by_hand():
    # 16 tiles a pair (1..16 blocks), heaviest first, static on 132 CTAs. 32 pairs: CTA 0
    # takes tiles 0, 132, 264, 396 = 16 + 12 + 8 + 4 = 40 blocks of 32 x 136 in all; the
    # curve's own launch at 2,048 tokens (8 x 16 = 128 pairs): CTA 0 takes 16, 15, ..., 1
    ours = tile_utilisation("cudnn", "fwd", True, 128, 32, 2048, 2048, SMS)
    ref = tile_utilisation("cudnn", "fwd", True, 128, 128, 2048, 2048, SMS)
    assert ours == pytest.approx(32 * 136 / SMS / 40)
    assert ref == pytest.approx(128 * 136 / SMS / 136)
    published = measured_efficiency(GPU, "cudnn", "fwd", True, 128, 2048)
    assert measured_efficiency(GPU, "cudnn", "fwd", True, 128, 2048, 32, SMS) == \
        pytest.approx(published * 0.85)


def _table_rows():
    text = resources.files("ddlsim.data").joinpath("attention_measured.csv").read_text()
    return list(csv.DictReader(ln for ln in text.splitlines() if ln and ln[0] != "#"))


@pytest.mark.parametrize("row", _table_rows(), ids=lambda r: "{kernel}-{pass}-{causal}-"
                         "d{head_dim}-s{seqlen}".format(**r))
def test_a_curve_at_its_own_launch_is_unchanged(row):
    causal, d, s = row["causal"] == "true", float(row["head_dim"]), float(row["seqlen"])
    pairs = float(row["batch"]) * float(row["heads"])
    args = (GPU, row["kernel"], row["pass"], causal, d, s)
    assert measured_efficiency(*args, pairs, SMS) == pytest.approx(measured_efficiency(*args),
                                                                   rel=1e-12)


def test_the_derived_causal_backward_keeps_its_curves_launch():
    # no causal backward in the table: at the non-causal curve's launch (8 x 16 pairs)
    # the derived curve is unchanged, at 16 pairs it is slower
    eta = measured_efficiency(GPU, "flash2", "bwd", True, 128, 2048)
    assert measured_efficiency(GPU, "flash2", "bwd", True, 128, 2048, 128, SMS) == \
        pytest.approx(eta)
    assert measured_efficiency(GPU, "flash2", "bwd", True, 128, 2048, 16, SMS) < 0.75 * eta


def _cfg(preset: str) -> dict:
    return {"model": {"num_hidden_layers": 2, "hidden_size": 1024, "num_attention_heads": 8,
                      "vocab_size": 1024, "max_position_embeddings": 8192},
            "train": {"micro_batch_size": 1, "global_batch_size": 1, "seq_length": 2048},
            "system": {"preset": preset, "nodes": 1, "devices_per_node": 1}}


def _seconds_per_flop(preset: str, kind: str, b: int, heads: int) -> float:
    dev = kernel_device(ddlsim.load_config(_cfg(preset)).system)
    k, = attention_kernels(kind, b, heads, 2048, 128, 2, dropout=False, backward=False)
    assert k.batch == b * heads          # the launch's (sequence, head) pairs
    return kernel_time(k, dev) / k.flops


def test_few_heads_run_slower_a_flop_where_the_curves_time_the_kernel():
    # dgx-h100 times cuDNN from the measured curves: 16 heads of one sequence (256 tiles)
    # leave SMs idle that 8 sequences of 16 heads (the curve's launch) keep busy
    few, full = (_seconds_per_flop("dgx-h100", "cudnn", b, 16) for b in (1, 8))
    ratio = (tile_utilisation("cudnn", "fwd", True, 128, 128, 2048, 2048, SMS)
             / tile_utilisation("cudnn", "fwd", True, 128, 16, 2048, 2048, SMS))
    assert few / full == pytest.approx(ratio)
    assert ratio > 1.2


def test_a_device_without_curves_keeps_its_figure():
    # dgx-a100 has a single FlashAttention-2 figure and no curves: no tiles applied
    few, full = (_seconds_per_flop("dgx-a100", "flash2", b, 16) for b in (1, 8))
    assert few == pytest.approx(full)


@pytest.mark.parametrize("call, match", [
    (lambda: tile_schedule("xformers", "fwd", 128), "no tile schedule for kernel 'xformers'"),
    (lambda: tile_schedule("flash2", "fwd", 0), "head dim d = 0"),
    (lambda: schedule_utilisation([1, 2], 0, "greedy"), "slots = 0"),
    (lambda: tile_utilisation("cudnn", "fwd", True, 128, 8, 2048, 2048, 0), "sm_count = 0"),
])
def test_bad_input_is_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()
