"""The torchtitan stacks (FSDP2) and ZeRO-3 inside pipeline stages, with context parallelism
and asynchronous TP (ddlsim/workloads/decoder/fsdp.py, docs/stacks.md)."""

from __future__ import annotations

import copy
import warnings

import pytest

import ddlsim
from ddlsim.software import COMPILE_FUSIONS, SoftwareSpec, resolve_software, stacks
from ddlsim.stackrules import stack_rules
from ddlsim.workloads.decoder.builder import StageBuilder
from ddlsim.workloads.decoder.overlap import overlap_phrase

STACKS = ("torchtitan-2024", "torchtitan-2025")

#: Llama 3.1 8B shortened to 8 layers on 2 DGX H100 nodes, FSDP over every rank
BASE = {"model": {"preset": "llama-3.1-8b", "num_hidden_layers": 8},
        "parallel": {"zero_stage": 3},
        "train": {"micro_batch_size": 1, "global_batch_size": 32, "seq_length": 4096,
                  "recompute": "full"},
        "system": {"preset": "dgx-h100", "nodes": 2, "software": "torchtitan-2025"}}

#: parameters of one Llama 3.1 8B layer: attention 2·4096² + 2·1024·4096, SwiGLU
#: 3·4096·14336, two RMSNorm weights of 4096
LAYER = 2 * 4096 ** 2 + 2 * 1024 * 4096 + 3 * 4096 * 14336 + 2 * 4096
#: its edges (workloads/decoder/fsdp_edges.py): the embedding, 128,256 × 4096, and the head,
#: the untied output layer of the same size and the final norm's 4096
EMB, HEAD = 128256 * 4096, 128256 * 4096 + 4096


def config(software=None, recompute=None, **parallel):
    d = copy.deepcopy(BASE)
    d["parallel"].update(parallel)
    if recompute is not None:
        d["train"]["recompute"] = recompute
    if software is not None:
        d["system"]["software"] = software
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ddlsim.load_config(d)


def predict(cfg, engine="analytical"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ddlsim.predict(cfg, engine=engine, check_fit=False)


def test_layer_parameters_match_the_shape():
    assert config().model.shape().layer_params == LAYER


@pytest.mark.parametrize("stack", STACKS)
def test_stacks_are_named_with_a_source_for_every_field_and_rule(stack):
    assert stack in stacks()
    sw = resolve_software(stack)
    assert sw.zero3_gather == "per_layer" and sw.zero3_copy_out
    assert sw.grad_reduce_dtype == "fp32" and sw.attention == "flash2"
    assert all(isinstance(s, str) and s.strip() for s in sw.sources.values())
    for field in ("attention", "fused_layernorm", "fused_optimizer", "grad_reduce_dtype",
                  "zero3_gather", "zero3_reshard_after_forward", "compile"):
        assert ("torchtitan " + ("9dec370" if stack.endswith("2024") else "07c00d9")
                in sw.sources[field]), field
    names = [rule.name for rule, _ in stack_rules(stack)]
    assert names == ["tp_needs_sp", "no_pipeline_layout", "no_transformer_engine_fp8",
                     "no_recompute_modules",
                     "async_tp_needs_compile", "async_tp_is_torchs", "no_zero12",
                     "no_megatron_fsdp"] + (["no_torchao_rowwise"] if stack.endswith("2024")
                                            else []) + ["no_te_cross_entropy",
                                                        "no_fp8_param_gather"]


def test_eager_fusions_and_the_optimizer_follow_each_commit():
    old, new = resolve_software("torchtitan-2024"), resolve_software("torchtitan-2025")
    for sw in (old, new):
        assert not any(getattr(sw, f) for f in COMPILE_FUSIONS)
        assert sw.host_dispatch == "eager"
    # 2024: optimizer.fused off by default (foreach); 2025: implementation 'fused'
    assert not old.fused_optimizer and new.fused_optimizer
    assert old.zero3_reshard_after_forward == "not_with_pp_nor_last"
    assert new.zero3_reshard_after_forward == "not_with_pp"


def test_compile_switches_on_its_fusions_but_not_a_field_the_config_sets():
    sw = resolve_software(SoftwareSpec(stack="torchtitan-2025", compile=True))
    assert all(getattr(sw, f) for f in COMPILE_FUSIONS)
    assert sw.host_dispatch == "compiled"
    assert "compile: true" in sw.sources["fused_layernorm"]
    kept = resolve_software(SoftwareSpec(stack="torchtitan-2025", compile=True,
                                         kernels={"fused_rope": False}))
    assert kept.fused_rope is False and kept.fused_layernorm is True
    with pytest.raises(ddlsim.ConfigError, match="contradicts kernels.compile"):
        config({"stack": "torchtitan-2025", "compile": True, "kernels": {"compile": False}})


def test_compile_makes_the_step_faster_and_moves_no_bytes():
    eager, compiled = config(), config({"stack": "torchtitan-2025", "compile": True})
    a, b = predict(eager), predict(compiled)
    assert b.iteration_time_s < a.iteration_time_s
    assert b.comm_bytes == a.comm_bytes


@pytest.mark.parametrize("stack, backward_gathers, edge_gathers", [
    ("torchtitan-2025", 8, EMB),     # every layer and the embedding gathered again
    ("torchtitan-2024", 7, 0),       # the last layer and the root stay gathered
    ({"stack": "torchtitan-2025",
      "overlap": {"zero3_reshard_after_forward": "never"}}, 0, 0)])
def test_fsdp_without_pipelining_gathers_per_micro_batch(stack, backward_gathers,
                                                         edge_gathers):
    """Per rank and micro-batch: 8 forward gathers of a layer's bf16 parameters, the
    backward's, and 8 reduce-scatters of its fp32 gradients (trace bytes: the gathered
    output and the full input, docs/comm.md); the edges gathered for the forward, again for
    the backward where resharded (``edge_gathers`` parameters), and reduce-scattered."""
    cfg = config(stack)
    m = cfg.num_microbatches
    per_micro_batch = (LAYER * (2 * 8 + 2 * backward_gathers + 4 * 8)
                       + (EMB + HEAD) * (2 + 4) + 2 * edge_gathers)
    assert predict(cfg).comm_bytes["dp"] == pytest.approx(m * per_micro_batch, rel=1e-12)


def test_fsdp_in_pipeline_stages_gathers_once_per_iteration():
    """PP 2 with 4 micro-batches: each stage gathers its parameters once (bf16) and
    reduce-scatters them once (fp32) per iteration, whatever the micro-batch count."""
    cfg = config(pipeline_model_parallel_size=2, data_parallel_size=8)
    assert cfg.num_microbatches == 4
    b = StageBuilder.from_config(cfg, cfg.model.shape())
    stages = [b.stage_params(s) * (2 + 4) for s in range(2)]
    got = predict(cfg).comm_bytes["dp"]
    assert min(abs(got - x) / x for x in stages) < 1e-12
    assert "gathered once per iteration" in overlap_phrase(cfg)


@pytest.mark.parametrize("par", [
    {"pipeline_model_parallel_size": 2, "data_parallel_size": 8},
    {"pipeline_model_parallel_size": 2, "data_parallel_size": 4,
     "tensor_model_parallel_size": 2, "sequence_parallel": True},
    {"context_parallel_size": 2, "data_parallel_size": 8},
    {"tensor_model_parallel_size": 2, "sequence_parallel": True, "data_parallel_size": 8},
])
def test_engines_agree_on_fsdp_with_pp_cp_and_tp(par):
    cfg = config(**par)
    a, d = predict(cfg), predict(cfg, "des")
    assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=3e-2)


def test_fsdp_with_cp_shards_over_dp_times_cp():
    """FSDP under CP shards over the dp × cp ranks (torchtitan's dp_shard_cp mesh): the
    same bytes per micro-batch as without CP, on the dp_cp group."""
    cfg = config(context_parallel_size=2, data_parallel_size=8)
    per_micro_batch = LAYER * (2 * 8 + 2 * 8 + 4 * 8) + (EMB + HEAD) * (2 + 4) + 2 * EMB
    got = predict(cfg).comm_bytes["dp"]
    assert got == pytest.approx(cfg.num_microbatches * per_micro_batch, rel=1e-12)


def test_async_tp_needs_compile_and_hides_tp_communication():
    par = {"tensor_model_parallel_size": 2, "sequence_parallel": True, "data_parallel_size": 8,
           "tp_comm_overlap": "torch_async"}
    with pytest.raises(ddlsim.ConfigError, match="async_tp_needs_compile"):
        config(**par)
    on = config({"stack": "torchtitan-2025", "compile": True}, **par)
    off = config({"stack": "torchtitan-2025", "compile": True},
                 **{k: v for k, v in par.items() if k != "tp_comm_overlap"})
    exposed = [predict(c).breakdown.exposed_comm_s["tp"] for c in (on, off)]
    assert exposed[0] < exposed[1]


@pytest.mark.parametrize("how", ["bulk", "pipelined"])
def test_torchtitan_refuses_transformer_engines_userbuffers(how):
    par = {"tensor_model_parallel_size": 2, "sequence_parallel": True, "data_parallel_size": 8,
           "tp_comm_overlap": how}
    with pytest.raises(ddlsim.ConfigError, match="async_tp_is_torchs"):
        config({"stack": "torchtitan-2025", "compile": True}, **par)


@pytest.mark.parametrize("stack, rule", [("megatron-core-2024", "no_zero3"),
                                         ("megatron-lm-2021", "no_zero3"),
                                         ("deepspeed", "pipeline_zero")])
def test_stacks_that_cannot_run_fsdp_with_pp_say_so(stack, rule):
    with pytest.raises(ddlsim.ConfigError, match=rule):
        config(stack, pipeline_model_parallel_size=2, data_parallel_size=8)


def test_fsdp_with_pp_resharded_every_forward_is_refused_by_name():
    sw = {"stack": "torchtitan-2025", "overlap": {"zero3_reshard_after_forward": "always"}}
    with pytest.raises(ddlsim.ConfigError, match="zero3_reshard_after_forward = 'always'"):
        config(sw, pipeline_model_parallel_size=2, data_parallel_size=8)


def test_torchtitan_runs_no_zero1():
    with pytest.raises(ddlsim.ConfigError, match="no_zero12"):
        config(zero_stage=1)


def test_bundled_example_predicts():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = ddlsim.load_config("examples/llama3-8b-fsdp2-h100.yaml")
    r = ddlsim.predict(cfg)          # fits on the DGX H100 as torchtitan configures it
    # one micro-batch per rank: 32 forward gathers, 32 backward ones, 32 fp32 reduce-scatters;
    # the embedding gathered twice, the head once, both reduce-scattered
    edges = (EMB + HEAD) * (2 + 4) + 2 * EMB
    assert r.comm_bytes["dp"] == pytest.approx(LAYER * (2 * 32 + 2 * 32 + 4 * 32) + edges,
                                               rel=1e-12)


#: torchtitan 07c00d9 torchtitan/models/llama3/train_configs/llama3_8b.toml, the keys that
#: shape one iteration
TOML = """
[model]
name = "llama3"
flavor = "8B"
[training]
local_batch_size = 1
seq_len = 8192
[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 1
pipeline_parallel_degree = 1
context_parallel_degree = 1
[compile]
enable = false
components = ["model", "loss"]
[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"
"""


def test_the_example_is_what_ddlsim_import_makes_of_torchtitans_toml(tmp_path):
    from ddlsim.importers import import_config
    (tmp_path / "llama3_8b.toml").write_text(TOML)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        imported = import_config([tmp_path / "llama3_8b.toml"], system="dgx-h100",
                                 nodes=1).config
        a = ddlsim.predict(ddlsim.load_config(imported))
        b = ddlsim.predict(ddlsim.load_config("examples/llama3-8b-fsdp2-h100.yaml"))
    assert a.iteration_time_s == b.iteration_time_s and a.comm_bytes == b.comm_bytes


#: torchtitan 9dec370 train_configs/llama3_405b.toml (2024 format), the keys that shape one
#: iteration
TOML_2024 = """
[model]
name = "llama3"
flavor = "405B"
norm_type = "rmsnorm"
[optimizer]
name = "AdamW"
[training]
batch_size = 2
seq_len = 8192
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 8
compile = true
[experimental]
context_parallel_degree = 1
pipeline_parallel_degree = 1
enable_async_tensor_parallel = true
[activation_checkpoint]
mode = 'full'
[float8]
enable_float8_linear = true
"""


def test_torchtitans_2024_config_format_is_read_onto_the_2024_stack(tmp_path):
    from ddlsim.importers import import_config
    (tmp_path / "llama3_405b.toml").write_text(TOML_2024)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = import_config([tmp_path / "llama3_405b.toml"], system="dgx-h100",
                            nodes=16).config
    assert cfg["system"]["software"]["stack"] == "torchtitan-2024"
    assert cfg["system"]["software"]["compile"] is True
    p, t = cfg["parallel"], cfg["train"]
    assert (p["tensor_model_parallel_size"], p["sequence_parallel"], p["zero_stage"],
            p["tp_comm_overlap"]) == (8, True, 3, "torch_async")
    assert (t["dtype"], t["micro_batch_size"], t["global_batch_size"], t["recompute"]) == \
        ("fp8", 2, 32, "full")


def test_2024_pipelining_takes_one_micro_batch_per_stage_by_default(tmp_path):
    from ddlsim.importers import import_config
    text = TOML_2024.replace("pipeline_parallel_degree = 1", "pipeline_parallel_degree = 2")
    text = text.replace('norm_type = "rmsnorm"', 'norm_type = "fused_rmsnorm"')
    (tmp_path / "t.toml").write_text(text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = import_config([tmp_path / "t.toml"], system="dgx-h100", nodes=16).config
    assert cfg["parallel"]["pipeline_model_parallel_size"] == 2
    assert cfg["train"]["micro_batch_size"] == 2 // 2
    assert cfg["system"]["software"]["kernels"]["fused_layernorm"] is True


@pytest.mark.parametrize("stack", ["torchtitan-2024", "torchtitan-2025"])
def test_torchtitans_tensor_parallelism_is_sequence_parallel(stack):
    """apply_tp shards the norms and the block outputs over the sequence on every TP plan: TP
    with sequence parallelism written false is refused by name, in predict and in search
    alike; left unset it is on (the stack's), and the plan line names the rule."""
    from ddlsim.search.evaluate import evaluate_grid
    from ddlsim.search.spec import Constraints
    par = {"tensor_model_parallel_size": 2, "data_parallel_size": 4}
    with pytest.raises(ddlsim.ConfigError, match=r"\(rule tp_needs_sp;"):
        config(stack, sequence_parallel=False, **par)
    assert config(stack, sequence_parallel=True, **par).parallel.sequence_parallel
    unset = config(stack, **par)
    assert unset.parallel.sequence_parallel
    assert unset.family.plan_summary(unset).startswith("TP2 SP (tp_needs_sp) × PP1 × DP4")
    assert not config(stack, data_parallel_size=8).parallel.sequence_parallel   # TP 1
    d = {"model": "llama-3.1-8b", "parallel": {"zero_stage": 3},
         "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096},
         "system": {"preset": "dgx-h100", "nodes": 1, "software": stack}}
    grid = evaluate_grid(d, None, [], {"parallel.tensor_model_parallel_size": [1, 2],
                                       "parallel.sequence_parallel": [False, True]},
                         Constraints(must_fit=False))
    got = set(zip(grid.frame["parallel.tensor_model_parallel_size"],
                  grid.frame["parallel.sequence_parallel"]))
    assert got == {(1, False), (2, True)}
    assert any(r.endswith("(rule tp_needs_sp)") for r in grid.rejected), grid.rejected


def test_a_tp_axis_without_an_sp_axis_is_searched_sequence_parallel():
    """The search builds each plan as predict does: under torchtitan an unset SP is on at
    TP > 1 (the stack's), off at TP 1; no plan is rejected for it."""
    from ddlsim.search.evaluate import evaluate_grid
    from ddlsim.search.spec import Constraints
    d = {"model": "llama-3.1-8b", "parallel": {"zero_stage": 3},
         "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 4096},
         "system": {"preset": "dgx-h100", "nodes": 1, "software": "torchtitan-2025"}}
    grid = evaluate_grid(d, None, [], {"parallel.tensor_model_parallel_size": [1, 2, 4]},
                         Constraints(must_fit=False))
    got = set(zip(grid.frame["parallel.tensor_model_parallel_size"],
                  grid.frame["parallel.sequence_parallel"]))
    assert got == {(1, False), (2, True), (4, True)} and not grid.rejected, grid.rejected


@pytest.mark.parametrize("stack", ["torchtitan-2024", "torchtitan-2025"])
def test_unset_zero_is_torchtitans_fsdp2_and_zero_written_is_its_ddp(stack):
    """torchtitan's data_parallel_shard_degree defaults to -1 (the leftover ranks shard):
    ZeRO-3 where there is more than one data-parallel rank; nothing to shard at DP 1; a
    written zero_stage (0: torch's replicate) is kept."""
    def unset(software, **parallel):
        d = copy.deepcopy(BASE)
        d["parallel"] = parallel          # no zero_stage written
        d["system"]["software"] = software
        return ddlsim.load_config(d)
    assert unset(stack).parallel.zero_stage == 3                   # DP 16
    assert unset(stack, zero_stage=0).parallel.zero_stage == 0     # replicate: DDP
    one = unset(stack, tensor_model_parallel_size=8, pipeline_model_parallel_size=2)
    assert one.dp == 1 and one.parallel.zero_stage == 0 and one.parallel.sequence_parallel
    assert unset(stack, dp_strategy="reduce_scatter").parallel.zero_stage == 0
    assert unset("megatron-core-2024").parallel.zero_stage == 0


def test_every_stacks_plan_defaults_are_plan_fields_with_sources():
    from ddlsim.config import ParallelConfig
    from ddlsim.software import stack_entry, stacks
    seen = 0
    for name in stacks():
        for field, item in (stack_entry(name).get("plan") or {}).items():
            assert field in ParallelConfig.model_fields, (name, field)
            # RunConfig._plan_from_stack applies these (with their conditions): a new field
            # there must be taught to it, not read nowhere
            assert field in {"zero_stage"}, (name, field)
            assert set(item) == {"value", "source"} and item["source"].strip(), (name, field)
            ParallelConfig.model_validate({field: item["value"]})   # a value the field takes
            seen += 1
    assert seen >= 2


def test_a_grid_that_leaves_zero_to_torchtitan_searches_it_as_predict_builds_it():
    """The vectorised tier holds one ZeRO stage for a grid; torchtitan's default depends on
    each plan's DP (ZeRO-3 at DP > 1, nothing at DP 1), so such a grid (here one the tier
    would take: an even pipeline split) goes to the exact tier, and each plan is predict's."""
    from ddlsim.search.evaluate import evaluate_grid
    from ddlsim.search.spec import Constraints
    d = {"model": {"preset": "llama-3.1-8b", "num_hidden_layers": 8},
         "parallel": {"tensor_model_parallel_size": 1},
         "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 2048,
                   "recompute": "full"},
         "system": {"preset": "dgx-h100", "nodes": 1, "software": {
             "stack": "torchtitan-2025",   # the fields the vectorised tier times set so
             "kernels": {"pipeline_split": "even", "selective_recompute": "attention_core"},
             "overlap": {"zero3_reshard_after_forward": "always", "zero3_copy_out": False}}}}
    axes = {"parallel.pipeline_model_parallel_size": [1, 8]}
    grid = evaluate_grid(d, None, [], axes, Constraints(must_fit=False))
    assert grid.frame.attrs["tier"] == "exact"
    got = dict(zip(grid.frame["parallel.pipeline_model_parallel_size"],
                   grid.frame["parallel.zero_stage"]))
    assert got == {1: 3, 8: 0}, got              # DP 8: FSDP2; DP 1: nothing to shard
    d["parallel"]["zero_stage"] = 0               # written (DDP): the vectorised tier's
    assert evaluate_grid(d, None, [], {"parallel.pipeline_model_parallel_size": [1, 2]},
                         Constraints(must_fit=False)).frame.attrs["tier"] == "vectorised"
