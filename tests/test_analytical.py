"""The analytical engine: pipeline schedules timed step by step, overlap, invariants."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import ddlsim
from ddlsim.errors import DeadlockError
from ddlsim.simulator.analytical.engine import simulate_analytical
from ddlsim.simulator.costs import CostModel
from ddlsim.workloads.trace import (Block, Compute, GroupFamily, Op, P2P, Program, RankClass,
                                    Step, Workload, WorkloadMeta)

# a GPT whose embedding and head are negligible, so pipeline stages are equal: a vocabulary of
# 8, and its kernels launched from CUDA graphs (eagerly, the head's and loss's eleven launches
# would cost the last stage 64 µs of host time per micro-batch: docs/compute.md); untied, so
# the first and last stages do not meet at the tied embedding's gradient all-reduce before the
# step, whose wait would count as pipeline communication (workloads/decoder/tied_embedding.py)
UNIFORM = {"model": {"num_hidden_layers": 8, "hidden_size": 4096, "num_attention_heads": 32,
                     "vocab_size": 8, "max_position_embeddings": 2048,
                     "tie_word_embeddings": False},
           "train": {"micro_batch_size": 1, "seq_length": 2048},
           "system": {"preset": "dgx-a100", "nodes": 1, "devices_per_node": 4,
                      "software": {"stack": "megatron-core-2024",
                                   "kernels": {"host_dispatch": "cuda_graphs"}}}}


def pipeline(schedule: str, m: int, v: int | None = None, free_p2p: bool = False,
             spans: bool = False):
    d = copy.deepcopy(UNIFORM)
    if free_p2p:   # transfers of no duration: the schedule's own bubble
        d["system"]["intra_node"] = {"bandwidth_Bps": "1 PB/s", "latency_s": 0}
    d["parallel"] = {"pipeline_model_parallel_size": 4, "schedule": schedule,
                     "virtual_pipeline_model_parallel_size": v}
    d["train"]["global_batch_size"] = m
    # Megatron-Core has no GPipe (rule no_gpipe): the GPipe bubble is a what-if of its stack
    d["system"]["software"]["what_if"] = schedule == "gpipe"
    return ddlsim.predict(d, record_spans=spans)


def compute_busy_s(result) -> dict[str, float]:
    """Seconds each rank class's compute stream spends in compute ops (the spans)."""
    busy: dict[str, float] = {}
    for x in result.spans:
        if x.stream == "compute" and x.kind == "compute":
            busy[x.class_name] = busy.get(x.class_name, 0.0) + x.end_s - x.start_s
    return busy


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("m", [4, 8, 32])
def test_bubble_fraction_gpipe_1f1b(schedule, m):
    # Narayanan et al. 2021 §2.2: bubble / ideal = (p-1)/m, i.e. (p-1)/(m+p-1) of the total,
    # with free point-to-point transfers (these schedules' P2P blocks, as Megatron's does:
    # on the A100's NVLink its transfers add 2 % to the bubble at m = 32)
    # The last stage also runs the final norm before the head (a b·s·h pass, 0.3 % of a
    # stage here), which paces the steady state: stage 0 idles (p-1) micro-batch slots plus,
    # per micro-batch, what the last stage's compute exceeds its own
    r = pipeline(schedule, m, free_p2p=True, spans=True)
    b, busy = r.breakdown, compute_busy_s(r)
    extra = (busy["stage3"] - busy["stage0"]) / b.compute_s
    assert 0 < extra < 0.01
    assert b.bubble_s / b.compute_s == pytest.approx(3 / m + extra, rel=0.02)
    slow = pipeline(schedule, m).breakdown
    assert slow.bubble_s + slow.exposed_comm_s["pp"] > b.bubble_s + b.exposed_comm_s["pp"]


@pytest.mark.parametrize("m", [4, 8, 32])
def test_bubble_fraction_interleaved(m):
    r = pipeline("interleaved", m, v=2, spans=True)   # the last stage's extra as above
    busy = compute_busy_s(r)
    extra = (busy["stage3"] - busy["stage0"]) / r.breakdown.compute_s
    assert r.breakdown.bubble_s / r.breakdown.compute_s == pytest.approx(3 / (2 * m) + extra,
                                                                         rel=0.02)


def test_breakdown_adds_up(small_cfg):
    r = ddlsim.predict(small_cfg)
    b = r.breakdown
    total = (b.compute_s + b.optimizer_s + sum(b.exposed_comm_s.values()) + b.bubble_s
             + b.host_s)
    assert total == pytest.approx(r.iteration_time_s, rel=1e-9)


def test_ddp_overlap_hides_gradient_all_reduce(base_dict):
    base_dict["parallel"] = {"data_parallel_size": 8}
    base_dict["train"]["global_batch_size"] = 8
    base_dict["system"]["nodes"] = 1
    on = ddlsim.predict(copy.deepcopy(base_dict))
    base_dict["parallel"]["overlap_grad_reduce"] = False
    off = ddlsim.predict(base_dict)
    assert on.iteration_time_s < off.iteration_time_s
    assert on.breakdown.exposed_comm_s["dp"] < off.breakdown.exposed_comm_s["dp"]
    assert on.comm_bytes["dp"] == pytest.approx(off.comm_bytes["dp"])


def test_doubling_dp_at_fixed_per_replica_batch_keeps_compute_per_device():
    # the buckets after the backward: overlapped, their NCCL channels take SMs from the
    # backward's GEMMs for longer on more ranks (ddlsim.workloads.smcontention)
    d = {"model": "gpt3-1.3b", "parallel": {"data_parallel_size": 4,
                                            "overlap_grad_reduce": False},
         "train": {"micro_batch_size": 2, "global_batch_size": 16, "seq_length": 1024},
         "system": {"preset": "dgx-a100", "nodes": 2}}
    a = ddlsim.predict(copy.deepcopy(d))
    d["parallel"]["data_parallel_size"] = 8
    d["train"]["global_batch_size"] = 32
    b = ddlsim.predict(d)
    assert b.breakdown.compute_s == pytest.approx(a.breakdown.compute_s, rel=1e-12)
    assert b.samples_per_s > a.samples_per_s


@settings(max_examples=15, deadline=None)
@given(scale=st.floats(1.0, 50.0))
def test_more_nic_bandwidth_is_never_slower(scale):
    d = {"model": "gpt3-2.7b", "parallel": {"tensor_model_parallel_size": 4,
                                            "pipeline_model_parallel_size": 2},
         "train": {"micro_batch_size": 1, "global_batch_size": 32, "seq_length": 2048},
         "system": {"preset": "dgx-a100", "nodes": 2, "nics_per_node": 1,
                    "nic": {"bandwidth_Bps": 1e9, "latency_s": 5e-6}}}
    slow = ddlsim.predict(copy.deepcopy(d))
    d["system"]["nic"]["bandwidth_Bps"] = 1e9 * scale
    fast = ddlsim.predict(d)
    assert fast.iteration_time_s <= slow.iteration_time_s * (1 + 1e-12)


def test_deterministic_bit_for_bit(small_cfg):
    a, b = ddlsim.predict(small_cfg), ddlsim.predict(small_cfg)
    assert a.to_dict() == b.to_dict()


def test_wiki_strategies_analytical_order():
    t = {s: ddlsim.predict(f"examples/wiki-gpt2-9ranks-{s}.yaml").iteration_time_s
         for s in ("reduce_broadcast", "sliced_reduce_broadcast", "reduce_scatter")}
    # reduce-scatter + all-gather moves 2(p-1)/p·n per rank instead of 2n through the chain
    assert t["reduce_scatter"] < t["reduce_broadcast"]
    assert t["sliced_reduce_broadcast"] <= t["reduce_broadcast"]


def _two_rank_workload(tag_a: str, tag_b: str) -> Workload:
    pp = GroupFamily("pp", "pp", np.array([[0, 1]]))
    send = Block("s", "forward", (Op(Compute("c", 1e9)), Op(P2P("send", "send", "pp", 1, 1e6, tag_a), "pp", (0,))))
    recv = Block("r", "forward", (Op(P2P("recv", "recv", "pp", -1, 1e6, tag_b), "pp"),
                                  Op(Compute("c", 1e9), deps=(0,))))
    return Workload("two", 2, {"pp": pp}, (
        RankClass("a", (0,), Program({"s": send}, (Step("s"),))),
        RankClass("b", (1,), Program({"r": recv}, (Step("r"),)))),
        WorkloadMeta(samples=1, tokens=1, model_flops=1.0))


def test_matched_send_recv_runs_and_unmatched_is_a_deadlock(small_cfg):
    ok = _two_rank_workload("x", "x")
    cost = CostModel(small_cfg.system, ok, small_cfg.parallel.collective_algorithm)
    t = simulate_analytical(ok, cost).timings
    assert t[1].end > t[0].end
    bad = _two_rank_workload("x", "y")
    with pytest.raises(DeadlockError, match="class b .* waits .* 'recv'"):
        simulate_analytical(bad, CostModel(small_cfg.system, bad,
                                           small_cfg.parallel.collective_algorithm))


@given(name=st.sampled_from(["gpipe", "1f1b", "interleaved"]), p=st.integers(1, 12),
       groups=st.integers(1, 5), v=st.integers(2, 4))
def test_schedule_arrays_give_every_stage_the_listed_order(name, p, groups, v):
    """The vectorised schedules (all stages at once) are the list-built ones."""
    from ddlsim.workloads.schedules import schedule, schedule_arrays
    if name == "interleaved" and p == 1:
        p = 2
    m = groups * p
    v = v if name == "interleaved" else 1
    backward, _, mb, chunk, _ = schedule_arrays(name, p, m, v)
    for s in range(p):
        got = [("B" if b else "F", int(x), int(c)) for b, x, c in zip(backward[s], mb[s], chunk[s])]
        assert got == list(schedule(name, s, p, m, v))


def test_step_table_is_a_sequence_of_steps():
    from ddlsim.workloads.trace import StepTable
    t = StepTable(["F0", "B0"], [0, 0, 1, 1], [0, 1, 0, 1])
    assert list(t) == [Step("F0", 0), Step("F0", 1), Step("B0", 0), Step("B0", 1)]
    assert t[2] == Step("B0", 0, 0) and t[1:3] == [Step("F0", 1), Step("B0", 0)] and len(t) == 4
    with pytest.raises(ValueError, match="block indices must index names"):
        StepTable(["F0"], [0, 1], [0, 0])
    with pytest.raises(ValueError, match="unknown blocks"):
        Program({"F0": Block("F0", "forward", ())}, t)


@given(name=st.sampled_from(["gpipe", "1f1b", "interleaved"]), p=st.integers(2, 16),
       groups=st.integers(1, 6), v=st.integers(2, 4), data=st.data())
def test_peak_inflight_closed_form_matches_the_schedule(name, p, groups, v, data):
    from ddlsim.workloads.schedules import peak_inflight, schedule
    m = groups * p
    v = v if name == "interleaved" else 1
    stage = data.draw(st.integers(0, p - 1))
    live = peak = 0
    for kind, _, _ in schedule(name, stage, p, m, v):
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    assert peak_inflight(name, stage, p, m, v) == peak


def test_zero3_sequential_gathers_are_not_stretched_as_concurrent():
    """All-gathers queued on one stream run one after another; only collectives on different
    streams issued together share links (found by comparing with the DES)."""
    d = {"model": "gpt3-1.3b", "parallel": {"data_parallel_size": 8, "zero_stage": 3},
         "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 1024},
         "system": {"preset": "dgx-a100", "nodes": 1,   # its ZeRO-3 a what-if: no_zero3
                    "software": {"stack": "megatron-core-2024", "what_if": True}}}
    a = ddlsim.predict(copy.deepcopy(d))
    des = ddlsim.predict(d, "des")
    assert a.iteration_time_s == pytest.approx(des.iteration_time_s, rel=0.05)
