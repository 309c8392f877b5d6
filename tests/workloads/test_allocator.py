"""Memory beyond model states and activations (ddlsim/workloads/allocator.py): each term by
hand from its source, the parts of the breakdown, and the search tier's agreement."""

from __future__ import annotations

import json

import numpy as np
import pytest

import ddlsim
from ddlsim.config import build_config
from ddlsim.errors import ConfigError
from ddlsim.software import stacks
from ddlsim.workloads.allocator import CUDA_CONTEXT_BYTES, comm_buffer_bytes, loss_bytes
from ddlsim.workloads.framework_memory import FRAMEWORKS, framework
from ddlsim.workloads.memory import PARTS, MemoryBreakdown

#: GPT-3 13B (40 layers, h 5120, V 51,200 padded as given) on two DGX A100 nodes
BASE = {"model": "gpt3-13b",
        "parallel": {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                     "data_parallel_size": 16},
        "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 2048},
        "system": {"preset": "dgx-a100", "nodes": 2}}


def _cfg(software: str, **parallel):
    data = {**BASE, "parallel": {**BASE["parallel"], **parallel},
            "system": {**BASE["system"], "software": software}}
    return build_config(data, [])


def test_every_stack_belongs_to_a_framework():
    """Each stack of software.yaml resolves to one framework's rules (longest prefix)."""
    names = stacks()
    assert "torchtitan-2024" in names and "deepspeed-2021" in names
    for name in names:
        assert framework(name).name in FRAMEWORKS
    assert framework("torchtitan-2025").kept_root == "head"
    assert framework("torchtitan-2024").kept_root == "edges"


def test_an_unknown_framework_is_refused_by_name():
    with pytest.raises(ConfigError, match="'jax-2025'.*allowed: .*megatron"):
        framework("jax-2025")


def test_loss_bytes_per_framework():
    """Megatron keeps the 16-bit logits and one fp32 copy (2 + 4 B); torchtitan's eager loss
    three fp32 tensors of the logits' size in its backward (12 B); split over TP·CP."""
    b, s, v = 2, 4096, 128256
    assert loss_bytes(framework("megatron-core-2024").logit_bytes, b, s, v, 4) == b * s * v / 4 * 6
    assert loss_bytes(framework("torchtitan-2024").logit_bytes, b, s, v, 1) == b * s * v * 12
    # torchtitan's loss parallelism under TP, at its backward's peak: four fp32 tensors of the
    # logits' size at once (torch/distributed/tensor/parallel/loss.py, deb9e15)
    titan = framework("torchtitan-2024")
    assert (titan.logits_at(1), titan.logits_at(8)) == (12, 16)
    assert list(titan.logits_at(np.array([1, 2]))) == [12, 16]
    assert framework("megatron-core-2024").logits_at(8) == 6
    # torchtitan 2025 compiles the loss with the model: the 16-bit logits and gradient; 2024
    # left the loss eager
    assert framework("torchtitan-2025").logits_at(1, True) == 4
    assert framework("torchtitan-2024").logits_at(1, True) == 12


def test_fsdp2_buffers_by_hand():
    """Per micro-batch: the gathered units, the kept edges in bf16 and one unit's bf16
    gradients and fp32 reduce-scatter input; per iteration (pipelining): the stage's
    parameters gathered and their gradients accumulated in fp32."""
    fm = framework("torchtitan-2024")
    unit, kept, stage, gathered = 2e8, 1e9, 3e9, 2 * 2e8 * 2
    per_mb = comm_buffer_bytes(fm, 3, 8, gathered, unit, kept, 2, 4, stage, True, False)
    assert per_mb == gathered + kept * 2 + unit * (2 + 4)
    whole = comm_buffer_bytes(fm, 3, 8, gathered, unit, kept, 2, 4, stage, True, True)
    assert whole == stage * (2 + 4)
    assert comm_buffer_bytes(fm, 1, 8, 0.0, unit, kept, 2, 4, stage, True, False) == 0.0


def test_deepspeed_buckets_by_hand():
    """ZeRO-1/2 under DeepSpeed: reduce_bucket_size (5e8) elements in the model dtype, twice
    with overlap_comm; none without data parallelism, none under ZeRO-3 or Megatron."""
    fm = framework("deepspeed")
    assert comm_buffer_bytes(fm, 1, 8, 0.0, 0, 0, 2, 2, 6e9, True, False) == 2 * 5e8 * 2
    assert comm_buffer_bytes(fm, 2, 8, 0.0, 0, 0, 2, 2, 6e9, False, False) == 5e8 * 2
    assert comm_buffer_bytes(fm, 1, 8, 0.0, 0, 0, 2, 2, 1e8, False, False) == 1e8 * 2
    assert comm_buffer_bytes(fm, 1, 1, 0.0, 0, 0, 2, 2, 6e9, True, False) == 0.0
    assert comm_buffer_bytes(framework("megatron-lm-2021"), 1, 8, 0.0, 0, 0, 2, 4, 6e9, True,
                             False) == 0.0


def test_rules_take_arrays_over_plans():
    """The search tier calls the same rule with arrays: element-wise equal to scalar calls."""
    fm = framework("deepspeed")
    zero, dp = np.array([0, 1, 2, 3]), np.array([8, 8, 1, 8])
    got = comm_buffer_bytes(fm, zero, dp, np.zeros(4), 1e7, 0.0, 2, 2, 6e9, True, False)
    want = [comm_buffer_bytes(fm, int(z), int(d), 0.0, 1e7, 0.0, 2, 2, 6e9, True, False)
            for z, d in zip(zero, dp)]
    assert list(got) == want


def test_breakdown_parts_reserved_and_total():
    """reserved is every part but the CUDA context; total adds it and is what must fit."""
    m = MemoryBreakdown(1.0, 2.0, 3.0, 4.0, 5.0, 100.0, 0, 6.0, 7.0)
    assert m.reserved == 21.0 and m.total == 28.0 and m.fits
    assert PARTS == ("weights", "gradients", "optimizer", "activations", "other", "buffers",
                     "context")
    assert set(PARTS) <= set(m.to_dict()) and m.to_dict()["reserved"] == 21.0


def test_gpu_ranks_hold_a_cuda_context_cpu_ranks_none():
    """A GPU rank: the CUDA context and one NCCL communicator per group of more than one rank
    (DP 16: 688 MiB; a TP pair: 544 MiB); a CPU socket: none."""
    from ddlsim.workloads.allocator import NCCL_COMM_BYTES, context_bytes
    m = ddlsim.memory_per_device(_cfg("megatron-core-2024"))
    assert m.context == CUDA_CONTEXT_BYTES + NCCL_COMM_BYTES["more"] == (1343 + 688) * 2**20
    tp2 = ddlsim.memory_per_device(_cfg("megatron-core-2024", tensor_model_parallel_size=2,
                                        data_parallel_size=8))
    assert tp2.context == (1343 + 544 + 688) * 2**20
    dev = _cfg("megatron-core-2024").system.device
    assert list(context_bytes(dev, (np.array([1, 2, 8]),))) == [
        1343 * 2**20, (1343 + 544) * 2**20, (1343 + 688) * 2**20]
    cpu = ddlsim.memory_per_device(ddlsim.load_config("examples/wiki-gpt2-9ranks-ddp.yaml"))
    assert cpu.context == 0.0


def test_torchtitan_fsdp_breakdown_by_hand():
    """GPT-3 13B under torchtitan-2024 FSDP over 16 ranks, one micro-batch of 2048: the
    buffers are two gathered layers, the kept root unit (the embedding with its learned
    positions, tied to the head, and the final norm) and one layer's bf16 gradients and fp32
    reduce-scatter input, and the root's bf16 gradients of the tied weight and the final norm,
    held from the head's backward to the root's reduce-scatter (decoder/fsdp_edges.py); the
    loss 12 B per logit."""
    cfg = _cfg("torchtitan-2024", zero_stage=3)
    m = ddlsim.memory_per_device(cfg)
    sh = cfg.model.shape()
    h, V = 5120, cfg.model.vocab_size
    layer, edges = sh.layer_params, sh.embedding_params
    root = edges + sh.norm_params
    held = V * h + sh.norm_params
    assert m.buffers == pytest.approx(2 * layer * 2 + root * 2 + layer * (2 + 4) + held * 2,
                                      rel=1e-12)
    # the loss, the final norm's input and output and the head's input (16-bit), and the
    # embedding output (one stage: first and last)
    assert m.other == pytest.approx(2048 * V * 12 + 2048 * 2 * h * 3 + 2048 * h, rel=1e-12)
    # FSDP2 keeps the shards in fp32, the optimizer's master: 4 B weights, 8 B Adam moments,
    # 4 B gradients (reduced in fp32), each over the 16 ranks
    n = sh.params
    assert (m.weights, m.optimizer, m.gradients) == pytest.approx(
        (4 * n / 16, 8 * n / 16, 4 * n / 16), rel=1e-12)


@pytest.mark.parametrize("software, zero, dtype", [
    ("deepspeed", 1, "bf16"), ("deepspeed", 2, "bf16"), ("megatron-core-2024", 1, "bf16"),
    ("deepspeed-2021", 0, "fp16"), ("deepspeed-2021", 3, "fp16")])
def test_search_tier_memory_equals_predict(software, zero, dtype):
    """The search tier's memory of one plan is memory_per_device's, buffers, step temporaries
    and context included (torchtitan's FSDP2 stacks are searched by the exact tier, which
    calls memory_per_device itself: ddlsim.workloads.decoder.fsdp.vector_refusal)."""
    from ddlsim.search.family import vector_family
    from ddlsim.search.plans import VECTOR_FIELDS, enumerate_plans
    cfg = build_config({**BASE, "parallel": {**BASE["parallel"], "zero_stage": zero},
                        "train": {**BASE["train"], "recompute": "full", "dtype": dtype},
                        "system": {**BASE["system"], "software": software}}, [])
    fields = {p: getattr(getattr(cfg, p.split(".")[0]), p.split(".")[1]) for p in VECTOR_FIELDS}
    fields["parallel.schedule"] = cfg.parallel.schedule
    plans = enumerate_plans({}, fields, cfg.system.num_devices)
    family = vector_family("gpt")
    got = family.memory(family.prepare(cfg), plans)[0][0]
    m = ddlsim.memory_per_device(cfg)
    assert got == pytest.approx(m.total, rel=1e-12)
    assert m.buffers > 0 or software == "megatron-core-2024" or zero == 0


def test_a_result_saved_before_the_new_parts_reads_them_as_zero(tmp_path):
    """A result JSON written before buffers/context existed loads with both 0 (they were
    not counted then), its total unchanged."""
    r = ddlsim.predict(_cfg("megatron-core-2024"), check_fit=False)
    d = r.to_dict()
    old = {k: v for k, v in d["memory_per_device_bytes"].items()
           if k not in ("buffers", "context", "reserved")}
    d["memory_per_device_bytes"] = old
    back = type(r).from_dict(json.loads(json.dumps(d)))
    assert back.memory.buffers == 0.0 and back.memory.context == 0.0
    assert back.memory.weights == r.memory.weights


def test_deepspeed_fp16_step_temporaries_by_hand():
    """DeepSpeed without ZeRO: the step builds fp32 copies of the gradients and their flat
    concatenation (8 B per parameter) after the backward freed the activations, so the
    temporaries are the larger of the loss's and the step's beyond the activations."""
    from ddlsim.workloads.allocator import step_temporaries
    fm = framework("deepspeed-2021")
    assert step_temporaries(fm, 0, True, 1e9) == 8e9
    assert step_temporaries(fm, 1, True, 1e9) == 0.0
    assert step_temporaries(fm, 0, False, 1e9) == 0.0    # not fp16: not FP16_Optimizer
    assert step_temporaries(framework("megatron-core-2024"), 0, True, 1e9) == 0.0
    cfg = build_config({**BASE, "train": {**BASE["train"], "dtype": "fp16"},
                        "system": {**BASE["system"], "software": "deepspeed-2021"}}, [])
    m = ddlsim.memory_per_device(cfg)
    n = cfg.model.shape().params
    assert m.other == pytest.approx(8 * n - m.activations, rel=1e-12)
    assert type(m.other) is float


def test_torchtitan_op_level_sac_keeps_by_hand():
    """Llama 3.1 8B (h 4096, 32 heads, 8 KV heads, f 14336) under torchtitan's op-level SAC,
    one rank: the block input, wq (4096), wv (1024), w1 (14336) and w2 (4096) outputs, SDPA's
    output (4096) in 16 bits, its log-sum-exp in fp32 per head; with TP 2 and sequence
    parallelism the column outputs halve, w2's stays whole, and the two reduce-scatter
    outputs are added."""
    from ddlsim.workloads.decoder.memory import sac_activation_bytes
    cfg = ddlsim.load_config("examples/llama3-8b-fsdp2-h100.yaml")
    sh, M = cfg.model.shape(), 2 * 8192
    widths = 4096 + 4096 + 1024 + 14336 + 4096 + 4096
    assert sac_activation_bytes(sh, 2, 8192, 1, False) == 2 * M * widths + 4 * M * 32
    widths_tp2 = 2048 + 2048 + 512 + 7168 + 4096 + 2048 + 2 * 2048
    assert sac_activation_bytes(sh, 2, 8192, 2, True) == 2 * M * widths_tp2 + 4 * M * 16
    m = ddlsim.memory_per_device(cfg)
    b, s = cfg.train.micro_batch_size, cfg.train.seq_length
    # and the layer in backward, rebuilt by its checkpoint (memory.rebuilt_bytes): its whole
    # count (norms, GEMM inputs 8h; Q, K, V, projection input 4(q + kv); K and V repeated
    # to the query heads 4(q - kv); the gated MLP's 6f; SDPA's log-sum-exp) less what it kept
    M = b * s
    whole = 2 * M * (4 * 4096 + 2 * (4096 + 1024) + 2 * (4096 - 1024) + 3 * 14336) + 4 * M * 32
    kept = sac_activation_bytes(sh, b, s, 1, False)
    assert m.activations == pytest.approx(32 * kept + whole - kept, rel=1e-12)
