"""``ddlsim comm``: one iteration's communication as an MPI profiler reports it.

Every expected number is derived here from the plan (model shape, batch, parallel sizes) and
the buffer convention of docs/comm.md, not copied from a run.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import ddlsim
from ddlsim.api import build_workload
from ddlsim.cli import app
from ddlsim.commprofile import CommProfileError, comm_profile
from ddlsim.workloads.trace import (Block, Collective, GroupFamily, Loop, Op, P2P, Program,
                                    RankClass, StepTable, Workload)

runner = CliRunner()
WIKI = "examples/wiki-gpt2-9ranks-reduce_broadcast.yaml"
GPT2_124M = 124_439_808   # GPT-2 small's parameters (tied head, 50257 vocab, 1024 positions)

# TP2 x PP2 x DP2 of GPT-3 XL (Brown et al. 2020: 24 layers, h = 2048, V = 50257), bf16
H, L, V, POS, B, S, TP, PP, DP, GBS = 2048, 24, 50257, 2048, 1, 1024, 2, 2, 2, 16
PLAN = {"model": "gpt3-1.3b",
        "parallel": {"tensor_model_parallel_size": TP, "pipeline_model_parallel_size": PP,
                     "data_parallel_size": DP},
        "train": {"micro_batch_size": B, "global_batch_size": GBS, "seq_length": S},
        "system": {"preset": "dgx-a100", "nodes": 1}}
MB = GBS // (B * DP)                       # micro-batches per iteration: 8
ACT = B * S * H * 2                        # one micro-batch's activations, bf16
LAYER = 12 * H * H + 13 * H                # GPT layer: 4h²+4h attention, 8h²+5h MLP, 4h norms


@pytest.fixture(scope="module")
def plan():
    cfg = ddlsim.load_config(PLAN)
    return cfg, build_workload(cfg)


@pytest.fixture(scope="module")
def per_rank(plan):
    return comm_profile(plan[1], "rank")


def _row(frame, **where):
    sel = frame
    for k, v in where.items():
        sel = sel[sel[k] == v]
    assert len(sel) == 1, sel
    return sel.iloc[0]


def test_wiki_reduce_then_broadcast_moves_the_fp32_gradients_once_each_way():
    frame = comm_profile(build_workload(ddlsim.load_config(WIKI)), "rank")
    n = 4 * GPT2_124M
    assert set(frame["rank"]) == set(range(9)) and len(frame) == 18
    assert (frame["root"] == 0).all() and (frame["group_size"] == 9).all()
    assert (frame["calls"] == 1).all()
    red, bc = frame[frame["op"] == "reduce"], frame[frame["op"] == "bcast"]
    assert (red["send_bytes"] == n).all()                      # every rank sends B
    root_only = {r: (n if r == 0 else 0) for r in range(9)}
    others = {r: (0 if r == 0 else n) for r in range(9)}
    assert red.set_index("rank")["recv_bytes"].to_dict() == root_only
    assert bc.set_index("rank")["send_bytes"].to_dict() == root_only
    assert bc.set_index("rank")["recv_bytes"].to_dict() == others


def test_pipeline_sends_a_tp_slice_per_micro_batch_then_gathers_it(per_rank):
    # Narayanan et al. 2021 §4.1: each TP rank sends 1/t of the activations, the receiver
    # all-gathers them over TP. Stage 0 = ranks 0-3 sends forward to the same (tp, dp)
    # position of stage 1 = rank + 4, which sends gradients back.
    # Megatron posts them with isend/irecv (batch_isend_irecv): ops on the trace's "pp" stream
    for r in (0, 2):
        s = _row(per_rank, rank=r, op="isend")
        assert (s["peer"], s["calls"], s["recv_bytes"]) == (r + 4, MB, 0)
        assert s["send_bytes"] == MB * ACT / TP
        g = _row(per_rank, rank=r, op="irecv")
        assert (g["peer"], g["calls"], g["recv_bytes"]) == (r + 4, MB, MB * ACT / TP)
        ag = _row(per_rank, rank=r, op="allgather")
        assert (ag["calls"], ag["send_bytes"], ag["recv_bytes"]) == (MB, MB * ACT / TP, MB * ACT)
    assert _row(per_rank, rank=5, op="isend")["peer"] == 1


def test_tp_allreduces_four_per_layer_and_micro_batch(per_rank):
    # Megatron: attention and MLP each all-reduce once forward and once backward; plus the
    # vocab-parallel embedding's all-reduce (first stage) or the loss's (last stage, b·s fp32).
    # The default stack (megatron-core-2024, tp_async_backward) launches the backward's
    # input-gradient all-reduces asynchronously (async_op=True): an MPI profiler sees them as
    # iallreduce, the forward's as allreduce
    layers = L // PP
    first = _row(per_rank, rank=0, op="allreduce", group="tp")
    assert first["calls"] == MB * (2 * layers + 1)
    assert first["send_bytes"] == first["recv_bytes"] == MB * (2 * layers + 1) * ACT
    last = _row(per_rank, rank=4, op="allreduce", group="tp")
    assert last["calls"] == MB * (2 * layers + 1)
    assert last["send_bytes"] == MB * (2 * layers * ACT + 4 * B * S)
    for rank in (0, 4):
        bwd = _row(per_rank, rank=rank, op="iallreduce", group="tp")
        assert bwd["calls"] == MB * 2 * layers
        assert bwd["send_bytes"] == bwd["recv_bytes"] == MB * 2 * layers * ACT


def test_tp_allreduces_all_block_without_the_async_backward():
    cfg = ddlsim.load_config({**PLAN, "system": {**PLAN["system"], "software": {
        "stack": "megatron-core-2024", "overlap": {"tp_async_backward": False}}}})
    frame = comm_profile(build_workload(cfg), "rank")
    layers = L // PP
    assert _row(frame, rank=0, op="allreduce", group="tp")["calls"] == MB * (4 * layers + 1)
    assert not ((frame["op"] == "iallreduce") & (frame["group"] == "tp")).any()


def test_dp_allreduce_moves_the_stage_gradients(per_rank):
    # DDP's bucket all-reduces run on the "dp" stream beside the backward: non-blocking.
    # bf16 on Megatron-Core's stack: fp32 main grads, all-reduced in fp32 (4 B per parameter;
    # Megatron-LM arguments.py forces accumulate_allreduce_grads_in_fp32 with --bf16)
    layers = L // PP * LAYER / TP          # ddlsim shards a layer's parameters by t
    first = 4 * (layers + V * H / TP + POS * H)
    last = 4 * (layers + 2 * H + V * H / TP)   # final norm, tied head's copy
    assert _row(per_rank, rank=0, op="iallreduce", group="dp")["send_bytes"] == first
    assert _row(per_rank, rank=7, op="iallreduce", group="dp")["recv_bytes"] == last


def test_send_bytes_match_the_prediction_comm_bytes(plan, per_rank):
    # Result.comm_bytes: per group kind, the nccl-tests size of every collective plus sends
    # (all-gather: the gathered output = recv_bytes; all-reduce and send: send_bytes)
    cfg, wl = plan
    res = ddlsim.predict(cfg)
    cls = next(c for c in wl.classes if c.name == res.critical_class)
    rows = per_rank[per_rank["rank"] == cls.ranks[0]]
    nccl = np.where(rows["op"] == "allgather", rows["recv_bytes"],
                    np.where(rows["op"].isin(["recv", "irecv"]), 0.0, rows["send_bytes"]))
    kinds = rows["group"].map(lambda g: wl.groups[g].kind)   # comm_bytes is per group kind
    got = pd.Series(nccl, index=kinds.values).groupby(level=0).sum().to_dict()
    assert got == pytest.approx({k: v for k, v in res.comm_bytes.items() if v})


def test_per_class_rows_are_per_rank_rows_summed(plan, per_rank):
    wl = plan[1]
    klass = {r: c.name for c in wl.classes for r in c.ranks}
    keys = ["class", "op", "group"]
    ranks = per_rank.assign(**{"class": per_rank["rank"].map(klass)})
    a = ranks.groupby(keys)[["calls", "send_bytes", "recv_bytes"]].sum().sort_index()
    cols = ["calls", "send_bytes", "recv_bytes"]
    b = comm_profile(wl, "class").groupby(keys)[cols].sum().sort_index()
    pd.testing.assert_frame_equal(a, b, check_dtype=False)


def _tiny(ops, steps, split=None):
    fam = GroupFamily("ep", "ep", np.array([[0, 1, 2]]))
    prog = Program({"x": Block("x", "forward", tuple(ops))}, steps)
    return Workload("tiny", 3, {"ep": fam}, (RankClass("all", (0, 1, 2), prog),))


def test_steps_repeat_and_loops_multiply_calls():
    body = (Op(Collective("a2a", "all_to_all", "ep", 60.0, split_bytes=(10.0, 20.0, 30.0))),)
    ops = [Op(Loop("layers", body, 3), repeat=2),
           Op(Collective("b", "broadcast", "ep", 9.0, root=1)),
           Op(P2P("s", "send", "ep", 1, 5.0, "t"), stream="p")]
    wl = _tiny(ops, StepTable(["x"], [0] * 5, list(range(5))))
    f = comm_profile(wl, "rank")
    a2a = f[f["op"] == "alltoallv"].set_index("rank")
    assert (a2a["calls"] == 5 * 2 * 3).all() and (a2a["send_bytes"] == 30 * 60).all()
    # member j receives b_j from each of the 3 members
    assert a2a["recv_bytes"].to_dict() == {0: 30 * 3 * 10, 1: 30 * 3 * 20, 2: 30 * 3 * 30}
    bc = f[f["op"] == "bcast"].set_index("rank")
    assert (bc["root"] == 1).all() and bc["send_bytes"].to_dict() == {0: 0, 1: 45, 2: 0}
    # the send runs on stream "p", not "compute": MPI_Isend
    assert f[f["op"] == "isend"].set_index("rank")["peer"].to_dict() == {0: 1, 1: 2, 2: 0}


def test_per_rank_refuses_too_many_rows_and_points_to_per_class(plan):
    with pytest.raises(CommProfileError, match="--per class"):
        comm_profile(plan[1], "rank", max_rows=10)


def test_per_class_of_a_thousand_ranks_is_quick():
    cfg = ddlsim.load_config("examples/gpt3-175b-1024-a100.yaml")
    f = comm_profile(build_workload(cfg), "class")
    assert f["ranks"].groupby([f["class"], f["op"], f["group"], f["peer"].astype(str),
                               f["role"]]).sum().max() <= 1024


def test_cli_csv_parses_and_json_carries_rows():
    r = runner.invoke(app, ["comm", WIKI, "--format", "csv"])
    assert r.exit_code == 0, r.output
    frame = pd.read_csv(io.StringIO(r.output))
    assert list(frame.columns) == ["rank", "op", "group", "group_size", "peer", "root", "calls",
                                   "send_bytes", "recv_bytes"]
    assert frame["send_bytes"].sum() == 9 * 4 * GPT2_124M + 4 * GPT2_124M
    r = runner.invoke(app, ["comm", WIKI, "--format", "json", "--per", "class"])
    doc = json.loads(r.output)
    assert doc["per"] == "class" and doc["world_size"] == 9
    assert sum(row["ranks"] for row in doc["rows"] if row["op"] == "reduce") == 9


@pytest.mark.parametrize("args", [["comm", "no-such.yaml"], ["comm", WIKI, "--per", "node"],
                                  ["comm", WIKI, "--format", "xml"], ["comm", WIKI, "--force"],
                                  ["comm", WIKI, "--set", "parallel.data_parallel_size=0"]])
def test_bad_input_is_one_paragraph_and_exit_2(args):
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error:")


def test_ops_off_the_compute_stream_are_named_as_non_blocking_calls():
    # docs/comm.md: the compute stream blocks (MPI_Allreduce, MPI_Send); any other stream is
    # MPI's non-blocking call (MPI_Iallreduce, MPI_Isend), with the same buffer sizes
    ops = [Op(Collective("a", "all_reduce", "ep", 30.0)),
           Op(Collective("b", "all_reduce", "ep", 30.0), stream="dp"),
           Op(Collective("c", "all_gather", "ep", 30.0), stream="dp"),
           Op(P2P("s", "send", "ep", 1, 5.0, "t")),
           Op(P2P("r", "recv", "ep", -1, 5.0, "t"), stream="pp")]
    f = comm_profile(_tiny(ops, StepTable(["x"], [0], [0])), "rank")
    r0 = f[f["rank"] == 0].set_index("op")
    assert sorted(r0.index) == ["allreduce", "iallgather", "iallreduce", "irecv", "send"]
    assert r0.loc["iallgather", "send_bytes"] == 10 and r0.loc["iallgather", "recv_bytes"] == 30
    assert r0.loc["irecv", "recv_bytes"] == 5 and r0.loc["irecv", "peer"] == 2
