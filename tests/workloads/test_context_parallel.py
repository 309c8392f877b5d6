"""Context parallelism (ring attention and all-gather of K/V) against hand derivations.

Setting: a Llama-style layer (h = 1024, 16 query heads, 4 key/value heads of d = 64, so
gd = 256; SwiGLU f = 2816), micro-batch b = 1, sequence s = 8192, bf16 (e = 2), TP t = 2,
CP c = 4 on one DGX H100 node (8 GPUs: tp·cp = 8, dp = 1). One K/V block (a rank's
``s/c`` positions, its ``g/t`` heads):

    B_kv = 2 · b · (s/c) · gd · e / t = 2 · 1 · 2048 · 256 · 2 / 2 = 1,048,576 bytes.
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest

import ddlsim
from ddlsim.workloads.decoder.partition import make_partitioner
from ddlsim.workloads.trace import P2P, Collective, Compute

B_KV = 2 * 1 * 2048 * 256 * 2 / 2
BASE = {
    "model": {"architecture": "llama", "num_hidden_layers": 2, "hidden_size": 1024,
              "num_attention_heads": 16, "num_key_value_heads": 4, "intermediate_size": 2816,
              "vocab_size": 32000},
    "parallel": {"tensor_model_parallel_size": 2, "context_parallel_size": 4},
    "train": {"micro_batch_size": 1, "global_batch_size": 2, "seq_length": 8192},
    "system": {"preset": "dgx-h100", "nodes": 1},
}


def config(**over) -> ddlsim.RunConfig:
    d = copy.deepcopy(BASE)
    for key, value in over.items():
        section, field = key.split("__")
        d[section][field] = value
    return ddlsim.load_config(d)


def layer(cfg):
    part = make_partitioner(cfg, cfg.model.shape())
    return part, part.layer_forward(), part.layer_backward(0.0)


def test_ring_moves_kv_blocks_around_the_ring():
    # Forward: c − 1 = 3 hops of B_kv (send to +1, receive from −1). Backward: K/V make the
    # same 3 hops again and dK/dV make c = 4 (one after each step, back to their owner).
    _, fwd, bwd = layer(config())
    sends = Counter((op.payload.name, op.payload.bytes, op.payload.peer) for op in fwd + bwd
                    if isinstance(op.payload, P2P) and op.payload.kind == "send")
    assert sends == {("fwd.kv.send", B_KV, 1): 3, ("bwd.kv.send", B_KV, 1): 3,
                     ("bwd.dkv.send", B_KV, 1): 4}
    assert all(op.payload.group == "cp" for op in fwd + bwd if isinstance(op.payload, P2P))


def test_each_ring_step_waits_only_for_its_own_block():
    # Step i's attention depends on the receive of block i (which overlapped step i − 1),
    # and block i + 1 is forwarded as soon as block i has arrived.
    _, fwd, _ = layer(config())
    steps = [i for i, op in enumerate(fwd) if op.payload.name == "fwd.attn_core.step"]
    recvs = [i for i, op in enumerate(fwd) if op.payload.name == "fwd.kv.recv"]
    sends = [i for i, op in enumerate(fwd) if op.payload.name == "fwd.kv.send"]
    assert len(steps) == 4 and fwd[steps[0]].deps == ()
    assert [fwd[s].deps for s in steps[1:]] == [(r,) for r in recvs]
    assert [fwd[s].deps for s in sends[1:]] == [(r,) for r in recvs[:-1]]
    assert all(fwd[r].stream == "cp" for r in recvs)


def test_attention_core_is_balanced_over_the_ring():
    # Megatron-Core's 2·c chunks: every step does the same work, 1/c of the rank's core;
    # the rank's core is 4·b·s²·ad / (t·c) = 4·8192²·1024 / 8 FLOPs (the mask not exploited,
    # as DecoderShape counts it).
    part, fwd, bwd = layer(config())
    steps = [op.payload.flops for op in fwd if op.payload.name == "fwd.attn_core.step"]
    core = 4 * 8192**2 * 1024 / 8
    assert steps == [core / 4] * 4
    assert sum(op.payload.flops for op in bwd if op.payload.name == "bwd.attn_core.step") \
        == pytest.approx(2 * core, rel=1e-12)


def test_gemms_shrink_by_cp():
    # Every GEMM works on s/c tokens: its FLOPs are 1/c of the plain TP plan's.
    cp4 = layer(config())[1]
    cp1 = layer(config(parallel__context_parallel_size=1, parallel__data_parallel_size=1))
    assert cp1[0].structured is False
    shape = config().model.shape()
    g = shape.layer_gemm_flops(1, 8192)
    gemms = g["q"] + g["kv"] + g["proj"] + g["mlp"]
    got = sum(op.payload.flops for op in cp4 if isinstance(op.payload, Compute)
              and op.payload.name in ("fwd.qkv", "fwd.proj", "fwd.fc1", "fwd.fc2"))
    assert got == pytest.approx(gemms / (2 * 4), rel=1e-12)


def test_all_gather_variant():
    # Forward: one all-gather of the c blocks (nccl-tests size: the gathered 4·B_kv);
    # backward: the all-gather again and a reduce-scatter of dK/dV of the same size.
    _, fwd, bwd = layer(config(parallel__cp_comm_type="all_gather"))
    colls = [(op.payload.name, op.payload.op, op.payload.bytes) for op in fwd + bwd
             if isinstance(op.payload, Collective) and op.payload.group == "cp"]
    assert colls == [("fwd.kv.all_gather", "all_gather", 4 * B_KV),
                     ("bwd.kv.all_gather", "all_gather", 4 * B_KV),
                     ("bwd.dkv.reduce_scatter", "reduce_scatter", 4 * B_KV)]


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_activation_memory_divides_by_cp(recompute):
    # Each rank keeps 1/c of every activation (the s² scores: s/c queries × s keys). Same
    # TP, no CP, 2 GPUs (data_parallel_size 1): the layers' activations are c times larger.
    with_cp = ddlsim.memory_per_device(config(train__recompute=recompute))
    without = ddlsim.memory_per_device(config(train__recompute=recompute,
                                              parallel__context_parallel_size=1,
                                              parallel__data_parallel_size=1))
    assert with_cp.activations == pytest.approx(without.activations / 4, rel=1e-12)


def test_cp_of_one_is_no_context_parallelism():
    plain = copy.deepcopy(BASE)
    del plain["parallel"]["context_parallel_size"]
    plain["parallel"]["data_parallel_size"] = 1
    explicit = copy.deepcopy(plain)
    explicit["parallel"]["context_parallel_size"] = 1
    a, b = (ddlsim.predict(d, check_fit=False) for d in (plain, explicit))
    assert a.iteration_time_s == b.iteration_time_s and a.memory.total == b.memory.total


def test_gradients_are_reduced_over_dp_times_cp():
    # Megatron-Core: the gradient group under CP is dp × cp (family dp_cp, 4 ranks here).
    wl = ddlsim.build_workload(config())
    assert wl.groups["dp_cp"].size == 4
    groups = {op.payload.group for b in wl.classes[0].program.blocks.values()
              for op in b.flat.ops if op.payload.name.startswith("grad.")}
    assert groups == {"dp_cp"}


def test_ring_hides_what_the_gather_exposes():
    # At s = 8192 a ring step (core/4 = 4·8192²·1024/32 ≈ 8.6e9 FLOPs, ~12 µs at 75 % of
    # 989 TFLOP/s) outlasts a 1 MiB NVLink hop (~2.3 µs at 450 GB/s), so the ring's transfers
    # are hidden; the all-gather precedes the core and is exposed.
    ring = ddlsim.predict(config(), check_fit=False)
    ag = ddlsim.predict(config(parallel__cp_comm_type="all_gather"), check_fit=False)
    assert ring.breakdown.exposed_comm_s.get("cp", 0.0) < 0.05 * ag.breakdown.exposed_comm_s["cp"]
    assert ring.iteration_time_s < ag.iteration_time_s


def test_both_engines_time_the_ring_alike():
    # One DGX H100 node: each GPU sends one block to one peer over NVSwitch, hidden behind
    # the step it overlaps. The engines agree to within 2 %: the DES also lets the ring's
    # transfers and the gradient buckets share NVLink with the TP collectives in flight at
    # the same time, which the analytical engine times alone.
    cfg = config()
    a = ddlsim.predict(cfg, check_fit=False)
    d = ddlsim.predict(cfg, engine="des", check_fit=False)
    assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=2e-2)
    assert d.iteration_time_s >= a.iteration_time_s * (1 - 1e-9)


@pytest.mark.parametrize("over, words", [
    ({"train__seq_length": 8196}, ["seq_length = 8196", "2 × context_parallel_size = 8"]),
    # ZeRO-3 from module hooks (DeepSpeed's, as a what-if past its no-CP rule); per-layer
    # FSDP units with CP are modelled (tests/test_torchtitan_stack.py)
    ({"parallel__zero_stage": 3, "system__software": {"stack": "deepspeed", "what_if": True}},
     ["zero_stage = 3", "zero3_gather = 'per_module'"]),
    ({"parallel__dp_strategy": "reduce_scatter"}, ["dp_strategy = 'reduce_scatter'"]),
    ({"parallel__cp_comm_type": "a2a"}, ["cp_comm_type"]),
])
def test_plans_context_parallelism_cannot_run_are_refused(over, words):
    with pytest.raises(ddlsim.ConfigError) as err:
        config(**over)
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def test_moe_with_cp_is_a_limit_of_the_2024_stack_only():
    # TP2 × CP4 on 8 GPUs (DP 1), EP 4 with expert TP 2: EP × expert TP = 8 folds over
    # TP × CP × DP = 8 (Megatron-Core's MoE parallel folding). Megatron-Core of 2024 refused
    # EP with CP (its rule, with the source); 2025 runs it, on both engines (docs/moe.md)
    d = copy.deepcopy(BASE)
    d["model"].update({"num_local_experts": 4, "num_experts_per_tok": 2})
    d["parallel"].update({"expert_model_parallel_size": 4, "sequence_parallel": True,
                          "moe": {"token_dispatcher_type": "alltoall"}})
    with pytest.raises(ddlsim.ConfigError, match="moe_ep_no_context_parallel"):
        ddlsim.load_config(d)
    d["system"]["software"] = "megatron-core-2025"
    cfg = ddlsim.load_config(d)
    assert (cfg.mesh.size("ep"), cfg.mesh.size("etp"), cfg.mesh.size("edp")) == (4, 2, 1)
    for engine in ("analytical", "des"):
        assert ddlsim.predict(cfg, engine, check_fit=False).iteration_time_s > 0
