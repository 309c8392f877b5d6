"""Megatron-FSDP (``zero3_implementation: megatron_fsdp``, megatron-core-2025): the stack rules
that admit and refuse it, the collectives of a tiny MoE plan under it (dense parameters over
dp, experts over edp, per layer), and a config round trip (workloads/decoder/megatron_fsdp.py)."""

from __future__ import annotations

import copy
import warnings

import pytest

import ddlsim
from ddlsim.api import build_workload
from ddlsim.errors import ConfigError
from ddlsim.software import resolve_software, stacks
from ddlsim.workloads.trace import Collective

#: Qwen3-30B-A3B cut to 2 layers on one DGX H100: TP2 (SP), EP4, expert TP1, so DP 4 and
#: EDP 8 / (4·1) = 2; 2 micro-batches per data-parallel rank, full recomputation
BASE = {"model": {"preset": "qwen3-30b-a3b", "num_hidden_layers": 2},
        "parallel": {"tensor_model_parallel_size": 2, "sequence_parallel": True,
                     "expert_model_parallel_size": 4, "expert_tensor_parallel_size": 1,
                     "zero_stage": 3,
                     "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True}},
        "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 1024,
                  "recompute": "full", "dtype": "bf16"},
        "system": {"preset": "dgx-h100", "nodes": 1,
                   "software": {"stack": "megatron-core-2025",
                                "kernels": {"gradient_accumulation_fusion": False},
                                "overlap": {"zero3_implementation": "megatron_fsdp"}}}}
#: Qwen3-30B-A3B (its config.json): hidden 2048, 32 query heads and 4 key/value heads of 128,
#: 128 experts of moe_intermediate_size 768
H, Q, KV, D, EXPERTS, FFN = 2048, 32, 4, 128, 128, 768


def config(software: dict | None = None, **parallel) -> dict:
    d = copy.deepcopy(BASE)
    d["parallel"].update(parallel)
    if software is not None:
        d["system"]["software"] = software
    return d


def load(d: dict):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ddlsim.load_config(d)


def refusal(d: dict) -> str:
    with pytest.raises(ConfigError) as exc:
        load(d)
    return str(exc.value)


def test_every_stack_names_its_zero3_implementation_with_a_source():
    for stack in stacks():
        sw = resolve_software(stack)
        assert sw.zero3_implementation in ("torch_fsdp", "torch_fsdp2", "deepspeed")
        assert sw.sources["zero3_implementation"].strip()
    assert resolve_software("megatron-core-2025").zero3_implementation == "torch_fsdp2"


def test_fsdp2_refuses_expert_parallelism_and_megatron_fsdp_runs_it():
    fsdp2 = {"stack": "megatron-core-2025"}
    assert "zero3_no_expert_parallel" in refusal(config(fsdp2))
    assert load(config()).software.zero3_implementation == "megatron_fsdp"


def test_megatron_fsdp_needs_gradient_accumulation_fusion_off():
    sw = copy.deepcopy(BASE["system"]["software"])
    del sw["kernels"]
    text = refusal(config(sw))
    assert "megatron_fsdp_no_grad_accum_fusion" in text
    assert "gradient_accumulation_fusion = True" in text and "1e057005" in text


@pytest.mark.parametrize("stack", ["torchtitan-2025", "deepspeed", "megatron-core-2024"])
def test_other_stacks_have_no_megatron_fsdp(stack):
    d = {"model": {"preset": "llama-3.1-8b", "num_hidden_layers": 2},
         "parallel": {"zero_stage": 3, "data_parallel_size": 8},
         "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 1024},
         "system": {"preset": "dgx-h100", "nodes": 1,
                    "software": {"stack": stack,
                                 "overlap": {"zero3_implementation": "megatron_fsdp"}}}}
    assert "no_megatron_fsdp" in refusal(d)


def test_another_frameworks_zero3_is_refused_by_name():
    sw = copy.deepcopy(BASE["system"]["software"])
    sw["overlap"]["zero3_implementation"] = "deepspeed"
    text = refusal(config(sw))
    assert "zero3_implementation = 'deepspeed'" in text and "'torch_fsdp2'" in text


@pytest.mark.parametrize("change, words", [
    ({"zero_stage": 1}, "parallel.zero_stage = 1"),
    ({"pipeline_model_parallel_size": 2}, "not modelled"),
])
def test_what_megatron_fsdp_does_not_model_is_refused(change, words):
    assert words in refusal(config(**change))


def test_its_fixed_behaviour_cannot_be_contradicted():
    sw = copy.deepcopy(BASE["system"]["software"])
    sw["overlap"]["zero3_copy_out"] = True
    assert "zero3_copy_out = True contradicts" in refusal(config(sw))


def _gathers_and_reduces(cfg) -> dict:
    """(op, group) -> [bytes, ...] of the parameter gathers and gradient reduce-scatters of
    each block of stage 0, by block."""
    out: dict = {}
    for name, block in build_workload(cfg).classes[0].program.blocks.items():
        for o in block.flat.ops:
            p = o.payload
            if isinstance(p, Collective) and p.name in ("param.all_gather",
                                                        "grad.reduce_scatter"):
                out.setdefault((name, p.op, p.group), []).append(p.bytes)
    return out


def test_each_layer_gathers_dense_over_dp_and_experts_over_edp():
    """Per layer and pass, one gather of the dense parameters over dp and one of the local
    experts over edp (Megatron-FSDP's per-unit buckets by group); with full recomputation the
    backward gathers each layer once; each micro-batch reduce-scatters both in fp32."""
    cfg = load(config())
    wl = build_workload(cfg)
    assert wl.groups["dp"].members[0].tolist() == [0, 2, 4, 6]
    assert wl.groups["edp"].members[0].tolist() == [0, 4]
    # the 32 local experts of 3 GEMMs each, bf16
    expert = EXPERTS // 4 * 3 * H * FFN * 2
    # attention GEMMs, the router and the four norms (input, post-attention, q and k), each
    # split over the 2 TP ranks as ddlsim splits a layer's parameters (layer_rank_params)
    dense = (H * Q * D * 2 + 2 * H * KV * D + H * EXPERTS + 2 * H + 2 * D) / 2 * 2
    found = _gathers_and_reduces(cfg)
    for block in ("F0", "B0"):
        assert found[(block, "all_gather", "dp")] == [dense] * 2
        assert found[(block, "all_gather", "edp")] == [expert] * 2
    assert found[("B0", "reduce_scatter", "dp")] == [2 * dense] * 2
    assert found[("B0", "reduce_scatter", "edp")] == [2 * expert] * 2
    assert ("F0", "reduce_scatter", "dp") not in found


def test_the_modules_outside_the_units_are_gathered_once_and_reduced_per_micro_batch():
    """The embedding, the final norm and the output layer (no unit): their gradients
    reduce-scattered over dp after each micro-batch's backward of them (the head's after the
    head's backward, the embedding's at the end), in fp32; gathered once, after the step."""
    wl = build_workload(load(config()))
    blocks = wl.classes[0].program.blocks
    VOCAB = 151936
    head, emb = VOCAB * H / 2 + H, VOCAB * H / 2        # output layer over TP, final norm
    edges = {o.payload.name: (o.payload.op, o.payload.group, o.payload.bytes)
             for name in ("B0", "update") for o in blocks[name].ops
             if isinstance(o.payload, Collective) and ".head" in o.payload.name
             or isinstance(o.payload, Collective) and "edges" in o.payload.name
             or isinstance(o.payload, Collective) and ".embedding" in o.payload.name}
    assert edges == {"grad.reduce_scatter.head": ("reduce_scatter", "dp", 4 * head),
                     "grad.reduce_scatter.embedding": ("reduce_scatter", "dp", 4 * emb),
                     "params.all_gather.edges": ("all_gather", "dp", 2 * (head + emb))}
    b0 = [o.payload.name for o in blocks["B0"].ops]
    # after the head's backward (its logits' and the final norm's), before the first layer's
    assert b0.index("bwd.final_norm") + 1 == b0.index("grad.reduce_scatter.head") \
        < b0.index("recompute.qkv")
    assert b0[-1] == "grad.reduce_scatter.embedding"


def test_the_config_round_trips_through_yaml_and_set(tmp_path):
    """The option written in a YAML file, and given with --set, predicts as the dict does,
    and the plan line names it."""
    import yaml
    from ddlsim.configload import build_config
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config()))
    by_dict = ddlsim.predict(load(config()))
    by_file = ddlsim.predict(load(path))
    plain = config({"stack": "megatron-core-2025",
                    "kernels": {"gradient_accumulation_fusion": False}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        by_set = ddlsim.predict(build_config(plain, [
            "system.software.overlap.zero3_implementation=megatron_fsdp"]))
    assert by_file.to_dict() == by_dict.to_dict() == by_set.to_dict()
    assert "Megatron-FSDP" in str(by_dict.to_dict())


#: ModelZoo row 3 as a command line: run_235b.sh's flags (tests/importers/
#: test_megatron_lists.py QWEN3_235B) with the row's plan (TP2 EP8 PP1, MBS 4, full
#: recomputation) and Megatron-FSDP as Megatron-LM 1e057005's custom_fsdp.md gives it
ROW3 = (
    "torchrun --nproc_per_node 8 --nnodes 32 pretrain_gpt.py "
    "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 "
    "--expert-model-parallel-size 8 --expert-tensor-parallel-size 1 --context-parallel-size 1 "
    "--sequence-parallel --use-distributed-optimizer --overlap-grad-reduce "
    "--overlap-param-gather --use-custom-fsdp --data-parallel-sharding-strategy "
    "optim_grads_params --no-gradient-accumulation-fusion "
    "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split "
    "--micro-batch-size 4 --global-batch-size 2048 --seq-length 4096 --bf16 "
    "--recompute-granularity full --recompute-method uniform "
    "--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep "
    "--moe-grouped-gemm --moe-permute-fusion --moe-router-force-load-balancing "
    "--moe-aux-loss-coeff 1e-3 --moe-router-dtype fp32 --cross-entropy-loss-fusion "
    "--cross-entropy-fusion-impl te --no-create-attention-mask-in-dataloader\n")


def test_the_row_3_command_line_imports_as_validate_moes_config():
    from benchscripts import load_script
    from ddlsim.importers.common import nested
    from ddlsim.importers.megatron import read_megatron
    vm = load_script("validate_moe")
    row = next(r for r in vm.zoo_rows() if r["row"] == "3")
    zoo = vm.zoo_config(row)
    draft = read_megatron(ROW3, "row3.sh")
    assert not draft.refused
    imported = nested({k: v for k, v in draft.fields.items() if not k.startswith("model.")})
    imported["model"] = zoo["model"]
    imported["system"] = {"preset": "dgx-h100", "nodes": imported["system"]["nodes"],
                          "software": imported["system"]["software"]}
    moe = {k: v for k, v in zoo["parallel"]["moe"].items()
           if k not in ("overlap_expert_parallel_comm", "delay_wgrad_compute", "router_fusion")}
    assert imported == {**zoo, "parallel": {**zoo["parallel"], "moe": moe}}


@pytest.mark.parametrize("flags, words", [
    ("--use-custom-fsdp", "optim_grads_params (ZeRO-3) only, got 'no_shard'"),
    ("--use-custom-fsdp --data-parallel-sharding-strategy optim_grads", "got 'optim_grads'"),
    ("--data-parallel-sharding-strategy optim_grads_params", "with that flag only"),
])
def test_megatron_fsdp_flags_ddlsim_does_not_model_are_refused_by_name(flags, words):
    from ddlsim.importers.megatron import read_megatron
    refused = read_megatron(f"--use-distributed-optimizer {flags}", "run.sh").refused
    assert len(refused) == 1 and words in refused[0][1]


def test_search_refuses_what_predict_refuses():
    """A search under Megatron-FSDP (the exact tier: the vectorised one refuses it) counts
    ZeRO-1 and pipelining as predict refuses them, and predicts the ZeRO-3 plan as predict."""
    from ddlsim.search.run import search
    base = config(zero_stage=3)
    axes = {"parallel.zero_stage": [1, 3], "parallel.pipeline_model_parallel_size": [1, 2]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        frame = search(base, axes=axes, top=4)
    assert frame.attrs["tier"] == "exact"
    assert frame[["parallel.zero_stage", "parallel.pipeline_model_parallel_size"]
                 ].values.tolist() == [[3, 1]]
    rejected = frame.attrs["rejected"]
    assert sum(n for r, n in rejected.items() if "parallel.zero_stage = 1" in r) == 2
    assert sum(n for r, n in rejected.items() if "is not modelled" in r) == 1
    assert frame["iteration_time_s"].iloc[0] == ddlsim.predict(load(base)).iteration_time_s


def test_its_buffers_are_the_gathered_units_the_kept_edges_and_a_units_gradients():
    """Beyond the two gathered layers (what a what-if FSDP2 plan of this stack holds):
    the embedding, final norm and output layer kept gathered in bf16 (outside any unit),
    and one layer's unsharded gradients, bf16 param.grad and the fp32 main_grad bucket."""
    sw = copy.deepcopy(BASE["system"]["software"])
    sw.update(overlap={}, what_if=True)
    mine = ddlsim.predict(load(config()))
    fsdp2 = ddlsim.predict(load(config(sw)))
    VOCAB = 151936
    kept = 2 * VOCAB * H / 2 + H                  # embedding and output over TP, final norm
    unit = (H * Q * D * 2 + 2 * H * KV * D + H * EXPERTS + 2 * H + 2 * D) / 2 \
        + EXPERTS // 4 * 3 * H * FFN
    extra = mine.memory.buffers - fsdp2.memory.buffers
    assert extra == kept * 2 + unit * (2 + 4)
