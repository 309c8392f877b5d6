"""Every family is searchable: a model or plan without a vectorised form (ResNet, BERT, DLRM,
CosmoFlow, MoE, context parallelism) is searched by the exact engine, plan by plan, with the
config's own rules as the rejections (ddlsim/search/exact.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import ddlsim
from ddlsim.config import build_config
from ddlsim.errors import ConfigError
from ddlsim.search.exact import EXACT_PLANS
from ddlsim.search.run import load_search, plan_overrides, search

ROOT = Path(__file__).resolve().parent.parent
NEW_KINDS = ["search-resnet50-ddp.yaml", "search-bert-large-pp.yaml", "search-dlrm-dcnv2.yaml",
             "search-cosmoflow.yaml", "search-mixtral-8x7b-ep.yaml", "search-llama3-8b-cp.yaml",
             "search-tp-modes-64.yaml"]


@pytest.mark.parametrize("name", NEW_KINDS)
def test_each_bundled_search_of_a_new_kind_runs_and_its_best_plans_are_exact(name):
    path = ROOT / "examples" / name
    frame = search(path, top=2)
    assert frame.attrs["tier"] == "exact"
    assert len(frame) >= 3 and frame["iteration_time_s"].is_monotonic_increasing
    data, base_dir, _ = load_search(path)
    columns = [c for c in frame.columns if "." in c]
    for i in range(2):   # the frame's figures are ddlsim.predict's, bit for bit
        cfg = build_config(data, plan_overrides(frame.iloc[i], columns), base_dir)
        assert ddlsim.predict(cfg, check_fit=False).iteration_time_s == \
            frame["iteration_time_s"].iloc[i]
        assert frame["exact_error"].iloc[i] == 0.0


def test_a_plan_the_config_refuses_is_a_rejection_with_the_configs_reason():
    frame = search(ROOT / "examples" / "search-mixtral-8x7b-ep.yaml", top=1)
    reasons = frame.attrs["rejected"]
    # EP8 × expert TP (= TP 4) = 32 ranks cannot be carved out of TP·DP = 4·4 at PP4
    assert any("expert_tensor_parallel_size = 8 × 4 = 32 must divide" in r for r in reasons)


def test_labels_show_what_a_family_plans_and_tell_every_plan_apart():
    """A family's labels leave out the decoder's parts it does not read (BERT has no
    sequence parallelism or recomputation; TP 1, PP 1 and ZeRO-0 in every plan of the grid
    are not shown), and plans that differ only in their schedule are told apart (BERT's
    1F1B and GPipe at PP 1 hold different memory)."""
    from ddlsim.search.report import hidden_parts, legend, plan_label, _context_columns

    frame = search(ROOT / "examples" / "search-bert-large-pp.yaml", top=0)
    hide = hidden_parts(frame)
    assert {"sp", "recompute", "tp", "zero"} <= hide and "schedule" not in hide
    extra = _context_columns(frame)
    labels = [plan_label(r, extra, hide=hide) for r in frame.to_dict(orient="records")]
    assert len(set(labels)) == len(labels)
    assert not any(t in label for label in labels for t in ("TP1", "Z0", " SP", "none"))
    assert "gpipe" in legend(frame, True, True) and "ZeRO" not in legend(frame, True, True)
    gpt = search(ROOT / "examples" / "search-gpt3-175b-1024.yaml", top=0)
    assert hidden_parts(gpt) == {"schedule"}    # a decoder: the whole plan, as before


def test_an_exact_grid_over_its_bound_is_refused_before_it_runs():
    axes = {"train.micro_batch_size": list(range(1, EXACT_PLANS + 2))}
    with pytest.raises(ConfigError, match="at most 5,000 plans"):
        search(ROOT / "examples" / "search-resnet50-ddp.yaml", axes=axes, top=1)


def test_the_software_stack_and_the_cluster_preset_are_search_axes():
    """``system.software`` and ``system.preset`` vary as contexts of the vectorised tier: each
    plan is judged by its own stack's rules and timed on its own cluster, as predict would."""
    config = {"model": "gpt3-1.3b",
              "train": {"micro_batch_size": 1, "global_batch_size": 32, "seq_length": 2048},
              "system": {"preset": "dgx-a100", "nodes": 2}}
    axes = {"parallel.tensor_model_parallel_size": [2, 4],
            "parallel.zero_stage": [0, 1],
            "system.software": ["megatron-lm-2021", "megatron-core-2024"],
            "system.preset": ["dgx-a100", "dgx-h100"]}
    frame = search(config, axes=axes, top=3)
    assert frame.attrs["tier"] == "vectorised"
    assert any("megatron-lm-2021 cannot run ZeRO-1/2" in r for r in frame.attrs["rejected"])
    assert set(frame["system.preset"]) == {"dgx-a100", "dgx-h100"}
    assert frame["exact_error"].head(3).abs().max() < 1e-6
    h100 = frame[frame["system.preset"] == "dgx-h100"]["iteration_time_s"].min()
    a100 = frame[frame["system.preset"] == "dgx-a100"]["iteration_time_s"].min()
    assert h100 < a100


def test_model_fields_are_search_axes_in_both_tiers():
    """A ``model.*`` axis is a context of its own: CosmoFlow's spatial grid in the exact tier
    (the spatial group's size follows each grid, a grid the model refuses is a rejection with
    its reason), a decoder's layer count in the vectorised one (its figures the exact
    engine's)."""
    frame = search(ROOT / "examples" / "search-cosmoflow.yaml", top=3)
    grids = {tuple(g) for g in frame["model.spatial_grid"]}
    assert {(1, 1, 1), (2, 1, 1), (2, 2, 1), (4, 1, 1)} <= grids
    assert (frame["parallel.tensor_model_parallel_size"]
            == [g[0] * g[1] * g[2] for g in frame["model.spatial_grid"]]).all()
    assert any("spatial_grid = [2, 2, 2]" in r for r in frame.attrs["rejected"])
    config = {"model": "gpt3-1.3b",
              "train": {"micro_batch_size": 1, "global_batch_size": 32, "seq_length": 2048},
              "system": {"preset": "dgx-a100", "nodes": 2}}
    axes = {"parallel.tensor_model_parallel_size": [1, 2],
            "model.num_hidden_layers": [12, 24]}
    frame = search(config, axes=axes, top=4)
    assert frame.attrs["tier"] == "vectorised"
    assert set(frame["model.num_hidden_layers"]) == {12, 24}
    assert frame["exact_error"].head(4).abs().max() < 1e-9
    deep = frame[frame["model.num_hidden_layers"] == 24]["iteration_time_s"].min()
    assert deep > frame[frame["model.num_hidden_layers"] == 12]["iteration_time_s"].min()


@pytest.mark.parametrize("axes, column", [
    ({"model.hidden_size": [2048, 4096], "parallel.zero_stage": [0, 1]}, "model.hidden_size"),
    ({"model.num_hidden_layers": [12, 24, 30]}, "model.num_hidden_layers"),
    ({"system.preset": ["dgx-a100", "dgx-h100"], "parallel.zero_stage": [0, 1]},
     "system.preset")])
def test_a_context_that_fails_on_the_neutral_plan_keeps_its_own_model_and_system(axes, column):
    """``tp_comm_overlap`` needs TP > 1, so every context's config fails on the neutral plan
    (one device) and is judged plan by plan: each plan was built on the run's model and
    system (a hidden size of 2,048 timed at 4,096, an A100 plan on the H100s, 30 layers
    accepted at PP·VPP = 4 where the config refuses them) until the context's own model and
    system were given to the judge (``planconfig.ContextBases``)."""
    config = {"model": "llama-3-8b",
              "parallel": {"tensor_model_parallel_size": 2, "sequence_parallel": True,
                           "pipeline_model_parallel_size": 2,
                           "virtual_pipeline_model_parallel_size": 2, "schedule": "interleaved",
                           "tp_comm_overlap": "pipelined"},
              "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 2048},
              "system": {"preset": "dgx-h100", "nodes": 2, "software": "megatron-core-2024"}}
    frame = search(config, axes=axes, top=len(axes[column]) * 2)
    assert frame.attrs["tier"] == "vectorised"
    assert frame["exact_error"].abs().max() < 1e-9
    times = frame.groupby(column)["iteration_time_s"].min()
    assert times.nunique() == len(times)
    if column == "model.num_hidden_layers":   # 30 layers do not split over PP·VPP = 4
        assert set(frame[column]) == {12, 24}
        assert any("num_hidden_layers = 30 is not divisible" in r
                   for r in frame.attrs["rejected"])


def test_each_software_stack_of_an_axis_applies_its_own_rules():
    """A ``system.software`` axis: each context is judged by its own stack's rules (the first
    context's stack judged every plan: Megatron-LM 2021's "no ZeRO-1" rejected Megatron-Core's
    ZeRO-1 plans, or let its own through when it came second), and a what-if stack's plans are
    marked as such."""
    config = {"model": "gpt3-760m",
              "train": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 2048},
              "system": {"preset": "dgx-a100", "nodes": 2}}
    for stacks in (["megatron-core-2024", "megatron-lm-2021"],
                   ["megatron-lm-2021", "megatron-core-2024"]):
        frame = search(config, axes={"parallel.zero_stage": [0, 1], "system.software": stacks},
                       top=4)
        plans = {(s, z) for s, z in frame[["system.software", "parallel.zero_stage"]].values}
        assert plans == {("megatron-core-2024", 0), ("megatron-core-2024", 1),
                         ("megatron-lm-2021", 0)}
        assert any("megatron-lm-2021 cannot run ZeRO-1/2" in r for r in frame.attrs["rejected"])
    what_if = {"stack": "megatron-lm-2021", "what_if": True}
    frame = search(config, axes={"parallel.zero_stage": [0, 1],
                                 "system.software": ["megatron-core-2024", what_if]}, top=0)
    marked = {(str(s), z) for s, z, w in
              frame[["system.software", "parallel.zero_stage", "what_if"]].values if w}
    assert marked == {(str(what_if), 1)}


def test_a_derived_dp_fills_each_context_cluster():
    """Without a data-parallel axis DP fills each context's own cluster, as ``predict``
    derives it: two DGX-2 nodes hold 32 GPUs where two DGX A100 nodes hold 16 (every plan
    took the run's 16)."""
    config = {"model": "gpt3-1.3b",
              "train": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 2048,
                        "dtype": "fp16"},
              "system": {"preset": "dgx-a100", "nodes": 2}}
    frame = search(config, axes={"system.preset": ["dgx-a100", "dgx2-v100"],
                                 "parallel.tensor_model_parallel_size": [1, 2, 4]}, top=6)
    gpus = frame.groupby("system.preset")["gpus"].agg(set)
    assert gpus["dgx-a100"] == {16} and gpus["dgx2-v100"] == {32}
    assert frame["exact_error"].abs().max() < 1e-9


def test_the_cost_per_token_counts_each_contexts_own_sequence():
    """A ``train.seq_length`` axis is a context: each plan's cost per million tokens counts
    its own sequence (it took the run's for every plan)."""
    config = {"model": "gpt3-1.3b",
              "train": {"micro_batch_size": 1, "global_batch_size": 32, "seq_length": 2048},
              "system": {"preset": "dgx-a100", "nodes": 2}}
    frame = search(config, axes={"parallel.tensor_model_parallel_size": [1, 2],
                                 "train.seq_length": [1024, 2048]},
                   top=0, price_per_gpu_hour=2.0)
    tokens = frame["train.global_batch_size"] * frame["train.seq_length"]
    expected = frame["cost_per_iteration"] / tokens * 1e6
    assert set(frame["train.seq_length"]) == {1024, 2048}
    assert ((frame["cost_per_million_tokens"] - expected).abs() <= 1e-12 * expected).all()


def test_a_null_axis_value_beside_text_stays_the_default_not_the_text_nan():
    """pandas 3 stores a column of text and None as strings, None read back as NaN; a plan
    rebuilt from such a row set ``flex_dispatcher_backend: 'NaN'`` and was refused."""
    config = {"model": "mixtral-8x7b",
              "parallel": {"pipeline_model_parallel_size": 4, "tensor_model_parallel_size": 2,
                           "expert_model_parallel_size": 8, "sequence_parallel": True,
                           "zero_stage": 1, "moe": {"token_dispatcher_type": "flex"}},
              "train": {"micro_batch_size": 1, "global_batch_size": 128, "seq_length": 4096,
                        "recompute": "full"},
              "system": {"preset": "dgx-h100", "nodes": 8, "software": "megatron-core-2025"}}
    axes = {"parallel.moe.flex_dispatcher_backend": [None, "hybridep"]}
    frame = search(config, axes=axes, top=2)
    column = frame["parallel.moe.flex_dispatcher_backend"].tolist()
    assert sorted(column, key=str) == [None, "hybridep"]
    assert frame["exact_error"].abs().max() < 1e-9


def test_context_axes_are_short_in_labels_and_no_figure_is_cut_at_a_narrow_width():
    """A context-parallel axis reads as ``CP2`` and a stack axis by the stack's name, the
    legend names them and leaves out what no label shows (virtual stages, SP); at a width
    the plans do not fit in, the plan folds onto more lines and every time stays whole."""
    import os

    from rich.console import Console

    from ddlsim.formatting import format_time
    from ddlsim.search.report import _context_columns, legend, plan_label, ranked_table

    config = {"model": "gpt3-1.3b",
              "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 2048},
              "system": {"preset": "dgx-a100", "nodes": 1}}
    axes = {"parallel.context_parallel_size": [1, 2],
            "system.software": ["megatron-core-2024", "torchtitan-2025"],
            "parallel.zero_stage": [0, 3]}
    frame = search(config, axes=axes, top=0)
    labels = [plan_label(r, _context_columns(frame)) for r in frame.to_dict(orient="records")]
    assert any(" CP2 " in label for label in labels)
    assert all(label.endswith(("megatron-core-2024", "torchtitan-2025")) for label in labels)
    text = legend(frame, exact=False, front=True)
    assert "CP context-parallel size" in text and "software stack" in text
    assert "virtual stages" not in text and "SP sequence" not in text
    console = Console(width=50, record=True, file=open(os.devnull, "w"), color_system=None)
    console.print(ranked_table(frame, 3, width=50))
    shown = console.export_text()
    for t in frame["iteration_time_s"].head(3):
        assert format_time(t) in shown


def test_an_exact_tier_reason_keeps_the_stacks_rule_not_its_source():
    """A stack rule's message ends with its source and advice; the reason keeps the rule's
    name whole, as the vectorised tier words it, however long the message before it."""
    from ddlsim.search.exact import first_sentence
    msg = ("software stack 'torchtitan-2024' cannot run tensor parallelism without sequence "
           "parallelism: parallel.tensor_model_parallel_size = 2, parallel.sequence_parallel "
           "= False (rule tp_needs_sp; source: torchtitan 9dec370 apply_tp (lines 129-196)). "
           "Change the plan or system.software, or set system.software: {…}")
    got = first_sentence(msg)
    assert len(got) == 160 and got.endswith("… (rule tp_needs_sp)") and "source" not in got
    assert first_sentence("x (rule a; source: b). Change it") == "x (rule a)"
    assert first_sentence("y" * 200) == "y" * 159 + "…"     # no rule: cut at the limit
