"""benchmarks/validate_nemo2022.py: NeMo Megatron's published July-2022 GPT-3 throughput on DGX
A100 (the search winner's evidence, docs/search.md), its provenance, each row read as its
plan, and one row predicted."""

from __future__ import annotations

import pytest

import ddlsim
from benchscripts import load_script

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

vn = load_script("validate_nemo2022")
pr = load_script("public_runs")


def test_the_table_names_its_source_commit_and_settings():
    text = pr.header(vn.TABLE)
    for cite in ("NVIDIA/NeMo-Framework-Launcher", "1c66ddf0c6285f166bae5c164c896997e8c09404",
                 "conf/training/gpt3/175b.yaml", "gradient_accumulation_fusion: True",
                 "fused_adam", "NeMo 1.10.0", "cuBLAS 11.10", "PR #4494"):
        assert cite in text
    assert [r["tokens_per_s"] for r in vn.rows()] == [
        "20642", "38025", "141306", "39543", "731791"]


def test_published_mfu_follows_from_the_tokens_per_second():
    # 175B on 16 nodes: 1,536 x 2,048 tokens at 20,642 tokens/s = 152.39 s; its model FLOPs
    # 72 B s l h^2 (1 + s/6h + V/12lh) over 128 x 312 TFLOP/s = 55.6 % (by hand)
    row = vn.rows()[0]
    assert vn.iteration_s(row) == pytest.approx(1536 * 2048 / 20642)
    mfu = vn.model_flops(row) / vn.iteration_s(row) / 128 / vn.PEAK
    assert mfu == pytest.approx(0.556, abs=0.001)


def test_every_row_reads_as_its_plan():
    for row in vn.rows():
        cfg = ddlsim.load_config(vn.config(row))
        p = cfg.parallel
        gpus = int(row["nodes"]) * 8
        assert (p.tensor_model_parallel_size, p.pipeline_model_parallel_size,
                p.data_parallel_size) == (int(row["tp"]), int(row["pp"]),
                                          gpus // (int(row["tp"]) * int(row["pp"])))
        assert cfg.train.dtype == "bf16" and cfg.train.recompute == row["recompute"]
        assert cfg.model.vocab_size % (128 * int(row["tp"])) == 0


def test_one_row_predicted_under_both_stacks():
    row = vn.rows()[2]                                      # 175B on 128 nodes
    out = vn.evaluate(only=[row])[0]
    assert out["result"] is not None and not out["skipped"]
    assert -0.2 < out["error"] < 0.2
    assert out["default"] < out["predicted"]                # cuDNN attention, overlaps


def test_without_fusion_runs_the_unfused_stack_and_stays_out_of_the_docs(capsys, monkeypatch):
    """``--without-fusion``: the column docs/search.md quotes (the fusion's gain taken away),
    never written into the docs' table, which is the config's."""
    assert vn.main(["--without-fusion", "--write-docs"]) == 2
    assert "do not go together" in capsys.readouterr().err
    seen = {}
    monkeypatch.setattr(vn, "run_script",
                        lambda name, doc, argv, evaluate, show, summary:
                        seen.update(evaluate=evaluate, argv=argv) or 0)
    assert vn.main(["--without-fusion", "--markdown"]) == 0
    kernels = seen["evaluate"].keywords["software"]["kernels"]
    assert kernels["gradient_accumulation_fusion"] is False and seen["argv"] == ["--markdown"]
    assert vn.SOFTWARE["kernels"]["gradient_accumulation_fusion"] is True   # not mutated
    row = vn.rows()[3]                                      # 5B on 1 node
    fused, unfused = (vn.evaluate(only=[row], software=s)[0]["predicted"]
                      for s in (None, seen["evaluate"].keywords["software"]))
    assert unfused > fused          # the fp32 accumulation pass is back
