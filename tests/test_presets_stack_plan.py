"""What a software-stack preset switches on and off is named on the plan line and in the JSON
result's ``plan``: the attention kernel, GEMM library, precision, fusions and overlaps."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import ddlsim
from ddlsim.cli import app
from ddlsim.planinfo import plan_fields

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

EXAMPLES = Path(__file__).parents[1] / "examples"
LLAMA = ["parallel.schedule=1f1b", "parallel.virtual_pipeline_model_parallel_size=null"]


def test_the_deepspeed_stack_names_its_attention_kernel():
    """DeepSpeed keeps Megatron's fused softmax where the default stack runs cuDNN's fused
    attention through TransformerEngine on Hopper (ddlsim/data/software.yaml); the choice is named, and the prediction is unchanged by
    naming it."""
    base = ddlsim.load_config(EXAMPLES / "llama2-70b-64-h100.yaml", overrides=LLAMA)
    ds = ddlsim.load_config(EXAMPLES / "llama2-70b-64-h100.yaml",
                            overrides=[*LLAMA, "system.software=deepspeed"])
    assert plan_fields(base)["attention"] == "cudnn"
    assert plan_fields(ds)["attention"] == "fused_softmax"
    assert "rope" in plan_fields(ds)["not_fused"] and "rope" in plan_fields(base)["fused"]
    r = ddlsim.predict(ds)
    assert r.to_dict()["plan"] == plan_fields(ds)


def test_the_plan_line_names_kernels_gemm_library_and_precision():
    r = CliRunner().invoke(app, ["predict", str(EXAMPLES / "megatron-1t-3072-a100.yaml")])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert ("software megatron-lm-2021: attention fused_softmax, GEMMs cublas-11, fp16, eager "
            "dispatch; fused: bias-gelu, bias-dropout-add, layernorm, optimizer; not fused: rope, "
            "cross-entropy, grad-accumulation") in text


def test_plan_overlaps_are_the_active_ones_with_why_others_are_not():
    cfg = ddlsim.load_config(EXAMPLES / "gpt3-175b-1024-a100.yaml")
    plan = plan_fields(cfg)
    assert plan["overlaps"] == ["grad-reduce", "tp-async backward"]
    assert "distributed optimizer" in plan["overlaps_inactive"]["param-gather"]
    assert plan["precision"] == "bf16, fp32 gradients and their reduction"
    fp8 = plan_fields(ddlsim.load_config(EXAMPLES / "gpt3-175b-1024-a100.yaml", overrides=[
        "system.preset=dgx-h100", "train.dtype=fp8"]))
    assert fp8["precision"].startswith("fp8 GEMMs (te_delayed scaling), bf16 elsewhere")


def test_families_that_read_only_the_overlaps_get_no_kernel_fields():
    plan = plan_fields(ddlsim.load_config(EXAMPLES / "proxies" / "resnet50.yaml"))
    assert set(plan) == {"software_stack", "overlaps", "overlaps_inactive"}
