"""benchmarks/validate_fms_fsdp.py: IBM fms-fsdp's published A100 runs (FSDP1), mapped onto
ddlsim. These tests check that the rows carry their provenance, are set up as the source ran
them and predict; not the size of the error."""

from __future__ import annotations

import math
import warnings

import pytest
from benchscripts import load_script

vf = load_script("validate_fms_fsdp")
ROWS = vf.rows()


def _row(set_prefix: str, size: str) -> dict:
    (row,) = [r for r in ROWS if r["set"].startswith(set_prefix) and r["size"] == size]
    return row


def test_rows_carry_their_commit_and_line():
    """Two README tables of foundation-model-stack/fms-fsdp, four Llama 2 sizes each."""
    assert {(r["set"], r["commit"]) for r in ROWS} == {("2024-05-02 eager", "3759b766"),
                                                      ("2024-05-09 compiled", "ed74fd5d")}
    assert [r["size"] for r in ROWS] == ["7b", "13b", "34b", "70b"] * 2
    assert all(isinstance(r["line"], int) and isinstance(r["mfu_line"], int) for r in ROWS)
    assert "foundation-model-stack/fms-fsdp" in vf.__doc__


def test_published_time_of_the_first_row_by_hand():
    """2 sequences of 4,096 tokens per GPU at 3,700 tokens/s/GPU (fms-fsdp's own throughput:
    batch_size · seq_length / step time)."""
    assert vf.published_time(ROWS[0]) == pytest.approx(2 * 4096 / 3700, rel=1e-12)


def test_recompute_share_reads_the_stated_rows_back():
    """HFU / MFU gives ~0 where the table says "No AC" and ~1 where it says "Full AC", so the
    share it gives the "Selective AC" rows is the one they ran."""
    for row in ROWS:
        p = vf.recompute_share(row)
        if row["ac"] == "No AC":
            assert abs(p) < 0.1, (row, p)
        elif row["ac"] == "Full AC":
            assert 0.95 < p < 1.2, (row, p)
    assert 0.4 < vf.recompute_share(_row("2024-05-09", "13b")) < 0.5
    assert vf.recompute_share(_row("2024-05-09", "70b")) > 0.95


def test_selective_rows_checkpoint_whole_blocks_at_the_nearest_share():
    """fms-fsdp's selective checkpointing is every 1/p-th block: the 13B rows every second
    block, the compiled 34B and 70B rows (p ~ 1) every block."""
    t13 = vf.config(_row("2024-05-09", "13b"))["train"]
    assert (t13["recompute"], t13["recompute_every_n_layers"]) == ("full", 2)
    t70 = vf.config(_row("2024-05-09", "70b"))["train"]
    assert t70["recompute"] == "full" and "recompute_every_n_layers" not in t70
    assert vf.config(ROWS[0])["train"]["recompute"] == "none"


def test_rows_run_fsdp1_hsdp_and_fsdp_as_the_table_says():
    hsdp, fsdp = vf.config(_row("2024-05-02", "7b")), vf.config(_row("2024-05-02", "13b"))
    assert hsdp["parallel"]["data_parallel_replicate_size"] == 16
    assert "data_parallel_replicate_size" not in fsdp["parallel"]
    for cfg in (hsdp, fsdp):
        assert cfg["parallel"]["zero_stage"] == 3 and cfg["parallel"]["data_parallel_size"] == 128
        assert cfg["system"] == {"preset": "aws-p4de-a100", "nodes": 16,
                                 "software": {"stack": "fms-fsdp-2024", "compile": False}}
        assert cfg["train"]["micro_batch_size"] == 2 and cfg["train"]["seq_length"] == 4096
    from ddlsim.software import resolve_software
    sw = resolve_software("fms-fsdp-2024")
    # FSDP1, gradients reduce-scattered in bf16 (bfSixteen), no copy-out of the flat parameter
    assert (sw.zero3_implementation, sw.grad_reduce_dtype, sw.zero3_copy_out) == \
        ("torch_fsdp", "param", False)


def test_the_34b_model_is_fms_fsdps_own():
    """config_utils.py's 34b: the 70B shape with 48 layers and hidden 22016."""
    import ddlsim
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = ddlsim.load_config(vf.config(_row("2024-05-09", "34b"))).model
    assert (m.num_hidden_layers, m.intermediate_size, m.hidden_size,
            m.num_key_value_heads) == (48, 22016, 8192, 8)


def test_the_fms_stack_has_memory_rules():
    """The stack belongs to a framework whose loss and root unit ddlsim models: the bf16
    logits held through the backward (deleted only in 2025), FSDP1's root never resharded."""
    from ddlsim.workloads.framework_memory import framework
    fm = framework("fms-fsdp-2024")
    assert fm.name == "fms-fsdp" and not fm.fsdp2 and fm.kept_root == "edges"
    assert fm.logit_bytes == 8


@pytest.mark.parametrize("i", range(len(ROWS)))
def test_every_row_predicts(i):
    (rec,) = vf.evaluate("analytical", only=[ROWS[i]])
    assert not rec["refused"] and rec["result"].fits
    assert math.isfinite(rec["error"]) and rec["predicted"] > 0


def test_breakdown_splits_a_row():
    (out,) = vf.breakdown(only=[ROWS[0]])
    assert out["kinds"]["GEMM"] > 0.5 * out["predicted"]
    assert 0 <= out["exposed_dp"] < out["predicted"]
