"""The command line, as a user runs it."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ddlsim.cli import app

runner = CliRunner()
EXAMPLES = ["examples/gpt3-175b-1024-a100.yaml", "examples/megatron-1t-3072-a100.yaml",
            "examples/wiki-gpt2-9ranks-reduce_broadcast.yaml",
            "examples/wiki-gpt2-9ranks-sliced_reduce_broadcast.yaml",
            "examples/wiki-gpt2-9ranks-reduce_scatter.yaml", "examples/wiki-gpt2-9ranks-ddp.yaml"]
KEYS = {"iteration_time_s", "tokens_per_s", "samples_per_s", "mfu", "flops_per_device",
        "breakdown", "comm_bytes", "memory_per_device_bytes"}


@pytest.mark.parametrize("example", EXAMPLES)
def test_predict_examples_json_and_table(example):
    r = runner.invoke(app, ["predict", example, "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert KEYS <= set(d)
    assert {"compute_s", "exposed_comm_s", "bubble_s"} <= set(d["breakdown"])
    assert d["iteration_time_s"] > 0
    t = runner.invoke(app, ["predict", example])
    assert t.exit_code == 0 and "iteration time" in t.output and "Memory per device" in t.output


def test_set_override_and_output_file(tmp_path):
    out = tmp_path / "r.json"
    r = runner.invoke(app, ["predict", EXAMPLES[0], "-f", "json", "-o", str(out),
                            "--set", "parallel.pipeline_model_parallel_size=8",
                            "--set", "parallel.data_parallel_size=16",
                            "--set", "parallel.zero_stage=1"])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["world_size"] == 1024
    again = runner.invoke(app, ["predict", EXAMPLES[0], "-f", "json", "-o", str(out)])
    assert again.exit_code == 2 and "already exists" in again.output


@pytest.mark.parametrize("text, expected", [
    ("model: gpt3-175b\nparallel: {tensor_model_paralel_size: 8}\ntrain: gpt3-paper\n"
     "system: {preset: dgx-a100, nodes: 128}\n", "unknown key 'tensor_model_paralel_size'"),
    ("model: gpt3-175b\nparallel: {tensor_model_parallel_size: 5, data_parallel_size: 1}\n"
     "train: gpt3-paper\nsystem: {preset: dgx-a100, nodes: 128}\n",
     "num_attention_heads = 96 is not divisible by parallel.tensor_model_parallel_size = 5"),
    ("model: gpt3-175b\nparallel: {tensor_model_parallel_size: 8}\n"
     "train: {micro_batch_size: 1, global_batch_size: 8, seq_length: 2048}\n"
     "system: {preset: dgx-a100, nodes: 1}\n", "does not fit in memory"),
])
def test_bad_configs_give_one_paragraph(tmp_path, text, expected):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    r = runner.invoke(app, ["predict", str(f)])
    assert r.exit_code == 2
    assert expected in " ".join(r.output.split())
    assert "Traceback" not in r.output


def test_presets_lists_sources():
    r = runner.invoke(app, ["presets", "system"])
    assert r.exit_code == 0 and "dgx-a100" in r.output and "cpu-10gbe" in r.output
    assert runner.invoke(app, ["presets", "gadgets"]).exit_code == 2


def test_presets_lists_the_software_stacks_with_their_attention_kernel():
    r = runner.invoke(app, ["presets", "software"], env={"COLUMNS": "250"})
    assert r.exit_code == 0
    rows = {line.split("│")[1].strip(): line for line in r.output.splitlines()
            if line.startswith("│") and line.split("│")[1].strip()}
    # ddlsim/data/software.yaml: 2021 Megatron ran the fused softmax and no overlap; 2024's
    # stack cuDNN's fused attention through TransformerEngine with the DP overlaps on
    assert set(rows) >= {"megatron-lm-2021", "megatron-core-2024", "deepspeed"}
    assert "fused_softmax" in rows["megatron-lm-2021"]
    assert "overlap_grad_reduce" not in rows["megatron-lm-2021"]
    assert "cudnn" in rows["megatron-core-2024"]
    assert "overlap_grad_reduce" in rows["megatron-core-2024"]
    assert "system presets" not in r.output        # only the stacks were asked for
