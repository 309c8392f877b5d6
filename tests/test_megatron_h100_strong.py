"""The README's strong-scaling ends beside the Megatron-Core r0.8.0 weak table
(benchmarks/validate_megatron_h100.py ``--strong``).

NVIDIA/Megatron-LM README (f2e5db40 line 74): "the standard GPT-3 model ... from 96 H100 GPUs
to 4608 GPUs, using the same batch size of 1152 sequences throughout ... a reduction in MFU
from 47% to 42%". The checks are derived by hand from that sentence and the weak table's 177B
row (h 12,288, 96 layers, 96 heads, TP 8, PP 6; V 131,072, s 4,096).
"""

from __future__ import annotations

import pytest

from benchscripts import load_script

vm = load_script("validate_megatron_h100")

#: Megatron's FLOP count of one 177B iteration at a batch of 1,152:
#: 12·1152·4096·96·12288²·((2 + 4096/12288) + 4 + 131072/(2·96·12288))
FLOPS = 12 * 1152 * 4096 * 96 * 12288**2 * ((2 + 4096 / 12288) + 4 + 131072 / (2 * 96 * 12288))


def test_strong_ends_are_the_177b_plan_at_96_and_4608_gpus():
    ends = vm.strong_rows()
    assert [(r["gpus"], r["dp"], r["tp"], r["pp"], r["gbs"]) for r in ends] == [
        ("96", "2", "8", "6", "1152"), ("4608", "96", "8", "6", "1152")]
    assert {(r["hidden"], r["layers"], r["heads"]) for r in ends} == {("12288", "96", "96")}


def test_published_times_follow_the_mfu():
    """FLOPS / (MFU · 989 TFLOP/s · GPUs): 5.2439e18 / (0.47 · 989e12 · 96) = 117.51 s and
    / (0.42 · 989e12 · 4608) = 2.7396 s."""
    lo, hi = vm.strong_rows()
    assert vm.megatron_flops(lo) == pytest.approx(FLOPS)
    assert vm.published_time(lo) == pytest.approx(117.513, abs=1e-3)
    assert vm.published_time(hi) == pytest.approx(2.7396, abs=1e-4)


def test_strong_table_prints_both_ends_and_the_mfu_kept(capsys):
    vm.print_strong("analytical", markdown=False)
    text = capsys.readouterr().out
    assert "   96   2" in text and " 4608  96" in text
    assert "MFU kept from 96 to 4608 GPUs: published 0.894 (0.874-0.914 by rounding)" in text
