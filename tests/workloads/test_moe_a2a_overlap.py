"""Megatron-Core's expert-parallel all-to-all overlap (``parallel.moe.overlap_expert_parallel_comm``,
the combined 1F1B; ``ddlsim/workloads/decoder/combined.py``, docs/moe.md): the schedule's order
on hand-checkable cases, the trace's encoding of a combined step, the overlap hiding all-to-all
time only where there is compute to hide it behind, the stack's refusals, memory, and the two
engines agreeing on it.
"""

from __future__ import annotations

import numpy as np
import pytest

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.stackrules import PlanFacts, stack_rejections
from ddlsim.workloads.schedules import (combined_extra_layer, combined_schedule,
                                         peak_inflight, schedule)
from ddlsim.workloads.trace import Collective, P2P, Wait

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

STACK = "megatron-core-2025"


def run(layers: int = 4, ep: int = 8, pp: int = 1, vp: int | None = None, nodes: int = 2,
        overlap: bool = True, delay: bool = True, gbs: int = 32, model: str = "mixtral-8x7b",
        moe: dict | None = None, train: dict | None = None, stack: str = STACK, **system) -> dict:
    """A shortened MoE model on ``nodes`` DGX H100s with the overlap on (or off)."""
    par = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": pp,
           "expert_model_parallel_size": ep,
           "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True,
                   "overlap_expert_parallel_comm": overlap,
                   "delay_wgrad_compute": delay and overlap, **(moe or {})}}
    if vp:
        par.update(schedule="interleaved", virtual_pipeline_model_parallel_size=vp)
    return {"model": {"preset": model, "num_hidden_layers": layers}, "parallel": par,
            "train": {"micro_batch_size": 1, "global_batch_size": gbs, "seq_length": 4096,
                      "recompute": "selective", **(train or {})},
            "system": {"preset": "dgx-h100", "nodes": nodes, "software": {"stack": stack},
                       **system}}


# ---------------------------------------------------------------- the schedule
def test_pp1_order_is_megatrons_no_pipelining_combined_order():
    # combined_1f1b_schedule_for_no_pipelining: F(0), then B(i) + F(i+1), then B(m-1)
    assert combined_schedule("1f1b", 0, 1, 4) == (
        ("F", 0, 0), ("FB", 1, 0, 0, 0), ("FB", 2, 0, 1, 0), ("FB", 3, 0, 2, 0), ("B", 3, 0))


def test_interleaved_order_has_one_more_warmup_forward_and_pairs_forward_k_plus_w_with_b_k():
    # PP4 VP2, 8 micro-batches, last stage (s = 3): interleaved warm-up 2(p-s-1) + (v-1)p = 4,
    # combined 5. Forward #5 is group 0, position 5 of p·v = 8: chunk 5 // 4 = 1, micro-batch
    # 5 % 4 = 1; backward #0 is micro-batch 0 of chunk v-1 = 1.
    order = combined_schedule("interleaved", 3, 4, 8, 2)
    kinds = [e[0] for e in order]
    assert kinds == ["F"] * 5 + ["FB"] * 11 + ["B"] * 5
    assert order[5] == ("FB", 1, 1, 0, 1)
    # every forward and backward of the interleaved schedule, each once, in its own order
    base = schedule("interleaved", 3, 4, 8, 2)
    fwd = [e[1:3] for e in order if e[0] == "F"][:5] + [e[1:3] for e in order if e[0] == "FB"]
    bwd = [e[3:5] for e in order if e[0] == "FB"] + [e[1:3] for e in order if e[0] == "B"]
    assert fwd + [e[1:3] for e in order if e[0] == "F"][5:] == \
        [(mb, c) for k, mb, c in base if k == "F"]
    assert bwd == [(mb, c) for k, mb, c in base if k == "B"]


def test_gpipe_has_no_combined_form():
    with pytest.raises(ConfigError, match="gpipe"):
        combined_schedule("gpipe", 0, 1, 4)


def test_peak_inflight_is_the_warmup_plus_one_layer_not_one_chunk_more():
    # stage 0 of PP4 VP2, m = 8: interleaved warm-up 2·3 + 4 = 10, peak 11 chunks; combined:
    # warm-up 11, then each combined step frees the backward's layers as the forward fills its
    # own (Megatron-Core's get_layer(i) / pop_layer() pairs): 11 chunks and one layer
    assert peak_inflight("interleaved", 0, 4, 8, 2) == 11
    assert peak_inflight("interleaved", 0, 4, 8, 2, combined=True) == 11
    assert combined_extra_layer("interleaved", 0, 4, 8, 2)
    assert peak_inflight("1f1b", 0, 1, 4, combined=True) == 1     # F(1) fills as B(0) empties
    assert combined_extra_layer("1f1b", 0, 1, 4)
    assert peak_inflight("1f1b", 0, 1, 1, combined=True) == 1     # one micro-batch: all of it
    assert not combined_extra_layer("1f1b", 0, 1, 1)              # and no combined step


# ---------------------------------------------------------------- the trace
def _steps(cfg_dict: dict, stage: int):
    w = ddlsim.build_workload(ddlsim.load_config(cfg_dict))
    cls = next(c for c in w.classes if c.name == f"stage{stage}")
    return cls.program, list(cls.program.steps)


def test_a_combined_step_keys_each_sides_p2p_by_its_own_microbatch():
    program, steps = _steps(run(pp=4, vp=2, layers=8, nodes=4, gbs=64), 1)
    order = combined_schedule("interleaved", 1, 4, 16, 2)
    first_pair = next(e for e in order if e[0] == "FB")
    _, mf, cf, mb, cb = first_pair
    j = next(i for i, s in enumerate(steps) if s.block.startswith("C"))
    # stage 1 is neither the first nor the last virtual stage: both receives, both sends
    assert [(s.block, s.microbatch) for s in steps[j - 2:j + 3]] == [
        (f"R.F{cf}", mf), (f"R.B{cb}", mb), (f"C{cf}.{cb}", mf), (f"S.F{cf}", mf),
        (f"S.B{cb}", mb)]
    recv_b = [o.payload for o in program.blocks[f"R.B{cb}"].ops if type(o.payload) is P2P]
    assert [(p.kind, p.tag) for p in recv_b] == [("recv", f"grad.c{cb}")]


def _names(block) -> list[tuple[str, str]]:
    return [(o.payload.name, o.stream) for o in block.ops if not isinstance(o.payload, Wait)]


def test_layer_pair_issue_order_and_waits_follow_megatron():
    # PP1, two MoE layers: C0.0 pairs forward layer 0 with backward layer 1, then 1 with 0
    program, _ = _steps(run(layers=2), 0)
    ops = program.blocks["C0.0"].ops
    names = [o.payload.name for o in ops]
    a2a = [(o.payload.name, o.stream) for o in ops if isinstance(o.payload, Collective)
           and o.payload.op == "all_to_all"]
    assert a2a == [("bwd.combine", "ep"), ("fwd.dispatch", "ep"), ("bwd.dispatch", "ep"),
                   ("fwd.combine", "ep")] * 2
    i = {n: names.index(n) for n in ("bwd.combine", "fwd.dispatch", "bwd.dispatch",
                                     "fwd.combine", "fwd.experts.fc1",
                                     "bwd.experts.fc1.dgrad", "bwd.experts.fc2.wgrad")}
    # the compute stream: mlp bwd (data gradients) waits for the combine's gradient, the
    # forward experts for the dispatch; the backward dispatch waits for the data gradients
    # only (delay_wgrad_compute: the weight gradients record no event)
    # (one local expert: no sort pass, so fc2's data gradient opens the expert backward)
    assert ops[names.index("bwd.experts.fc2.dgrad")].deps == (i["bwd.combine"],)
    assert ops[i["bwd.dispatch"]].deps == (i["bwd.experts.fc1.dgrad"],)
    assert ops[i["fwd.experts.fc1"]].deps == (i["fwd.dispatch"],)
    assert ops[i["bwd.experts.fc2.wgrad"]].deps == ()
    assert ops[i["bwd.experts.fc2.wgrad"]].stream == "compute"
    # the forward's output (then the head, on this last stage) waits for its last combine
    join = next(j for j, o in enumerate(ops) if o.payload == Wait("combined.join", "ep"))
    # and the embedding's backward after the head's forward (PP 1: this stage is the first)
    tail = len(ops) - join - 2
    assert join > i["fwd.combine"] + len(ops) // 2 and names[join + 1:] == \
        [o.payload.name for o in program.blocks["F0"].ops[-tail:]] + ["bwd.embedding"]


def test_delayed_attention_weight_gradients_run_after_its_backward_with_no_event():
    # self_attention.backward_dw: the qkv and proj weight gradients follow the attention
    # backward on the compute stream, and the next pair's combine backward (its first op, the
    # un-permutation's gradient) waits for the attention's data-gradient path only
    program, _ = _steps(run(layers=2), 0)
    ops = program.blocks["C0.0"].ops
    names = [o.payload.name for o in ops]
    for gemm in ("bwd.qkv", "bwd.proj"):
        d, w = names.index(f"{gemm}.dgrad"), names.index(f"{gemm}.wgrad")
        assert d < w and ops[w].deps == () and ops[w].stream == "compute"
    second_combine = [j for j, n in enumerate(names) if n == "bwd.permute"][1]
    (dep,) = ops[second_combine].deps
    assert names[dep] == "bwd.grad_accumulate" and dep < names.index("bwd.qkv.wgrad")


def test_without_delay_the_weight_gradients_stay_in_the_expert_backward():
    program, _ = _steps(run(layers=2, delay=False), 0)
    names = [o.payload.name for o in program.blocks["C0.0"].ops]
    assert "bwd.experts.fc1" in names and "bwd.qkv" in names
    assert not any(n.endswith("wgrad") for n in names)


def test_a_run_without_the_overlap_has_no_combined_steps():
    program, steps = _steps(run(overlap=False), 0)
    assert not any(s.block.startswith(("C", "R.", "S.")) for s in steps)


# ---------------------------------------------------------------- what it hides
def _time(cfg_dict: dict, engine: str = "analytical"):
    return ddlsim.predict(ddlsim.load_config(cfg_dict), engine=engine)


def test_the_overlap_hides_all_to_alls_behind_long_compute():
    # Qwen3-30B-A3B (128 experts, top-8), EP16 across two nodes: the all-to-alls leave the
    # node, and one layer's attention or experts take as long as an all-to-all, so most of
    # the exposed all-to-all time is hidden (8 micro-batches: only F(0) and B(7) run alone)
    base = dict(model="qwen3-30b-a3b", layers=4, ep=16, nodes=2, gbs=128)
    off, on = _time(run(overlap=False, **base)), _time(run(**base))
    assert on.breakdown.exposed_comm_s["ep"] < 0.5 * off.breakdown.exposed_comm_s["ep"]
    assert on.iteration_time_s < off.iteration_time_s


def test_the_overlap_cannot_hide_more_than_the_compute_beside_it():
    # a 1 Gb/s NIC makes every all-to-all far longer than the compute of the other
    # micro-batch: the saving is at most that compute, and most all-to-all time stays exposed
    base = dict(model="qwen3-30b-a3b", layers=4, ep=16, nodes=2,
                nic={"bandwidth_Bps": "1 Gb/s"})
    off, on = _time(run(overlap=False, **base)), _time(run(**base))
    saved = off.iteration_time_s - on.iteration_time_s
    assert 0 <= saved <= off.breakdown.compute_s
    assert on.breakdown.exposed_comm_s["ep"] > 0.8 * off.breakdown.exposed_comm_s["ep"]


def test_memory_holds_one_more_layer_of_activations():
    # stage 0 of PP4 VP2 with 8 layers (one a chunk): 11 chunks either way, the combined step
    # one layer more; PP1 with 4 layers: one micro-batch, plus one layer (a quarter of it)
    for base, more in ((dict(pp=4, vp=2, layers=8, nodes=4, gbs=64), 12 / 11),
                       (dict(layers=4, nodes=1), 5 / 4)):
        off = ddlsim.load_config(run(overlap=False, **base))
        on = ddlsim.load_config(run(**base))
        a_off = ddlsim.build_workload(off).memory[0].activations
        a_on = ddlsim.build_workload(on).memory[0].activations
        assert a_on == pytest.approx(a_off * more)


@pytest.mark.parametrize("plan", [dict(nodes=1), dict(pp=4, vp=2, layers=8, nodes=4, gbs=64)],
                         ids=["pp1-one-node", "pp4-vp2"])
def test_engines_agree_on_an_overlapped_run(plan):
    # no link shared by two flows at once (EP inside a node; the pipeline's sends), so the
    # DES and the analytical engine time the same trace alike (tests/simulator/test_agreement.py)
    a, d = _time(run(**plan), "analytical"), _time(run(**plan), "des")
    assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=0.01)


# ---------------------------------------------------------------- refusals
@pytest.mark.parametrize("change, rule", [
    (dict(ep=1, nodes=1), "ep_a2a_overlap_needs_ep"),
    (dict(moe={"token_dispatcher_type": "allgather"}), "ep_a2a_overlap_dispatcher"),
    (dict(pp=4, nodes=4, layers=8, gbs=64), "ep_a2a_overlap_schedule"),
    (dict(train={"recompute": "full"}), "ep_a2a_overlap_no_full_recompute"),
    (dict(train={"dtype": "fp32"}), "ep_a2a_overlap_16bit"),
    (dict(overlap=False, moe={"delay_wgrad_compute": True}), "delay_wgrad_needs_ep_a2a_overlap"),
    (dict(stack="megatron-core-2024", ep=8), "no_ep_a2a_overlap"),
])
def test_the_stack_refuses_what_megatron_core_asserts(change, rule):
    with pytest.raises(ConfigError, match=rule) as exc:
        ddlsim.load_config(run(**change))
    assert "overlap_expert_parallel_comm" in str(exc.value) or rule.startswith("delay")


def test_the_rules_judge_arrays_of_plans_as_the_search_does():
    facts = PlanFacts.of(tp=1, pp=np.array([1, 4, 4]), cp=1, zero=1, sp=False,
                         interleaved=np.array([False, False, True]),
                         one_f_one_b=np.array([True, True, False]), p2p_overlap=True,
                         moe=True, ep=8, dp=8, a2a_overlap=True,
                         shared_overlap=np.array([False, False, True]))
    rejected = dict(stack_rejections(STACK, facts))
    schedule_rule = next(m for r, m in rejected.items() if "ep_a2a_overlap_schedule" in r)
    shared_rule = next(m for r, m in rejected.items() if "no_shared_expert_overlap" in r)
    assert schedule_rule.tolist() == [False, True, False]
    assert shared_rule.tolist() == [False, False, True]


def test_zero3_with_the_overlap_is_refused_not_ignored():
    d = run()
    d["parallel"]["zero_stage"] = 3
    # the stack refuses its FSDP2 with EP (rule zero3_no_expert_parallel): a what-if here,
    # so that the builder's own refusal of the combined 1F1B over ZeRO-3 is what is tested
    d["system"]["software"]["what_if"] = True
    with pytest.raises(ConfigError, match="overlap_expert_parallel_comm"):
        ddlsim.build_workload(ddlsim.load_config(d))


def test_megatron_arguments_import_as_the_two_options():
    # Megatron-LM's MoE README (d7288711, lines 557-558) names both flags
    from ddlsim.importers.megatron import read_megatron
    draft = read_megatron("torchrun pretrain_gpt.py --num-experts 8 --expert-model-parallel-size 8"
                          " --overlap-moe-expert-parallel-comm --delay-wgrad-compute\n", "run.sh")
    assert draft.fields["parallel.moe.overlap_expert_parallel_comm"] is True
    assert draft.fields["parallel.moe.delay_wgrad_compute"] is True
    assert not draft.refused
