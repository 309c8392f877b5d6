"""Section-level validation: every broken section reported at once, "did you mean", sections of
the wrong kind, malformed overrides, the same topology rules for both engines, and no input
that makes load_config raise anything but a DDLSimError."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ddlsim
from ddlsim.config import build_config
from ddlsim.errors import ConfigError, DDLSimError
from tests.conftest import BASE


def test_every_broken_section_is_reported_at_once():
    data = {"model": {"preset": "gpt3-1.3b", "hiden_size": 3},
            "parallel": {"schedule": "1f1c"},
            "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 64,
                      "dtype": "bf17"},
            "system": "dgx-a10", "sytem": 1}
    with pytest.raises(ConfigError) as err:
        build_config(data)
    msg = str(err.value)
    assert msg.startswith("5 problems: (1) ") and "\n" not in msg
    for part in ("unknown section 'sytem' (did you mean 'system'?)",
                 "system preset 'dgx-a10' does not exist (did you mean 'dgx-a100'?)",
                 "unknown key 'hiden_size' in model (did you mean 'hidden_size'?)",
                 "parallel.schedule: Input should be 'gpipe', '1f1b' or 'interleaved' "
                 "(did you mean '1f1b'?) (got '1f1c')",
                 "train.dtype: Input should be 'fp32', 'tf32', 'fp16', 'bf16' or 'fp8' "
                 "(did you mean 'bf16'?)"):
        assert part in msg


def test_did_you_mean_for_nested_keys_and_algorithms():
    with pytest.raises(ConfigError) as err:
        build_config(copy.deepcopy(BASE), ["system.nic.bandwith_Bps=1e9",
                                           "parallel.collective_algorithm={all_reduce: rng}"])
    assert "unknown key 'bandwith_Bps' in system.nic (did you mean 'bandwidth_Bps'?)" in str(err.value)
    assert "all_reduce = 'rng' is not an algorithm for all_reduce (did you mean 'ring'?)" in str(err.value)


@pytest.mark.parametrize("value, shown", [([1, 2], "a list [1, 2]"), (3, "a number 3"),
                                           (None, "null"), (True, "a boolean True")])
def test_a_section_of_the_wrong_kind(value, shown):
    data = {**copy.deepcopy(BASE), "system": value}
    with pytest.raises(ConfigError) as err:
        build_config(data)
    assert (f"section 'system' must be a mapping of its fields or the name of a system preset "
            f"(see `ddlsim presets system`); got {shown}") in str(err.value)


def test_a_preset_that_is_not_a_name():
    data = {**copy.deepcopy(BASE), "model": {"preset": ["gpt3-1.3b"]}}
    with pytest.raises(ConfigError, match=r"model.preset must be the name of a model preset; "
                                          r"got a list"):
        build_config(data)


@pytest.mark.parametrize("item, message", [
    ("parallel.tp", "must look like section.key=value"),
    ("=4", "the path '' must be a section and one or more keys"),
    ("train=4", "the path 'train' must be a section and one or more keys"),
    ("train..seq_length=4", "the path 'train..seq_length'"),
    ("trian.seq_length=4", "unknown section 'trian' (did you mean 'train'?)"),
    ("train.seq_length.x=4", "train.seq_length is a number, not a mapping, so it has no key 'x'"),
    ("train.seq_length=[1,", "not valid YAML"),
    ("train.seq_length=&a [*a]", "recursive documents are not allowed"),
    ("train.seq_length={a: 1, a: 2}", "duplicate key 'a'"),
])
def test_malformed_overrides(item, message):
    with pytest.raises(ConfigError) as err:
        build_config(copy.deepcopy(BASE), [item])
    assert message in str(err.value) and item in str(err.value)


@pytest.mark.parametrize("network, message", [
    ({"topology": "torus", "torus_dims": [3, 3]}, "torus_dims = [3, 3] holds 9 nodes but the "
                                                  "system has nodes = 4"),
    ({"topology": "torus", "torus_dims": [0, 4]}, "torus_dims.0: Input should be greater than 0"),
    ({"topology": "torus", "torus_dims": []}, "torus_dims = [] names no dimension"),
    ({"topology": "torus", "torus_dims": [1] * 9 + [4]}, "10 is above the plausible maximum 8"),
    ({"topology": "fat_tree", "torus_dims": [2, 2]}, "applies only to topology = 'torus'"),
    ({"topology": "torus", "torus_dims": [True, 4]}, "expected a number, got the boolean true"),
])
def test_both_engines_refuse_the_same_torus(network, message):
    """The run config (both engines) and the topology builder (the DES) refuse alike."""
    from ddlsim.topologies import build_topology

    system = {"preset": "dgx-a100", "nodes": 4, "network": network}
    with pytest.raises(ConfigError) as by_config:
        build_config({**copy.deepcopy(BASE), "system": system})
    with pytest.raises(ConfigError) as by_builder:
        build_topology(system)
    assert message in str(by_config.value) and message in str(by_builder.value)


def test_a_valid_torus_runs_on_both_engines():
    cfg = build_config({**copy.deepcopy(BASE), "system": {
        "preset": "dgx-a100", "nodes": 4, "network": {"topology": "torus", "torus_dims": [2, 2]}}},
        ["train.global_batch_size=16", "parallel.data_parallel_size=8",
         "parallel.tensor_model_parallel_size=2", "parallel.pipeline_model_parallel_size=2"])
    assert ddlsim.predict(cfg, "des").iteration_time_s > 0
    assert ddlsim.predict(cfg).iteration_time_s > 0


def test_dragonfly_global_links_refused_before_the_build():
    from ddlsim.topologies.spec import parse_spec

    with pytest.raises(ConfigError, match="global_links = 5 exceeds the routers of the smallest "
                                          r"dragonfly group \(2\)"):
        parse_spec({"preset": "dgx-a100", "nodes": 8,
                    "network": {"topology": "dragonfly", "routers_per_group": 3,
                                "global_links": 5}})


# --------------------------------------------------------------- no traceback, by property
_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["200 Gb/s", "1e400 s", "inf Gb/s", "5 μs", "gpt3-175b", "dgx-a100", "ring",
                     "1e9", "torus", "interleaved", "-3", "80 GiB"]))
_VALUE = st.recursive(_LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
_PATHS = ["model", "parallel", "train", "system", "model.num_hidden_layers", "model.hidden_size",
          "parallel.tensor_model_parallel_size", "parallel.zero_stage", "parallel.schedule",
          "parallel.collective_algorithm", "train.global_batch_size", "train.micro_batch_size",
          "system.nodes", "system.nic", "system.nic.bandwidth_Bps", "system.nic.latency_s",
          "system.network", "system.network.torus_dims", "system.network.oversubscription",
          "system.placement", "system.device.peak_flops", "extra"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(_PATHS), _VALUE), min_size=1, max_size=3))
def test_load_config_raises_only_ddlsim_errors(changes):
    data = copy.deepcopy(BASE)
    for path, value in changes:
        node, *keys = path.split(".")
        if not keys:
            data[node] = value
            continue
        section = data.get(node)
        if not isinstance(section, dict):
            section = data[node] = {"preset": section} if isinstance(section, str) else {}
        for k in keys[:-1]:
            section = section.setdefault(k, {}) if isinstance(section.get(k, {}), dict) else {}
        section[keys[-1]] = value
    try:
        ddlsim.load_config(data)
    except DDLSimError:
        pass


@pytest.mark.parametrize("source", [123, None, ["model"], b"model: x"])
def test_load_config_of_something_else(source):
    with pytest.raises(ConfigError, match="a run config is a path to a YAML/JSON file or a mapping"):
        ddlsim.load_config(source)


def test_a_missing_section_says_what_would_fill_it():
    """A run config without train names its required keys; without model or system, a
    preset and the command that lists them (all problems in one message)."""
    with pytest.raises(ConfigError, match=r"the config has no 'train' section; it needs "
                                          r"micro_batch_size, global_batch_size, seq_length"):
        ddlsim.load_config({"model": "gpt2", "system": "dgx-h100"})
    with pytest.raises(ConfigError) as got:
        ddlsim.load_config({"train": {"micro_batch_size": 1, "global_batch_size": 8,
                                      "seq_length": 128}})
    text = str(got.value)
    assert "2 problems" in text and "`ddlsim presets model`" in text
    assert "no 'system' section; give a preset (`system: NAME`" in text


@pytest.mark.parametrize("model", ["resnet50", "mlperf-hpc-cosmoflow", "dlrm-proxy"])
def test_a_sample_that_is_not_a_sequence_needs_no_seq_length(model):
    """An image, a volume, a row of features: train.seq_length left out is the family's 1
    (it was required, and had to be written as 1)."""
    cfg = ddlsim.load_config({"model": model, "train": {"micro_batch_size": 4,
                                                        "global_batch_size": 32},
                              "system": {"preset": "dgx-a100", "nodes": 1}})
    assert cfg.train.seq_length == 1


def test_a_sequence_model_without_seq_length_is_told_to_give_it():
    with pytest.raises(ConfigError, match=r"train.seq_length: Field required: a gpt model's "
                                          r"samples are sequences"):
        ddlsim.load_config({"model": "gpt2", "train": {"micro_batch_size": 1,
                                                       "global_batch_size": 8},
                            "system": "dgx-h100"})
