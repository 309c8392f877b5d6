"""The timed passes of benchmarks/moe_host_ops.py ``--time``: Megatron-LM's ``MoELayer`` on
CPU over two gloo ranks (:mod:`moe_host_ops_megatron` builds it), each part's thread CPU time
per pass, forward and backward, with the time inside ``torch.distributed`` calls apart
(``moe_host_ops.host_seconds`` turns them into the host seconds the GPU path would spend).
Needs torch and a Megatron-LM checkout; imports neither at module level.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from moe_host_ops_megatron import Tally, _setup

#: ``torch.distributed`` calls whose thread CPU time is the gloo transport's (on a GPU: NCCL
#: launches, which ddlsim charges per collective): taken out of the parts' host time
C10D = ("all_to_all_single", "all_gather_into_tensor", "_all_gather_base", "all_reduce",
        "reduce_scatter_tensor", "_reduce_scatter_base", "all_gather", "broadcast")


def _c10d_timed(dist, tally: Tally) -> None:
    """Wrap the :data:`C10D` calls so that their thread CPU time is charged to
    ``tally.c10d_us`` under the current label (as well as to the label's own time)."""
    def wrap(fn):
        def timed(*a, **k):
            t0 = time.thread_time_ns()
            try:
                return fn(*a, **k)
            finally:
                tally.c10d_us[tally.label] += (time.thread_time_ns() - t0) / 1e3
        return timed
    for name in C10D:
        if hasattr(dist, name):
            setattr(dist, name, wrap(getattr(dist, name)))


def _timed_pass(torch, layer, tally: Tally, seed: int, tokens: int, hooks: bool) -> dict:
    """One forward and backward of ``tokens`` tokens, timed per label (thread CPU µs: the
    forward by the labelled steps, the backward by a pre-hook on every autograd node
    the forward's steps made, ``hooks``), with the CPU µs inside :data:`C10D` calls per label
    and the backward's hooked nodes per label; without ``hooks`` only the backward's total."""
    torch.manual_seed(seed)
    x = torch.randn(tokens, 1, 64, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(tokens, 1, 64, dtype=torch.bfloat16)
    tally.tagged.clear()
    tally.us.clear()
    tally.c10d_us.clear()
    tally.take()
    tally.timing = True
    tally.switch("outside")
    tally.us["outside"] = 0.0
    out = layer(x)[0]
    tally.switch("outside")
    handles = [n.register_prehook(tally.timed_prehook(n)) for n in tally.tagged] if hooks else []
    tally.us["outside"] = 0.0
    t0 = time.thread_time_ns()
    out.backward(g)
    total = (time.thread_time_ns() - t0) / 1e3
    tally.switch("outside")
    tally.timing = False
    for h in handles:
        h.remove()
    return {"us": dict(tally.us), "c10d_us": dict(tally.c10d_us), "bwd_total_us": total,
            "bwd_nodes": dict(tally.take()["nodes"])}


def _median(xs: list) -> float:
    """The median of ``xs`` (the mean of the middle two for an even count)."""
    xs, n = sorted(xs), len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def timing_worker(rank: int, world: int, megatron: str, local: int, router_dtype, out: str,
                  passes: int, tokens: tuple) -> None:
    """One gloo rank: build the layer, then per token count in ``tokens`` time ``passes``
    forward and backward passes after five warm-up passes, alternating with and without the
    backward's node hooks; rank 0 writes the medians per label (JSON, ``out``): ``us`` (thread
    CPU µs per label), ``c10d_us`` (of it inside :data:`C10D` calls), ``bwd_total_us`` with
    and without hooks and the hooked nodes per label."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29518", TORCHDYNAMO_DISABLE="1")
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    tally = Tally()
    _c10d_timed(dist, tally)
    layer = _setup(torch, megatron, local, world, router_dtype, tally)
    result = {}
    for t in tokens:
        for i in range(5):
            _timed_pass(torch, layer, tally, rank + i, t, True)
        runs, bare = [], []
        for i in range(passes):
            runs.append(_timed_pass(torch, layer, tally, rank + i, t, True))
            bare.append(_timed_pass(torch, layer, tally, rank + i, t, False)["bwd_total_us"])
        labels = sorted({k for r in runs for k in (*r["us"], *r["c10d_us"])})
        result[str(t)] = {
            "us": {k: _median([r["us"].get(k, 0.0) for r in runs]) for k in labels},
            "c10d_us": {k: _median([r["c10d_us"].get(k, 0.0) for r in runs]) for k in labels
                        if any(k in r["c10d_us"] for r in runs)},
            "bwd_total_us": {"hooks": _median([r["bwd_total_us"] for r in runs]),
                             "bare": _median(bare)},
            "bwd_nodes": runs[-1]["bwd_nodes"], "nodes_same": all(
                r["bwd_nodes"] == runs[0]["bwd_nodes"] for r in runs),
            "passes": passes}
    if rank == 0:
        Path(out).write_text(json.dumps({"timing": result, "torch": torch.__version__},
                                        indent=1, sort_keys=True))
    dist.barrier()
    dist.destroy_process_group()
