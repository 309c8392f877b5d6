"""benchmarks/validate_torchtitan.py: torchtitan's published H100 runs, mapped onto ddlsim."""

from __future__ import annotations

import math

import pytest
from benchscripts import BENCH, load_script


vt = load_script("validate_torchtitan")
ROWS = vt.rows()


def test_data_carries_its_provenance():
    text = (BENCH / "data" / "torchtitan_tps.csv").read_text()
    for must in ("pytorch/torchtitan", "llama3_h100_202412_torchtitan.md", "9dec370",
                 "asyncTP_llama3_h100_2025-06_torchtitan.md", "820504e", "500 W"):
        assert must in text, must


def test_published_time_of_the_first_row_by_hand():
    """Table 1 FSDP: 16 sequences of 8192 tokens at 5,762 tokens/s on each of 8 GPUs."""
    assert vt.published_time(ROWS[0]) == pytest.approx(16 * 8192 / (5762 * 8), rel=1e-12)


def test_pipelined_405b_rows_take_torchtitans_split_and_micro_batches():
    row = next(r for r in ROWS if r["table"] == "5" and r["schedule"] == "1f1b")
    cfg = vt.config(row)
    p, t = cfg["parallel"], cfg["train"]
    # torchtitan 9dec370 generate_split_points: 126 layers over 8 stages
    assert p["layers_per_virtual_stage"] == [15] + [16] * 6 + [15]
    assert t["micro_batch_size"] == 32 // 8 and p["zero_stage"] == 3
    assert p["tp_comm_overlap"] == "torch_async" and cfg["system"]["software"]["compile"]


def test_the_interleaved_row_takes_torchtitans_uneven_virtual_stages():
    """126 layers over 16 virtual stages, two per rank (stages r and r + 8 on rank r): 7 on
    the first and the last, 8 on the others (9dec370 generate_split_points); it runs."""
    (row,) = [r for r in ROWS if r["schedule"] == "interleaved"]
    p = vt.config(row)["parallel"]
    assert p["virtual_pipeline_model_parallel_size"] == 2
    assert p["layers_per_virtual_stage"] == [7] + [8] * 14 + [7]
    (rec,) = vt.evaluate("analytical", only=[row])
    assert rec["result"] is not None and rec["result"].iteration_time_s > 0


def test_float8_rows_name_their_recipe():
    rowwise = next(r for r in ROWS if r["float8"] == "rowwise")
    assert vt.config(rowwise)["system"]["software"]["kernels"]["fp8_recipe"] == "rowwise"
    assert vt.config(rowwise)["train"]["dtype"] == "fp8"


def test_one_row_runs_on_its_dated_stack():
    (rec,) = vt.evaluate("analytical", only=[ROWS[0]])
    assert vt.config(ROWS[0])["system"]["software"]["stack"] == "torchtitan-2024"
    assert math.isfinite(rec["error"]) and rec["predicted"] > 0


def _eight_b_2025(float8: str = "none") -> list[dict]:
    return [r for r in ROWS if r["set"] == "2025" and r["model"] == "llama-3.1-8b"
            and r["float8"] == float8]


def test_async_tp_gains_less_as_torch_runs_it_than_as_te_userbuffers():
    """torch's fused all-gather-matmul / matmul-reduce-scatter overlap one GEMM each (no SM
    margin, chunked GEMMs, an exposed copy and reduction); TE's pipelined userbuffers overlap
    the whole block: vanilla > torch_async > pipelined in iteration time (8B, TP 8)."""
    vanilla, fused = _eight_b_2025()
    te = vt.config(fused)
    te["parallel"]["tp_comm_overlap"] = "pipelined"      # torchtitan has no TE: a what-if
    te["system"]["software"]["what_if"] = True
    from public_runs import time_record
    t_te = time_record(fused, te, "analytical", None, 1.0)["predicted"]
    t_off, t_torch = (o["predicted"] for o in vt.evaluate("analytical", [vanilla, fused]))
    assert t_off > t_torch > t_te


def test_async_tp_rows_agree_between_engines():
    rows = _eight_b_2025()
    ana = [o["predicted"] for o in vt.evaluate("analytical", rows)]
    des = [o["predicted"] for o in vt.evaluate("des", rows)]
    assert des == pytest.approx(ana, rel=0.01)


def test_h100_rows_run_on_the_runs_hbm2e_hosts():
    """torchtitan's H100s have 96 GB of HBM2e at 2.4 TB/s (its Hardware section), not the
    DGX H100's 80 GB of HBM3 at 3.35 TB/s: the memory-bound kernels of a row take
    3.35 / 2.4 times longer, so every H100 row is slower on grand-teton-h100."""
    from ddlsim.presets import get_preset
    h100 = [r for r in ROWS if r["set"] != "2024-04"]
    assert {r["system"] for r in h100} == {"grand-teton-h100"}
    dev = get_preset("system", "grand-teton-h100")["device"]
    assert dev["memory_bandwidth_Bps"] == "2.4 TB/s" and dev["memory_bytes"] == "94 GiB"
    # the runs' 500 W limit; the 700 W ceilings capped by what an H100 sustains at 500 W
    assert (dev["power_limit_W"], dev["matmul_power_limit_W"]) == (500, 700)
    assert 500 in dev["power_limits"]
    row = ROWS[0]
    times = [o["predicted"] for o in vt.evaluate("analytical", [dict(row, system="dgx-h100"), row])]
    assert times[1] > times[0]


def test_the_405b_rows_gather_in_float8_as_their_config_says():
    """9dec370 train_configs/llama3_405b.toml turns on the float8 all-gather and its scale
    precompute; torchtitan passes it to torchao only with a data-parallel shard degree > 1."""
    on = [r for r in ROWS if r["fsdp_float8_all_gather"] == "1"]
    assert {r["model"] for r in on} == {"llama-3.1-405b"}
    assert all(int(r["dp_shard"]) > 1 for r in on)
    assert [r["techniques"] for r in ROWS if r["model"] == "llama-3.1-405b"
            and r["fsdp_float8_all_gather"] == "0"] == ["FSDP 1, CP 8"]
    kernels = vt.config(on[0])["system"]["software"]["kernels"]
    assert kernels["enable_fsdp_float8_all_gather"] and \
        kernels["precompute_float8_dynamic_scale_for_fsdp"]


def test_a100_rows_run_on_the_aws_efa_hosts_of_torchtitans_launch_script():
    """torchtitan's April 2024 A100 rows (docs/performance.md at 1ea476e9: 64 A100 80 GB) do
    not state their network; the repo's launch script at that commit is "optimized for AWS
    with EFA" (FI_PROVIDER=efa "for A100"), so they run on aws-p4de-a100: EC2's A100 80 GB
    instance, 4 x 100 Gb/s EFA per node (50 GB/s), a quarter of a DGX A100's 8 x 200 Gb/s.
    FSDP2 moves about 55 GB per GPU per step over it: the blocks' gathers and reduce-scatters
    still hide mostly under the compute, but less of them than on the DGX's fabric, so the
    row is slower there and exposes more data-parallel time."""
    a100 = [r for r in ROWS if r["set"] == "2024-04"]
    assert {r["system"] for r in a100} == {"aws-p4de-a100"} and len(a100) == 3
    text = (BENCH / "data" / "torchtitan_tps.csv").read_text()
    for must in ("1ea476e9", "multinode_trainer.slurm", "optimized for AWS with EFA"):
        assert must in text, must
    import ddlsim
    cfg = vt.config(next(r for r in a100 if r["techniques"] == "8B selective op"))
    efa = ddlsim.load_config(cfg).system
    assert efa.device.name == "A100-SXM4-80GB" and efa.device.power_limit_W == 400
    assert efa.nics_per_node * efa.nic.bandwidth_Bps == pytest.approx(400e9 / 8, rel=1e-12)
    dgx, aws = (ddlsim.predict({**cfg, "system": {**cfg["system"], "preset": preset}},
                               "analytical") for preset in ("dgx-a100", "aws-p4de-a100"))
    assert aws.iteration_time_s > dgx.iteration_time_s
    assert aws.breakdown.exposed_comm_s["dp"] > 2 * dgx.breakdown.exposed_comm_s["dp"]
    # the blocks' compute still hides most of it: exposed well under the step
    assert aws.breakdown.exposed_comm_s["dp"] < 0.15 * aws.iteration_time_s


def test_a100_hosts_what_if_slows_the_row_as_the_network_narrows(capsys):
    """``--a100-hosts``: an A100 row on dgx-a100, on its EFA preset and at 0.6 of EFA's line
    rate (docs/compute.md's what-if): each host narrower than the last exposes more
    data-parallel time and runs slower; the fraction is checked and the flags refused alone."""
    row = next(r for r in ROWS if r["set"] == "2024-04" and r["techniques"] == "8B selective op")
    out = vt.a100_hosts(0.6, only=[row], breakdown=True)
    assert all(o["kinds"]["GEMM"] > 1.0 and "SM contention" in o["kinds"] for o in out)
    assert [o["host"] for o in out] == ["dgx-a100", "aws-p4de-a100",
                                        "aws-p4de-a100, EFA at 0.6 of line rate"]
    assert out[0]["predicted"] < out[1]["predicted"] < out[2]["predicted"]
    assert out[0]["exposed_dp"] < out[1]["exposed_dp"] < out[2]["exposed_dp"]
    for argv in (["--a100-hosts", "--efa-fraction", "1.5"], ["--a100-hosts", "--engine", "des"]):
        with pytest.raises(SystemExit) as exc:
            vt.main(argv)
        assert exc.value.code == 2
    assert vt.main(["--efa-fraction", "0.5"]) == 2
    assert "--efa-fraction is a what-if of --a100-hosts" in capsys.readouterr().err
