"""benchmarks/stream_start_rule.py: a second stream's kernel against a persistent GEMM on the
H200 (run10), beside the last-round rule."""

from __future__ import annotations

import pytest
from benchscripts import load_script

rule = load_script("stream_start_rule")


def test_tiles_come_from_the_kernel_name():
    assert rule.tiles("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 8192, 3584) == 32 * 28
    assert rule.tiles("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT", 8192, 8192) == 26 * 64
    with pytest.raises(ValueError, match="no tile"):
        rule.tiles("ampere_sgemm_128x64_nn", 128, 128)


def test_the_rule_waits_for_the_last_round_only():
    rep = {"gemm_grid": [2, 66, 1], "gemm_kernel": "nvjet_sm90_tst_256x128_64x4_x",
           "gemm_start": 0.0, "gemm_dur_us": 680.0, "ready": 100.0}
    # 896 tiles on 132 CTAs: 6.79 rounds, the last beginning 6/6.79 of the way: 601 µs
    assert rule.rule_delay_us(rep, 8192, 3584) == pytest.approx(6 / (896 / 132) * 680 - 100)
    assert rule.rule_delay_us({**rep, "ready": 650.0}, 8192, 3584) == 0.0


def test_the_measured_delays_follow_the_rule_not_the_gemms_end():
    rows = rule.rows()
    assert len(rows) == 12
    for r in rows:
        if r["gemm_us"] > 500:        # the long GEMMs: the side kernel waited
            assert r["rule_us"] == pytest.approx(r["measured_us"], rel=0.10), r
            assert r["to_end_us"] > 1.15 * r["measured_us"], r
        else:                          # the expert GEMM was in its last round: at once
            assert r["measured_us"] < 20 and r["rule_us"] < 45 < r["to_end_us"], r
