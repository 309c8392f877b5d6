"""Megatron-Core's SequentialMLP (no grouped GEMM): the other local experts' linear modules on
the host after the first expert's fc2 step, and the backward's per-expert host work
(ddlsim/workloads/decoder/sequential_mlp.py)."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.api import build_workload
from ddlsim.workloads.decoder import sequential_mlp
from ddlsim.workloads.decoder.moe_host import TE_LINEAR_HOST_S


def _config(experts: int, grouped: bool, dispatcher: str = "alltoall") -> dict:
    """One Qwen3-235B layer of ``experts`` experts (top-4 or fewer) on one H200, as
    benchmarks/moe_layer_vs_ddlsim.py sets the measured layer."""
    return {"model": {"preset": "qwen3-235b-a22b", "num_hidden_layers": 1,
                      "num_local_experts": experts, "num_experts_per_tok": min(4, experts)},
            "parallel": {"moe": {"token_dispatcher_type": dispatcher, "grouped_gemm": grouped,
                                 "permute_fusion": False, "router_fusion": False,
                                 "router_force_load_balancing": True}},
            "train": {"micro_batch_size": 1, "global_batch_size": 1, "seq_length": 1024,
                      "dtype": "bf16", "recompute": "none"},
            "system": {"preset": "dgx-h200", "nodes": 1, "devices_per_node": 1,
                       "software": {"stack": "megatron-core-2025",
                                    "kernels": {"gradient_accumulation_fusion": False}}}}


def _blocks(cfg: dict) -> list[list]:
    """The ops of each step's block, in program order (deps index within a block)."""
    prog = build_workload(ddlsim.load_config(cfg)).classes[0].program
    return [list(prog.blocks[step.block].flat.ops) for step in prog.steps]


def _ops(cfg: dict) -> list:
    return [op for block in _blocks(cfg) for op in block]


@pytest.mark.parametrize("experts", [2, 4, 16])
def test_other_experts_modules_follow_the_fc2_step(experts):
    ops = _ops(_config(experts, grouped=False))
    names = [op.payload.name for op in ops]
    rest = [op for op in ops if op.payload.name == "fwd.experts.host.sequential"]
    assert len(rest) == 1 and rest[0].stream == "host"
    assert rest[0].payload.seconds == pytest.approx(2 * (experts - 1) * TE_LINEAR_HOST_S)
    host = [n for n, op in zip(names, ops) if op.stream == "host"]
    i = host.index("fwd.experts.host.sequential")
    assert host[i - 1].startswith("fwd.experts.fc2.host")     # right after the fc2 step
    assert host[i + 1] == "fwd.combine.host"                  # before the combine's step
    block = next(b for b in _blocks(_config(experts, grouped=False)) if rest[0] in b)
    unsort = next(op for op in block if op.payload.name == "fwd.unsort")
    assert block.index(rest[0]) in unsort.deps                # the un-sort waits for them
    bwd = [op for op in ops if op.payload.name == "bwd.experts.host.sequential"]
    assert len(bwd) == 1 and bwd[0].stream == "host"
    assert bwd[0].payload.seconds == pytest.approx(
        experts * sequential_mlp.BWD_HOST_PER_EXPERT_S)


def test_grouped_gemm_and_one_expert_have_no_sequential_modules():
    grouped = {op.payload.name for op in _ops(_config(16, grouped=True))}
    assert not {n for n in grouped if n.endswith(".sequential")}
    assert sequential_mlp.forward_rest("fwd", 1, "bf16") is None


def test_a_host_bound_layer_grows_with_its_experts_in_both_engines():
    """Each local expert adds its modules' host time before the experts' un-sort (one rank:
    no combine all-to-all for the chain's combine step to gate); the engines agree."""
    times = {}
    for engine in ("analytical", "des"):
        times[engine] = [ddlsim.predict(_config(e, grouped=False), engine=engine).iteration_time_s
                         for e in (4, 16)]
    assert times["analytical"] == pytest.approx(times["des"], rel=1e-6)
    no_rule = [ddlsim.predict(_config(e, grouped=True), engine="analytical").iteration_time_s
               for e in (4, 16)]
    grown, grouped_grown = times["analytical"][1] - times["analytical"][0], \
        no_rule[1] - no_rule[0]
    # 24 more linear modules before the experts' un-sort (the backward's host work hides
    # behind the head and the optimizer on the device here)
    assert grown - grouped_grown > 0.8 * 24 * TE_LINEAR_HOST_S
