"""DeepSpeed 2021's oversized gradients (``zero3_reduce_bucket_size``, per-tensor ZeRO-3): a
gradient over the bucket is reduce-scattered from the next gradient hook, after its module's
release has synchronised the compute stream, so the host issues it once the module's backward
has ended (decoder/zero3_fetch.reduce_host_split; docs/overlap.md)."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.config import build_config
from ddlsim.errors import ConfigError
from ddlsim.workloads.decoder.zero3_fetch import reduce_host_split

#: GPT-3 1.3B (h 2048) at TP 1: QKV 1.26e7, fc1 and fc2 1.68e7 elements, the output
#: projection 4.19e6, biases and norms under 1e4: a bucket of 1e7 holds all but three weights
BASE = {"model": "gpt3-1.3b",
        "parallel": {"zero_stage": 3, "pipeline_model_parallel_size": 1},
        # fp16: DeepSpeed v0.3.13 runs ZeRO in fp16 only (deepspeed-2021 rule zero_needs_fp16)
        "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 2048,
                  "recompute": "full", "dtype": "fp16"},
        "system": {"preset": "dgx-a100", "nodes": 2}}


def _config(bucket: float, stack: str = "deepspeed-2021"):
    software = {"stack": stack, "overlap": {"zero3_reduce_bucket_size": bucket}}
    return build_config({**BASE, "system": {**BASE["system"], "software": software}}, [])


def test_split_counts_the_gradients_over_the_bucket_by_hand():
    """16 ranks, the stack's 2 us per Python op and 10 us per copy_: a reduce-scatter's issue
    is 16 x (view + narrow) + (16 + 1) copy_ launches = 64 + 170 = 234 us. Of three gradients
    (1.26e7, 2,048 and 4,096 elements) under a bucket of 1e7 the first waits for the module's
    end; under 0 none does."""
    sw = _config(1e7).software
    one = 16 * 2 * 2e-6 + 17 * 1e-5
    beside, after = reduce_host_split(sw, 16, (1.26e7, 2048, 4096))
    assert (beside, after) == (pytest.approx(2 * one, rel=1e-12), pytest.approx(one, rel=1e-12))
    beside, after = reduce_host_split(_config(0).software, 16, (1.26e7, 2048, 4096))
    assert (beside, after) == (pytest.approx(3 * one, rel=1e-12), 0.0)


def test_late_issue_follows_the_units_compute():
    """Every late issue on the host waits for the op that ends its unit's backward on the
    compute stream (the gradients' passes), its reduce-scatters wait for it, and three of a
    layer's four weights are late (the output projection fits the bucket); the iteration is
    longer than with every issue beside the backward (the stack's default bucket, 5e8)."""
    from ddlsim.api import build_workload
    cfg = _config(1e7)
    ops = build_workload(cfg).classes[0].program.blocks["B0"].flat.ops
    late = [i for i, op in enumerate(ops) if op.payload.name == "zero3.host_reduce_after"]
    assert len(late) == 3 * cfg.model.num_hidden_layers + 1   # and the word table's
    for i in late:
        assert ops[i].stream == "host"
        assert any(ops[d].stream == "compute" and ops[d].payload.name == "zero3.reduce_passes"
                   for d in ops[i].deps)
        waiting = [op for op in ops[i + 1:i + 6] if op.payload.name.startswith("grad.reduce")]
        assert waiting and all(i in op.deps for op in waiting)
    slower = ddlsim.predict(cfg, check_fit=False).iteration_time_s
    assert slower > ddlsim.predict(_config(5e8), check_fit=False).iteration_time_s


def test_search_tier_times_the_late_issue_as_the_exact_engine():
    """On a small grid (TP 1/2, recomputation none/full) the search tier's iteration under a
    bucket of 1e7 equals the exact engine's."""
    from ddlsim.search.evaluate import evaluate_grid
    from ddlsim.search.run import plan_overrides
    from ddlsim.search.spec import Constraints
    software = {"stack": "deepspeed-2021", "overlap": {"zero3_reduce_bucket_size": 1e7}}
    data = {**BASE, "system": {**BASE["system"], "software": software}}
    axes = {"parallel.tensor_model_parallel_size": [1, 2], "parallel.zero_stage": [3],
            "train.recompute": ["none", "full"]}
    frame = evaluate_grid(data, None, [], axes, Constraints()).frame
    columns = [c for c in frame.columns if "." in c]
    assert len(frame) >= 4
    for i in range(len(frame)):
        cfg = build_config(data, plan_overrides(frame.iloc[i], columns))
        exact = ddlsim.predict(cfg, check_fit=False).iteration_time_s
        assert frame["iteration_time_s"].iloc[i] == pytest.approx(exact, rel=1e-9), \
            (cfg.parallel.tp, cfg.train.recompute)


def test_bucket_off_per_tensor_gathers_is_refused():
    """The option models DeepSpeed 2021's gradient hooks only: under today's DeepSpeed
    (per-module gathers) it is one error naming the field, its value and the way out."""
    with pytest.raises(ConfigError, match=r"zero3_reduce_bucket_size = 1e\+07 applies to "
                                          r"per-tensor ZeRO-3 only.*'per_module'"):
        _config(1e7, "deepspeed")
