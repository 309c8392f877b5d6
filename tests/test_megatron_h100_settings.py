"""Settings of the Megatron-Core r0.8.0 weak-scaling rows (benchmarks/validate_megatron_h100.py)
read from the framework's code at core_r0.8.0 (NVIDIA/Megatron-LM ``baf94af3c6``), and the
data-parallel floor of the 32B row that no collective model may go under.

Each expected value is derived by hand from the source named beside it.
"""

from __future__ import annotations

import math

import pytest

import ddlsim
from benchscripts import load_script

vm = load_script("validate_megatron_h100")
ROWS = {r["model"]: r for r in vm.rows()}
PP_ROWS = [name for name, r in ROWS.items() if int(r["pp"]) > 1]


def test_the_pipelined_rows_are_the_five_largest():
    assert PP_ROWS == ["70B", "119B", "177B", "314B", "462B"]


@pytest.mark.parametrize("name", PP_ROWS)
def test_pipelined_rows_run_the_interleaved_schedule_one_layer_a_chunk(name):
    """README (core_r0.8.0 line 64): PP communication overlapped "(enabled by default)";
    arguments.py lines 271-277 turn ``overlap_p2p_comm`` off unless the schedule is
    interleaved. Layers per stage: 70B 84/2 = 42, 119B 92/4 = 23, 177B 96/6 = 16,
    314B 96/8 = 12, 462B 112/16 = 7, so one layer a virtual stage is 42, 23, 16, 12, 7 chunks."""
    chunks = {"70B": 42, "119B": 23, "177B": 16, "314B": 12, "462B": 7}[name]
    p = vm.config(ROWS[name])["parallel"]
    assert p["schedule"] == "interleaved"
    assert p["virtual_pipeline_model_parallel_size"] == chunks


def test_one_layer_a_chunk_is_the_only_chunk_every_pipelined_row_admits():
    """arguments.py lines 264-268: the layers per stage must divide by the chunk; their
    greatest common divisor is 1 (23 and 7 are prime)."""
    per_stage = [int(ROWS[n]["layers"]) // int(ROWS[n]["pp"]) for n in PP_ROWS]
    assert math.gcd(*per_stage) == 1 == vm.LAYERS_PER_VIRTUAL_STAGE


@pytest.mark.parametrize("name", PP_ROWS)
def test_interleaved_plans_are_valid_configs(name):
    """The interleaved schedule needs micro-batches in whole rounds of PP (core_r0.8.0
    schedules.py; ddlsim's validator): GBS / (DP · mbs) = 4·PP here."""
    cfg = ddlsim.load_config(vm.config(ROWS[name]))
    r = ROWS[name]
    assert (int(r["gbs"]) // (int(r["dp"]) * vm.MBS)) % int(r["pp"]) == 0
    assert cfg.parallel.schedule == "interleaved"


@pytest.mark.parametrize("name", ["1.7B", "7.1B", "16B", "32B"])
def test_unpipelined_rows_keep_one_f_one_b(name):
    p = vm.config(ROWS[name])["parallel"]
    assert p["schedule"] == "1f1b" and "virtual_pipeline_model_parallel_size" not in p


def test_32b_data_parallel_time_is_over_its_line_rate_floor():
    """32B (TP 8, DP 48, one GPU a node in each DP group, each on its own 400 Gb/s rail): per
    rank 3.94e9 parameters (12·48·7168² + 2·131072·7168 + 4096·7168 over TP 8),
    reduce-scattered in fp32 (``--bf16`` forces it, arguments.py lines 300-305) and
    all-gathered in bf16, a ring sending 47/48 of each through the rank's NIC:
    (15.75 + 7.88) GB · 47/48 / 50 GB/s = 0.463 s. Megatron-Core r0.8.0 overlaps the
    reduce-scatter with the last micro-batch's backward only and the gather with the first's
    forward only (distrib_optimizer.py lines 1329-1337, 1454-1475), together at most one
    micro-batch's compute, a quarter of the step's (4 micro-batches): the exposed DP time
    cannot be less than the rest."""
    params = (12 * 48 * 7168**2 + 2 * 131072 * 7168 + 4096 * 7168) / 8
    line_rate_s = params * (4 + 2) * 47 / 48 / 50e9
    assert line_rate_s == pytest.approx(0.463, abs=0.002)
    (rec,) = vm.evaluate("analytical", only=[ROWS["32B"]])
    b = rec["result"].breakdown
    micro_batches = int(ROWS["32B"]["gbs"]) // (int(ROWS["32B"]["dp"]) * vm.MBS)
    assert micro_batches == 4
    assert b.exposed_comm_s["dp"] >= line_rate_s - b.compute_s / micro_batches
