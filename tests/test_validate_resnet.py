"""benchmarks/validate_resnet.py: NVIDIA DeepLearningExamples' published ResNet-50 v1.5
training throughput (PyTorch DDP, DGX A100 and DGX-1), its provenance, and the script run on
a sample of its rows."""

from __future__ import annotations

import re

import pytest

import ddlsim
from benchscripts import load_script

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")


vr = load_script("validate_resnet")
pr = load_script("public_runs")


def test_the_table_names_its_source_commit_and_settings():
    text = pr.header(vr.TABLE)
    for cite in ("NVIDIA/DeepLearningExamples", "resnet50v1.5/README.md", "pytorch-21.03",
                 "configs.yml", "memory_format", "gradient_as_bucket_view"):
        assert cite in text
    assert re.search(r"\b[0-9a-f]{40}\b", text)


def test_every_row_reads_as_its_plan():
    rows = vr.rows()
    assert len(rows) == 12
    for row in rows:
        cfg = ddlsim.load_config(vr.config(row))
        assert cfg.world_size == cfg.dp == int(row["gpus"])
        assert cfg.train.micro_batch_size == int(row["batch_per_gpu"])
        assert cfg.train.dtype == row["dtype"]
        assert (cfg.model.memory_format == "channels_last") == (row["memory_format"] == "nhwc")
        # the steady iteration: images of all GPUs over the published img/s, the mean of 100
        # per-iteration rates whose first (cuDNN autotuning) is about 0
        assert vr.published_time(row) == pytest.approx(
            int(row["gpus"]) * int(row["batch_per_gpu"]) / float(row["img_s"]) * 99 / 100)


def test_the_script_on_a_sample_prints_rows_scaling_and_summary(capsys):
    rows = vr.rows()
    sample = [r for r in rows if r["system"] == "DGX A100 80GB" and r["precision"] == "AMP"]
    out = vr.evaluate("analytical", only=sample)
    assert all("predicted" in o for o in out)
    vr._print(out, markdown=False)
    text = capsys.readouterr().out
    assert "16621" in text and "published 8-GPU scaling" in text
    (pub, pred), = vr.scaling(out).values()
    assert pub == pytest.approx(16621 / 2470)
    # data parallelism costs time per image: the 8-GPU run is no faster per GPU than one GPU
    assert 1.0 < pred <= 8.0
    assert "8-GPU scaling mean |error|" in vr.summary(out, "analytical")
