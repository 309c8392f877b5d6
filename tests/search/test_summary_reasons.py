"""The search summary's rejection lines: one per rule, wrapped under their text."""

from __future__ import annotations

import pandas as pd

from ddlsim.search.report import grouped_reasons, summary_text

LAYERS = ("model.num_hidden_layers = 96 is not divisible by pipeline_model_parallel_size × "
          "virtual_pipeline_model_parallel_size = {} × {} = {}")
REJECTED = {"megatron-core-2024 cannot run ZeRO-2 (rule distributed_optimizer_is_zero1)": 30,
            "megatron-core-2024 cannot run ZeRO-3 with pipeline parallelism (rule "
            "zero3_pipeline)": 20,
            LAYERS.format(16, 4, 64): 8, LAYERS.format(32, 2, 64): 12,
            LAYERS.format(64, 6, 384): 12,
            "parallel: sequence_parallel = true needs tensor_model_parallel_size > 1 (got 1)": 5}


def test_reasons_that_differ_only_in_values_are_one_rule():
    """The three layer-count reasons are one line with their 32 plans, shown by the most
    frequent (the first of the two with 12); ZeRO-2 and ZeRO-3 (numbers inside names) stay
    apart; most plans first."""
    assert grouped_reasons(REJECTED) == [
        (LAYERS.format(32, 2, 64), 32, 3),
        ("megatron-core-2024 cannot run ZeRO-2 (rule distributed_optimizer_is_zero1)", 30, 1),
        ("megatron-core-2024 cannot run ZeRO-3 with pipeline parallelism (rule "
         "zero3_pipeline)", 20, 1),
        ("parallel: sequence_parallel = true needs tensor_model_parallel_size > 1 (got 1)", 5,
         1)]


def test_the_summary_wraps_each_reason_under_its_text():
    """At 60 columns no line is longer, every reason's later lines start under its text, the
    counts right-aligned, and nothing of the reasons is lost."""
    frame = pd.DataFrame({"plan": range(3)})
    frame.attrs.update(total=100, rejected=REJECTED)
    text = summary_text(frame, 60)
    lines = text.splitlines()
    assert lines[0] == "100 plans: 3 evaluated, 87 rejected:"
    assert all(len(ln) <= 60 for ln in lines)
    assert lines[1].startswith("  32 × model.num_hidden_layers = 96")
    heads = [ln for ln in lines[1:] if "×" in ln[:8]]
    assert [ln[:7] for ln in heads] == ["  32 × ", "  30 × ", "  20 × ", "   5 × "]
    assert all(ln.startswith(" " * 7) for ln in lines[1:] if ln not in heads)
    words = " ".join(ln.strip() for ln in lines[1:])
    assert "(and 2 more like it, with other values)" in words
    assert "tensor_model_parallel_size > 1 (got 1)" in words
    # without a width: one line per rule, as the frame's JSON keeps every reason apart
    assert len(summary_text(frame).splitlines()) == 5
