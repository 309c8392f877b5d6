"""benchmarks/validate_moe.py: Megatron-Bridge's published MoE rows on DGX H100, their
provenance, and their plans as ddlsim reads them (parallel folding: EP over TP x DP)."""

from __future__ import annotations

import math
import re

import pytest

import ddlsim
from benchscripts import load_script

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")


vm = load_script("validate_moe")
pr = load_script("public_runs")


def test_the_table_names_its_source_and_commit():
    text = pr.header(vm.TABLE)
    for cite in ("NVIDIA-NeMo/Megatron-Bridge", "performance-summary-archive.md", "DGX-H100",
                 "qwen3_workload_base_configs.py", "moe_router_force_load_balancing"):
        assert cite in text
    assert re.search(r"\b[0-9a-f]{40}\b", text)


def test_every_row_is_a_plan_ddlsim_reads_with_ep_folded_over_tp_and_dp():
    folded = 0
    for row in vm.rows():
        cfg = ddlsim.load_config(vm.config(row))
        tp, pp, ep = int(row["tp"]), int(row["pp"]), int(row["ep"])
        assert cfg.world_size == int(row["gpus"])
        # EP x expert TP 1 spans the TP x DP ranks of one stage (Qwen3-235B: 32 = 2 x 16)
        assert cfg.mesh.size("ep") * cfg.mesh.size("edp") == int(row["gpus"]) // pp
        assert cfg.mesh.size("etp") == 1 and tp * pp * cfg.dp == int(row["gpus"])
        folded += cfg.dp % ep != 0
    assert folded == 4      # Qwen3-235B: EP 32 does not divide DP 16 (2024's rule refuses it)


def test_the_script_runs_one_row(capsys):
    """Qwen3-30B-A3B on 16 H100s, PP2 × VP12, EP8 (26.02.01): published 1024·4096 /
    (9,058·16) = 28.94 s."""
    row = next(r for r in vm.rows() if r["release"] == "26.02.01" and r["gpus"] == "16")
    (rec,) = vm.evaluate("analytical", only=[row])
    assert rec["published"] == pytest.approx(1024 * 4096 / (9058 * 16))
    assert math.isfinite(rec["predicted"]) and rec["predicted"] > 0
    vm._print([rec], markdown=True)
    assert "| 26.02.01 | Qwen3_30B_a3B | 16 |" in capsys.readouterr().out


def test_each_rows_ep_overlap_settings_name_their_source():
    """The a2a-overlap columns come from Bridge's recipes and the Megatron-LM commit each tag pins
    (v0.3.0: b0cc2706, v0.4.0: d7288711)."""
    text = pr.header(vm.TABLE)
    for cite in ("_set_moe_a2a_overlap_overrides", "overlap_moe_expert_parallel_comm",
                 "b0cc2706ddc60d2aefd5fff346445b5c013036a8",
                 "d7288711ba278d160d2a5a22c099915c9fe1395c", "model_chunk_schedule_plan.py"):
        assert cite in text
    assert {r["recipes_at"] for r in vm.rows()} == {"v0.3.0", "v0.4.0"}


@pytest.mark.parametrize("row", vm.rows(), ids=lambda r: f"{r['model']}-{r['release']}")
def test_overlapped_rows_are_plans_megatron_core_accepts_for_the_overlap(row):
    """Bridge's override sets delay_wgrad_compute with the overlap and switches off the shared-
    expert overlap; Megatron-Core (transformer_config.py __post_init__ at d7288711, lines
    2081-2144) then asserts EP > 1, an alltoall or flex dispatcher, and VP when PP > 1, and
    refuses delay_wgrad_compute without the overlap."""
    overlap = row["a2a_overlap"] == "true"
    assert (row["delay_wgrad_compute"] == "true") == overlap
    assert row["moe_shared_expert_overlap"] == "false"
    if overlap:
        assert int(row["ep"]) > 1
        assert row["dispatcher_as_run"].split("-")[0] in ("alltoall", "flex")
        assert int(row["pp"]) == 1 or int(row["vp"]) > 1
    # the row's settings are the config's, which the stack's rules accept: modelled, not noted
    moe = ddlsim.load_config(vm.config(row)).parallel.moe
    assert moe.overlap_expert_parallel_comm is overlap and moe.delay_wgrad_compute is overlap
    assert "a2a overlap" not in vm.approximated(row)


# ---------------------------------------------------------------- Megatron-MoE-ModelZoo
def test_the_modelzoo_table_names_its_source_commit_and_scripts():
    text = pr.header(vm.ZOO_TABLE)
    for cite in ("yanring/Megatron-MoE-ModelZoo", "c1ad0b5c89f425d60febddc38e7f741a16f08bd1",
                 "best_practice/Qwen3/readme.md", "run_235b.sh", "sbatch_benchmarking.sh",
                 "Qwen3-235B-A22B.yaml", "--overlap-moe-expert-parallel-comm"):
        assert cite in text


def test_modelzoo_rows_are_the_tables_plans_and_rows_1_2_differ_only_in_the_overlap():
    rows = vm.zoo_rows()
    assert [r["row"] for r in rows] == ["1", "2", "3", "4", "5"]
    for row in rows:
        assert int(row["tp"]) * int(row["cp"]) * int(row["pp"]) * int(row["dp"]) == 256
        assert int(row["ep"]) * int(row["etp"]) * int(row["edp"]) == \
            int(row["tp"]) * int(row["dp"])
        if row["modelled"] != "yes":
            continue
        cfg = ddlsim.load_config(vm.config(row))
        assert cfg.world_size == 256 and cfg.dp == int(row["dp"])
        assert cfg.train.dtype == "bf16"
        if row["recompute"] == "norm, act":   # run_235b.sh's --recompute-modules
            assert cfg.train.recompute == "selective"
            assert cfg.train.recompute_modules == ("moe_act", "layernorm")
        assert cfg.parallel.moe.overlap_expert_parallel_comm is (row["a2a_overlap"] == "true")
    a, b = rows[0], rows[1]
    differ = {k for k in a if a[k] != b[k]}
    assert differ == {"row", "a2a_overlap", "notes", "step_time_s", "per_gpu_tflops"}
    assert (float(a["step_time_s"]), float(b["step_time_s"])) == (19.7, 17.6)


def test_a_row_ddlsim_does_not_model_is_listed_not_predicted():
    row = {**vm.zoo_rows()[0], "modelled": "no: a reason the table gives"}
    recs = vm.evaluate("analytical", only=[row])
    assert [r["result"] for r in recs] == [None]
    assert recs[0]["skipped"] == "a reason the table gives"


def test_row_3_runs_under_megatron_fsdp():
    """FSDP On: ZeRO-3 as Megatron-FSDP (decoder/megatron_fsdp.py), with the gradient
    accumulation fusion off that Megatron-LM asserts, and no overlap flags of its own."""
    fsdp = vm.zoo_rows()[2]
    assert (fsdp["row"], fsdp["fsdp"], fsdp["modelled"]) == ("3", "On", "yes")
    cfg = vm.config(fsdp)
    assert cfg["parallel"]["zero_stage"] == 3
    assert not {"overlap_grad_reduce", "overlap_param_gather"} & cfg["parallel"].keys()
    sw = ddlsim.load_config(cfg).software
    assert sw.zero3_implementation == "megatron_fsdp" and not sw.gradient_accumulation_fusion
    assert vm.approximated(fsdp) == "RS queue cap"


def test_row_4s_split_leaves_the_embedding_and_the_loss_chunks_without_a_layer():
    """PP 32 x VP 3 over 94 layers + embedding + loss: one unit per chunk, the first chunk
    the embedding alone and the last the loss alone (Megatron-Core builds them)."""
    from ddlsim.workloads.decoder.split import chunk_layers
    cfg = ddlsim.load_config(vm.config(vm.zoo_rows()[3]))
    split = chunk_layers(cfg)
    assert split[0] == (0, 1, 1) and split[-1] == (1, 1, 0) and len(split) == 32


def test_the_summary_gives_the_overlap_ab_predicted_and_published():
    rows = vm.zoo_rows()[:2]
    recs = [{"row": r, "result": object(), "refused": "", "skipped": "",
             "published": vm.published_time(r), "predicted": p,
             "error": p / vm.published_time(r) - 1} for r, p in zip(rows, (16.0, 12.0))]
    text = vm.summary(recs, "analytical")
    assert "published 19.7 -> 17.6 s (10.7 % faster)" in text
    assert "predicted 16.00 -> 12.00 s (25.0 % faster)" in text


def test_the_bridge_overlap_ab_runs_name_their_source_and_pair_off_with_on():
    text = pr.header(vm.AB_TABLE)
    for cite in ("NVIDIA-NeMo/Megatron-Bridge", "nemo-mbridge-perf-moe-comm-overlap/SKILL.md",
                 "24.7138", "20.9920", "41.25", "31.31", "36.55 %"):
        assert cite in text
    rows = vm.ab_rows()
    assert {(r["run"], r["a2a_overlap"]) for r in rows} == {
        (run, o) for run in ("hybridep", "alltoall") for o in ("false", "true")}
    for r in rows:      # the same plan on both sides but the overlap
        cfg = vm.config(r)
        assert cfg["parallel"]["moe"]["overlap_expert_parallel_comm"] == (r["a2a_overlap"] == "true")
        assert cfg["parallel"]["moe"]["router_force_load_balancing"] is True
        assert cfg["train"]["dtype"] == "bf16"
    recs = [{"row": r, "result": object(), "refused": "", "skipped": "",
             "published": vm.published_time(r), "predicted": p,
             "error": p / vm.published_time(r) - 1}
            for r, p in zip(rows, (20.0, 15.0, 30.0, 20.0))]
    text = vm.summary(recs, "analytical")
    assert "Bridge overlap A/B (hybridep): published 24.71 -> 20.99 s (15.1 % faster)" in text
    assert "predicted 30.00 -> 20.00 s (33.3 % faster)" in text


def test_the_overlapped_ab_runs_fit_as_they_ran():
    # both overlapped runs ran on 80 GB H100s; the combined 1F1B holds one layer more, not a
    # micro-batch more (until 2026-11-30 ddlsim put them at 90.4 GiB: "does not fit")
    for r in vm.ab_rows():
        if r["a2a_overlap"] == "true":
            ddlsim.predict(vm.config(r), "analytical")   # check_fit on: raises if it does not
