"""FSDP2's float8 all-gather and scale precompute (workloads/decoder/fsdp_float8.py), by hand
from torchao eab345c (float8/fsdp_utils.py, float8_tensor.py, float8_utils.py) on Llama 3.1 8B:
h = 4096, q = 4096, kv = 1024, f = 14336, 32 layers, RMSNorm."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from ddlsim import load_config, predict
from ddlsim.errors import ConfigError
from ddlsim.planinfo import plan_fields
from ddlsim.simulator.kernels.fp8recipe import fp8_cast_kernels
from ddlsim.workloads.trace import Collective

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

#: wq, wk, wv, wo, w1, w3, w2 of one Llama 3.1 8B block, and its two RMSNorm weights
FP8 = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336
NORMS = 2 * 4096
DP = 8


def _cfg(on=True, precompute=True, **over):
    kernels = {"fp8_recipe": "tensorwise", "enable_fsdp_float8_all_gather": on,
               "precompute_float8_dynamic_scale_for_fsdp": precompute and on}
    cfg = {"model": {"preset": "llama-3.1-8b"},
           "parallel": {"zero_stage": 3, "data_parallel_size": DP},
           "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 4096,
                     "dtype": "fp8", "recompute": "full"},
           "system": {"preset": "dgx-h100", "nodes": 1,
                      "software": {"stack": "torchtitan-2025", "kernels": kernels}}}
    for path, value in over.items():
        node = cfg
        *head, last = path.split("__")
        for key in head:
            node = node[key]
        node[last] = value
    return load_config(copy.deepcopy(cfg))


def _ops(cfg, block):
    program = cfg.family.build(cfg).classes[0].program
    return list(program.blocks[block].ops)


def test_the_weight_arrives_in_fp8_so_the_linear_casts_no_weight_forward():
    M, N, K = 8192.0, 4096.0, 14336.0
    fwd = fp8_cast_kernels("tensorwise", M, N, K, False, weight_fp8=True)
    bwd = fp8_cast_kernels("tensorwise", M, N, K, True, weight_fp8=True)
    # forward: the input's amax and cast (2 + 4), no weight pass; backward: the output
    # gradient's (2 + 4) and the FP8 weight copied to the other layout (1 + 1)
    assert sum(k.bytes for k in fwd) == 6 * M * K
    assert sum(k.bytes for k in bwd) == 6 * M * N + 2 * K * N


def test_each_layer_gathers_its_float8_weights_at_one_byte():
    on, off = _ops(_cfg(), "F0"), _ops(_cfg(on=False), "F0")
    gathers = [o.payload.bytes for o in on if o.name == "param.all_gather"]
    assert gathers == [FP8 + 2 * NORMS] * 32
    assert [o.payload.bytes for o in off if o.name == "param.all_gather"] == \
        [2 * (FP8 + NORMS)] * 32
    copy_out = [o.payload.bytes for o in on if o.name == "zero3.copy_out"]
    # the embedding's and the head's units (fsdp_edges.py) are gathered in bf16: 2 B read and
    # written per parameter of the 128,256 x 4096 tables (the head with the final norm's 4096)
    emb = 128256 * 4096
    assert copy_out == [2 * 2 * emb] + [2 * (FP8 + 2 * NORMS)] * 32 + [2 * 2 * (emb + 4096)]


@pytest.mark.parametrize("precompute, per_element, amax_reduces", [(True, 27, 0), (False, 33, 7)])
def test_the_shard_is_cast_before_each_gather(precompute, per_element, amax_reduces):
    """Eager casts of each weight shard: to(float32) 2+4, * scale 4+4, clamp 4+4, to(float8)
    4+1 = 27 B per element; without precomputed scales also abs 2+2 and max 2, and one fp32
    amax all-reduce per weight (7) and gather."""
    ops = _ops(_cfg(precompute=precompute), "B0")
    casts = [o for o in ops if o.name == "fsdp.float8_cast"]
    assert len(casts) == 32      # torchtitan 2025 reshards every block: the backward re-gathers
    assert all(o.stream == "dp" for o in casts)
    assert casts[0].payload.bytes == pytest.approx(FP8 / DP * per_element)
    amax = [o for o in ops if o.name == "fsdp.float8_amax"]
    assert sum(o.repeat for o in amax) == amax_reduces * 32
    assert all(o.payload.bytes == 4 for o in amax)
    first = next(i for i, o in enumerate(ops) if o.name == "fsdp.float8_cast")
    gather = next(i for i, o in enumerate(ops) if o.name == "param.all_gather" and i > first)
    assert ops[gather].deps == (gather - 1,)     # the gather waits for its cast


def test_the_scales_are_precomputed_once_after_the_optimizer_step():
    ops = _ops(_cfg(), "update")
    names = [o.name for o in ops]
    assert names.index("optimizer") < names.index("float8.precompute.norm")
    norm = ops[names.index("float8.precompute.norm")].payload
    assert norm.bytes == pytest.approx(2 * FP8 * 32 / DP)     # inf-norm reads each shard
    amax = ops[names.index("float8.precompute.amax")].payload
    assert isinstance(amax, Collective) and amax.op == "all_reduce"
    assert amax.bytes == 7 * 32 * 2                          # one bf16 amax per weight
    assert "float8.precompute.norm" not in [o.name for o in _ops(_cfg(precompute=False),
                                                                   "update")]


def test_float8_gathers_make_the_iteration_faster_and_the_gathered_layers_smaller():
    on, off = predict(_cfg()), predict(_cfg(on=False))
    assert on.iteration_time_s < off.iteration_time_s
    assert on.memory.total < off.memory.total


def test_both_engines_run_it_with_pipelining_and_hsdp():
    pp = _cfg(parallel__pipeline_model_parallel_size=2, parallel__data_parallel_size=4)
    prologue = _ops(pp, "F0.pg")
    gathers = [o.payload.bytes for o in prologue if isinstance(o.payload, Collective)
               and o.payload.op == "all_gather"]
    assert gathers[0] == FP8 + 2 * NORMS                  # the first layer, then the rest
    assert [o.name for o in prologue].count("fsdp.float8_cast") == 2
    hsdp = _cfg(parallel__data_parallel_replicate_size=2)
    for cfg in (pp, hsdp):
        for engine in ("analytical", "des"):
            assert predict(cfg, engine=engine).iteration_time_s > 0


def test_the_plan_names_it():
    assert "float8 all-gather (scales precomputed after the step)" in \
        plan_fields(_cfg())["zero3_gathers"]
    assert "float8" not in plan_fields(_cfg(on=False))["zero3_gathers"]


@pytest.mark.parametrize("over, match", [
    ({"system__software__kernels__fp8_recipe": "rowwise"}, "tensorwise scaling only"),
    ({"train__dtype": "bf16"}, "train.dtype is 'bf16'"),
    ({"parallel__zero_stage": 1}, "zero_stage = 1"),
    ({"parallel__data_parallel_size": 1, "parallel__context_parallel_size": 8},
     "data_parallel_shard_degree > 1"),
])
def test_where_torchao_does_not_gather_in_float8_it_is_refused(over, match):
    with pytest.raises(ConfigError, match="enable_fsdp_float8_all_gather = true: .*" + match):
        _cfg(**over)


def test_moe_layers_are_refused():
    from types import SimpleNamespace

    from ddlsim.workloads.decoder.fsdp_float8 import check
    cfg = _cfg()
    example = Path(__file__).parents[1] / "examples" / "mixtral-8x7b-ep8.yaml"
    moe = load_config(example).model.shape()
    run = SimpleNamespace(software=cfg.software, parallel=cfg.parallel, train=cfg.train,
                          system=cfg.system, model=SimpleNamespace(shape=lambda: moe))
    with pytest.raises(ValueError, match="enable_fsdp_float8_all_gather = true: .*not MoE"):
        check(run)


def test_precompute_without_the_float8_all_gather_is_refused():
    with pytest.raises(ConfigError, match="precompute_float8_dynamic_scale_for_fsdp = true "
                                          "needs enable_fsdp_float8_all_gather"):
        load_config({"model": {"preset": "llama-3.1-8b"},
                     "parallel": {"zero_stage": 3, "data_parallel_size": 8},
                     "train": {"micro_batch_size": 1, "global_batch_size": 8,
                               "seq_length": 4096, "dtype": "fp8"},
                     "system": {"preset": "dgx-h100", "nodes": 1, "software": {
                         "stack": "torchtitan-2025",
                         "kernels": {"precompute_float8_dynamic_scale_for_fsdp": True}}}})


def test_moe_expert_casts_keep_the_compiled_transposing_kernel():
    """Issue 2 of the FP8 loose ends: the experts' cast passes rebuilt for a grouped GEMM
    keep their kernel (torch.compile's transposing cast, fp8recipe.FP8_PASS_KERNELS)."""
    from ddlsim.software import SoftwareSpec, resolve_software
    from ddlsim.workloads.decoder.fp8linear import linear_kernels
    sw = resolve_software(SoftwareSpec(stack="torchtitan-2025", compile=True))
    for backward in (False, True):
        kernels = linear_kernels(sw, "fp8", 4096, 1024, 2048, backward, batch=4)
        plain = [k for k in fp8_cast_kernels("tensorwise", 4096, 1024, 2048, backward, True)]
        casts = [k for k in kernels if k.kind == "memory"]
        assert [k.variant for k in casts] == [k.variant for k in plain]
        assert "inductor_transpose" in [k.variant for k in casts]
        assert [k.bytes for k in casts] == [4 * k.bytes for k in plain]


def test_moe_expert_casts_in_the_trace_keep_their_kernel():
    """The same through the MoE builder (moe.py → fp8linear.with_fp8_casts): every routed
    expert GEMM's cast that also writes a transposed copy is Inductor's transposing kernel."""
    import yaml
    example = Path(__file__).parents[1] / "examples" / "mixtral-8x7b-ep8.yaml"
    doc = yaml.safe_load(example.read_text())
    doc["model"] = {"preset": "mixtral-8x7b"}
    doc["train"]["dtype"] = "fp8"
    # torchao's recipe on a Megatron stack is a what-if (stack rule no_torchao_float8): the
    # builder path is what this checks
    doc["system"].update(preset="dgx-h100", software={
        "stack": "megatron-core-2024", "what_if": True, "compile": True,
        "kernels": {"fp8_recipe": "tensorwise"}})
    cfg = load_config(doc)
    program = cfg.family.build(cfg).classes[0].program
    variants = {o.name: [k.variant for k in o.payload.kernels if k.kind == "memory"]
                for block in program.blocks.values() for o in block.flat.ops
                if ".experts.fc" in o.name and getattr(o.payload, "kernels", None)}
    assert variants["fwd.experts.fc1"][0] == "inductor_transpose"      # x to both layouts
    assert variants["bwd.experts.fc2"] == ["inductor_transpose"] * 2      # gT, wT
