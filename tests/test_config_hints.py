"""A config written in another framework's words is refused with what the words are here:
FSDP and HSDP, a GPU count, batch sizes, checkpointing, dtype spellings, torchtitan's degrees,
stack names of a framework, and a section's key written at the top level."""

from __future__ import annotations

import copy
import re

import pytest

from ddlsim.config import build_config
from ddlsim.configload import _SECTIONS
from ddlsim.errors import ConfigError
from ddlsim.importers import hints
from ddlsim.software import _STACK_WORDS, stacks
from ddlsim.workloads.registry import iter_families
from tests.conftest import BASE


def _refusal(section: str | None, key: str, value) -> str:
    data = copy.deepcopy(BASE)
    if section is None:
        data[key] = value
    else:
        data[section] = {**data[section], key: value}
    with pytest.raises(ConfigError) as err:
        build_config(data)
    return str(err.value)


@pytest.mark.parametrize("section, key, value, says", [
    ("parallel", "fsdp", True, "FSDP (parameters, gradients and optimizer states sharded"),
    ("parallel", "fsdp", True, "is parallel.zero_stage: 3 with dp_strategy: ddp"),
    ("parallel", "hsdp", True, "parallel.data_parallel_replicate_size"),
    ("parallel", "data_parallel_shard_degree", 8, "the FSDP degree: parallel.data_parallel_size"),
    ("parallel", "tensor_parallel_degree", 2,
     "torchtitan's [parallelism] tensor_parallel_degree is ddlsim's "
     "parallel.tensor_model_parallel_size"),
    ("system", "gpus", 64, "system.nodes × system.devices_per_node"),
    ("system", "num_gpus", 64, "system.nodes × system.devices_per_node"),
    ("system", "gpu", "h100", "the GPU is system.device"),
    ("system", "num_nodes", 4, "the node count is system.nodes"),
    ("train", "batch_size", 8, "train.micro_batch_size is the sequences one rank runs"),
    ("train", "activation_checkpointing", "full", "activation checkpointing is train.recompute"),
    ("train", "gradient_checkpointing", True, "activation checkpointing is train.recompute"),
])
def test_a_key_in_other_words_is_told_what_it_is_here(section, key, value, says):
    msg = _refusal(section, key, value)
    assert f"unknown key {key!r} in {section}; " in msg and says in msg, msg
    assert "allowed keys: " in msg, msg     # still the whole list


def test_a_deepspeed_key_also_says_how_to_convert_the_file():
    msg = _refusal("train", "activation_checkpointing", {"partition_activations": True})
    assert "train.recompute" in msg and "ddlsim import ds_config.json" in msg, msg


@pytest.mark.parametrize("section, key, value, says", [
    ("parallel", "dp_strategy", "fsdp", "is parallel.zero_stage: 3 with dp_strategy: ddp"),
    ("parallel", "dp_strategy", "FSDP2", "torchtitan-2024 and torchtitan-2025 stacks"),
    ("parallel", "dp_strategy", "hsdp", "HSDP is parallel.zero_stage: 3"),
    ("parallel", "dp_strategy", "zero2", "ZeRO is parallel.zero_stage (1: optimizer states"),
    ("train", "dtype", "bfloat16", "it is written 'bf16'"),
    ("train", "dtype", "float16", "it is written 'fp16'"),
    ("train", "dtype", "float8", "it is written 'fp8'"),
    ("train", "recompute", "selective_op", "per-op selective checkpointing is recompute: "
                                           "selective"),
    ("train", "recompute", "layer", "recompute: full with train.recompute_every_n_layers"),
    ("train", "recompute", True, "every layer checkpointed is recompute: full"),
])
def test_a_value_in_other_words_is_told_what_it_is_here(section, key, value, says):
    msg = _refusal(section, key, value)
    assert f"{section}.{key}: Input should be " in msg and says in msg, msg
    assert f"(got {value!r})" in msg, msg
    assert "did you mean" not in msg, msg   # the hint in place of the closest spelling


def test_a_misspelt_value_still_gets_the_closest_choice():
    msg = _refusal("train", "recompute", "selectiv")
    assert "(did you mean 'selective'?)" in msg, msg


@pytest.mark.parametrize("key, home", [
    ("micro_batch_size", "train"), ("nodes", "system"), ("zero_stage", "parallel"),
    ("num_hidden_layers", "model"), ("num_local_experts", "model"),
])
def test_a_sections_key_at_the_top_names_its_section(key, home):
    msg = _refusal(None, key, 1)
    assert f"unknown section {key!r}: it is a key of section {home} ({home}.{key})" in msg, msg


def test_a_word_for_a_field_at_the_top_gets_its_hint():
    assert "unknown section 'gpus'; ddlsim counts the GPUs" in _refusal(None, "gpus", 64)
    assert "unknown section 'foo'" in _refusal(None, "foo", 1)


@pytest.mark.parametrize("name, says", [
    ("fsdp2", "torchtitan-2024 and torchtitan-2025 stacks, PyTorch's FSDP1 fms-fsdp-2024"),
    ("NeMo", "megatron-core-2024 (NeMo 24.07) or megatron-core-2025"),
    ("megatron-bridge", "Megatron-Bridge trains with Megatron-Core: megatron-core-2025"),
    ("torchtitan", "(did you mean 'torchtitan-2025'?)"),
])
def test_a_frameworks_name_for_a_stack_lists_its_stacks(name, says):
    for software in (name, {"stack": name}):
        msg = _refusal("system", "software", software)
        assert f"{name!r} is not a known software stack" in msg and says in msg, msg
        assert "valid string" not in msg, msg   # the name's branch, not the type's


def test_every_field_a_hint_names_exists():
    """A hint that names ``section.field`` names a field of that section (a family's schema
    for ``model``), and every stack it names is one: renaming a field breaks this test."""
    models = [f.schema for _, f in iter_families()]
    texts = [*hints._CONCEPTS.values(), *hints._VALUES.values(),
             *(hint for _, hint in _STACK_WORDS)]
    named = set()
    for text in texts:
        for section, field in re.findall(r"\b(parallel|train|system|model)\.([a-z_]+)", text):
            schemas = models if section == "model" else [_SECTIONS[section]]
            assert any(field in s.model_fields for s in schemas), (section, field, text)
            named.add(f"{section}.{field}")
        for stack in re.findall(r"\b((?:megatron|torchtitan|fms|deepspeed)[a-z0-9-]*-20\d\d)",
                                text):
            assert stack in stacks(), (stack, text)
    assert {"parallel.zero_stage", "train.recompute", "system.nodes"} <= named


def test_virtual_stages_without_a_schedule_are_the_interleaved_schedule():
    """Megatron-LM's --virtual-pipeline-model-parallel-size selects the interleaved schedule
    (it has no flag of its own): virtual stages with the schedule unset run it; a schedule
    written otherwise is refused."""
    data = copy.deepcopy(BASE)
    data["parallel"] = {**data["parallel"], "virtual_pipeline_model_parallel_size": 2}
    assert build_config(data).parallel.schedule == "interleaved"
    data["parallel"]["schedule"] = "1f1b"
    with pytest.raises(ConfigError, match="virtual_pipeline_model_parallel_size = 2 needs "
                                          "schedule = 'interleaved' \\(got '1f1b'\\)"):
        build_config(data)
