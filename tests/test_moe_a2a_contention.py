"""SMs the dispatcher's kernels take from the compute beside them in Megatron-Core's combined
1F1B (``ddlsim/workloads/decoder/combined.py`` ``pair_contention``; docs/moe.md): one contention
op per overlap window of a layer pair, as ``TransformerLayerSchedulePlan.run`` states the windows,
holding DeepEP's 20 or HybridEP's 16 SMs (NCCL's channels for the alltoall dispatcher) while the
window's all-to-alls run.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import ddlsim
from ddlsim.simulator.collectives import flex
from ddlsim.simulator.kernels.contention import contention_seconds
from ddlsim.workloads.decoder.combined import WINDOWS
from ddlsim.workloads.trace import Collective, Compute, Contention

pytestmark = pytest.mark.filterwarnings("ignore::ddlsim.errors.DDLSimWarning")


def run(dispatcher: str = "deepep", layers: int = 2, **system) -> dict:
    """Qwen3-30B-A3B cut to ``layers`` layers, EP16 over two DGX H100s, the overlap on."""
    moe = ({"token_dispatcher_type": "alltoall"} if dispatcher == "alltoall" else
           {"token_dispatcher_type": "flex", "flex_dispatcher_backend": dispatcher})
    return {"model": {"preset": "qwen3-30b-a3b", "num_hidden_layers": layers},
            "parallel": {"expert_model_parallel_size": 16,
                         "moe": {**moe, "grouped_gemm": True, "permute_fusion": True,
                                 "router_force_load_balancing": True,
                                 "overlap_expert_parallel_comm": True,
                                 "delay_wgrad_compute": True}},
            "train": {"micro_batch_size": 1, "global_batch_size": 64, "seq_length": 4096},
            "system": {"preset": "dgx-h100", "nodes": 2,
                       "software": {"stack": "megatron-core-2025"}, **system}}


def _contention_ops(cfg: dict) -> list:
    w = ddlsim.build_workload(ddlsim.load_config(cfg))
    block = w.classes[0].program.blocks["C0.0"]
    return [o for o in block.ops if type(o.payload) is Compute and o.payload.contention]


@pytest.mark.parametrize("dispatcher, sms", [("deepep", 20), ("hybridep", 16),
                                             ("alltoall", 0)])
def test_each_window_of_each_pair_holds_the_dispatchers_sms(dispatcher, sms):
    ops = _contention_ops(run(dispatcher))
    # two layer pairs, three windows each: combine bwd | dispatch fwd + bwd | combine fwd
    assert len(ops) == 2 * len(WINDOWS) == 6
    assert {o.payload.contention.sms for o in ops} == {sms}
    colls = [tuple(c.name for c in o.payload.contention.collectives) for o in ops[:3]]
    # HybridEP's forward dispatch gathers the routing maps first (decoder/moe_dispatch.py)
    gather = ("fwd.dispatch.routing_map",) if dispatcher == "hybridep" else ()
    assert colls == [("bwd.combine",), (*gather, "fwd.dispatch", "bwd.dispatch"),
                     ("fwd.combine",)]
    assert all(o.stream == "compute" and o.payload.contention.gemm_flops > 0 for o in ops)


def test_the_first_window_counts_the_forward_attention_nodes_flops():
    cfg = ddlsim.load_config(run())
    w = ddlsim.build_workload(cfg)
    ops = w.classes[0].program.blocks["C0.0"].ops
    names = [o.payload.name for o in ops]
    first = names.index("combined.attn.ep_sm_contention")
    # the forward attention node: from the op after the combine's gradient to the contention
    # op that closes it
    begin = names.index("bwd.combine") + 1
    flops = sum(o.payload.flops * o.repeat for o in ops[begin:first]
                if type(o.payload) is Compute and o.stream == "compute")
    assert ops[first].payload.contention.gemm_flops == pytest.approx(flops)


def test_a_kernels_own_sm_count_replaces_nccls_channels():
    dev = SimpleNamespace(peak_flops=lambda dt: 1e15, ceiling=lambda dt: 1.0, sm_count=132)
    coll = Collective("fwd.dispatch", "all_to_all", "tp_ep", 1e8)
    op = Compute("x", 0.0, contention=Contention(1e12, sms=20, collectives=(coll,)))
    g_k = 1e-3 * 132 / 112
    # C longer than the GEMMs on 112 SMs: they lose 20/132 of their rate for all of G_k
    assert contention_seconds(op, dev, 24, 5e-3) == pytest.approx(20 / 132 * g_k)
    # C shorter: for C only
    assert contention_seconds(op, dev, 24, 5e-4) == pytest.approx(20 / 132 * 5e-4)
    nccl = Compute("y", 0.0, contention=Contention(1e12, collectives=(coll,)))
    assert contention_seconds(nccl, dev, 24, 5e-4) == pytest.approx(24 / 132 * 5e-4)


def test_the_sms_slow_the_step_by_at_most_their_share_of_the_compute(monkeypatch):
    cfg = run(layers=4)
    held = ddlsim.predict(ddlsim.load_config(cfg))
    # one SM held (0 would mean NCCL's channels): next to no contention
    monkeypatch.setitem(flex.KERNEL_SMS, "deepep", (1, "test: one SM"))
    free = ddlsim.predict(ddlsim.load_config(cfg))
    assert free.iteration_time_s < held.iteration_time_s
    extra = held.iteration_time_s - free.iteration_time_s
    assert extra <= 20 / (132 - 20) * free.breakdown.compute_s


def test_both_engines_time_the_contention_alike_inside_one_node():
    # EP8 inside one node: no link shared by two flows at once, so the DES and the analytical
    # engine agree on the trace (test_moe_a2a_overlap.py), contention ops included
    cfg = run("deepep", layers=2)
    cfg["parallel"]["expert_model_parallel_size"] = 8
    cfg["system"]["nodes"] = 1
    cfg["train"]["global_batch_size"] = 16
    a, d = (ddlsim.predict(ddlsim.load_config(cfg), engine=e) for e in ("analytical", "des"))
    assert any(o.payload.contention for o in _block_ops(cfg))
    assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=0.01)


def _block_ops(cfg: dict) -> list:
    w = ddlsim.build_workload(ddlsim.load_config(cfg))
    return [o for o in w.classes[0].program.blocks["C0.0"].ops if type(o.payload) is Compute]
