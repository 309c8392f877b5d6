"""Transformer Engine's FP8 under sequence parallelism (fp8recipe.fp8_cast_kernels
``gathered``; fp8linear.fp8_sp_gather): the tensor a linear all-gathers is quantized on the
rank's shard, gathered in FP8 (1 byte per element) and transposed after the gather."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.simulator.kernels.fp8recipe import fp8_cast_kernels
from ddlsim.workloads.trace import Collective

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

M, N, K, T = 8192.0, 1280.0, 4096.0, 4


def _bytes(recipe: str, backward: bool, **kw) -> float:
    return sum(k.bytes for k in fp8_cast_kernels(recipe, M, N, K, backward, **kw))


def test_a_gathered_input_is_cast_row_wise_on_the_shard_and_transposed_in_the_backward():
    # te_delayed: cast_transpose of x (2 + 1 + 1 B) and the weight cast (3 B) unsharded;
    # gathered: x cast row-wise on M/T rows (2 + 1 B), its gathered FP8 copy transposed for
    # the weight gradient (1 + 1 B over all M rows)
    assert _bytes("te_delayed", False) == 4 * M * K + 3 * K * N
    assert _bytes("te_delayed", False, gathered="x", shards=T) == 3 * M * K / T + 3 * K * N
    assert _bytes("te_delayed", True, gathered="x", shards=T) == \
        _bytes("te_delayed", True) + 2 * M * K


def test_a_gathered_gradient_is_cast_on_the_shard_then_transposed_whole():
    got = fp8_cast_kernels("te_delayed", M, N, K, True, gathered="g", shards=T)
    assert [k.bytes for k in got] == [3 * M * N / T, 2 * M * N]
    # current scaling: zero, amax over the shard, scale, row-wise cast, transpose
    cur = fp8_cast_kernels("te_current", M, N, K, True, gathered="g", shards=T)
    assert [k.bytes for k in cur][1:] == [2 * M * N / T, 8.0, 3 * M * N / T, 2 * M * N]


def test_torchaos_rowwise_recipe_keeps_its_casts():
    # rowwise gathers in bf16 (torchtitan 07c00d9: float8 TP only for tensorwise)
    for backward in (False, True):
        for tensor in ("x", "g"):
            assert _bytes("rowwise", backward, gathered=tensor, shards=T) == \
                _bytes("rowwise", backward)


def test_one_shard_changes_nothing():
    for backward in (False, True):
        assert _bytes("te_delayed", backward, gathered="g", shards=1) == \
            _bytes("te_delayed", backward)


def _cfg(recipe: str | None, sp: bool = True, model: str = "llama-3-8b") -> dict:
    kernels = {"fp8_recipe": recipe} if recipe else {}
    return {"model": {"preset": model, "num_hidden_layers": 2},
            "parallel": {"tensor_model_parallel_size": 2, "sequence_parallel": sp},
            "train": {"micro_batch_size": 1, "global_batch_size": 4, "seq_length": 4096,
                      "dtype": "fp8" if recipe else "bf16"},
            "system": {"preset": "dgx-h100", "nodes": 1,
                       "software": {"stack": "megatron-core-2025", "kernels": kernels,
                                    # torchao's recipes: a what-if on Megatron-Core
                                    "what_if": recipe in ("tensorwise", "rowwise")}}}


def _gathers(cfg: dict) -> list[Collective]:
    """Stage 0's TP all-gathers (``Block.flat`` has its loops written out)."""
    w = ddlsim.build_workload(ddlsim.load_config(cfg))
    return [o.payload for b in w.classes[0].program.blocks.values() for o in b.flat.ops
            if isinstance(o.payload, Collective) and o.payload.group == "tp"
            and o.payload.op == "all_gather"]


@pytest.mark.parametrize("recipe", ["te_delayed", "te_current"])
def test_the_layers_sequence_parallel_gathers_carry_fp8(recipe):
    # each all-gather feeds a TE linear: qkv's and fc1's inputs (forward, and again for the
    # weight gradient), proj's and fc2's output gradients: 1 byte per element of b·s·h
    act = 4096 * 4096
    got = _gathers(_cfg(recipe))
    bf16 = _gathers(_cfg(None))
    assert len(got) == len(bf16) > 0
    assert {g.bytes for g in got} == {act}
    assert {g.bytes for g in bf16} == {2 * act}


def test_other_recipes_and_no_sequence_parallelism_gather_in_bf16():
    act = 4096 * 4096
    assert {g.bytes for g in _gathers(_cfg("rowwise"))} == {2 * act}
    assert not _gathers(_cfg("te_delayed", sp=False))


def test_the_context_parallel_layer_gathers_fp8_too():
    # with cp > 1 the layer comes from Megatron1D's template: s/cp positions per rank
    cfg = _cfg("te_delayed")
    cfg["parallel"]["context_parallel_size"] = 2
    cfg["system"]["nodes"] = 1
    got = _gathers(cfg)
    assert got and {g.bytes for g in got} == {4096 * 4096 / 2}


def test_the_search_tier_sizes_module_hook_gathers_alike():
    # ZeRO-3 from module hooks (search/decoder_zero3.py _module_pieces restates the TP collectives)
    from ddlsim.config import build_config
    from ddlsim.search.evaluate import evaluate_grid
    from ddlsim.search.run import plan_overrides
    from ddlsim.search.spec import Constraints
    base = _cfg("te_delayed")
    base["system"].update(nodes=2, software={"stack": "deepspeed-2021", "what_if": True,
                                             "overlap": {"zero3_gather": "per_tensor"}})
    base["train"]["global_batch_size"] = 16
    axes = {"parallel.tensor_model_parallel_size": [4], "parallel.sequence_parallel": [True],
            "parallel.zero_stage": [3], "parallel.pipeline_model_parallel_size": [1]}
    frame = evaluate_grid(base, None, [], axes, Constraints()).frame
    columns = [c for c in frame.columns if "." in c]
    assert len(frame) == 1
    exact = ddlsim.predict(build_config(base, plan_overrides(frame.iloc[0], columns)),
                           check_fit=False).iteration_time_s
    assert frame["iteration_time_s"].iloc[0] == pytest.approx(exact, rel=1e-3)
