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
from ddlsim.simulator.kernels.attention import attention_kernels, flash_forward_flops
from ddlsim.workloads.decoder.partition import make_partitioner
from ddlsim.workloads.decoder.plan import resolve_plan
from ddlsim.workloads.trace import P2P, Collective, Compute

from cpbase import BASE

B_KV = 2 * 1 * 2048 * 256 * 2 / 2


def config(**over) -> ddlsim.RunConfig:
    d = copy.deepcopy(BASE)
    if over.get("parallel__cp_comm_type") == "all_gather" and "system__software" not in over:
        # the preset's megatron-core-2024 has the ring only (rule no_cp_all_gather)
        d["system"]["software"] = "megatron-core-2025"
    for key, value in over.items():
        section, field = key.split("__")
        d[section][field] = value
    sw = d["system"].get("software")
    if "torchtitan" in str(sw if isinstance(sw, str) else (sw or {}).get("stack")):
        d["parallel"].setdefault("sequence_parallel", True)   # its TP always is (tp_needs_sp)
    return ddlsim.load_config(d)


def layer(cfg):
    part = make_partitioner(resolve_plan(cfg, cfg.model.shape()))
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
              for op in b.flat.ops if op.payload.name.startswith("grad.")
              and isinstance(op.payload, Collective)}   # not the DDP's passes (dpsync)
    assert groups == {"dp_cp"}


def test_ring_hides_what_the_gather_exposes():
    # At s = 8192 a ring step (core/4 = 4·8192²·1024/32 ≈ 8.6e9 FLOPs, ~12 µs at 75 % of
    # 989 TFLOP/s) outlasts a 1 MiB NVLink hop (~2.3 µs at 450 GB/s), so the ring's transfers
    # are hidden; the all-gather precedes the core and is exposed.
    ring = ddlsim.predict(config(system__software="megatron-core-2025"), check_fit=False)
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


# Context parallelism's fused attention kernels at the shapes the stack launches them.
# Setting (the module docstring's): b = 1, s = 8192, cp = 4, 16 query heads
# of d = 64 over t = 2, so each rank holds 8 heads and two chunks of c = s/(2cp) = 1024
# tokens; the stack's attention is cuDNN's fused kernel. With ``n = s/128`` blocks per row, a
# causal square of ``s`` computes ``(n+1)/(2n)`` of its ``s²`` scores.
#
# Before the per-step shapes every ring step was the whole-sequence kernel scaled to ``1/cp²``
# of it, so one rank's forward core did ``4·8·64·s²·(65/128)/4`` FLOPs in all; the per-step
# kernels must sum to the same figure (the FLOPs do not move, only the lengths and masks at
# which the measured efficiency is looked up).

S, C, HEADS, D = 8192, 1024, 8, 64
#: one rank's forward core before the per-step shapes: 4·b·heads·s²·d · causal(s) / cp
RANK_FORWARD = 4 * HEADS * S * S * D * (S / 128 + 1) / (2 * S / 128) / 4


def step_layer(comm: str = "p2p"):
    _, fwd, bwd = layer(config(parallel__cp_comm_type=comm))
    return fwd, bwd


def core_kernels(ops, tag):
    return [k for op in ops if isinstance(op.payload, Compute)
            and op.payload.name.startswith(tag) for k in op.payload.kernels]


@pytest.mark.parametrize("comm", ["p2p", "all_gather"])
def test_summed_kernel_flops_equal_the_whole_sequence_count(comm):
    fwd, bwd = step_layer(comm)
    assert sum(k.flops for k in core_kernels(fwd, "fwd.attn_core")) == \
        pytest.approx(RANK_FORWARD, rel=1e-12)
    assert sum(k.flops for k in core_kernels(bwd, "bwd.attn_core")) == \
        pytest.approx(2.5 * RANK_FORWARD, rel=1e-12)


def test_ring_step_zero_is_causal_and_later_steps_unmasked_half_queries():
    # Step 0: the rank's 2c queries on its own 2c keys, causal. Later steps of rank 0: the
    # second query chunk (c) on both key chunks (2c) of the arriving block, no mask.
    fwd, bwd = step_layer()
    for ops, tag, pass_ in ((fwd, "fwd.attn_core", "fwd"), (bwd, "bwd.attn_core", "bwd")):
        shapes = [(k.shape, k.variant) for k in core_kernels(ops, tag)]
        assert shapes == [((2 * C, 2 * C, D), f"cudnn/{pass_}/causal")] + \
            [((C, 2 * C, D), f"cudnn/{pass_}/full")] * 3


def test_all_gather_runs_one_causal_call_per_query_chunk():
    # Rank 0's chunks 0 and 2cp − 1 = 7: c queries on keys 0 … c, and on keys 0 … 8c = s.
    fwd, _ = step_layer("all_gather")
    kernels = core_kernels(fwd, "fwd.attn_core")
    assert [(k.shape, k.variant) for k in kernels] == [
        ((C, C, D), "cudnn/fwd/causal"), ((C, S, D), "cudnn/fwd/causal")]
    # (c, c) causal: 9/16 of c²; (c, s): the 7c keys before the square whole, then 9/16 of c²
    assert [k.flops for k in kernels] == [4 * HEADS * D * C * C * 9 / 16,
                                          4 * HEADS * D * (C * 7 * C + C * C * 9 / 16)]


def test_ring_kernel_traffic_counts_queries_and_keys_at_their_own_lengths():
    # Forward moves Q, O (c queries) and K, V (2c keys): 2·b·(c + 2c)·heads·d·2 bytes.
    fwd, _ = step_layer()
    later = core_kernels(fwd, "fwd.attn_core")[1]
    assert later.bytes == 2 * (C + 2 * C) * HEADS * D * 2


def test_bottom_right_causal_needs_at_least_as_many_keys_as_queries():
    assert flash_forward_flops(1, 1, 256, 64, True, s_k=256) == 4 * 256 * 256 * 64 * 3 / 4
    assert flash_forward_flops(1, 1, 128, 64, True, s_k=384) == 4 * 64 * 128 * (256 + 128)
    with pytest.raises(ValueError, match="s_k >= s"):
        flash_forward_flops(1, 1, 512, 64, True, s_k=256)


def test_unfused_kernels_refuse_a_key_length_of_their_own():
    with pytest.raises(ValueError, match="only the fused kinds"):
        attention_kernels("fused_softmax", 1, 8, 1024, 64, 2, False, False, s_k=2048)


# PyTorch's ring (software.cp_attention: torch; ddlsim/workloads/decoder/partition/torch_cp.py),
# as torchtitan runs it. Its Llama repeats K/V to the 16 query heads before SDPA, so one rank's
# bf16 query-side tensor (Q, O, or K, V at the query heads) is E = b·(s/cp)·(a/t)·d·2 bytes and
# the K/V it moves is 2E: four times the TE ring's B_kv (16 query heads over 4 K/V heads).
E = 1 * 2048 * 8 * 64 * 2
L = 1 * 2048 * 8 * 4                  # the fp32 log-sum-exp of those rows


def torch_layer(comm: str = "all_gather", compile: bool = False):
    return layer(config(parallel__cp_comm_type=comm, parallel__zero_stage=3,
                        system__software={"stack": "torchtitan-2024", "compile": compile}))


def test_torch_all_gather_rotation_gathers_repeated_kv_once_per_pass_overlapping_step_zero():
    # _AllGatherRotater: one all-gather of the flat K/V (2E per rank, 4 · 2E gathered) at
    # step 0, on its own stream; step 0 runs on the local block, steps 1-3 wait for it.
    # Backward: gathered again, and no reduce-scatter (dK/dV travel the ring instead).
    _, fwd, bwd = torch_layer()
    assert 2 * E == 4 * B_KV
    colls = [(op.payload.name, op.payload.op, op.payload.bytes, op.stream) for op in fwd + bwd
             if isinstance(op.payload, Collective) and op.payload.group == "cp"]
    assert colls == [("fwd.kv.all_gather", "all_gather", 4 * 2 * E, "cp"),
                     ("bwd.kv.all_gather", "all_gather", 4 * 2 * E, "cp")]
    gather = next(i for i, op in enumerate(fwd) if op.payload.name == "fwd.kv.all_gather")
    steps = [op for op in fwd if op.payload.name == "fwd.attn_core.step"]
    assert gather not in steps[0].deps
    assert [op.deps for op in steps[1:]] == [(gather,)] * 3


def test_torch_ring_sends_fp32_kv_gradients_to_the_next_rank_after_every_step():
    # _templated_ring_attention_backward: dK/dV accumulate in fp32 (2 · 2E bytes) and go to
    # rank +1 by the all-to-all rotater after each of the cp = 4 steps; each accumulation
    # after step 0 first waits for the accumulators from rank −1.
    _, _, bwd = torch_layer()
    sends = [(op.payload.bytes, op.payload.peer, op.stream) for op in bwd
             if isinstance(op.payload, P2P) and op.payload.kind == "send"]
    assert sends == [(4 * E, 1, "cp.dkv")] * 4
    recvs = [i for i, op in enumerate(bwd) if op.payload.name == "bwd.dkv.recv"]
    accs = [op for op in bwd if op.payload.name == "bwd.attn_core.accumulate"]
    assert [r in op.deps for op, r in zip(accs[1:], recvs)] == [True] * 3
    assert all(r not in accs[0].deps for r in recvs)


def test_torch_all_to_all_rotation_permutes_repeated_kv_every_step():
    # _AllToAllRotater (torchtitan's 'alltoall', ddlsim's p2p): cp − 1 = 3 permutes of 2E to
    # rank +1 each pass (forward and backward), plus the 4 fp32 dK/dV sends.
    _, fwd, bwd = torch_layer("p2p")
    sends = Counter((op.payload.name, op.payload.bytes) for op in fwd + bwd
                    if isinstance(op.payload, P2P) and op.payload.kind == "send")
    assert sends == {("fwd.kv.send", 2 * E): 3, ("bwd.kv.send", 2 * E): 3,
                     ("bwd.dkv.send", 4 * E): 4}


@pytest.mark.parametrize("comm", ["all_gather", "p2p"])
def test_torch_ring_runs_the_ring_steps_flops_as_the_whole_sequence(comm):
    # One causal (2c, 2c) call, then cp − 1 unmasked (c, 2c) calls of rank 0, FlashAttention-2
    # (torchtitan's sdpa_kernel([FLASH, EFFICIENT])); FLOPs as the whole-sequence count.
    _, fwd, bwd = torch_layer(comm)
    for ops, tag, pass_, factor in ((fwd, "fwd.attn_core", "fwd", 1.0),
                                    (bwd, "bwd.attn_core", "bwd", 2.5)):
        flash = [k for k in core_kernels(ops, tag) if k.kind == "flash"]
        assert [(k.shape, k.variant) for k in flash] == \
            [((2 * C, 2 * C, D), f"flash2/{pass_}/causal")] + \
            [((C, 2 * C, D), f"flash2/{pass_}/full")] * 3
        assert sum(k.flops for k in flash) == pytest.approx(factor * RANK_FORWARD, rel=1e-12)


@pytest.mark.parametrize("compile, merge", [
    # eager: cast 1.5E, three fp32 ops 3E + 2E + 3E, the output's cat 4E; six lse kernels
    (False, [1.5 * E, 3 * E, 2 * E, 3 * E, 4 * E, 0.75 * L, L, 0.75 * L, L, 0.75 * L, 2 * L]),
    # compiled: one pass (read E/2 bf16 and the 2E fp32 output, write 2E), one over the lse
    (True, [4.5 * E, 2.5 * L]),
])
def test_torch_merge_of_a_later_step_in_fp32(compile, merge):
    # _SDPAMerger of rank 0's partial steps (c of its 2c queries), after the flash call.
    _, fwd, _ = torch_layer(compile=compile)
    steps = [op.payload for op in fwd if op.payload.name == "fwd.attn_core.step"]
    for step in steps[1:3]:
        memory = [k.bytes for k in step.kernels if k.kind == "memory"]
        assert memory == merge + ([] if compile else [4 * E])   # eager: the unused K/V cat
    last = [k.bytes for k in steps[3].kernels if k.kind == "memory"]
    assert last == merge + [E if compile else 3 * E]              # results(): back to bf16


def test_compiled_torch_ring_waits_for_each_exchange_before_the_next_step():
    # Traced, a functional collective is waited as soon as it is issued (torch
    # _functional_collectives._maybe_wrap_tensor); Inductor sinks no wait by default
    # (reorder_for_compute_comm_overlap False). So compiled: step 0 waits for the K/V
    # all-gather; in the backward each flash waits for the dK/dV permute issued before it.
    _, fwd, bwd = torch_layer(compile=True)
    gather = next(i for i, op in enumerate(fwd) if op.payload.name == "fwd.kv.all_gather")
    steps = [op for op in fwd if op.payload.name == "fwd.attn_core.step"]
    assert [op.deps for op in steps] == [(gather,)] * 4
    recvs = [i for i, op in enumerate(bwd) if op.payload.name == "bwd.dkv.recv"]
    bsteps = [op for op in bwd if op.payload.name == "bwd.attn_core.step"]
    assert [r in op.deps for op, r in zip(bsteps[1:], recvs)] == [True] * 3
    assert all(r not in bsteps[0].deps for r in recvs)


def test_compiled_torch_all_to_all_ring_waits_for_the_permute_issued_with_each_step():
    # _AllToAllRotater, compiled: step i (i < cp − 1) also waits for the permute it was
    # issued with, which carries step i + 1's K/V; the last step only for its own.
    _, fwd, _ = torch_layer("p2p", compile=True)
    recvs = [i for i, op in enumerate(fwd) if op.payload.name == "fwd.kv.recv"]
    steps = [op for op in fwd if op.payload.name == "fwd.attn_core.step"]
    assert [op.deps for op in steps] == [(recvs[0],), (recvs[0], recvs[1]),
                                         (recvs[1], recvs[2]), (recvs[2],)]


@pytest.mark.parametrize("comm", ["all_gather", "p2p"])
def test_compiled_torch_ring_is_slower_than_eager_by_its_exposed_transfers(comm):
    # Same kernels up to the fusions compile makes; the waits can only add time, and the
    # two engines still agree.
    def run(compile, engine="analytical"):
        cfg = config(parallel__cp_comm_type=comm, parallel__zero_stage=3,
                     system__software={"stack": "torchtitan-2024", "compile": compile})
        return ddlsim.predict(cfg, engine=engine, check_fit=False)
    a, d = run(True), run(True, "des")
    assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=1e-2)
    assert a.breakdown.exposed_comm_s["cp"] > run(False).breakdown.exposed_comm_s["cp"]


@pytest.mark.parametrize("comm", ["all_gather", "p2p"])
def test_both_engines_time_the_torch_ring_alike(comm):
    cfg = config(parallel__cp_comm_type=comm, parallel__zero_stage=3,
                 system__software="torchtitan-2024")
    a = ddlsim.predict(cfg, check_fit=False)
    d = ddlsim.predict(cfg, engine="des", check_fit=False)
    assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=1e-2)
