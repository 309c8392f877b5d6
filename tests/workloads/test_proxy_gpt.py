"""The GPT proxies of spcl/DNN-cpp-proxies, call for call (examples/proxies/gpt*.yaml).

Every number is derived by hand from the proxies' sources (file:line in the comments), never
copied from a run: the #define constants are first re-derived from the model (test 1), then
`ddlsim comm` must reproduce, per rank and iteration, the proxy's MPI calls.
"""

from __future__ import annotations

import pytest

import ddlsim
from ddlsim.api import build_workload
from ddlsim.commprofile import comm_profile
from ddlsim.workloads.decoder.proxy import ProxySizes
from ddlsim.workloads.proxytime import TIMER_SLACK_S

GPT2 = "examples/proxies/gpt2_large.yaml"
GPT3 = "examples/proxies/gpt3.yaml"
MOE = "examples/proxies/gpt3_moe.yaml"
STEP = "examples/proxies/gpt3_one_pipe_step.yaml"
MOE_STEP = "examples/proxies/gpt3_moe_one_pipe_step.yaml"
F = 4                       # MPI_FLOAT

# comm_only/gpt2_large.cpp:22-26
P2PSIZE, BEGINSIZE, INTERSIZE, ENDSIZE = 808960, 85317120, 19677440, 84008960
# gpt3.cpp:25-29, gpt3_moe.cpp:26-30
PIPE_P2P_SIZE = MP_ALLREDUCE_SIZE = MOE_ALL2ALL_SIZE = 25165824
DP_ALLREDUCE_SIZE, MHA_SIZE, MLP_SIZE = 452984832, 603979776, 1207959552


def _cfg(path):
    return ddlsim.load_config(path)


@pytest.fixture(scope="module")
def gpt2():
    return comm_profile(build_workload(_cfg(GPT2)), "rank")


def _rows(frame, rank, op, peer=None):
    sel = frame[(frame["rank"] == rank) & (frame["op"] == op)]
    if peer is not None:
        sel = sel[sel["peer"] == peer]
    assert len(sel) == 1, (rank, op, peer, sel)
    return sel.iloc[0]


# ------------------------------------------------------------------ the #defines, derived
def test_gpt2_defines_derive_from_gpt2_large():
    # h = 1280, s = 632, V = 50257, 1024 positions; a GPT-2 layer has 12h² + 13h parameters
    # (qkv 3h²+3h, proj h²+h, fc 4h²+4h, fc-proj 4h²+h, two LayerNorms 4h)
    h, s, V, P = 1280, 632, 50257, 1024
    assert s * h == P2PSIZE
    assert 12 * h * h + 13 * h == INTERSIZE
    assert V * h + P * h + INTERSIZE == BEGINSIZE     # embedding + positions + first layer
    assert INTERSIZE + V * h + 2 * h == ENDSIZE       # last layer + head (tied copy) + final norm
    sz = ProxySizes(_cfg(GPT2), _cfg(GPT2).model.shape())
    assert sz.p2p == F * P2PSIZE
    assert sz.layer_grads() == (F * INTERSIZE, 0.0)
    assert sum(sz.edge_grads(0)) + sz.layer_grads()[0] == F * BEGINSIZE
    assert sum(sz.edge_grads(7)) + sz.layer_grads()[0] == F * ENDSIZE


def test_gpt3_defines_derive_from_gpt3_175b():
    # h = 12288, s = 2048, 4 model shards; layer weight matrices 12h² (gpt3.cpp:29: "num
    # params of one shard of a layer" = 12h²/4)
    h, s = 12288, 2048
    assert s * h == PIPE_P2P_SIZE == MP_ALLREDUCE_SIZE
    assert 12 * h * h // 4 == DP_ALLREDUCE_SIZE
    cfg = _cfg(GPT3)
    sz = ProxySizes(cfg, cfg.model.shape())
    assert (sz.p2p, sz.tp_allreduce) == (F * PIPE_P2P_SIZE, F * MP_ALLREDUCE_SIZE)
    assert sz.layer_grads() == (F * DP_ALLREDUCE_SIZE, 0.0)


def test_gpt3_moe_defines_derive_from_16_experts_of_4h_over_16():
    # attention weights 4h² (MHA_SIZE), MLP 8h² (MLP_SIZE) split in 16 experts of ffn 3072
    h = 12288
    assert 4 * h * h == MHA_SIZE and 8 * h * h == MLP_SIZE and 2 * h * 3072 == MLP_SIZE // 16
    cfg = _cfg(MOE)
    sz = ProxySizes(cfg, cfg.model.shape())
    assert sz.alltoall == F * MOE_ALL2ALL_SIZE        # top-1: everything a rank sends
    assert sz.layer_grads() == (F * MHA_SIZE, F * MLP_SIZE // 16)


# ------------------------------------------------------------------ gpt2_large 64 8, 32 ranks
def test_gpt2_point_to_point_per_stage(gpt2):
    # gpt2_large.cpp:66-104, grad_acc_step = 8 (:136): per micro-batch one MPI_Isend and one
    # MPI_Irecv of P2PSIZE floats per direction; stage = rank % 8, so stage s's partners are
    # rank ± 1. Stage 0 (rank 0): 8 isends to 1 forward, 8 irecvs from 1 backward.
    msg = 8 * F * P2PSIZE                                     # 25,886,720 bytes
    assert (_rows(gpt2, 0, "isend", 1)[["calls", "send_bytes", "recv_bytes"]].tolist()
            == [8, msg, 0])
    assert _rows(gpt2, 0, "irecv", 1)[["calls", "recv_bytes"]].tolist() == [8, msg]
    # a middle stage (rank 13 = stage 5 of pipeline 1): both ways, both directions
    for peer in (12, 14):
        assert _rows(gpt2, 13, "isend", peer)[["calls", "send_bytes"]].tolist() == [8, msg]
        assert _rows(gpt2, 13, "irecv", peer)[["calls", "recv_bytes"]].tolist() == [8, msg]
    # last stage (rank 31 = stage 7): receives forward from 30, sends backward to 30
    assert _rows(gpt2, 31, "irecv", 30)["recv_bytes"] == msg
    assert _rows(gpt2, 31, "isend", 30)["send_bytes"] == msg
    assert not ((gpt2["rank"] == 31) & (gpt2["peer"] == 0)).any()   # no wrap-around


def test_gpt2_allreduce_per_stage(gpt2):
    # gpt2_large.cpp:172-197 with MSGAGG: 64/8 = 8 layers per stage, one blocking
    # MPI_Allreduce per layer over the 4 ranks {s, s+8, s+16, s+24} (:158-160)
    ar = gpt2[gpt2["op"] == "allreduce"]
    assert set(ar["group_size"]) == {4} and (ar["calls"] == 8).all()
    per_stage = ar.assign(stage=ar["rank"] % 8).groupby("stage")["send_bytes"].agg(set)
    assert per_stage[0] == {F * (BEGINSIZE + 7 * INTERSIZE)}     # 892,236,800
    assert all(per_stage[s] == {F * 8 * INTERSIZE} for s in range(1, 7))   # 629,678,080
    assert per_stage[7] == {F * (7 * INTERSIZE + ENDSIZE)}       # 887,004,160
    assert F * (BEGINSIZE + 7 * INTERSIZE) == 892_236_800
    assert (ar["send_bytes"] == ar["recv_bytes"]).all()


# ------------------------------------------------------------------ gpt3 and gpt3_moe
def test_gpt3_per_rank_calls():
    frame = comm_profile(build_workload(_cfg(GPT3)), "class")
    m = 96 * 2                                   # grad_acc_step = num_stage × ACC_STEP_SCALE
    mid = frame[frame["class"] == "stage5"].set_index(["op", "group", "peer"])
    n = mid["ranks"].iloc[0]                     # 4 shards × 2 replicas = 8 ranks
    assert n == 8
    # per micro-batch and pass: one isend, one irecv (gpt3.cpp:71, 75, 95, 99)
    for op in ("isend", "irecv"):
        for peer in (1, -1):
            assert mid.loc[(op, "pp", peer), "calls"] == n * m
    assert mid.loc[("isend", "pp", 1), "send_bytes"] == n * m * F * PIPE_P2P_SIZE
    # 2 MPI_Allreduce per micro-batch and pass over the 4 shards (gpt3.cpp:77-79, 101-103)
    tp = mid.xs(("allreduce", "tp"), level=(0, 1)).iloc[0]
    assert (tp["group_size"], tp["calls"]) == (4, n * 2 * 2 * m)
    assert tp["send_bytes"] == n * 2 * 2 * m * F * MP_ALLREDUCE_SIZE
    # one MPI_Allreduce of DP_ALLREDUCE_SIZE floats over the 2 replicas (gpt3.cpp:106)
    dp = mid.xs(("allreduce", "dp"), level=(0, 1)).iloc[0]
    assert (dp["group_size"], dp["calls"], dp["send_bytes"]) == (2, n, n * F * DP_ALLREDUCE_SIZE)


def test_gpt3_moe_per_rank_calls():
    frame = comm_profile(build_workload(_cfg(MOE)), "class")
    m, n = 192, 32                               # 32 ranks per stage: 16 experts × 2 replicas
    st = frame[frame["class"] == "stage0"].set_index(["op", "group"])
    # 2 MPI_Alltoall per micro-batch and pass, sendcount MOE_ALL2ALL_SIZE/16 per peer
    # (gpt3_moe.cpp:85-87, 112-114): send p · count = MOE_ALL2ALL_SIZE floats, recv the same
    a2a = st.loc[("alltoall", "ep")]
    assert (a2a["group_size"], a2a["calls"]) == (16, n * 2 * 2 * m)
    assert a2a["send_bytes"] == a2a["recv_bytes"] == n * 4 * m * F * 16 * (MOE_ALL2ALL_SIZE // 16)
    # expert gradients over the 2 replicas, then the attention's over all 32 (:117-118)
    edp, dp = st.loc[("allreduce", "edp")], st.loc[("allreduce", "dp")]
    assert (edp["group_size"], edp["send_bytes"]) == (2, n * F * (MLP_SIZE // 16))
    assert (dp["group_size"], dp["send_bytes"]) == (32, n * F * MHA_SIZE)
    assert st.loc[("isend", "pp"), "send_bytes"] == n * m * F * PIPE_P2P_SIZE


def test_one_pipe_steps_pair_stages():
    # gpt3_one_pipe_step.cpp:46-62: even stage ↔ stage+1, one message each way, 2 all-reduces
    frame = comm_profile(build_workload(_cfg(STEP)), "rank")
    r0 = frame[frame["rank"] == 0].set_index("op")
    assert r0.loc["isend", "peer"] == 1 and r0.loc["irecv", "peer"] == 1
    assert r0.loc["isend", "send_bytes"] == F * PIPE_P2P_SIZE
    assert (r0.loc["allreduce", "calls"], r0.loc["allreduce", "group_size"]) == (2, 4)
    r1 = frame[frame["rank"] == 1].set_index("op")
    assert r1.loc["isend", "peer"] == 0
    moe = comm_profile(build_workload(_cfg(MOE_STEP)), "class")
    a2a = moe[(moe["class"] == "stage3") & (moe["op"] == "alltoall")].iloc[0]
    assert (a2a["group_size"], a2a["calls"] / a2a["ranks"]) == (16, 2)


# ------------------------------------------------------------------ timing
def test_gpt3_pipeline_timing_by_hand():
    # 4 stages of one GPT-3 layer, 2 micro-batches, one shard, on one DGX A100: the last
    # stage starts forward at 3F, ends its forwards at 5F, then each backward travels back:
    # stage 0 ends at 5F + 5B (+ 6 messages of 100 MB over NVLink, small)
    cfg = ddlsim.load_config(GPT3, overrides=[
        "model.num_hidden_layers=4", "parallel.pipeline_model_parallel_size=4",
        "parallel.tensor_model_parallel_size=1", "parallel.data_parallel_size=1",
        "train.global_batch_size=2", "system.nodes=1"])
    a = ddlsim.predict(cfg, "analytical")
    fwd, bwd = 15915e-6 + TIMER_SLACK_S, 31830e-6 + TIMER_SLACK_S  # usleep + timer slack
    assert a.breakdown.compute_s == pytest.approx(2 * (fwd + bwd))
    assert 5 * (fwd + bwd) < a.iteration_time_s < 5 * (fwd + bwd) * 1.02


@pytest.mark.parametrize("path,overrides", [
    (GPT2, ["parallel.data_parallel_size=1", "train.global_batch_size=8", "system.nodes=1"]),
    (GPT3, ["model.num_hidden_layers=4", "parallel.pipeline_model_parallel_size=4",
            "parallel.tensor_model_parallel_size=1", "parallel.data_parallel_size=2",
            "train.global_batch_size=8", "system.nodes=1"])], ids=["gpt2", "gpt3-dp2"])
def test_des_agrees_with_analytical_on_gpt_proxies(path, overrides):
    # contention-free on one NVSwitch node: one pipeline of 8 (gpt2); two pipelines of 4 whose
    # data-parallel all-reduce runs after every message has arrived (gpt3). (With TP, a
    # stage's isend overlaps its TP all-reduces on the same NVLink port: the DES is then ~1.4%
    # slower, as contention should make it.)
    cfg = ddlsim.load_config(path, overrides=overrides)
    a, d = ddlsim.predict(cfg, "analytical"), ddlsim.predict(cfg, "des")
    assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=0.01)


def test_proxy_program_with_the_cost_model_computes_the_layers_flops():
    # compute: model: the stage's forward is the layer's GEMM FLOPs (GPT-2: 24·b·s·h² +
    # 4·b·s²·h per layer, Narayanan et al. 2021), timed by the cost model, not slept
    cfg = ddlsim.load_config(GPT2, overrides=["model.compute=model", "model.proxy_timings=null"])
    wl = build_workload(cfg)
    fwd = next(op for op in wl.classes[3].program.blocks["F"].ops
               if getattr(op.payload, "name", "") == "forward")
    b, s, h = 1, 632, 1280
    assert fwd.repeat == 8 and fwd.payload.seconds is None
    assert fwd.payload.flops == 24 * b * s * h * h + 4 * b * s * s * h
    res = ddlsim.predict(cfg)
    assert res.breakdown.compute_s > 0


def test_proxy_options_are_refused_where_they_mean_nothing():
    base = {"model": "gpt2-124m", "parallel": {"pipeline_model_parallel_size": 2},
            "train": {"micro_batch_size": 1, "global_batch_size": 4, "seq_length": 64},
            "system": {"preset": "dgx-a100", "nodes": 1}}
    for model, match in [({"proxy_timings": {"forward": "1 ms"}}, "compute is 'model'"),
                         ({"grad_sync": "per_layer"}, "options of the proxy programs"),
                         ({"compute": "proxy", "proxy_timings": {"forward": "1 ms",
                                                                 "backward": "1 ms"}},
                          "program = 'megatron'"),
                         ({"program": "proxy_gpipe", "compute": "proxy", "grad_sync": "per_stage"},
                          "needs model.proxy_timings.forward"),
                         ({"program": "proxy_gpipe", "compute": "proxy", "grad_sync": "per_stage",
                           "proxy_timings": {"forward": "1 ms"}}, "needs model.proxy_timings.backward"),
                         ({"program": "proxy_gpipe", "compute": "proxy", "grad_sync": "per_stage",
                           "proxy_timings": {"forward": "1 ms", "backward": "1 ms",
                                             "forwrd": "1 ms"}}, "proxy_timings.forwrd is not a timing of the gpt family")]:
        with pytest.raises(ddlsim.ConfigError, match=match):
            ddlsim.load_config({**base, "model": {"preset": "gpt2-124m", **model}})


# ------------------------------------------------------------------ communicator members
def _group(wl, family, rank):
    return sorted(int(r) for r in wl.groups[family].group_of(rank))


def test_communicators_are_the_proxies_comm_splits():
    # gpt2_large.cpp:158-164: allreduce_comm = ranks with the same rank % 8; p2p_comm = the
    # same rank / 8
    wl = build_workload(_cfg(GPT2))
    assert _group(wl, "dp", 13) == [5, 13, 21, 29]
    assert _group(wl, "pp", 13) == list(range(8, 16))
    # gpt3.cpp:148-165: dp = same rank % 384; mp = same (rank % 384) % 96 within a replica;
    # pp = same (rank % 384) / 96
    wl = build_workload(_cfg(GPT3))
    assert _group(wl, "dp", 100) == [100, 484]
    assert _group(wl, "tp", 100) == [4, 100, 196, 292]
    assert _group(wl, "pp", 100) == list(range(96, 192))
    # gpt3_moe.cpp:163-180: dp = same rank % 96; with q = rank / 96, moe_allreduce = same
    # q % 16, moe_alltoall = same q / 16 (within the dp group)
    wl = build_workload(_cfg(MOE))
    r = 5 + 96 * (3 + 16 * 1)                   # stage 5, expert 3, replica 1
    assert _group(wl, "dp", r) == [5 + 96 * q for q in range(32)]
    assert _group(wl, "edp", r) == [5 + 96 * 3, 5 + 96 * 19]
    assert _group(wl, "ep", r) == [5 + 96 * q for q in range(16, 32)]
    assert _group(wl, "pp", r) == list(range(96 * 19, 96 * 20))
