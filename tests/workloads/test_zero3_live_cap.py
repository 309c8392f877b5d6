"""DeepSpeed v0.3.13's cap on live parameters (stage3_max_live_parameters, the stack field
zero3_max_live_parameters): the prefetch issued from a module's pre-hook is refused while
the module and those kept for reuse hold the cap or more elements, and the next module is
then gathered on demand (stage3.py PartitionedParameterCoordinator.prefetch_next_sub_modules)."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.config import build_config
from ddlsim.errors import ConfigError
from ddlsim.software import resolve_software
from ddlsim.workloads.decoder.zero3 import _live_elements, _Unit, module_fetches
from ddlsim.workloads.models.decoder import DecoderShape


def _shape(h: int) -> DecoderShape:
    return DecoderShape(layers=4, hidden=h, heads=32, ffn=4 * h, vocab=51200,
                        max_positions=2048)


def _backward_units(fetch) -> list[_Unit]:
    """One layer's backward under full recomputation: the recomputed forward's modules in
    order, then the backward's in reverse (MODULE_PARTS)."""
    order = [1, 2, 4, 5, 5, 4, 2, 1]
    return [_Unit([], [], module=m) for m in order]


def test_live_elements_count_the_module_and_those_kept_for_its_backward():
    """GPT-3 175B (h = 12,288): the second MLP GEMM (4h² = 604 M) is kept from its
    recomputed forward for its backward; while it is held the first MLP GEMM's backward
    does not count it (released after its own backward)."""
    h = 12288
    qkv, proj, fc = 3 * h * h, h * h, 4 * h * h
    fetch = {f.module: f for f in module_fetches(_shape(h), 1,
                                                 resolve_software("deepspeed-2021"), True)}
    units = _backward_units(fetch)
    _live_elements(units, fetch, backward=True)
    assert [u.live for u in units] == [qkv, proj, fc, fc, fc, fc, proj, qkv]
    forward = [_Unit([], [], module=m) for m in (1, 2, 4, 5)]
    _live_elements(forward, fetch, backward=False)
    assert [u.live for u in forward] == [qkv, proj, fc, fc]


def _run(h: int, overlap: dict) -> float:
    data = {"model": {"name": "gpt", "architecture": "gpt", "num_hidden_layers": 2,
                      "hidden_size": h, "num_attention_heads": 32, "vocab_size": 51200,
                      "max_position_embeddings": 1024},
            "parallel": {"zero_stage": 3},
            "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 1024,
                      "dtype": "fp16", "recompute": "full"},
            "system": {"preset": "dgx-a100", "nodes": 1,
                       "software": {"stack": "deepspeed-2021", "overlap": overlap}}}
    return ddlsim.predict(build_config(data, []), check_fit=False).iteration_time_s


def test_a_cap_every_module_reaches_gathers_everything_on_demand():
    """With a cap of one element every prefetch is refused: the trace is the one without
    prefetch (zero3_prefetch_modules 0), to the bit."""
    assert _run(2048, {"zero3_max_live_parameters": 1}) == \
        _run(2048, {"zero3_prefetch_modules": 0})


def test_without_prefetch_the_cap_changes_nothing():
    """Gathered on demand (zero3_prefetch_modules 0), there is no prefetch to refuse."""
    assert _run(2048, {"zero3_prefetch_modules": 0, "zero3_max_live_parameters": 1}) == \
        _run(2048, {"zero3_prefetch_modules": 0})


def test_the_cap_refuses_only_the_prefetch_after_a_module_over_it():
    """h = 2,048: modules of 4.2 M (the attention output) to 16.8 M elements (the MLP GEMMs).
    The stack's 1e9 is never reached (same as no cap); a cap of 1e7 refuses the prefetch
    after the QKV (12.6 M) and MLP modules only, so it lies between no cap and on demand."""
    free, stack = _run(2048, {"zero3_max_live_parameters": 0}), _run(2048, {})
    partial = _run(2048, {"zero3_max_live_parameters": 10_000_000})
    demand = _run(2048, {"zero3_prefetch_modules": 0})
    assert free == stack
    assert free < partial < demand


def test_the_cap_is_refused_with_per_layer_gathers():
    from ddlsim.software import SoftwareSpec
    with pytest.raises(ConfigError, match="zero3_max_live_parameters = 5"):
        resolve_software(SoftwareSpec(stack="megatron-lm-2021",
                                      overlap={"zero3_max_live_parameters": 5}))


def test_search_tier_refuses_the_same_prefetches_as_the_exact_engine():
    """GPT-3 13B (h = 5,120: QKV 78.6 M, MLP GEMMs 104.9 M elements at TP 1) with a cap of
    1e8: at TP 1 the prefetches after the MLP GEMMs are refused, at TP 4 none; the search
    tier's times equal the exact engine's, with and without recomputation's re-gathers."""
    from ddlsim.search.evaluate import evaluate_grid
    from ddlsim.search.run import plan_overrides
    from ddlsim.search.spec import Constraints
    software = {"stack": "deepspeed-2021", "overlap": {"zero3_max_live_parameters": 100_000_000}}
    data = {"model": "gpt3-13b",   # fp16: DeepSpeed v0.3.13's ZeRO (rule zero_needs_fp16)
            "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 2048,
                      "dtype": "fp16"},
            "system": {"preset": "dgx-h100", "nodes": 2, "software": software}}
    axes = {"parallel.tensor_model_parallel_size": [1, 4], "parallel.zero_stage": [3],
            "train.recompute": ["none", "full"]}
    frame = evaluate_grid(data, None, [], axes, Constraints()).frame
    columns = [c for c in frame.columns if "." in c]
    assert len(frame) == 4
    for i in range(len(frame)):
        cfg = build_config(data, plan_overrides(frame.iloc[i], columns))
        exact = ddlsim.predict(cfg, check_fit=False).iteration_time_s
        assert frame["iteration_time_s"].iloc[i] == pytest.approx(exact, rel=1e-9), \
            (cfg.parallel.tp, cfg.train.recompute)


@pytest.mark.parametrize("cap, held", [
    # no prefetch refused: the output layer (V·h = 629.1 M) with fc2 (4h² = 604.0 M)
    # gathered ahead of it for the backward, larger than any two modules of a layer
    (1_000_000_000, 51200 * 12288 + 4 * 12288**2),
    # every module and the output layer over the cap: each held alone, the output layer
    # the largest (DeepSpeedExamples 2cd968f2's Megatron config, validate_zero3's rows)
    (100_000_000, 51200 * 12288),
    # only the prefetches after QKV (453.0 M), fc1 and fc2 refused: proj with fc1 gathered
    # ahead of it (151.0 M + 604.0 M) is the largest run; the output layer goes alone
    (500_000_000, 12288**2 + 4 * 12288**2),
])
def test_gathered_memory_holds_only_the_prefetches_the_cap_lets_through(cap, held):
    """GPT-3 175B's modules at TP 1 under deepspeed-2021 (one module ahead): a module is held
    ahead of the one computing only if the unit that would prefetch it holds fewer than
    zero3_max_live_parameters elements (stage3.py prefetch_next_sub_modules), as the pass
    builder refuses it; 2 bytes per element."""
    from ddlsim.software import SoftwareSpec
    from ddlsim.workloads.decoder.zero3 import module_hook_bytes
    sw = resolve_software(SoftwareSpec(stack="deepspeed-2021",
                                       overlap={"zero3_max_live_parameters": cap}))
    assert module_hook_bytes(_shape(12288), 1, sw, 2.0) == 2.0 * held
