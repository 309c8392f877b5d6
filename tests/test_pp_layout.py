"""Megatron-Core's pipeline layout string (``parallel.pipeline_model_parallel_layout``,
ddlsim/workloads/decoder/pp_layout.py): parsed and checked as Megatron-Core d98e8a64's
``PipelineParallelLayerLayout`` does, each chunk's layers handed to the pipeline split."""

from __future__ import annotations

import copy
import warnings

import pytest

import ddlsim
from ddlsim.stackrules.facts import PlanFacts, rules
from ddlsim.workloads.decoder.pp_layout import _unroll, parse_layout
from ddlsim.workloads.decoder.split import chunk_layers

#: Llama 3.1 8B cut to 10 layers, PP 4 × VPP 2 under Megatron-Core of 2025
BASE = {"model": {"preset": "llama-3.1-8b", "num_hidden_layers": 10},
        "parallel": {"pipeline_model_parallel_size": 4, "schedule": "interleaved",
                     "virtual_pipeline_model_parallel_size": 2, "zero_stage": 1},
        "train": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 2048},
        "system": {"preset": "dgx-h100", "nodes": 1, "software": "megatron-core-2025"}}


def config(layout, model=None, **parallel):
    d = copy.deepcopy(BASE)
    d["parallel"].update(parallel, pipeline_model_parallel_layout=layout)
    d["model"].update(model or {})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ddlsim.load_config(d)


def test_deepseek_v3_recipe_layout():
    """Megatron-Bridge's DeepSeek-V3 layout on PP 8 × VPP 4 (61 layers and one MTP layer):
    the first virtual stage the embedding and a layer, thirty of two, the last 'mL' (the MTP
    layer and the loss, no transformer layer); virtual stage k on rank k mod 8."""
    lay = parse_layout("Et|(tt|)*30mL", 8, 4, 61, 1)
    layers = lay.count("t")
    assert layers[0] == (1, 2, 2, 2) and layers[7] == (2, 2, 2, 0)
    assert all(row == (2, 2, 2, 2) for row in layers[1:7])
    assert lay.chunks[7][3] == "mL" and lay.mtp_stage == 7
    assert sum(map(sum, layers)) == 61


def test_repetition_forms_and_commas():
    """``(…)*n`` then ``x*n`` unrolled, commas cosmetic (Megatron-Core's docstring example
    ``"Ettt|(tt|)*29,m|L"`` = [Ettt] + [tt]*29 + [m] + [L])."""
    assert _unroll("Ettt|(tt|)*29,m|L") == "|".join(["Ettt"] + ["tt"] * 29 + ["m", "L"])
    assert _unroll("xy(ab|cd|ef)*2,pq") == "xyab|cd|efab|cd|efpq"   # Megatron-Core's examples
    assert _unroll("(|ab)*2,cd") == "|ab|abcd"
    assert parse_layout("Et*3|t*3|t*2|t*2L", 4, 1, 10, 0).count("t") == ((3,), (3,), (2,), (2,))


def test_layout_sets_the_split():
    """The split of the plan is the layout's: stage s holds virtual stages s and s + PP."""
    cfg = config("Et|tt|t|t|t|tt|t|tL")
    assert chunk_layers(cfg) == ((1, 1), (2, 2), (1, 1), (1, 1))


@pytest.mark.parametrize("layout, match", [
    ("Et|tt|t|t|t|tt|t|txL", "'x' at character 19 of the string is not a layout letter"),
    ("Et|tt|t|t|t|tt|tL", "7 virtual stages, not a multiple of pipeline_model_parallel_size = 4"),
    ("Et|tt|t|t", "virtual_pipeline_model_parallel_size = 2: set it to 1"),
    ("tE|tt|t|t|t|tt|t|tL", "the embedding 'E' must come first"),
    ("Et|tt|t|t|t|tt|tL|t", "the loss 'L' must come last"),
    ("Et|tt|t|t|t|tt|t|ttL", "holds 11 transformer layers 't'; model.num_hidden_layers = 10"),
    ("Et|tt|t|t|t|tt|t|tmL", "holds 1 multi-token-prediction layers 'm'; model.mtp_num_layers = 0"),
])
def test_bad_layouts_are_refused_with_the_rule(layout, match):
    with pytest.raises(ddlsim.ConfigError, match=match.replace("(", r"\(").replace(")", r"\)")):
        config(layout)


def test_mtp_placement_rules():
    """Megatron-Core's MTP rules: no 't' after an 'm', 'm' only in a rank's last chunk;
    ddlsim models it on the last rank only."""
    with pytest.raises(ValueError, match="comes after an MTP layer"):
        parse_layout("Et|t|t|t|t|t|mt|L", 4, 2, 7, 1)   # an 'm' before a 't'
    with pytest.raises(ValueError, match="chunk 0 holds an MTP layer"):
        parse_layout("Et|t|t|tm|||L|", 4, 2, 4, 1)
    with pytest.raises(ValueError, match="'standalone' MTP stage"):
        parse_layout("Et|t|t|t||t|m|L", 4, 2, 5, 1)


def test_exclusive_with_the_other_uneven_splits():
    """Megatron-Core raises ValueError when the layout comes with any of the four options."""
    with pytest.raises(ddlsim.ConfigError, match="cannot be set together with "
                       "account_for_embedding_in_pipeline_split"):
        config("Et|tt|t|t|t|tt|t|tL", account_for_embedding_in_pipeline_split=True)
    with pytest.raises(ddlsim.ConfigError, match="num_layers_in_first_pipeline_stage"):
        config("Et|tt|t|t|t|tt|t|tL", num_layers_in_first_pipeline_stage=2)


def test_layout_counts_the_models_mtp_layers():
    """With model.mtp_num_layers = 1 the layout's 'm' is accepted and the MTP layer joins the
    last chunk (ddlsim/workloads/decoder/mtp.py)."""
    cfg = config("Et|tt|t|t|t|tt|t|mL", model={"num_hidden_layers": 9, "mtp_num_layers": 1})
    assert chunk_layers(cfg) == ((1, 1), (2, 2), (1, 1), (1, 1))


def test_stack_rule_names_the_layout():
    """The stacks without the option refuse it (software.yaml's no_pipeline_layout)."""
    cfg = config("Et|tt|t|t|t|tt|t|tL")
    assert bool(rules()["no_pipeline_layout"].rejects(PlanFacts.of_config(cfg)))
    even = config(None, model={"num_hidden_layers": 8})
    assert not bool(rules()["no_pipeline_layout"].rejects(PlanFacts.of_config(even)))


def test_search_tier_refuses_a_layout():
    """The vectorised search assumes even splits: a dense plan with a layout is refused."""
    from ddlsim.search.decoder import DecoderVectors
    with pytest.raises(ddlsim.ConfigError, match="parallel.pipeline_model_parallel_layout = "
                       "'Et|tt|t|t|t|tt|t|tL': the vectorised search tier"):
        DecoderVectors().prepare(config("Et|tt|t|t|t|tt|t|tL"))


@pytest.mark.parametrize("stack", ["megatron-core-2024", "megatron-lm-2021", "deepspeed"])
def test_stacks_without_the_option_refuse_it(stack):
    """Megatron-Core's layout came in 77732c3628 (2025-06-13): older stacks and other
    frameworks refuse it by name (software.yaml rule no_pipeline_layout)."""
    d = copy.deepcopy(BASE)
    d["parallel"].update(pipeline_model_parallel_layout="Et|tt|t|t|t|tt|t|tL",
                         schedule="1f1b" if stack == "deepspeed" else "interleaved")
    if stack == "deepspeed":
        d["parallel"].update(virtual_pipeline_model_parallel_size=None,
                             pipeline_model_parallel_layout="Ett|ttt|ttt|ttL")
    d["system"]["software"] = stack
    d["parallel"]["zero_stage"] = 0
    with pytest.raises(ddlsim.ConfigError, match="rule no_pipeline_layout"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ddlsim.load_config(d)
