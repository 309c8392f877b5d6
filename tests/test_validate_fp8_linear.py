"""benchmarks/validate_fp8_linear.py: the FP8 rowwise recipe's kernels against torchao's
published per-linear speedup table (LayerNorm -> Linear -> Sigmoid, H100)."""

from __future__ import annotations

import pytest
from benchscripts import BENCH, load_script

vf = load_script("validate_fp8_linear")
OUT = vf.evaluate()


def test_data_carries_its_provenance_and_every_cell():
    text = (BENCH / "data" / "torchao_fp8_rowwise_linear.csv").read_text()
    for must in ("pytorch/ao", "fp8-rowwise-perf.png", "fdddb2cfa", "float8_roofline.py",
                 "2.8.0a0"):
        assert must in text, must
    rows = vf.read_csv(vf.TABLE)
    sizes = [2 ** i for i in range(10, 16)]
    assert {(int(r["M"]), int(r["K"]), int(r["N"])) for r in rows} == {
        (m, k, n) for m in sizes for k in sizes for n in sizes}


def test_a_cell_by_hand():
    # the table's M=16384, K=8192, N=1024 cell: rowwise FP8 at 0.61 of bf16's speed
    o = next(o for o in OUT if (o["M"], o["K"], o["N"]) == (16384, 8192, 1024))
    assert o["measured"] == 0.61
    assert o["error"] == pytest.approx(o["predicted"] / 0.61 - 1, rel=1e-12)


def test_held_out_shapes_are_predicted_within_ten_percent():
    # ROWWISE_PASS_SHARE (fp8recipe.py) is fitted on the shapes with M = 1024, 4096, 16384
    # (benchmarks/fit_fp8_rowwise_passes.py); the other half of the table is held out:
    # 30.3 % mean |error| with the passes unfitted, 8.9 % fitted
    held = [o for o in OUT if o["M"] not in load_script("fit_fp8_rowwise_passes").FIT_M]
    st = vf.stats(held)
    assert len(held) == 108
    assert st["mean"] < 0.10
    assert st["same_side"] >= 96       # faster or slower than bf16 as measured (82 unfitted)


def test_large_shapes_stay_within_twelve_percent():
    # the one fitted share slows every rowwise input/gradient pass alike, so the large
    # shapes, where the GEMMs dominate, came out 11.1 % too slow on average (8.4 % too fast
    # before the fit): what the fit costs there, kept in view
    big = [o for o in OUT if vf.large(o)]
    st = vf.stats(big)
    assert len(big) == 48
    assert st["mean"] < 0.12
    assert st["same_side"] >= 40


def test_the_gain_grows_from_narrow_to_wide_outputs_as_measured():
    # at every M >= 8192 and K the measured FP8 gain is smaller at N = 1024 than at N = 8192
    # (the casts of the M x K input cost the same, the GEMMs 8 times less); ddlsim agrees,
    # though it is still too optimistic at N = 1024 (docs/compute.md, "FP8")
    by = {(o["M"], o["K"], o["N"]): o for o in OUT}
    for m in (8192, 16384, 32768):
        for k in (1024, 2048, 4096, 8192, 16384, 32768):
            narrow, wide = by[(m, k, 1024)], by[(m, k, 8192)]
            assert narrow["measured"] < wide["measured"]
            assert narrow["predicted"] < wide["predicted"]
