"""HybridEP's metadata preprocessing in Megatron-Core's flex dispatcher
(``decoder/moe_dispatch.py`` ``hybridep_routing_map_gather``): every forward dispatch, a
recomputed one too, first all-gathers the members' boolean routing maps with NCCL (DeepEP
hybrid-ep 7febc6e ``executor.cu`` ``allgather_routing_map``), because Megatron-Core's
``HybridEPDispatch.forward`` passes no handle; the backward's dispatch reuses the forward's
handle, and so did the kernel benchmark the HybridEP rates come from
(``tests/test_hybrid_ep.py`` lines 262-268)."""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.workloads.trace import Collective

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")

HYBRIDEP = {"token_dispatcher_type": "flex", "flex_dispatcher_backend": "hybridep"}
DEEPEP = {"token_dispatcher_type": "flex", "flex_dispatcher_backend": "deepep"}


def qwen3_30b(dispatcher: dict, layers: int = 2, **moe) -> dict:
    """Qwen3-30B-A3B (128 experts, top-8, hidden 2048) cut to ``layers`` layers, EP16 over
    two DGX H100s, 4096 tokens per rank."""
    return {"model": {"preset": "qwen3-30b-a3b", "num_hidden_layers": layers},
            "parallel": {"expert_model_parallel_size": 16, "expert_tensor_parallel_size": 1,
                         "moe": {**dispatcher, "grouped_gemm": True, "permute_fusion": True,
                                 "router_force_load_balancing": True, **moe}},
            "train": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 4096,
                      "dtype": "bf16"},
            "system": {"preset": "dgx-h100", "nodes": 2,
                       "software": {"stack": "megatron-core-2025"}}}


def _collectives(cfg: dict, block: str | None = None) -> list[Collective]:
    w = ddlsim.build_workload(ddlsim.load_config(cfg))
    blocks = w.classes[0].program.blocks
    names = [block] if block else list(blocks)
    return [o.payload for n in names for o in blocks[n].flat.ops
            if isinstance(o.payload, Collective)]


def test_each_forward_dispatch_first_gathers_the_routing_maps():
    colls = _collectives(qwen3_30b(HYBRIDEP), "F0")
    names = [c.name for c in colls]
    gathers = [c for c in colls if c.name == "fwd.dispatch.routing_map"]
    assert len(gathers) == 2                      # one per MoE layer
    for g in gathers:
        # p · T · E booleans: 16 members x 4096 tokens x 128 experts, one byte each
        assert (g.op, g.group, g.bytes) == ("all_gather", "tp_ep", 16 * 4096 * 128)
        assert names[names.index(g.name) + 1] == "fwd.dispatch"   # right before the kernel
    assert names.count("fwd.dispatch") == 2


def test_the_backward_reuses_the_handle_and_deepep_gathers_nothing():
    bwd = _collectives(qwen3_30b(HYBRIDEP), "B0")
    assert not [c for c in bwd if c.op == "all_gather" and "routing_map" in c.name]
    assert not [c for c in _collectives(qwen3_30b(DEEPEP)) if "routing_map" in c.name]


def test_a_recomputed_forward_gathers_again():
    cfg = qwen3_30b(HYBRIDEP)
    cfg["train"].update(recompute="full")
    names = [c.name for c in _collectives(cfg, "B0")]
    assert names.count("recompute.dispatch.routing_map") == 2


def test_the_combined_1f1b_dispatch_node_runs_the_gather_then_the_kernel_on_the_ep_stream():
    cfg = qwen3_30b(HYBRIDEP, overlap_expert_parallel_comm=True)
    w = ddlsim.build_workload(ddlsim.load_config(cfg))
    ops = w.classes[0].program.blocks["C0.0"].flat.ops
    ep = [o.payload.name for o in ops if o.stream == "ep"]
    i = ep.index("fwd.dispatch.routing_map")
    assert ep[i + 1] == "fwd.dispatch"


def test_the_gathers_are_exposed_expert_parallel_time_without_the_overlap():
    # one micro-batch per rank: every EP collective runs on the compute stream, so the exposed
    # EP time is their sum, the two forward gathers (NCCL's all-gather time) included
    from ddlsim.api import _placement
    from ddlsim.simulator.costs import CostModel
    cfg = qwen3_30b(HYBRIDEP)
    cfg["train"]["global_batch_size"] = 16
    c = ddlsim.load_config(cfg)
    w = ddlsim.build_workload(c)
    cost = CostModel(c.system, w, c.parallel.collective_algorithm, devices=_placement(c, w))
    colls = _collectives(cfg, "F0") + _collectives(cfg, "B0.sync")
    ep = [x for x in colls if x.group == "tp_ep"]
    gathers = [x for x in ep if x.name == "fwd.dispatch.routing_map"]
    assert len(gathers) == 2
    t_gather = cost.collective(gathers[0])
    assert 1e-5 < t_gather < 1e-3      # 8 MiB gathered over two nodes: tens of microseconds
    exposed = ddlsim.predict(cfg, "analytical").to_dict()["breakdown"]["exposed_comm_s"]["ep"]
    assert exposed == pytest.approx(sum(cost.collective(x) for x in ep), rel=1e-6)
