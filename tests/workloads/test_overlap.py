"""ZeRO-3 / FSDP and the overlap options (docs/overlap.md): counts, exposed communication,
memory, refusals. Numbers are derived in each test from the trace's definition."""

from __future__ import annotations

import copy

import pytest

import ddlsim
from ddlsim.config import build_config
from ddlsim.simulator.costs import CostModel
from ddlsim.workloads.decoder.builder import StageBuilder
from ddlsim.workloads.trace import Collective, Compute, P2P

GPT = {"model": "gpt3-1.3b",
       "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 1024},
       "system": {"preset": "dgx-a100", "nodes": 1}}


def _cfg(*overrides, base=GPT):
    return build_config(copy.deepcopy(base), list(overrides))


def _zero3(prefetch: int, *more):
    return _cfg("parallel.zero_stage=3", "parallel.data_parallel_size=8",
                "parallel.pipeline_model_parallel_size=1", "parallel.tensor_model_parallel_size=1",
                f"system.software={{stack: megatron-core-2024, what_if: true, overlap: "
                f"{{zero3_prefetch_layers: {prefetch}}}}}", *more)


def _count(wl, pred) -> int:
    """Ops matching ``pred`` issued over the iteration by one rank of each class, summed."""
    n = 0
    for cls in wl.classes:
        prog = cls.program
        for step in prog.steps:
            n += sum(op.repeat for op in prog.blocks[step.block].flat.ops if pred(op.payload))
    return n


# ---------------------------------------------------------------- ZeRO-3
def test_zero3_gathers_every_layer_twice_per_microbatch():
    """gpt3-1.3b: L = 24 layers; global batch 32 over DP 8 at micro-batch 1 is m = 4
    micro-batches. The forward and the backward each all-gather the 24 layers (FSDP/DeepSpeed free
    them after use), the backward reduce-scatters 24: 2·24·4 = 192 gathers, 96 RS."""
    wl = ddlsim.build_workload(_zero3(1, "train.global_batch_size=32"))
    gathers = _count(wl, lambda p: isinstance(p, Collective) and p.name == "param.all_gather")
    scatters = _count(wl, lambda p: isinstance(p, Collective) and p.name == "grad.reduce_scatter")
    assert (gathers, scatters) == (2 * 24 * 4, 24 * 4)


def _zero3_parts(cfg):
    """Durations of the pieces (CostModel): embedding, one layer forward / backward, head
    forward / backward, one layer's gather and reduce-scatter, the optimizer."""
    wl = ddlsim.build_workload(cfg)
    cost = CostModel(cfg.system, wl)
    b = StageBuilder.from_config(cfg, cfg.model.shape())

    def t(items):
        return sum(cost.compute(x) if isinstance(x, Compute) else cost.collective(x)
                   for x in items)
    layer = b.shape.layer_params * b.dt
    a = cost.collective(Collective("g", "all_gather", "dp", layer))
    # gradients are reduce-scattered in the stack's grad_reduce_dtype (fp32 with bf16 here)
    r = cost.collective(Collective("r", "reduce_scatter", "dp", b.shape.layer_params * b.gdt))
    opt = [o.payload for o in wl.classes[0].program.blocks["update"].ops
           if isinstance(o.payload, Compute)]
    return (t(b.embedding_forward()), t(b.layer_forward()), t(b.head_forward()),
            t(b.head_backward()), t(b.layer_backward()), a, r, t(opt))


def test_zero3_without_prefetch_exposes_every_gather(monkeypatch):
    """zero3_prefetch_layers = 0: a layer's gather starts when the layer before it has ended
    and the layer waits for it; in the backward the dp stream runs RS(l) before the gather
    of the next layer. PyTorch FSDP's root unit (embedding, final norm, output layer:
    decoder/fsdp_edges.py) is gathered before the embedding (g) and its gradients
    reduce-scattered after the embedding's backward (eb: decoder/embedding_grad.py) (rr),
    every micro-batch. With e, f, hf, hb, b (compute), a (gather), r (reduce-scatter), L
    layers, m micro-batches:

        forward  = g + e + a + f + (L − 1)(a + f) + hf
        backward = max(hb, a) + b + (L − 1)(r + a + b) + max(r, eb)
        T = Σ_mb (forward + backward + rr) + optimizer,

    the dp stream running each micro-batch's last reduce-scatters (r, rr) before the next
    forward's root gather. megatron-core-2024's ZeRO-3 is PyTorch's FSDP1, whose passes over
    each unit's gradients (a cat, the pre- and post-division on their own stream:
    decoder/fsdp1_passes.py, tests/test_fms_fsdp1_grad_passes.py) are left out here: this
    closed form is the gathers' and reduce-scatters' schedule."""
    from ddlsim.workloads.decoder import fsdp1_passes
    monkeypatch.setattr(fsdp1_passes, "add_grad_passes", lambda *args: None)
    cfg = _zero3(0, "train.global_batch_size=16")
    e, f, hf, hb, bw, a, r, opt = _zero3_parts(cfg)
    wl = ddlsim.build_workload(cfg)
    cost = CostModel(cfg.system, wl)
    blocks = wl.classes[0].program.blocks
    g, rr = (cost.collective(next(o.payload for o in blocks[blk].ops
                                  if getattr(o.payload, "name", "") == name))
             for blk, name in (("F0", "param.all_gather.root"),
                               ("B0", "grad.reduce_scatter.root")))
    eb = cost.compute(next(o.payload for o in blocks["B0"].ops
                           if getattr(o.payload, "name", "") == "bwd.embedding"))
    L, m = 24, 2
    rest = f + (L - 1) * (a + f) + hf + max(hb, a) + bw + (L - 1) * (r + a + bw)
    want = m * (g + e + a + rest + max(r, eb) + rr) + opt
    got = ddlsim.predict(cfg, check_fit=False).iteration_time_s
    assert got == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("engine", ["analytical", "des"])
def test_zero3_prefetch_hides_gathers(engine):
    """One layer ahead hides the gathers behind the previous layer (≥ 20 % faster here:
    gpt3-1.3b's 50 MB layer gathers over 8 A100s are comparable to its layer compute); a
    deeper prefetch cannot be slower (the dp stream is the same, only issued earlier)."""
    t = [ddlsim.predict(_zero3(k), engine, check_fit=False).iteration_time_s for k in (0, 1, 3)]
    assert t[1] < 0.99 * t[0]
    assert t[2] <= t[1] * (1 + 1e-9)


def test_zero3_memory_holds_prefetch_plus_one_layers():
    """The gathered layers in flight: (k + 1) · layer_params/TP · 2 bytes (bf16); from k = 1
    to k = 3 two more layers: 2 · 12·2048²(+biases) · 2 B."""
    m1 = ddlsim.memory_per_device(_zero3(1)).total
    m3 = ddlsim.memory_per_device(_zero3(3)).total
    layer = _zero3(1).model.shape().layer_params
    assert m3 - m1 == pytest.approx(2 * layer * 2, rel=1e-12)


# ---------------------------------------------------------------- sequence parallel
def test_sequence_parallel_backward_regathers_the_input():
    """TP 2 with SP: a layer's forward runs an all-gather and a reduce-scatter per block
    (2 + 2); its backward also re-gathers each column-parallel block's saved input for the
    weight gradient (Korthikanti et al. 2022 §4.2.2): 4 all-gathers + 2 reduce-scatters,
    each of b·s·h·2 bytes."""
    cfg = _cfg("parallel.tensor_model_parallel_size=2", "parallel.sequence_parallel=true")
    b = StageBuilder.from_config(cfg, cfg.model.shape())
    bwd = [x for x in b.layer_backward() if isinstance(x, Collective)]
    fwd = [x for x in b.layer_forward() if isinstance(x, Collective)]
    assert [c.op for c in fwd].count("all_gather") == 2
    assert [c.op for c in bwd].count("all_gather") == 4
    assert [c.op for c in bwd].count("reduce_scatter") == 2
    assert {c.bytes for c in bwd} == {1 * 1024 * 2048 * 2}


# ---------------------------------------------------------------- interleaving
def test_interleaved_p2p_count():
    """TP 2 × PP 4 on 8 GPUs (DP 1), global batch 8: m = 8 micro-batches; each crosses pp·v − 1 = 7 virtual-stage boundaries
    forward and 7 backward: 8 · 7 · 2 = 112 sends per pipeline."""
    cfg = _cfg("parallel.pipeline_model_parallel_size=4", "parallel.tensor_model_parallel_size=2",
               "parallel.schedule=interleaved",
               "parallel.virtual_pipeline_model_parallel_size=2")
    wl = ddlsim.build_workload(cfg)
    sends = _count(wl, lambda p: isinstance(p, P2P) and p.kind == "send")
    assert cfg.num_microbatches == 8
    assert sends == 8 * (4 * 2 - 1) * 2


# ---------------------------------------------------------------- options on vs off
def _time(cfg, engine):
    return ddlsim.predict(cfg, engine, check_fit=False).iteration_time_s


@pytest.mark.parametrize("engine", ["analytical", "des"])
def test_tp_comm_overlap_hides_tp_communication(engine, monkeypatch):
    """GPT-3 13B, TP 8 with SP on one DGX-H100: bulk hides the backward's input all-gather
    and reduce-scatter behind the GEMMs, pipelined also the forward's (all but the last
    chunk of each reduce-scatter):
    blocking > bulk > pipelined. (At h = 5,120 the hidden b·s·h collectives outweigh the
    13.8 % SM margin on the overlapped GEMMs; GEMMs grow as h², collectives as h, so a small
    model such as 1.3B at TP 8 can come out slower with the overlap, as TE's users find.)
    Off, Megatron-Core's NCCL path overlaps the same backward collectives as bulk, its
    channels holding 24 SMs while they run where bulk holds TE's 16 for the GEMMs' whole
    duration: faster than blocking; without NCCL's SMs (none taken) faster than bulk, as
    it then runs bulk's overlaps without any margin, and slower with them."""
    base = {"model": "gpt3-13b",
            "parallel": {"tensor_model_parallel_size": 8, "sequence_parallel": True},
            "train": {"micro_batch_size": 1, "global_batch_size": 2, "seq_length": 2048},
            "system": {"preset": "dgx-h100", "nodes": 1}}
    t = [_time(_cfg(f"parallel.tp_comm_overlap={m}", base=base), engine)
         for m in ("off", "bulk", "pipelined")]
    blocking = {**base, "system": {**base["system"], "software": {
        "stack": "megatron-core-2024", "overlap": {"tp_async_backward": False}}}}
    t_block = _time(_cfg("parallel.tp_comm_overlap=off", base=blocking), engine)
    assert t_block > t[1] > t[2]
    assert t_block > t[0]
    from ddlsim.simulator.kernels import contention
    monkeypatch.setattr(contention, "nccl_ring_ctas", lambda system, net=None: 0)
    t_free = _time(_cfg("parallel.tp_comm_overlap=off", base=base), engine)
    assert t_free < t[1] and t_free < t[0]


@pytest.mark.parametrize("engine", ["analytical", "des"])
def test_tp_comm_overlap_under_context_parallelism(engine):
    """Llama 2 13B, TP 4 + SP with CP 2 on one DGX-H100 (the ring attention between the
    GEMMs): the TP collectives are overlapped per GEMM, so blocking > bulk > pipelined, and
    the exposed TP communication shrinks; the trace stays valid (the ring's deps remapped)."""
    base = {"model": "llama2-13b",
            "parallel": {"tensor_model_parallel_size": 4, "sequence_parallel": True,
                         "context_parallel_size": 2},
            "train": {"micro_batch_size": 1, "global_batch_size": 2, "seq_length": 4096},
            "system": {"preset": "dgx-h100", "nodes": 1, "software": {
                "stack": "megatron-core-2024", "overlap": {"tp_async_backward": False}}}}
    runs = [ddlsim.predict(_cfg(f"parallel.tp_comm_overlap={m}", base=base), engine,
                           check_fit=False) for m in ("off", "bulk", "pipelined")]
    t = [r.iteration_time_s for r in runs]
    assert t[0] > t[1] > t[2]
    exposed = [r.breakdown.exposed_comm_s["tp"] for r in runs]
    assert exposed[2] < 0.5 * exposed[0]
    ddlsim.build_workload(_cfg("parallel.tp_comm_overlap=pipelined", base=base)).validate()


def test_tp_comm_overlap_under_context_parallelism_engines_agree():
    base = {"model": "llama2-13b",
            "parallel": {"tensor_model_parallel_size": 4, "sequence_parallel": True,
                         "context_parallel_size": 2, "tp_comm_overlap": "pipelined"},
            "train": {"micro_batch_size": 1, "global_batch_size": 4, "seq_length": 4096},
            "system": {"preset": "dgx-h100", "nodes": 1}}
    a, d = (_time(_cfg(base=base), e) for e in ("analytical", "des"))
    assert d == pytest.approx(a, rel=0.02)


@pytest.mark.parametrize("engine", ["analytical", "des"])
def test_overlapped_grad_reduce_is_faster(engine):
    base = ("system.nodes=2", "parallel.pipeline_model_parallel_size=1",
            "parallel.tensor_model_parallel_size=2")
    on = _time(_cfg(*base, "parallel.overlap_grad_reduce=true"), engine)
    off = _time(_cfg(*base, "parallel.overlap_grad_reduce=false"), engine)
    assert on < off


# ---------------------------------------------------------------- refusals and plan line
@pytest.mark.parametrize("overrides, message", [
    (["parallel.tensor_model_parallel_size=1", "parallel.tp_comm_overlap=pipelined"],
     "parallel.tp_comm_overlap = 'pipelined' cannot apply to this plan: tensor_model_parallel_size is 1"),
    (["parallel.tensor_model_parallel_size=2", "parallel.tp_comm_overlap=bulk"],
     "it needs sequence_parallel"),
    (["parallel.pipeline_model_parallel_size=1", "parallel.overlap_p2p_comm=true"],
     "parallel.overlap_p2p_comm = True cannot apply to this plan: pipeline_model_parallel_size is 1"),
    (["parallel.overlap_param_gather=true"], "it needs the distributed optimizer"),
    (["parallel.pipeline_model_parallel_size=2", "parallel.overlap_p2p_comm=true"],
     "it needs the interleaved schedule"),
    (["parallel.pipeline_model_parallel_size=1", "parallel.zero_stage=3",
      "parallel.overlap_grad_reduce=true", "system.software={stack: deepspeed}"],
     "parallel.overlap_grad_reduce = True cannot apply to this plan: ZeRO-3 reduce-scatters"),
    (["parallel.dp_strategy=reduce_broadcast", "parallel.overlap_grad_reduce=true"],
     "dp_strategy 'reduce_broadcast' updates after the whole backward"),
])
def test_refused_when_the_plan_sets_an_option_that_cannot_apply(overrides, message):
    with pytest.raises(ddlsim.ConfigError) as err:
        ddlsim.build_workload(_cfg(*overrides))
    assert message in str(err.value)


def test_stack_default_that_cannot_apply_is_inactive_and_said():
    """megatron-core-2024 turns overlap_param_gather on; a ZeRO-0 plan runs without it (and
    tp_comm_overlap without TP); its overlapped P2P needs the interleaved schedule (Megatron-LM
    turns it off otherwise), so a 1F1B pipeline's P2P blocks, as megatron-lm-2021's does."""
    cfg = _cfg("system.software={stack: megatron-core-2024, overlap: {tp_comm_overlap: bulk}}")
    assert "inactive here: tp-comm, param-gather" in cfg.family.plan_summary(cfg)
    ddlsim.build_workload(cfg)
    mcore = _cfg("parallel.pipeline_model_parallel_size=2")
    assert mcore.family.plan_summary(mcore).endswith("inactive here: param-gather, p2p")
    old = _cfg("system.software=megatron-lm-2021", "parallel.pipeline_model_parallel_size=2")
    assert cfg.family.plan_summary(old).endswith("overlaps: none")
    ddlsim.build_workload(old)


@pytest.mark.parametrize("stack, phrase", [
    ("{stack: megatron-core-2024, what_if: true}",
     "inactive here: grad-reduce, param-gather, p2p; ZeRO-3 gathers per layer, 1 layer ahead"),
    ("deepspeed", "inactive here: grad-reduce; ZeRO-3 gathers per module, 1 module ahead"),
    ("deepspeed-2021", "inactive here: grad-reduce; ZeRO-3 gathers per tensor, 1 module ahead, "
                       "host-issued per rank (the device's wait counts as 'bubble / wait')")])
def test_zero3_plan_line_says_how_it_gathers(stack, phrase):
    """Under ZeRO-3 the stack's overlap_grad_reduce does not apply (the reduce-scatters are
    part of each layer's backward), and the plan line names the gather granularity and
    prefetch."""
    # fp16: DeepSpeed v0.3.13 runs ZeRO in fp16 only (deepspeed-2021 rule zero_needs_fp16)
    cfg = _cfg(f"system.software={stack}", "parallel.pipeline_model_parallel_size=1",
               "parallel.zero_stage=3", "train.dtype=fp16")
    assert cfg.family.plan_summary(cfg).endswith(phrase)


@pytest.mark.parametrize("engine", ["analytical", "des"])
def test_blocking_p2p_posts_each_receive_after_the_compute_before_it(engine):
    """Megatron's _communicate posts a receive where it is called, so the transfer cannot
    overlap the compute before it: an interleaved plan (v = 2, PP 4) is slower with
    overlap_p2p_comm off than on, by at most its pipeline transfers' seconds."""
    base = ("parallel.pipeline_model_parallel_size=4", "parallel.tensor_model_parallel_size=2",
            "parallel.schedule=interleaved", "parallel.virtual_pipeline_model_parallel_size=2",
            "system.nodes=2", "train.global_batch_size=16")
    on = ddlsim.predict(_cfg(*base, "parallel.overlap_p2p_comm=true"), engine, check_fit=False)
    off = ddlsim.predict(_cfg(*base, "parallel.overlap_p2p_comm=false"), engine,
                         check_fit=False)
    assert off.iteration_time_s > on.iteration_time_s
    wl = ddlsim.build_workload(_cfg(*base, "parallel.overlap_p2p_comm=false"))
    recvs = [op for c in wl.classes for b in c.program.blocks.values() for op in b.ops
             if isinstance(op.payload, P2P) and op.payload.kind == "recv"]
    assert recvs and all(op.deps for op in recvs)    # each after the block's Wait(compute)


def test_yaml_off_is_off():
    """YAML 1.1 reads an unquoted off as false."""
    assert _cfg("parallel.tp_comm_overlap=off").software.tp_comm_overlap == "off"


@pytest.mark.parametrize("engine", ["analytical", "des"])
def test_overlapped_param_gather_leaves_one_bucket_exposed(engine):
    """ZeRO-1 on two nodes (DP 8, TP 2): off, the update gathers all the stage's parameters
    after the step; on, only the first bucket stays there and the rest runs beside the first
    forward, which is faster. The bucket is Megatron-Core's (the stack's ddp.grad_buckets):
    max(40e6, 1e6 · DP 8) = 40e6 parameters, gathered in bf16: 80,000,000 bytes."""
    base = ("system.nodes=2", "parallel.tensor_model_parallel_size=2",
            "parallel.pipeline_model_parallel_size=1", "parallel.zero_stage=1",
            "train.global_batch_size=32")
    on_cfg = _cfg(*base, "parallel.overlap_param_gather=true")
    update = ddlsim.build_workload(on_cfg).classes[0].program.blocks["update"]
    gather = [o.payload for o in update.ops if getattr(o.payload, "name", "") == "params.all_gather"]
    assert [g.bytes for g in gather] == [40_000_000 * 2]
    off = _time(_cfg(*base, "parallel.overlap_param_gather=false"), engine)
    assert _time(on_cfg, engine) < off


CPU = {"model": "gpt2-124m",
       "train": {"micro_batch_size": 2, "global_batch_size": 128, "seq_length": 1024,
                 "dtype": "fp32"},
       "system": {"preset": "cpu-10gbe", "nodes": 16}}


@pytest.mark.parametrize("engine", ["analytical", "des"])
def test_overlapped_param_gather_holds_the_first_forward_before_it_sends(engine):
    """On 10 Gb/s NICs (PP 2, DP 16, ZeRO-1) the overlapped gather of a stage's ~324 MB of
    fp32 parameters outlasts its first forward: that forward cannot finish its layers
    without their parameters, so the activation it sends stage 1 leaves only once the
    gather is done, and stage 1's first forward starts after it."""
    cfg = _cfg("parallel.pipeline_model_parallel_size=2", "parallel.data_parallel_size=16",
               "parallel.zero_stage=1", "parallel.overlap_param_gather=true", base=CPU)
    r = ddlsim.predict(cfg, engine, check_fit=False, record_spans=True)
    s0 = [x for x in r.spans if x.class_name == "stage0"]
    gather_end = min((x for x in s0 if x.stream == "dp"), key=lambda x: x.start_s).end_s
    sent = min(x.start_s for x in s0 if x.stream == "pp")        # the first activation
    compute_end = max(x.end_s for x in s0 if x.stream == "compute" and x.start_s < sent)
    first = min(x.start_s for x in r.spans if x.class_name == "stage1"
                and x.stream == "compute")
    assert compute_end < gather_end <= sent < first


def test_sequence_parallel_pipeline_message_is_the_rank_shard():
    """With SP the stage output is split along the sequence: each TP rank sends its b·s·h/t
    (Megatron-LM's p2p tensor shape is seq_length // TP) and nothing is gathered; without SP,
    the scatter-gather sends 1/t and all-gathers the b·s·h on arrival. TP 2, b·s·h·2 bytes =
    1·1024·2048·2."""
    act = 1 * 1024 * 2048 * 2
    for sp, want in ((True, (act / 2, None)), (False, (act / 2, act))):
        cfg = _cfg("parallel.tensor_model_parallel_size=2",
                   f"parallel.sequence_parallel={str(sp).lower()}")
        assert StageBuilder.from_config(cfg, cfg.model.shape()).part.boundary(act) == want


def test_async_backward_overlap_applies_with_and_without_sequence_parallelism():
    """megatron-core-2024 overlaps the backward's TP collectives through NCCL: with SP the
    input re-gather and the input-gradient reduce-scatter, without SP the input-gradient
    all-reduce (Megatron-LM 739cb43d megatron/mpu/layers.py, async_grad_allreduce). The
    forward keeps its blocking all-reduces, the backward's run on the ``tp`` stream beside
    the block's GEMMs, and the iteration is shorter than with the option off. The 2021 stack
    has no such overlap and says nothing."""
    from ddlsim.workloads.decoder import tp_overlap
    from ddlsim.workloads.decoder.overlap import inactive_reasons
    sp = _cfg("parallel.tensor_model_parallel_size=2", "parallel.sequence_parallel=true")
    assert tp_overlap.mode(sp) == "async"
    assert "tp-async backward" in sp.family.plan_summary(sp).split("inactive here")[0]
    plain = _cfg("parallel.tensor_model_parallel_size=2")
    assert tp_overlap.mode(plain) == "async"
    assert "tp_async_backward" not in inactive_reasons(plain)
    assert "tp-async backward" in plain.family.plan_summary(plain).split("inactive here")[0]
    wl = ddlsim.build_workload(plain)
    fwd, bwd = (wl.classes[0].program.blocks[name].flat.ops for name in ("F0", "B0"))
    on = {(op.stream, op.payload.name) for op in bwd if isinstance(op.payload, Collective)
          and op.payload.group == "tp" and op.payload.op == "all_reduce"}
    assert on == {("tp", "bwd.attn.ar"), ("tp", "bwd.mlp.ar")}
    assert {op.stream for op in fwd if isinstance(op.payload, Collective)} == {"compute"}
    off = _cfg("parallel.tensor_model_parallel_size=2",
               "system.software={stack: megatron-core-2024, overlap: {tp_async_backward: false}}")
    assert tp_overlap.mode(off) is None
    t_on, t_off = (ddlsim.predict(c, check_fit=False).iteration_time_s for c in (plain, off))
    assert t_on < t_off
    old = _cfg("parallel.tensor_model_parallel_size=2", "parallel.sequence_parallel=true",
               # the 2021 stack has no sequence parallelism either (docs/stacks.md): a what-if
               "system.software={stack: megatron-lm-2021, what_if: true}")
    assert tp_overlap.mode(old) is None and "tp_async_backward" not in inactive_reasons(old)
    # userbuffers take precedence over the NCCL path, and need SP: a stack's userbuffers
    # without SP are inactive (and said so), and the NCCL path runs
    bulk = _cfg("parallel.tensor_model_parallel_size=2", "parallel.sequence_parallel=true",
                "parallel.tp_comm_overlap=bulk")
    assert tp_overlap.mode(bulk) == "bulk"
    no_sp = _cfg("parallel.tensor_model_parallel_size=2",
                 "system.software={stack: megatron-core-2024, overlap: {tp_comm_overlap: bulk}}")
    assert tp_overlap.mode(no_sp) == "async"
    assert "needs sequence_parallel" in inactive_reasons(no_sp)["tp_comm_overlap"]
    assert "tp_async_backward" not in inactive_reasons(no_sp)
