"""FSDP2's host time per unit and per parameter tensor on this CPU: what ``fully_shard``'s
hooks (pre_forward, post_forward, pre_backward, post_backward) cost beyond the model's own
ops (issue 30, task HM).

    PYTHONPATH=... python -m torch.distributed.run --standalone --nproc-per-node N \\
        benchmarks/fsdp2_host_costs.py [--iters 40]

Each rank (Gloo, CPU, one thread) builds chains of ``L`` units, each with ``T`` parameter
tensors of 8 fp32 elements whose forward is ``x = x + p`` per tensor, for ``L`` in (2, 10) and
``T`` in (2, 12) (12: a block of the torch loop's model, ``ddlsim/reference/torch_train.py``:
two LayerNorms, the QKV, projection and two MLP Linears, weight and bias each). Each chain is
timed bare and under ``fully_shard`` on every unit and the root (as the loop's trainer wraps
its blocks), alternating, forward and backward apart, each the least process CPU time over
``--iters`` rounds of the most over ranks. The tensors are tiny, so the difference is host
time: the hooks' Python, DTensor's and FSDP2's ATen ops, and at two ranks Gloo's blocking
collectives on a few bytes, which are timed alone too (``all_gather_into_tensor`` and
``reduce_scatter_tensor`` of a unit's padded shard) and taken off (ddlsim charges a
collective by its own cost model).

With ``--trace PATH`` it reads instead a Kineto trace of a one-rank FSDP2 step (the H200's,
``benchmarks/data/device_h200_2026-11-30/run5/none_s2048/llama_step_trace.json.gz``, ``run1/
llama/...``) and prints the host duration of each block's ``FSDP::`` ranges: forward
(``pre_forward`` + ``post_forward``) and backward (``pre_backward``, the backward prefetch
inside it, + ``post_backward_reduce`` + ``post_backward_reshard`` + ``post_backward_accumulate``),
the median over the blocks, with the ATen ops inside them.

Per unit: ``(Δ(L=10) − Δ(L=2)) / 8`` (the root's once-per-pass work cancels); per tensor: the
slope between ``T = 2`` and ``T = 12``; the unit's fixed part: the rest at ``T = 2``. Each is
printed in seconds and in units of this machine's tiny op (a 1-element ``torch.add`` in a
Python loop: the loop's ``launch.stream_gap_s``, ``ddlsim/reference/torch_machine.py``), the
unit :mod:`ddlsim.workloads.decoder.fsdp2_host` charges them in. Nothing is fitted to a
step time.

With ``--fake N`` it runs in one process on torch's fake process group of ``N`` ranks
(``torch.testing._internal.distributed.fake_pg``: every collective returns at once, nothing
is sent): FSDP2's sharded path alone, without Gloo's blocking collectives and their
subtraction, whose noise (two processes on two cores) is larger than the hooks' own time
(``Gloo taken off`` 180-610 µs a unit against 190-910 µs left). ``fsdp2_host``'s figures
are these.

With ``--evict MIB`` every unit, bare and sharded alike, zeroes a buffer of that many MiB in
its forward and again in its backward (one kernel each way), so that each unit's hooks run
after a kernel that has evicted the caches, as the torch loop's real blocks do between two
units (its GEMMs and the Adam step stream past the 32 MiB L3); ``--evict llc`` zeroes the
torch job's own flush (``ddlsim/reference/torch_samples.flush_buffer``: twice the last-level
cache, the flush before every GEMM sample and FSDP2 copy sample of the loop's calibration).
Each zeroing's own CPU time is timed where it runs and taken off its pass, so that a pass's
difference is the hooks' alone, in the cache state the zeroing leaves (before 2026-11-30
08:00 UTC the zeroing stayed in, twice over, whose spread hid the per-tensor slope).
``--fake 2 --iters 20 --evict 64`` (2026-11-30 06:56 UTC, load 0.9-1.5, two runs each,
alternating, the zeroing left in): forward 0.42 ms hot, 0.62 and 1.11 ms evicted; backward
0.61-0.63 ms hot, 1.38-1.41 ms evicted: FSDP2's hooks' Python and dispatch refetch their
code and data from memory after each block (``py-spy record --native`` on the loop's model
under FSDP2 on the fake process group: the non-kernel samples inside FSDP2's frames are
``foreach_reduce``'s per-parameter loop, ``record_function``'s enter and exit, the
``torch._dynamo.disable`` wrappers built per call and the collectives' Python wrappers, all
per unit or per tensor). ``fsdp2_host.HOOK_TINY_OPS`` are the hot figures,
``fsdp2_host.COLD_HOOK_TINY_OPS`` the ``--evict llc`` ones.
"""

from __future__ import annotations

import time

import torchbench as tb

LENGTHS = (2, 10)
TENSORS = (2, 12)
ELEMENTS = 8
#: under ``--evict``: [the buffer each unit zeroes forward and backward, the autograd
#: function doing it, [CPU seconds the zeroings took since the pass began]]; empty: no
#: eviction
EVICT: list = []


def _chain(layers: int, tensors: int, sharded: bool):
    """``layers`` units of ``tensors`` 8-element parameters, ``fully_shard`` on each and the
    root when ``sharded``."""
    import torch
    from torch import nn

    class Unit(nn.Module):
        def __init__(self):
            super().__init__()
            self.ps = nn.ParameterList(nn.Parameter(torch.randn(ELEMENTS))
                                       for _ in range(tensors))

        def forward(self, x):
            if EVICT:
                x = EVICT[1].apply(x)
            for p in self.ps:
                x = x + p
            return x

    torch.manual_seed(0)
    model = nn.Sequential(*(Unit() for _ in range(layers)))
    if sharded:
        from torch.distributed.fsdp import fully_shard
        for unit in model:
            fully_shard(unit)
        fully_shard(model)
    return model


def _evict_function():
    """An autograd function zeroing :data:`EVICT`'s buffer in the forward and the backward."""
    import torch

    class Evict(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            _zero_timed()
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            _zero_timed()
            return grad
    return Evict


def _zero_timed() -> None:
    """Zero :data:`EVICT`'s buffer, adding the CPU seconds it took to ``EVICT[2][0]``."""
    t0 = time.process_time()
    EVICT[0].zero_()
    EVICT[2][0] += time.process_time() - t0


def _least_net(fn, iters: int) -> float:
    """Least over ``iters`` calls of the most over ranks of ``fn()``'s process CPU seconds,
    less the zeroings' (:data:`EVICT`) inside it (:func:`torchbench.least_max_cpu` where
    nothing is evicted)."""
    if not EVICT:
        return tb.least_max_cpu(fn, iters)
    import torch
    import torch.distributed as dist
    best = float("inf")
    for _ in range(iters):
        dist.barrier()
        EVICT[2][0] = 0.0
        t0 = time.process_time()
        fn()
        t = torch.tensor([time.process_time() - t0 - EVICT[2][0]], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        best = min(best, float(t))
    return best


def _phases(model, iters: int) -> tuple[float, float]:
    """Least (forward, backward) CPU seconds of ``model`` on an 8-element input."""
    import torch
    x = torch.zeros(ELEMENTS)
    held = []

    def forward():
        held[:] = [model(x).sum()]

    def backward():
        held[0].backward()
        model.zero_grad(set_to_none=True)

    fwd = bwd = float("inf")
    for _ in range(3):                      # warm-up: FSDP2's lazy init, allocator
        forward(), backward()
    for _ in range(iters):
        fwd = min(fwd, _least_net(forward, 1))
        bwd = min(bwd, _least_net(backward, 1))
    return fwd, bwd


def _collectives(tensors: int, iters: int) -> tuple[float, float]:
    """Least CPU seconds of one unit's all-gather and reduce-scatter (0 at one rank)."""
    import torch
    import torch.distributed as dist
    n = dist.get_world_size()
    if n == 1:
        return 0.0, 0.0
    shard = -(-ELEMENTS // n) * tensors
    inp, out = torch.zeros(shard), torch.zeros(shard * n)
    gather = tb.least_max_cpu(lambda: dist.all_gather_into_tensor(out, inp), iters)
    scatter = tb.least_max_cpu(lambda: dist.reduce_scatter_tensor(inp, out), iters)
    return gather, scatter


def hook_shares(iters: int) -> dict[str, float]:
    """The post-hook's share of each pass's FSDP2 ranges (``post_forward`` of the forward's;
    ``post_backward*`` of the backward's, beside ``pre_backward``), read from the profiler's
    ``FSDP::`` ranges over ``iters`` iterations of the longer chain with 12 tensors a unit."""
    from torch.profiler import ProfilerActivity, profile
    model = _chain(LENGTHS[1], TENSORS[1], True)
    _phases(model, 1)
    total = {"pre_forward": 0.0, "post_forward": 0.0, "pre_backward": 0.0,
             "post_backward": 0.0}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _phases(model, iters)
    for e in prof.events():
        if e.name.startswith("FSDP::") and "(" in e.name:    # a unit's, not the root's
            kind = e.name[6:].split(" ")[0]
            kind = "post_backward" if kind.startswith("post_backward") else kind
            if kind in total:
                total[kind] += e.cpu_time_total
    return {"forward": total["post_forward"] / (total["pre_forward"] + total["post_forward"]),
            "backward": total["post_backward"] / (total["pre_backward"]
                                                  + total["post_backward"])}


def measure(iters: int) -> dict:
    """The per-unit and per-tensor costs (module docstring) on this process group."""
    import torch
    tiny = tb.least_cpu(_tiny_ops(torch), iters, warmup=2) / 1000
    delta = {}
    for layers in LENGTHS:
        for tensors in TENSORS:
            bare = _phases(_chain(layers, tensors, False), iters)
            fsdp = _phases(_chain(layers, tensors, True), iters)
            delta[layers, tensors] = (fsdp[0] - bare[0], fsdp[1] - bare[1])
    out = {"tiny_op_s": tiny, "post_share": hook_shares(max(iters // 4, 1))}
    spread = LENGTHS[1] - LENGTHS[0]
    for i, phase in enumerate(("forward", "backward")):
        gather, scatter = zip(*(_collectives(t, iters) for t in TENSORS))
        comm = [g + (s if phase == "backward" else 0.0) for g, s in zip(gather, scatter)]
        unit = [(delta[LENGTHS[1], t][i] - delta[LENGTHS[0], t][i]) / spread - c
                for t, c in zip(TENSORS, comm)]
        per_tensor = (unit[1] - unit[0]) / (TENSORS[1] - TENSORS[0])
        out[phase] = {"unit_s": unit[0] - TENSORS[0] * per_tensor, "tensor_s": per_tensor,
                      "collectives_s": comm}
    return out


def _tiny_ops(torch):
    a, b = torch.ones(1), torch.ones(1)

    def loop():
        for _ in range(1000):
            torch.add(a, b)
    return loop


#: a block's FSDP2 ranges in a one-rank trace, by pass (``backward_prefetch`` is inside
#: ``pre_backward``: not added)
TRACE_RANGES = {"forward": ("pre_forward", "post_forward"),
                "backward": ("pre_backward", "post_backward_reduce", "post_backward_reshard",
                             "post_backward_accumulate")}


def trace_hooks(path: str) -> dict[str, dict[str, float]]:
    """Each block's FSDP2 host seconds per pass in a Kineto trace (module docstring), the
    median over blocks, and the ATen ops (``cpu_op`` events) inside them per block.

    Parameters
    ----------
    path : str
        A ``.json`` or ``.json.gz`` Kineto trace of a one-rank FSDP2 step.

    Returns
    -------
    dict
        ``{"forward": {"s": ..., "aten_ops": ...}, "backward": {...}, "blocks": n}``.
    """
    import gzip
    import json
    import re
    import statistics
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    ranges = [e for e in events if e.get("cat") == "user_annotation"
              and re.fullmatch(r"FSDP::\w+ \(layers\.\d+\)", e["name"])]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    blocks = sorted({e["name"].rsplit("(", 1)[1] for e in ranges})
    out: dict = {"blocks": len(blocks)}
    for phase, names in TRACE_RANGES.items():
        seconds, counts = [], []
        for blk in blocks:
            mine = [e for e in ranges if e["name"].split(" (")[0][6:] in names
                    and e["name"].endswith(blk)]
            seconds.append(sum(e["dur"] for e in mine) * 1e-6)
            counts.append(sum(1 for r in mine for e in ops if e["tid"] == r["tid"]
                              and r["ts"] <= e["ts"] <= r["ts"] + r["dur"]
                              and e["name"].startswith("aten::")))
        out[phase] = {"s": statistics.median(seconds), "aten_ops": statistics.median(counts)}
    return out


def _evict_mib(ap, text: str) -> float:
    """``--evict``'s MiB: a number >= 0, or ``llc`` for the torch job's flush
    (``torch_samples.flush_bytes`` of this machine's last-level cache)."""
    if text == "llc":
        tb.loop_model(False)                # puts the repository on the path
        from ddlsim.reference.mpijobs import last_level_cache_bytes
        from ddlsim.reference.torch_samples import flush_bytes
        return flush_bytes(last_level_cache_bytes()) / 2 ** 20
    try:
        mib = float(text)
    except ValueError:
        mib = -1.0
    if not mib >= 0:
        ap.error(f"--evict {text!r}: must be a number of MiB >= 0 (0: no eviction) or 'llc'")
    return mib


def main(argv: list[str] | None = None) -> int:
    ap = tb.parser(__doc__, "iters", 40, "rounds; the least is kept")
    ap.add_argument("--trace", help="read a one-rank Kineto trace's FSDP2 ranges instead")
    ap.add_argument("--fake", type=int, default=0, metavar="N",
                    help="one process on torch's fake process group of N ranks (no Gloo)")
    ap.add_argument("--evict", default="0", metavar="MIB",
                    help="each unit zeroes this many MiB forward and backward (0: none; "
                         "llc: the torch job's flush, twice the last-level cache)")
    args = tb.parse(ap, argv, ("iters",))
    evict_mib = _evict_mib(ap, args.evict)
    if args.fake < 0:
        ap.error(f"--fake {args.fake}: must be >= 1 (or 0: Gloo under torch.distributed.run)")
    if args.trace:
        res = trace_hooks(args.trace)
        print(f"{args.trace}: {res['blocks']} blocks")
        for phase in TRACE_RANGES:
            print(f"  {phase}: {res[phase]['s'] * 1e6:.1f} us per block (median), "
                  f"{res[phase]['aten_ops']:.0f} ATen ops in it")
        return 0
    if tb.loop_model(False) is None:        # torch with Gloo, one thread
        return 2
    if evict_mib:
        import torch
        EVICT[:] = [torch.empty(int(evict_mib * 2 ** 20) // 4), _evict_function(), [0.0]]
    import torch.distributed as dist
    if args.fake:
        from torch.testing._internal.distributed.fake_pg import FakeStore
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=args.fake)
    else:
        dist.init_process_group("gloo")
    res = measure(args.iters)
    if dist.get_rank() == 0:
        tiny = res["tiny_op_s"]
        backend = "fake" if args.fake else "gloo"
        print(f"ranks {dist.get_world_size()} ({backend}): tiny op {tiny * 1e6:.2f} us; "
              f"evicting {evict_mib:.0f} MiB a unit and pass (its zeroing taken off)"
              if evict_mib else f"ranks {dist.get_world_size()} ({backend}): tiny op "
              f"{tiny * 1e6:.2f} us; hot")
        for phase in ("forward", "backward"):
            r = res[phase]
            comm = ", ".join(f"{c * 1e6:.1f}" for c in r["collectives_s"])
            print(f"  {phase}: per unit {r['unit_s'] * 1e6:.1f} us ({r['unit_s'] / tiny:.1f} "
                  f"tiny ops), per tensor {r['tensor_s'] * 1e6:.2f} us "
                  f"({r['tensor_s'] / tiny:.2f}); Gloo taken off per unit at T={TENSORS}: "
                  f"{comm} us; the post-hook's share (profiled) {res['post_share'][phase]:.2f}")
            unit = r["unit_s"] + TENSORS[1] * r["tensor_s"]
            print(f"    a unit of {TENSORS[1]} tensors: {unit * 1e3:.3f} ms "
                  f"({unit / tiny:.1f} tiny ops)")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
