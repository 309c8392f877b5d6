"""The alltoall dispatcher's pre-process (Megatron-LM d7288711 ``token_dispatcher.py``
``preprocess``): the routing map summed into per-expert counts, the counts all-gathered over
the dispatcher's group and reduced to the all-to-all's splits, before the host waits for
them; on both the 1F1B layer and the combined 1F1B's attention node."""

from __future__ import annotations

import ddlsim
from ddlsim.workloads.decoder.moe_dispatch import COUNT_BYTES, COUNT_KERNELS

from test_moe_host import ALLTOALL, DEEPEP, _combined_nodes, qwen3_30b


def _forward(cfg: dict) -> list:
    block = ddlsim.build_workload(ddlsim.load_config(cfg)).classes[0].program.blocks["F0"]
    return list(block.flat.ops)


def test_the_counts_are_gathered_before_the_hosts_wait():
    ops = _forward(qwen3_30b(ALLTOALL, layers=1))
    names = [o.payload.name for o in ops]
    at = names.index("fwd.dispatch.counts_gather")
    gather = ops[at].payload
    # EP 8 ranks × 128 experts' int64 counts gathered (nccl-tests convention: the output)
    assert (gather.op, gather.group, gather.bytes) == ("all_gather", "tp_ep", 8 * 128 * 8)
    assert names[at - 1] == "fwd.dispatch.counts" and names[at + 1] == "fwd.dispatch.splits"
    splits = ops[at + 1].payload
    assert len(splits.kernels) == COUNT_KERNELS
    assert all(k.bytes == 8 * 128 * COUNT_BYTES for k in splits.kernels)
    sync = names.index("fwd.dispatch.sync")                   # the host waits for the splits
    assert at + 1 in ops[sync].deps
    assert "fwd.dispatch.counts_gather" not in [o.payload.name for o in _backward(ALLTOALL)]


def _backward(dispatcher: dict) -> list:
    w = ddlsim.build_workload(ddlsim.load_config(qwen3_30b(dispatcher, layers=1)))
    return list(w.classes[0].program.blocks["B0"].flat.ops)


def test_the_flex_dispatcher_has_no_such_gather():
    assert not [o for o in _forward(qwen3_30b(DEEPEP, layers=1))
                if o.payload.name.startswith("fwd.dispatch.count")]


def test_the_combined_1f1b_carries_them_too():
    attn = [o.payload.name for o in _combined_nodes(ALLTOALL)["attn"]]
    at = attn.index("fwd.dispatch.counts_gather")
    assert attn[at - 1:at + 2] == ["fwd.dispatch.counts", "fwd.dispatch.counts_gather",
                                   "fwd.dispatch.splits"]
    assert "fwd.dispatch.counts_gather" not in [
        o.payload.name for o in _combined_nodes(ALLTOALL, True)["attn"]]
