"""Nothing a stack or plan switches on is silent (issue #28 item 1): the MoE dispatcher and
its backend, the expert grid and the MoE overlaps; HSDP; checkpointing of every n-th layer;
each virtual stage's layers given; ResNet's autocast and memory format: each is named on the
report's plan line and in the JSON result's ``plan`` (ddlsim/planinfo.py)."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
from rich.console import Console

import ddlsim
from ddlsim.planinfo import plan_fields
from ddlsim.report import render_results

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

#: Mixtral 8x7B cut to 4 layers, EP8 on 2 DGX H100s, Megatron-Core of 2025 (which has the
#: flex dispatcher and the expert-parallel all-to-all overlap)
MOE = {"model": {"preset": "mixtral-8x7b", "num_hidden_layers": 4},
       "parallel": {"tensor_model_parallel_size": 1, "expert_model_parallel_size": 8,
                    "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True}},
       "train": {"micro_batch_size": 1, "global_batch_size": 32, "seq_length": 4096,
                 "recompute": "selective"},
       "system": {"preset": "dgx-h100", "nodes": 2, "software": "megatron-core-2025"}}
#: Llama 3.1 8B cut to 12 layers, PP2 × 2 virtual stages, FSDP, torchtitan of 2025
FSDP = {"model": {"preset": "llama-3.1-8b", "num_hidden_layers": 12},
        "parallel": {"zero_stage": 3, "pipeline_model_parallel_size": 2,
                     "schedule": "interleaved", "virtual_pipeline_model_parallel_size": 2},
        "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 2048,
                  "recompute": "full"},
        "system": {"preset": "dgx-h100", "nodes": 2, "software": "torchtitan-2025"}}
#: ResNet-50 modelled (not a proxy) on one DGX A100
RESNET = {"model": "resnet50", "parallel": {"data_parallel_size": 8},
          "train": {"micro_batch_size": 32, "global_batch_size": 256, "seq_length": 1,
                    "dtype": "fp32", "optimizer": "sgd"},
          "system": {"preset": "dgx-a100", "nodes": 1}}


def load(base: dict, **sections) -> ddlsim.RunConfig:
    d = copy.deepcopy(base)
    for section, fields in sections.items():
        if isinstance(d[section], dict):
            d[section].update(fields)
        else:
            d[section] = fields
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ddlsim.load_config(d)


def line(cfg) -> str:
    return cfg.family.plan_summary(cfg)


def header(cfg) -> str:
    """The report as ``ddlsim predict`` prints it, on one line."""
    console = Console(record=True, width=400, color_system=None, file=open("/dev/null", "w"))
    render_results(console, cfg, [ddlsim.predict(cfg)])
    return " ".join(console.export_text().split())


# ----------------------------------------------------------------------------------- MoE
def moe(**fields) -> ddlsim.RunConfig:
    return load(MOE, parallel={**MOE["parallel"], "moe": {**MOE["parallel"]["moe"], **fields}})


def test_moe_names_dispatcher_and_expert_grid_always():
    cfg = moe()
    plan = plan_fields(cfg)["moe"]
    assert plan == {"dispatcher": "alltoall", "ep": 8, "etp": 1, "grouped_gemm": True,
                    "permute_fusion": plan["permute_fusion"],
                    # unset and not forced: the balance is assumed, and named (issue 29)
                    "routing": "dropless, balanced (router_imbalance 1, assumed: "
                               "no measured default)",
                    "router_imbalance": 1.0, "delay_wgrad_compute": False,
                    "router_fusion": False,
                    "aux_loss_coeff": 0.0}    # mixtral-8x7b's config.json: no output_router_logits
    assert "flex_backend" not in plan             # only the flex dispatcher has a backend
    assert "MoE alltoall dispatch" in line(cfg) and "ETP1" in line(cfg)
    assert "(EP8)" in line(cfg)
    assert "moe" not in plan_fields(load(FSDP))   # a dense model has no MoE block


def test_moe_names_the_fused_router_and_the_loss():
    cfg = moe(router_fusion=True, aux_loss_coeff=1e-3)
    plan = plan_fields(cfg)["moe"]
    assert plan["router_fusion"] is True and plan["aux_loss_coeff"] == 1e-3
    assert "fused router, aux loss 0.001" in line(cfg)


@pytest.mark.parametrize("backend, sms", [("deepep", 20), ("hybridep", 16)])
def test_flex_dispatcher_names_its_backend_and_its_sms(backend, sms):
    cfg = moe(token_dispatcher_type="flex", flex_dispatcher_backend=backend)
    plan = plan_fields(cfg)["moe"]
    assert (plan["dispatcher"], plan["flex_backend"], plan["flex_sms"]) == ("flex", backend, sms)
    assert f"MoE flex/{backend} ({sms} SMs) dispatch" in line(cfg)
    given = moe(token_dispatcher_type="flex", flex_dispatcher_backend=backend,
                flex_dispatcher_num_sms=32)
    assert plan_fields(given)["moe"]["flex_sms"] == 32
    assert f"MoE flex/{backend} (32 SMs) dispatch" in line(given)


def test_expert_parallel_all_to_all_overlap_is_an_overlap():
    off = plan_fields(moe())
    assert not any(o.startswith("ep-a2a") for o in off["overlaps"])
    for delay in (False, True):
        cfg = moe(overlap_expert_parallel_comm=True, delay_wgrad_compute=delay)
        plan = plan_fields(cfg)
        assert "ep-a2a (combined 1F1B)" in plan["overlaps"]
        assert plan["moe"]["delay_wgrad_compute"] is delay
        assert "EP all-to-alls overlapped (combined 1F1B" in line(cfg)
        assert ("delayed wgrad" in line(cfg)) is delay


def test_shared_expert_overlap_is_an_overlap():
    # Qwen3-235B has no shared experts; DeepSeek-V3's preset does
    cfg = load(MOE, model={"preset": "deepseek-v3", "num_hidden_layers": 4,
                           "first_k_dense_replace": 0},
               parallel={**MOE["parallel"], "moe": {**MOE["parallel"]["moe"],
                                                    "shared_expert_overlap": True}})
    assert "shared-experts" in plan_fields(cfg)["overlaps"]
    assert "shared experts overlapped" in line(cfg)


# ---------------------------------------------------------------- FSDP-side plan options
def test_hsdp_every_nth_layer_and_given_virtual_stages_are_named():
    plain = plan_fields(load(FSDP))
    assert not {"hsdp", "recompute_every_n_layers"} & set(plain)
    # no split given: torchtitan 07c00d9's own of 12 layers over 4 virtual stages, named
    assert (plain["layers_per_virtual_stage"], plain["pipeline_split"]) == \
        ([3, 4, 3, 2], "torchtitan-2025")
    cfg = load(FSDP, parallel={"data_parallel_replicate_size": 2,
                               "layers_per_virtual_stage": [2, 4, 4, 2]},
               train={"recompute_every_n_layers": 2})
    plan = plan_fields(cfg)
    # 16 ranks / PP2 = DP8 = 2 replicas × 4-rank shards
    assert plan["hsdp"] == {"replicas": 2, "shard_ranks": 4}
    assert plan["recompute_every_n_layers"] == 2
    assert plan["layers_per_virtual_stage"] == [2, 4, 4, 2] and "pipeline_split" not in plan
    # torchtitan's FSDP2: one layer's gather ahead; under PP the parameters stay gathered
    assert plain["zero3_gathers"] == "per layer, 1 layer ahead, gathered once per iteration " \
        "(pipelined)"
    assert plan["zero3_gathers"].endswith("(pipelined), HSDP: 2 replicas of 4-rank shards")
    assert "zero3_gathers" not in plan_fields(moe())            # ZeRO-0: nothing to gather
    text = line(cfg)
    assert "HSDP: 2 replicas of 4-rank shards" in text
    assert "recompute full every 2 layers" in text
    assert "PP2(v2) [2+4×2+2 layers per virtual stage]" in text


# ------------------------------------------------------------------------------- ResNet
def test_resnet_names_autocast_and_memory_format():
    fp32 = load(RESNET)
    assert plan_fields(fp32)["precision"] == "fp32"
    assert line(fp32).endswith("global batch 256, fp32")
    cfg = load(RESNET, model={"architecture": "resnet", "depth": 50,
                              "memory_format": "channels_last"}, train={"dtype": "fp16"})
    plan = plan_fields(cfg)
    assert plan["precision"] == "fp16 autocast (AMP), fp32 weights and gradients"
    assert plan["memory_format"] == "channels_last"
    assert line(cfg).endswith("fp16 autocast (AMP), channels_last")


# ------------------------------------------------------------------ the report and JSON
@pytest.mark.parametrize("cfg, words", [
    (lambda: moe(token_dispatcher_type="flex", flex_dispatcher_backend="deepep"),
     "MoE flex/deepep (20 SMs) dispatch"),
    (lambda: load(RESNET, train={"dtype": "bf16"}), "bf16 autocast (AMP)"),
], ids=["moe-flex", "resnet-amp"])
def test_the_report_and_json_carry_them(cfg, words):
    cfg = cfg()
    assert words in header(cfg)
    assert ddlsim.predict(cfg).to_dict()["plan"] == plan_fields(cfg)


# ------------------------------------------------------------------------------- search
@pytest.mark.parametrize("base, axes", [
    (MOE, {"parallel.moe.token_dispatcher_type": ["flex"],
           "parallel.moe.flex_dispatcher_backend": ["deepep", "hybridep"],
           "parallel.moe.overlap_expert_parallel_comm": [False, True]}),
    (FSDP, {"parallel.data_parallel_replicate_size": [1, 2],
            "train.recompute_every_n_layers": [1, 2],
            "parallel.layers_per_virtual_stage": [None, [2, 4, 4, 2]]}),
], ids=["moe", "fsdp"])
def test_a_search_names_each_of_them_it_varies(base, axes):
    """Each plan's text (``ddlsim search -f csv``'s ``plan``) names the value of every axis
    varied among these options."""
    from ddlsim.search.report import plan_text_frame
    from ddlsim.search.run import search

    frame = search(copy.deepcopy(base), axes=axes, constraints={"must_fit": False}, top=1)
    texts = plan_text_frame(frame)["plan"].tolist()
    assert len(texts) == math.prod(len(v) for v in axes.values())   # every plan runs
    for text, row in zip(texts, frame.to_dict(orient="records")):
        for path in axes:
            assert f"{path.rpartition('.')[2]}={row[path]}" in text
