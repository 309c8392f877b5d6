"""The ``zero3_*`` software fields are read by ZeRO-3 plans only: one plan below stage 3 that
sets one itself is refused (:func:`ddlsim.software.check_zero3_fields`, called by
:func:`ddlsim.load_config` and so by ``ddlsim predict``), never silently ignored; a stack's
own values never count, and a search or a sweep over ``parallel.zero_stage`` keeps the
plans below stage 3, which leave the fields unread (issue 28)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import ddlsim
from ddlsim.cli import app
from ddlsim.config import build_config
from ddlsim.errors import ConfigError

#: GPT-3 1.3B on two DGX A100 nodes (16 ranks), under DeepSpeed 2021: per-tensor ZeRO-3,
#: whose stack sets every zero3_* host and bucket field away from zero
BASE = {"model": "gpt3-1.3b",
        # fp16: DeepSpeed v0.3.13 runs ZeRO in fp16 only (deepspeed-2021 rule zero_needs_fp16)
        "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 2048,
                  "recompute": "full", "dtype": "fp16"},
        "system": {"preset": "dgx-a100", "nodes": 2}}


def _config(zero_stage: int, overlap: dict | None = None, stack: str = "deepspeed-2021") -> dict:
    software = {"stack": stack, **({"overlap": overlap} if overlap else {})}
    return {**BASE, "parallel": {"zero_stage": zero_stage},
            "system": {**BASE["system"], "software": software}}


def _words(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("zero_stage", [0, 1, 2])
@pytest.mark.parametrize("field, value, shown", [
    ("zero3_reduce_bucket_size", 5e7, "5e+07"),
    ("zero3_prefetch_modules", 2, "2"),
    ("zero3_host_copy", "3 us", "3e-06 s"),
    ("zero3_gather", "per_tensor", "'per_tensor'"),      # the stack's own value, set again
])
def test_one_plan_below_stage_3_refuses_a_field_it_sets(zero_stage, field, value, shown):
    """The message names the field where it was set, its value, the plan's stage, and
    the two ways out."""
    with pytest.raises(ConfigError) as err:
        ddlsim.load_config(_config(zero_stage, {field: value}))
    assert str(err.value) == (
        f"system.software.overlap.{field} = {shown} applies to ZeRO-3 only, and "
        f"parallel.zero_stage is {zero_stage}: a plan without ZeRO-3 never reads it; remove "
        "it from system.software.overlap, or set parallel.zero_stage: 3")


def test_every_field_set_is_named_at_once():
    """(in the order software_fields declares them)"""
    with pytest.raises(ConfigError, match=r"zero3_prefetch_layers = 2 and system\.software\."
                                          r"overlap\.zero3_gather = 'per_layer' apply to "
                                          r"ZeRO-3 only.* never reads them; remove them"):
        ddlsim.load_config(_config(1, {"zero3_gather": "per_layer",
                                       "zero3_prefetch_layers": 2}, stack="megatron-core-2024"))


@pytest.mark.parametrize("stack", ["deepspeed-2021", "deepspeed", "torchtitan-2024",
                                   "megatron-core-2024"])
def test_a_stacks_own_values_never_count(stack):
    """DeepSpeed 2021's stack sets the bucket, host costs and live cap away from zero;
    torchtitan's, FSDP2's resharding and copy-out: a plan without ZeRO (torchtitan runs no
    ZeRO-1/2) under them loads."""
    cfg = ddlsim.load_config(_config(0, stack=stack))
    assert cfg.parallel.zero_stage == 0
    assert cfg.software.name == stack


def test_stage_3_takes_the_fields():
    cfg = ddlsim.load_config(_config(3, {"zero3_reduce_bucket_size": 5e7}))
    assert cfg.software.zero3_reduce_bucket_size == 50_000_000


def test_a_set_override_is_refused_as_the_file_would_be():
    """``--set parallel.zero_stage=1`` on a ZeRO-3 config that sets a field: one plan."""
    with pytest.raises(ConfigError, match=r"zero3_reduce_bucket_size = 5e\+07 applies to "
                                          r"ZeRO-3 only, and parallel.zero_stage is 1"):
        ddlsim.load_config(_config(3, {"zero3_reduce_bucket_size": 5e7}),
                           ["parallel.zero_stage=1"])


def test_predict_on_the_command_line_refuses_it(tmp_path):
    f = tmp_path / "zero1.yaml"
    f.write_text("model: gpt3-1.3b\nparallel: {zero_stage: 1}\n"
                 "train: {micro_batch_size: 1, global_batch_size: 16, seq_length: 2048, "
                 "dtype: fp16}\n"
                 "system: {preset: dgx-a100, nodes: 2, software: {stack: deepspeed-2021, "
                 "overlap: {zero3_reduce_bucket_size: 5.0e+7}}}\n")
    r = CliRunner().invoke(app, ["predict", str(f)])
    assert r.exit_code == 2
    assert ("system.software.overlap.zero3_reduce_bucket_size = 5e+07 applies to ZeRO-3 only, "
            "and parallel.zero_stage is 1") in _words(r.output)
    assert "Traceback" not in r.output


def test_each_plan_of_a_search_leaves_the_fields_unread():
    """What a search or a sweep builds per plan (build_config) keeps a plan below stage 3,
    the field unread, as the stack's default is."""
    cfg = build_config(_config(1, {"zero3_reduce_bucket_size": 5e7}))
    assert cfg.parallel.zero_stage == 1
    assert cfg.software.zero3_reduce_bucket_size == 50_000_000


def test_a_search_over_zero_stage_keeps_the_plans_below_stage_3():
    frame = ddlsim.search(_config(3, {"zero3_reduce_bucket_size": 5e7}),
                          {"parallel.zero_stage": [1, 3]}, top=1)
    assert sorted(frame["parallel.zero_stage"]) == [1, 3]
