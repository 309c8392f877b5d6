"""The Megatron-Core r0.8.0 H100 weak-scaling validation (benchmarks/validate_megatron_h100.py):
its data's provenance and consistency, the mapping onto ddlsim's config, and that it runs.

No accuracy bounds: the figures are reported in docs/validation.md; the checks below are
derived by hand from the source, as written beside each.
"""

from __future__ import annotations

import math
import re

import pytest

from benchscripts import load_script

vm = load_script("validate_megatron_h100")
pr = load_script("public_runs")
ROWS = {r["model"]: r for r in vm.rows()}


def test_data_file_carries_its_provenance():
    text = pr.header(vm.TABLE)
    for cite in ["NVIDIA/Megatron-LM", "images/model_table.png", "core_r0.8.0",
                 "num_floating_point_operations", "micro-batch size"]:
        assert cite in text, cite
    assert re.search(r"\b[0-9a-f]{40}\b", text)


def test_rows_are_whole_plans_and_mfu_is_against_the_bf16_peak():
    """The README's nine rows; TP·PP·DP = GPUs; the MFU column is TFLOP/s / 989 rounded
    (H100 SXM dense BF16 peak), which is why the rows are run in BF16."""
    assert list(ROWS) == ["1.7B", "7.1B", "16B", "32B", "70B", "119B", "177B", "314B", "462B"]
    for name, r in ROWS.items():
        tp, pp, dp, gpus = (int(r[k]) for k in ("tp", "pp", "dp", "gpus"))
        assert tp * pp * dp == gpus and gpus % 8 == 0, name
        assert round(100 * float(r["tflops_per_gpu"]) / 989) == int(r["mfu_pct"]), name


def test_published_time_is_megatrons_flop_count_over_the_throughput():
    """1.7B: 12·192·4096·24·2048²·((2 + 2) + 4 + 131072/(2·24·2048)) FLOPs over
    408.8 TFLOP/s · 48 GPUs = 0.4519 s."""
    flops = 12 * 192 * 4096 * 24 * 2048**2 * (4 + 4 + 131072 / (2 * 24 * 2048))
    assert vm.published_time(ROWS["1.7B"]) == pytest.approx(flops / (408.8e12 * 48))
    assert vm.published_time(ROWS["1.7B"]) == pytest.approx(0.4519, abs=1e-4)


def test_config_follows_the_readme_flags():
    c7 = vm.config(ROWS["7.1B"])
    assert c7["parallel"]["sequence_parallel"] and c7["parallel"]["tp_comm_overlap"]
    assert c7["parallel"]["zero_stage"] == 1 and c7["parallel"]["overlap_param_gather"]
    assert c7["model"]["vocab_size"] == 131072 and not c7["model"]["tie_word_embeddings"]
    c1 = vm.config(ROWS["1.7B"], mbs=2)
    assert "tp_comm_overlap" not in c1["parallel"] and not c1["parallel"]["sequence_parallel"]
    assert c1["train"]["micro_batch_size"] == 2 and c1["train"]["dtype"] == "bf16"


def test_script_runs_one_row(capsys):
    (rec,) = vm.evaluate("analytical", only=[ROWS["1.7B"]])
    assert math.isfinite(rec["predicted"]) and rec["predicted"] > 0
    assert rec["error"] == pytest.approx(rec["predicted"] / rec["published"] - 1)
    vm._print([rec], markdown=True)
    assert "| 1.7B | 48 |" in capsys.readouterr().out


def test_breakdown_parts_add_up_to_the_prediction(capsys):
    """``--breakdown``: compute, optimizer, exposed dp/tp/pp and bubble are the critical
    rank's :class:`ddlsim.Breakdown`, which adds up to the iteration time; the compute-bound
    error leaves the exposed communication out."""
    (rec,) = vm.evaluate("analytical", only=[ROWS["1.7B"]])
    parts = vm.breakdown(rec)
    assert sum(parts[p] for p in vm.PARTS) == pytest.approx(rec["predicted"], rel=1e-12)
    hidden = parts["compute"] + parts["optimizer"] + parts["bubble"]
    assert parts["compute-bound error"] == pytest.approx(hidden / rec["published"] - 1)
    vm.print_breakdown([rec], markdown=True)
    out = capsys.readouterr().out
    assert "| 1.7B |" in out and "| GEMM |" in out


def test_breakdown_flag_is_taken_off_before_the_shared_options():
    argv = ["--mbs", "2", "--breakdown", "--markdown"]
    assert vm._flag(argv, "--mbs", value=True) == "2"
    assert vm._flag(argv, "--breakdown") is True and vm._flag(argv, "--breakdown") is None
    assert argv == ["--markdown"]


def test_compute_kinds_book_userbuffers_sm_margin_as_contention():
    """7.1B runs TE userbuffers (TP 2, ``tp_comm_overlap``): its GEMMs' SM margin is a
    contention op with no collective of its own, booked as SM contention, not as an op
    without kernels."""
    kinds = vm.compute_kinds(ROWS["7.1B"])
    assert kinds["SM contention"] > 0 and kinds.get("copies and other (no kernels)", 0.0) < 1e-3


def test_layer_device_time_is_the_layers_share_of_compute(capsys):
    """The host check's per-layer device time: 24 layers x 4 micro-batches (GBS 192 / DP 48,
    micro-batch 1) of the 1.7B's forward and backward fit inside its predicted compute, and
    are most of it (the head, loss and gradient passes are the rest); the backward is longer
    than the forward. The host table prints the 1.7B with the bound 5 x 99.66 us."""
    (rec,) = vm.evaluate("analytical", only=[ROWS["1.7B"]])
    d = vm.layer_device_s(ROWS["1.7B"])
    layers = 24 * 4 * (d["fwd"] + d["bwd"])
    compute = vm.breakdown(rec)["compute"]
    assert 0.5 * compute < layers < compute and d["bwd"] > d["fwd"] > 0
    vm.print_host_check([rec], markdown=True)
    out = capsys.readouterr().out
    assert "| 1.7B |" in out and f"| {1e6 * 5 * 99.66e-6:.0f} |" in out
