"""benchmarks/bert_layer_v100.py: ddlsim's BERT-large layer on a V100 against the published
measurement of mli/transformers-benchmarks (micro_bench.ipynb at 53a232b)."""

from __future__ import annotations

import pytest

from benchscripts import load_script

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

bl = load_script("bert_layer_v100")
pr = load_script("public_runs")


def test_the_table_names_its_source():
    text = pr.header(bl.TABLE)
    for cite in ("mli/transformers-benchmarks", "53a232b", "micro_bench.ipynb",
                 "Tesla V100-SXM2-16GB", "1.13.0a0+08820cb", "BertLayer"):
        assert cite in text
    assert len(bl.rows()) == 12


def test_times_recovered_from_the_printed_tflops():
    r = next(r for r in bl.rows() if r["seq"] == 128 and r["batch"] == 16)
    flops = 24 * 16 * 128 * 1024 ** 2 + 4 * 16 * 1024 * 128 ** 2
    assert r["fwd_bwd_s"] == pytest.approx(3 * flops / 53.081e12)


def test_only_the_flat_rows_are_host_bound():
    # 128 tokens, 4 and 8 sequences: 2.90 and 2.92 ms for twice the work
    assert bl.host_bound(bl.rows()) == {(128, 4), (128, 8)}


def test_the_device_bound_rows_and_the_host_gap():
    out = bl.evaluate()
    dev = [r for r in out if r["regime"] == "device"]
    # the device model within 12 % of every device-bound row (4.1 % mean today: -11.4 % at
    # 16 × 128 tokens, the edge of the host-bound regime, -9.3 % at 4 × 512, else within
    # 4 %); a bound a change to the V100 kernels can break
    assert all(abs(r["error"]) < 0.12 for r in dev)
    assert sum(abs(r["error"]) for r in dev) / len(dev) < 0.06
    # the host-bound rows take 43 of ddlsim's kernels ~2.9 ms: ~68 µs a kernel, an order
    # of magnitude over the preset's eager host time
    host = [r for r in out if r["regime"] == "host"]
    assert all(r["pred_kernels"] == 43 for r in host)
    assert all(r["fwd_bwd_s"] / r["pred_kernels"] > 10 * r["pred_host_s"] / r["pred_kernels"]
               for r in host)
    assert "device-bound rows (10)" in bl.summary(out)
