"""One memory rule for torchtitan's op-level selective activation checkpointing in both tiers,
with the layer its checkpoint rebuilds in the backward (issues 27 and 29).

The search's vectorised tier does not time op-level checkpointing yet (its plans are searched by
the exact engine: ``fsdp.vector_refusal``), but its memory must be the exact tier's, per plan:
both call :func:`ddlsim.workloads.decoder.memory.layer_kept_bytes` and
:func:`~ddlsim.workloads.decoder.memory.rebuilt_bytes`. The refusal is lifted here for the
memory alone. Before the search tier called them it counted such layers as Megatron's
attention-core recomputation (18.5 GiB over the exact tier on Llama 3.1 8B, TP 1, 8,192 tokens
per micro-batch).
"""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.search.family import vector_family
from ddlsim.search.plans import VECTOR_FIELDS, enumerate_plans
from ddlsim.workloads.decoder import fsdp
from ddlsim.workloads.decoder.memory import rebuilt_bytes

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

B, S, LAYERS = 2, 4096, 4           # Llama 3.1 8B, four layers: h 4096, q 4096, kv 1024, f 14336


def _data(stack: str) -> dict:
    return {"model": {"preset": "llama-3.1-8b", "num_hidden_layers": LAYERS},
            "parallel": {"zero_stage": 3, "data_parallel_size": 8},
            "train": {"micro_batch_size": B, "global_batch_size": 8 * B * 4, "seq_length": S,
                      "dtype": "bf16", "recompute": "selective"},
            "system": {"preset": "dgx-h100", "nodes": 1, "software": {"stack": stack}}}


def _plan_config(data: dict, plans, k: int) -> dict:
    """The run config of plan ``k`` of ``plans``."""
    tp, pp, sp = int(plans["tp"][k]), int(plans["pp"][k]), bool(plans["sp"][k])
    rec = ("none", "selective", "full")[int(plans["recompute"][k])]
    par = {**data["parallel"], "tensor_model_parallel_size": tp, "sequence_parallel": sp,
           "pipeline_model_parallel_size": pp, "zero_stage": int(plans["zero"][k]),
           "data_parallel_size": int(plans["dp"][k])}
    train = {**data["train"], "recompute": rec, "global_batch_size": int(plans["gbs"][k])}
    return {**data, "parallel": par, "train": train}


@pytest.mark.parametrize("stack", ["torchtitan-2024", "torchtitan-2025"])
def test_both_tiers_count_the_same_memory_per_plan(stack, monkeypatch):
    monkeypatch.setattr(fsdp, "vector_refusal", lambda sw: None)   # memory alone, see above
    data = _data(stack)
    # the tier's even split: torchtitan's own of these 4 layers over PP 2 is 2, 2 too
    data["system"]["software"]["kernels"] = {"pipeline_split": "even"}
    run = ddlsim.load_config(data)
    family = vector_family(run.model.architecture)
    base = {p: getattr(getattr(run, p.split(".")[0]), p.split(".")[1]) for p in VECTOR_FIELDS}
    base["parallel.schedule"] = run.parallel.schedule
    axes = {"parallel.tensor_model_parallel_size": [1, 2],
            "parallel.pipeline_model_parallel_size": [1, 2],
            "parallel.sequence_parallel": [False, True],
            "parallel.zero_stage": [0, 3],
            "train.recompute": ["selective", "full"]}
    plans = enumerate_plans(axes, base, run.system.num_devices)
    memory, _ = family.memory(family.prepare(run), plans)
    checked = 0
    for k in range(len(plans)):
        if plans["sp"][k] != (plans["tp"][k] > 1):   # SP needs TP; torchtitan's TP is SP
            continue
        one = ddlsim.load_config(_plan_config(data, plans, k))
        exact = ddlsim.memory_per_device(one).total
        assert memory[k] == pytest.approx(exact, rel=1e-12), (k, plans.take([k]))
        checked += 1
    assert checked == 16


def _activations(stack: str, recompute: str, tp: int = 1) -> float:
    data = _data(stack)
    data["parallel"] = {**data["parallel"], "tensor_model_parallel_size": tp,
                        "data_parallel_size": 8 // tp}
    data["train"] = {**data["train"], "recompute": recompute,
                     "global_batch_size": 8 // tp * B * 4}
    return ddlsim.memory_per_device(ddlsim.load_config(data)).activations


def test_the_rebuilt_layer_by_hand():
    """Llama 3.1 8B on one rank, M = b·s tokens. Without recomputation a layer keeps (16-bit)
    the norms' and GEMMs' inputs 8h, Q, K, V and the projection input 4(q + kv), K and V
    repeated to the query heads 4(q − kv), the gated MLP's 6f, and SDPA's fp32 log-sum-exp;
    op-level checkpointing keeps the block input, wq, wv, w1 and w2's outputs and SDPA's
    output; full keeps the block input. Either way the layer in its backward holds the whole
    count beyond what it kept: L·kept + (whole − kept)."""
    M, h, q, kv, f, heads = B * S, 4096, 4096, 1024, 14336, 32
    lse = 4 * M * heads
    whole = M * (8 * h + 4 * (q + kv) + 4 * (q - kv) + 6 * f) + lse
    kept = {"selective": 2 * M * (h + q + kv + f + h + q) + lse, "full": 2 * M * h}
    for stack in ("torchtitan-2024", "torchtitan-2025"):
        for recompute, k in kept.items():
            got = _activations(stack, recompute)
            assert got == pytest.approx(LAYERS * k + whole - k, rel=1e-12), (stack, recompute)
    assert rebuilt_bytes(1.0, 3.0) == 0.0            # never negative


def test_megatron_selective_recomputation_rebuilds_no_layer():
    """Megatron's selective recomputation checkpoints the attention core alone: no layer is
    rebuilt, L layers of Korthikanti et al.'s selective count (no scores kept)."""
    run = ddlsim.load_config({**_data("megatron-core-2024"),
                              "parallel": {"zero_stage": 1, "data_parallel_size": 8}})
    sh = run.model.shape()
    from ddlsim.workloads.decoder.layerkernels import activation_kinds
    layer = sh.layer_activation_bytes(B, S, 1, False, "selective", **activation_kinds(run))
    assert ddlsim.memory_per_device(run).activations == pytest.approx(LAYERS * layer,
                                                                       rel=1e-12)


def test_a_stage_without_checkpointed_layers_rebuilds_none():
    """torchtitan's every-n-th-layer checkpointing (``recompute_every_n_layers``) with n past
    the stage's layers checkpoints none of them: its memory is the plan's without
    recomputation."""
    def acts(recompute: str, every: int | None = None) -> float:
        data = _data("torchtitan-2025")
        data["train"] = {**data["train"], "recompute": recompute}
        if every is not None:
            data["train"]["recompute_every_n_layers"] = every
        return ddlsim.memory_per_device(ddlsim.load_config(data)).activations
    assert acts("full", LAYERS + 1) == acts("none")
    assert acts("none") > acts("full", 2) > acts("full")
