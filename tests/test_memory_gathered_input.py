"""Under torchtitan's DTensor tensor parallelism with sequence parallelism, autograd saves the
all-gathered input of each column-parallel linear (``wq/wk/wv``, ``w1/w3``) for the weight
gradient, ``b·s·h`` per module input, where Megatron saves the ``b·s·h/t`` shard and gathers it
again (Korthikanti et al. 2022 §4.2.2). Memory follows the time side's rule
(``dtensor.regathers_input``): bytes derived by hand, the search tier's memory the exact one's.
"""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.search.family import vector_family
from ddlsim.simulator.kernels.dtensor import keeps_gathered_input, regathers_input

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

B, S, H, T, LAYERS = 2, 2048, 4096, 4, 2          # llama-3.1-8b, two layers


def _cfg(recompute: str, saves: bool | None = None, dtype: str = "bf16", tp: int = T) -> dict:
    kernels = {} if saves is None else {"sp_saves_gathered_input": saves}
    return {"model": {"preset": "llama-3.1-8b", "num_hidden_layers": LAYERS},
            "parallel": {"tensor_model_parallel_size": tp, "sequence_parallel": tp > 1,
                         "zero_stage": 3, "data_parallel_size": 8 // tp},
            "train": {"micro_batch_size": B, "global_batch_size": B * 8 // tp,
                      "seq_length": S, "dtype": dtype, "recompute": recompute},
            "system": {"preset": "dgx-h100", "nodes": 1,
                       "software": {"stack": "torchtitan-2024", "kernels": kernels}}}


def _activations(cfg: dict) -> float:
    return ddlsim.memory_per_device(ddlsim.load_config(cfg)).activations


def _extra(per_element: int, t: int = T) -> float:
    """Two whole inputs (QKV's, the MLP's) in place of their shards, one layer."""
    return 2 * per_element * B * S * H * (1 - 1 / t)


def test_the_memory_rule_is_the_negation_of_the_time_rule():
    sw = ddlsim.load_config(_cfg("none")).software
    for recompute in ("none", "selective", "full"):
        assert keeps_gathered_input(sw, recompute) is not regathers_input(sw, recompute)
    assert keeps_gathered_input(sw, "full") and not keeps_gathered_input(sw, "selective")


@pytest.mark.parametrize("recompute, layers_whole",
                         [("none", LAYERS), ("full", 1), ("selective", 1)])
def test_a_layer_kept_whole_holds_its_gathered_inputs(recompute, layers_whole):
    """No recomputation: every layer's; full and op-level selective checkpointing: the one
    layer its backward rebuilds (the recomputed forward gathers the inputs again and autograd
    saves them, :func:`ddlsim.workloads.decoder.memory.rebuilt_bytes`)."""
    extra = _activations(_cfg(recompute)) - _activations(_cfg(recompute, saves=False))
    assert extra == pytest.approx(layers_whole * _extra(2), rel=1e-12)


def test_fp8_keeps_the_gathered_float8_input():
    """torchao eab345c float8_linear.py: manual_float8_matmul_with_args_in_float8 saves
    input_fp8, the tensor gathered in float8 (1 B)."""
    extra = _activations(_cfg("full", dtype="fp8")) - _activations(
        _cfg("full", saves=False, dtype="fp8"))
    assert extra == pytest.approx(_extra(1), rel=1e-12)


def test_op_level_selective_checkpointing_keeps_none_and_one_rank_has_none():
    """Op-level checkpointing's kept layers hold no gathered input (the save list keeps the
    reduce-scatter, not the all-gather): only the rebuilt layer's differ (above)."""
    from ddlsim.workloads.decoder.memory import layer_kept_bytes
    from ddlsim.workloads.decoder.layerkernels import activation_kinds
    for saves in (True, False):
        run = ddlsim.load_config(_cfg("selective", saves=saves))
        kinds = activation_kinds(run, "selective")
        assert not kinds["gathered_input"]
        assert layer_kept_bytes(run.model.shape(), run.software, B, S, T, True, "selective",
                                kinds) == layer_kept_bytes(
            run.model.shape(), run.software, B, S, T, True, "selective",
            {**kinds, "gathered_input": True})
    assert _activations(_cfg("none", tp=1)) == _activations(_cfg("none", saves=False, tp=1))


def test_the_shape_counts_it_only_under_sequence_parallelism():
    sh = ddlsim.load_config(_cfg("none")).model.shape()
    for sp in (False, True):
        diff = (sh.layer_activation_bytes(B, S, T, sp, "none", gathered_input=True)
                - sh.layer_activation_bytes(B, S, T, sp, "none"))
        assert diff == pytest.approx(_extra(2) if sp else 0.0, rel=1e-12, abs=0)


def test_the_search_tiers_memory_is_the_exact_ones():
    """torchtitan's plans are searched by the exact engine (op-level checkpointing is not
    vectorised); the vectorised tier's memory takes the same keyword per plan's recompute
    (the base config's selective would keep none), checked on a Megatron-Core plan told its
    linears keep the gathered input (a what-if)."""
    from ddlsim.search.plans import VECTOR_FIELDS, enumerate_plans
    cfg = _cfg("selective", saves=True)
    cfg["parallel"]["zero_stage"] = 1
    cfg["system"]["software"] = {"stack": "megatron-core-2024", "what_if": True,
                                 "kernels": {"sp_saves_gathered_input": True}}
    run = ddlsim.load_config(cfg)
    family = vector_family(run.model.architecture)
    axis = ["none", "full"]
    base = {p: getattr(getattr(run, p.split(".")[0]), p.split(".")[1]) for p in VECTOR_FIELDS}
    base["parallel.schedule"] = run.parallel.schedule
    plans = enumerate_plans({"train.recompute": axis}, base, run.system.num_devices)
    memory, _ = family.memory(family.prepare(run), plans)
    for k, recompute in enumerate(axis):
        one = ddlsim.load_config({**cfg, "train": {**cfg["train"], "recompute": recompute}})
        assert memory[k] == pytest.approx(ddlsim.memory_per_device(one).total, rel=1e-12)
        off = {**cfg, "system": {**cfg["system"], "software": {
            **cfg["system"]["software"], "kernels": {"sp_saves_gathered_input": False}}}}
        off["train"] = {**cfg["train"], "recompute": recompute}
        assert _activations(off) < ddlsim.memory_per_device(one).activations
