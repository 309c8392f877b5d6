"""Uneven table-wise sharding: the pooled-embedding all-to-all with per-peer sizes.

With tables of equal dim d spread in contiguous runs (dlrm_s_pytorch ``get_my_slice``), rank i
holds ``n_i`` tables and pools ``width_i = n_i·d`` columns for every sample. Forward: rank i
sends ``b·width_i`` elements to each rank (the local batch ``b`` of that rank), a send-side
imbalance (``split_by="sender"``); backward: rank i sends ``b·width_j`` gradient elements to
the owner j of each table (``split_by="receiver"``).
"""

from __future__ import annotations

import numpy as np
import pytest

import ddlsim
from ddlsim.api import build_workload
from ddlsim.commprofile import comm_profile
from ddlsim.simulator.collectives import split_matrix
from ddlsim.workloads.trace import Collective

SIX = {"preset": "dlrm-proxy", "tables": [{"rows": 80000, "pooling": 5.05}] * 6}


def run(model, ranks=4, mb=512, overlap=True):
    return ddlsim.load_config({
        "model": model, "parallel": {"data_parallel_size": ranks,
                                     "overlap_grad_reduce": overlap},
        "train": {"micro_batch_size": mb, "global_batch_size": mb * ranks, "seq_length": 1,
                  "dtype": "fp32", "optimizer": "sgd"},
        "system": {"preset": "dgx-a100", "nodes": 1}})


def test_sender_split_is_the_transpose():
    assert np.array_equal(split_matrix([1, 2, 3], "sender"), split_matrix([1, 2, 3]).T)
    assert np.array_equal(split_matrix([1, 2, 3], "sender")[1], [2, 2, 2])


def test_six_tables_on_four_ranks_split_per_peer():
    # runs of 2, 2, 1, 1 tables: widths 256, 256, 128, 128; b = 512, fp32:
    # to/from each peer 512·256·4 = 524,288 or 512·128·4 = 262,144 bytes
    wl = build_workload(run(SIX))
    assert len(wl.classes) == 2 and wl.classes[0].ranks == (0, 1)
    for c in wl.classes:
        ops = {o.payload.name: o.payload for o in c.program.blocks["F"].ops + c.program.blocks[
            "BL"].ops if isinstance(o.payload, Collective)}
        fwd, bwd = ops["embedding.all_to_all.fwd"], ops["embedding.all_to_all.bwd"]
        assert fwd.split_bytes == bwd.split_bytes == (524_288, 524_288, 262_144, 262_144)
        assert (fwd.split_by, bwd.split_by) == ("sender", "receiver")


def test_six_tables_on_four_ranks_bytes_per_rank():
    # forward: rank i sends 4·512·width_i·4 and receives 512·(256+256+128+128)·4 = 1,572,864;
    # backward the reverse. Rank 0: 2,097,152 + 1,572,864 = 3,670,016 each way; rank 2:
    # 1,048,576 + 1,572,864 = 2,621,440 each way.
    prof = comm_profile(build_workload(run(SIX)))
    a2a = prof[prof.op == "ialltoallv"].set_index("rank")
    assert list(a2a.calls) == [2, 2, 2, 2]
    assert list(a2a.send_bytes) == [3_670_016, 3_670_016, 2_621_440, 2_621_440]
    assert list(a2a.recv_bytes) == list(a2a.send_bytes)


def test_forward_alone_sends_by_sender_and_receives_the_column_sum():
    from ddlsim.commprofile import _buffers, _walk

    wl = build_workload(run(SIX))
    out: dict = {}
    fwd = [o for o in wl.classes[0].program.blocks["F"].ops
           if isinstance(o.payload, Collective)]
    _walk(fwd, 1, out)
    (key, entry), = out.items()
    send, recv = _buffers(key, entry, 4, np.arange(4), np.zeros(4, bool))
    assert list(send) == [2_097_152, 2_097_152, 1_048_576, 1_048_576]
    assert list(recv) == [1_572_864] * 4


def test_uneven_all_to_all_des_agrees_with_analytical_without_contention():
    cfg = run({**SIX, "overlap_embedding_all_to_all": False}, overlap=False)
    a, d = ddlsim.predict(cfg, "analytical"), ddlsim.predict(cfg, "des")
    assert d.iteration_time_s == pytest.approx(a.iteration_time_s, rel=0.01)


def test_uneven_all_to_all_is_timed_by_the_largest_sender():
    # direct all-to-all on one NVSwitch node: α + max over ranks of max(sent, received) to
    # others / bw. Forward: rank 0 sends 3 · 524,288 = 1,572,864 B to the others and receives
    # 524,288 + 2·262,144 = 1,048,576: t = 3.4 us + 1,572,864 / 300 GB/s = 8.64288 us.
    from ddlsim.simulator.costs import CostModel

    cfg = run(SIX)
    wl = build_workload(cfg)
    fwd = next(o.payload for o in wl.classes[0].program.blocks["F"].ops
               if isinstance(o.payload, Collective))
    cost = CostModel(cfg.system, wl, {"all_to_all": "direct"})
    assert cost.collective(fwd) == pytest.approx(3.4e-6 + 1_572_864 / 300e9)
