"""Any text is read without a traceback: a Command or Draft, or one ConfigError."""

from __future__ import annotations

import json

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ddlsim.errors import ConfigError
from ddlsim.importers.deepspeed import read_deepspeed
from ddlsim.importers.megatron import read_megatron
from ddlsim.importers.torchtitan import read_torchtitan

WORDS = st.sampled_from(["--num-layers", "4", "$X", "${A[@]}", "A=(", ")", "\\\n", "#", "'",
                         '"', "$((2*", "))", "pretrain_gpt.py", "--bf16", "=", "torchrun",
                         "--nnodes", "if", "\n", "--lr=1", "${N:-2}", "$(x)", " "])


@settings(max_examples=300, deadline=None)
@given(st.lists(WORDS, max_size=30).map(" ".join) | st.text(max_size=200))
def test_megatron_reader_answers_any_text(text):
    try:
        draft = read_megatron(text, "fuzz.sh")
    except ConfigError:
        return
    assert all(isinstance(a, str) and isinstance(o, str) for a, o in draft.notes)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text(max_size=8), lambda c: st.lists(c, max_size=3)
                    | st.dictionaries(st.sampled_from(["zero_optimization", "stage", "bf16",
                                                       "enabled", "optimizer", "type",
                                                       "train_batch_size", "x"]), c,
                                      max_size=4), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(JSON)
@example({"train_batch_size": float("inf")})  # hypothesis's find: OverflowError in int(inf)
def test_deepspeed_reader_answers_any_json(doc):
    draft = read_deepspeed(json.loads(json.dumps(doc)), "fuzz.json")
    assert isinstance(draft.fields, dict)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_torchtitan_reader_answers_any_text(text):
    try:
        read_torchtitan(text, "fuzz.toml")
    except ConfigError:
        pass


SECTIONS = ["model", "training", "parallelism", "activation_checkpoint", "float8", "compile",
            "optimizer", "job"]
KEYS = ["name", "flavor", "converters", "local_batch_size", "global_batch_size", "seq_len",
        "mixed_precision_param", "tensor_parallel_degree", "pipeline_parallel_degree",
        "data_parallel_shard_degree", "data_parallel_replicate_degree", "mode", "enable",
        "recipe_name", "context_parallel_degree", "pipeline_parallel_schedule", "max_norm"]
VALUES = st.sampled_from(["1", "-1", "2", "0", "true", "false", '"x"', '"8B"', '"llama3"',
                          '"full"', "[]", '["float8"]', "1.5", '"1F1B"', '"bfloat16"'])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(SECTIONS),
                       st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=5), max_size=5))
def test_torchtitan_reader_answers_any_toml_of_its_keys(doc):
    text = "\n".join(f"[{s}]\n" + "\n".join(f"{k} = {v}" for k, v in keys.items())
                     for s, keys in doc.items())
    draft = read_torchtitan(text, "fuzz.toml")
    assert isinstance(draft.fields, dict)
