"""Transformer Engine's FP8 current scaling (``te_current``, simulator/kernels/fp8_current.py):
its amax passes over delayed scaling's casts, the amax all-reduce over TP where TE gathers a
tensor in FP8 under sequence parallelism, and per-problem kernels in grouped linears."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.simulator.kernels.fp8_current import (AMAX_BYTES, SCALE_KERNEL_BYTES,
                                                  ZERO_KERNEL_BYTES)
from ddlsim.simulator.kernels.fp8recipe import fp8_cast_kernels, fp8_gemm_variants
from ddlsim.software import SoftwareSpec, resolve_software
from ddlsim.workloads.decoder.fp8linear import linear_kernels
from ddlsim.workloads.trace import Collective

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

M, N, K = 8192.0, 1280.0, 4096.0
#: the two one-thread kernels of each quantized tensor (amax zeroed, scale computed)
TINY = ZERO_KERNEL_BYTES + SCALE_KERNEL_BYTES


def _bytes(recipe: str, backward: bool, **kw) -> float:
    return sum(k.bytes for k in fp8_cast_kernels(recipe, M, N, K, backward, **kw))


def test_current_scaling_costs_delayed_casts_plus_one_amax_read_per_activation():
    # forward: x (2 B a element read for its amax; the weight is quantized once a step, on the
    # first micro-batch); backward: g (quantizer.cpp quantize_impl: zero and compute the amax,
    # compute_scale_from_amax, quantize)
    assert _bytes("te_current", False) - _bytes("te_delayed", False) == 2 * M * K + TINY
    assert _bytes("te_current", True) - _bytes("te_delayed", True) == 2 * M * N + TINY
    # four kernels for x and g where delayed scaling has one
    assert len(fp8_cast_kernels("te_current", M, N, K, False)) == 5
    assert len(fp8_cast_kernels("te_current", M, N, K, True)) == 4
    assert len(fp8_cast_kernels("te_delayed", M, N, K, False)) == 2


def test_an_input_whose_norm_computed_its_amax_skips_only_that_read():
    # LayerNormLinear: layernorm_fwd/rmsnorm_fwd write the amax (FUSED_NORM_AMAX_FP8)
    fused = _bytes("te_current", False, norm_amax=True)
    assert _bytes("te_current", False) - fused == 2 * M * K
    assert len(fp8_cast_kernels("te_current", M, N, K, False, norm_amax=True)) == 4
    # no other recipe has such a pass to leave out
    for recipe in ("te_delayed", "tensorwise", "rowwise"):
        assert _bytes(recipe, False, norm_amax=True) == _bytes(recipe, False)


def test_current_scaling_runs_delayed_scalings_gemm_kernels():
    # Float8CurrentScaling: fprop without, dgrad and wgrad with the split accumulator
    for backward in (False, True):
        assert fp8_gemm_variants("te_current", backward) == \
            fp8_gemm_variants("te_delayed", backward)


@pytest.mark.parametrize("backward", [False, True])
def test_a_grouped_linear_quantizes_each_problem_with_its_own_kernels(backward):
    # cast.cpp multi_tensor_quantize_impl: one fused kernel only for delayed scaling
    def casts(recipe, batch):
        sw = resolve_software(SoftwareSpec(stack="megatron-core-2025",
                                           kernels={"fp8_recipe": recipe}))
        ks = linear_kernels(sw, "fp8", M, N, K, backward, batch)
        return [k for k in ks if k.kind == "memory"]
    assert len(casts("te_delayed", 4)) == len(casts("te_delayed", 1))
    assert len(casts("te_current", 4)) == 4 * len(casts("te_current", 1))
    one, four = casts("te_current", 1), casts("te_current", 4)
    assert sum(k.bytes for k in four) == pytest.approx(4 * sum(k.bytes for k in one))


def _llama(recipe: str, tp: int = 2, sp: bool = True, overlap: str = "off") -> dict:
    return {"model": {"preset": "llama-3-8b", "num_hidden_layers": 2},
            "parallel": {"tensor_model_parallel_size": tp, "sequence_parallel": sp,
                         "tp_comm_overlap": overlap},
            "train": {"micro_batch_size": 1, "global_batch_size": 8 // tp,
                      "seq_length": 4096, "dtype": "fp8"},
            "system": {"preset": "dgx-h100", "nodes": 1,
                       "software": {"stack": "megatron-core-2025",
                                    "kernels": {"fp8_recipe": recipe}}}}


def _amax_collectives(cfg: dict) -> dict[str, list[Collective]]:
    """Stage 0's amax all-reduces per block, each as often as it runs (``Block.flat`` has its
    loops written out)."""
    w = ddlsim.build_workload(ddlsim.load_config(cfg))
    blocks = w.classes[0].program.blocks
    return {name: [o.payload for o in b.flat.ops for _ in range(o.repeat)
                   if isinstance(o.payload, Collective) and o.payload.name.endswith(".amax")]
            for name, b in blocks.items()}


@pytest.mark.parametrize("overlap", ["off", "pipelined"])
def test_the_amax_all_reduce_runs_where_te_gathers_in_fp8(overlap):
    # per layer: the inputs of qkv and fc1 (column-parallel) in the forward, the output
    # gradients of proj and fc2 (row-parallel) in the backward; 4 B of fp32 amax over TP
    found = _amax_collectives(_llama("te_current", overlap=overlap))
    assert len(found["F0"]) == 2 * 2 and len(found["B0"]) == 2 * 2
    assert all(c.op == "all_reduce" and c.group == "tp" and c.bytes == AMAX_BYTES
               for c in found["F0"] + found["B0"])


@pytest.mark.parametrize("cfg", [_llama("te_delayed"), _llama("te_current", sp=False),
                                 _llama("te_current", tp=1, sp=False)])
def test_no_amax_all_reduce_without_current_scaling_or_sequence_parallel_gathers(cfg):
    assert not any(_amax_collectives(cfg).values())


def test_the_amax_all_reduce_waits_on_the_compute_stream_under_userbuffers():
    # TE waits for it (->wait()) before the scale kernel: never overlapped as a ring exchange
    from ddlsim.workloads.decoder.tp_overlap import _role
    c = Collective("fwd.attn.ag.amax", "all_reduce", "tp", AMAX_BYTES)
    assert _role(c, False, "pipelined") is None and _role(c, True, "pipelined") is None


def test_current_scaling_is_slower_than_delayed_in_both_engines():
    for engine in ("analytical", "des"):
        t = {r: ddlsim.predict(_llama(r), engine).to_dict()["iteration_time_s"]
             for r in ("te_delayed", "te_current")}
        assert t["te_current"] > t["te_delayed"]


def test_the_bridge_rows_run_current_scaling_and_nemo_2407_delayed():
    # Megatron-Bridge's fp8 "cs" precision (FP8-CS tables); NeMo 24.07's TE v1.8 had only
    # DelayedScaling
    from benchscripts import load_script
    vb, vh, vm = (load_script(n) for n in ("validate_bridge", "validate_h100", "validate_moe"))
    def recipe(cfg):
        return cfg["system"]["software"]["kernels"].get("fp8_recipe")
    assert {recipe(vb.config(r)) for r in vb.rows()} == {"te_current"}
    assert {recipe(vh.config(r)) for r in vh.rows()} == {"te_delayed"}
    assert {recipe(vm.config(r)) for r in vm.rows()} == {"te_current"}
    assert all("FP8-CS" not in vm.approximated(r) for r in vm.rows())


def test_an_moe_layer_reduces_one_amax_each_way():
    # its one sequence-parallel TE linear pair: qkv's input (forward), proj's output
    # gradient (backward); the experts are not TP-split (expert TP 1)
    cfg = {"model": {"preset": "qwen3-30b-a3b", "num_hidden_layers": 2},
           "parallel": {"tensor_model_parallel_size": 2, "sequence_parallel": True,
                        "expert_model_parallel_size": 4, "expert_tensor_parallel_size": 1,
                        "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True}},
           "train": {"micro_batch_size": 1, "global_batch_size": 4, "seq_length": 4096,
                     "dtype": "fp8"},
           "system": {"preset": "dgx-h100", "nodes": 1,
                      "software": {"stack": "megatron-core-2025",
                                   "kernels": {"fp8_recipe": "te_current"}}}}
    found = _amax_collectives(cfg)
    assert len(found["F0"]) == 2 and len(found["B0"]) == 2


@pytest.mark.parametrize("flag, recipe", [("tensorwise", "te_current"),
                                          ("delayed", "te_delayed")])
def test_megatron_fp8_recipe_flag_is_imported(tmp_path, flag, recipe):
    # megatron/core/fp8_utils.py: tensorwise -> TE Float8CurrentScaling, delayed -> DelayedScaling
    from ddlsim.importers import import_config
    script = tmp_path / "run.sh"
    script.write_text(
        "torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py --num-layers 32 "
        "--hidden-size 4096 --num-attention-heads 32 --seq-length 2048 "
        "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 64 --bf16 "
        f"--fp8-format hybrid --fp8-recipe {flag}\n")
    cfg = import_config([script], system="dgx-h100").config
    assert cfg["system"]["software"]["kernels"]["fp8_recipe"] == recipe


def test_an_sp_gathered_gradient_reads_only_the_ranks_shard_for_its_amax():
    # distributed.py _all_gather_fp8: each rank quantizes its sequence shard, then gathers
    def amax(**kw):
        ks = fp8_cast_kernels("te_current", M, N, K, True, **kw)
        return ks[1].bytes    # zero, amax, scale, cast
    assert amax() == 2 * M * N
    assert amax(gathered="g", shards=4) == 2 * M * N / 4


def test_the_dense_layers_row_parallel_gradients_are_read_per_shard():
    import warnings
    from ddlsim.workloads.decoder.layerkernels import layer_kernels
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shape = ddlsim.load_config(_llama("te_current")).model.shape()
    sw = resolve_software(SoftwareSpec(stack="megatron-core-2025",
                                       kernels={"fp8_recipe": "te_current"}))
    def casts(part, sp):
        ks = layer_kernels(shape, sw, 1, 4096, 4, sp, "fp8")[part]
        return sum(k.bytes for k in ks if k.kind == "memory" and k.bytes > 16)
    # the gradient [b·s, h]: its amax read (2 B) and row-wise cast (3 B) over s/4 positions,
    # then the gathered FP8 tensor transposed (2 B) where the cast-transpose wrote 4 B
    n = 4096 * shape.hidden
    for part in ("bwd.mlp.fc2", "bwd.attn.proj"):
        assert casts(part, False) - casts(part, True) == pytest.approx(
            2 * n * 3 / 4 + 4 * n - (3 * n / 4 + 2 * n))