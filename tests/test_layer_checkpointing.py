"""Checkpointing of every n-th transformer layer (torchtitan's ``selective_ac_option = 'n'``:
``train.recompute: full`` with ``recompute_every_n_layers``; ddlsim/workloads/decoder/sac.py)."""

from __future__ import annotations

import copy
import warnings

import pytest
from hypothesis import given, strategies as st

import ddlsim
from ddlsim.workloads.decoder.sac import checkpointed_layers

#: Llama 3.1 8B cut to 8 layers, FSDP over 16 H100s, torchtitan of 2025
BASE = {"model": {"preset": "llama-3.1-8b", "num_hidden_layers": 8},
        "parallel": {"zero_stage": 3},
        "train": {"micro_batch_size": 1, "global_batch_size": 32, "seq_length": 4096,
                  "recompute": "full"},
        "system": {"preset": "dgx-h100", "nodes": 2, "software": "torchtitan-2025"}}


def config(every: int | None = None, recompute: str = "full", stack=None, **parallel):
    d = copy.deepcopy(BASE)
    d["parallel"].update(parallel)
    d["train"]["recompute"] = recompute
    if every is not None:
        d["train"]["recompute_every_n_layers"] = every
    if stack is not None:
        d["system"]["software"] = stack
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ddlsim.load_config(d)


def predict(cfg):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ddlsim.predict(cfg)


def torchtitans_counter(every: int, first: int, count: int) -> int:
    """torchtitan's own rule, block by block (9dec370 parallelize_llama.py lines 282-290:
    ``_count += 1; if not ac_freq or _count % ac_freq == 0: checkpoint``)."""
    return sum(1 for k in range(first + 1, first + count + 1) if k % every == 0)


@given(st.integers(1, 20), st.integers(0, 200), st.integers(0, 200))
def test_the_count_is_torchtitans_counter(every, first, count):
    assert checkpointed_layers(every, first, count) == torchtitans_counter(every, first, count)


def test_every_layer_is_full_recomputation_and_beyond_the_layers_none():
    full, none = predict(config()), predict(config(recompute="none"))
    assert predict(config(every=1)).iteration_time_s == full.iteration_time_s
    # 8 layers, every 9th: no layer is checkpointed, so the ops are the plain plan's
    assert predict(config(every=9)).iteration_time_s == none.iteration_time_s


def test_every_second_layer_recomputes_half_the_layers():
    """Under FSDP without pipelining each layer is its own unit: every second layer
    checkpointed costs half the recomputation, and its activations lie between."""
    full, none, half = (predict(config(every=e, recompute=r))
                        for e, r in ((None, "full"), (None, "none"), (2, "full")))
    mid = (full.iteration_time_s + none.iteration_time_s) / 2
    assert none.iteration_time_s < half.iteration_time_s < full.iteration_time_s
    assert half.iteration_time_s == pytest.approx(mid, rel=0.02)
    acts = [r.memory.activations for r in (full, half, none)]
    assert acts[0] < acts[1] < acts[2]


def test_pipeline_stages_count_their_own_layers():
    """PP 2: each rank holds 4 layers and counts from its first; every 4th layer is one
    layer per stage, every 5th none (torchtitan's counter runs per process)."""
    pp = {"pipeline_model_parallel_size": 2}
    none = predict(config(recompute="none", **pp)).iteration_time_s
    assert predict(config(every=5, **pp)).iteration_time_s == none
    assert none < predict(config(every=4, **pp)).iteration_time_s \
        < predict(config(every=2, **pp)).iteration_time_s


def test_recompute_every_n_layers_needs_full_recomputation():
    with pytest.raises(ddlsim.ConfigError,
                       match="recompute_every_n_layers = 2 .* needs recompute = 'full'"):
        config(every=2, recompute="selective")


def test_megatron_cannot_checkpoint_every_nth_layer():
    with pytest.raises(ddlsim.ConfigError, match="rule no_every_nth_layer_recompute"):
        config(every=2, stack="megatron-core-2025", zero_stage=1)
