"""``--set`` override values: the plain ones read without the YAML parser
(:func:`ddlsim.configload._plain_value`) are the values the parser gives them."""

import pytest

from ddlsim.configload import _NOT_PLAIN, _plain_value, apply_overrides
from ddlsim.documents import parse_yaml

PLAIN = ["0", "1", "-1", "-0", "8", "1024", "9" * 30, "-" + "9" * 30, "true", "false", "null",
         '"1f1b"', '"interleaved"', '""', '"a.b-c_d"', '"megatron-core-2024"']
PARSED = ["010", "0x10", "+1", "1.5", "1e3", " 1", "1 ", "9" * 31, "True", "yes", "~", "Null",
          "'1f1b'", '"a b"', '"\\n"', "[1, 2]", "{a: 1}", "1f1b", "", ".inf"]


@pytest.mark.parametrize("raw", PLAIN)
def test_plain_value_is_the_parsers(raw):
    value = _plain_value(raw)
    assert value is not _NOT_PLAIN
    expected = parse_yaml(raw, "x")
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("raw", PARSED)
def test_other_text_is_left_to_the_parser(raw):
    assert _plain_value(raw) is _NOT_PLAIN


def test_overrides_read_the_same_values():
    sets = ["parallel.tensor_model_parallel_size=8", "parallel.sequence_parallel=true",
            "parallel.virtual_pipeline_model_parallel_size=null", 'parallel.schedule="1f1b"',
            "train.micro_batch_size=010", "train.recompute=selective"]
    out = apply_overrides({}, sets)
    assert out == {"parallel": {"tensor_model_parallel_size": 8, "sequence_parallel": True,
                                "virtual_pipeline_model_parallel_size": None,
                                "schedule": "1f1b"},
                   "train": {"micro_batch_size": 8, "recompute": "selective"}}


def test_predict_takes_overrides_as_the_cli_set_does():
    """``ddlsim.predict(path, overrides=[...])`` (was refused as "a DES option"): the same
    prediction as the config loaded with them; a validated RunConfig with overrides is
    refused, naming what to do."""
    import ddlsim

    path = "examples/gpt3-175b-1024-a100.yaml"
    sets = ["system=dgx-h100", "parallel.zero_stage=1"]
    got = ddlsim.predict(path, overrides=sets)
    assert got.iteration_time_s == ddlsim.predict(ddlsim.load_config(path, sets)).iteration_time_s
    assert got.config["system"]["device"]["name"].startswith("H100")
    with pytest.raises(ddlsim.ConfigError, match="RunConfig is already validated"):
        ddlsim.predict(ddlsim.load_config(path), overrides=sets)
