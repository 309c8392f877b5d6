"""Host (CPU) time per op kind of one eager ResNet-50 training step, read from a Kineto trace
(issue 29, "ResNet-50 with PyTorch DDP on A100: 34 % too fast"): the measurement behind
``ddlsim/workloads/resnet/host.py``.

Run:  python benchmarks/resnet_host_trace.py [TRACE.json.gz ...]

Default traces: ``benchmarks/data/device_h200_2026-11-30/run4/resnet/`` (``resnet_step.py --trace``
on one H200, torch 2.11, AMP fp16 + GradScaler, channels-last, batch 32 and 256; README.md there).

**What is read.** The trace's CPU events (``cpu_op``, ``cuda_runtime``, ``cuda_driver``,
``user_annotation``) on each host thread, nested by time; a *root* is an event no other contains.
The main thread's roots are the forward's module ops (``aten::conv2d``, ``aten::batch_norm``, ...),
the GradScaler's ops, ``Optimizer.step`` and ``Optimizer.zero_grad``; the autograd engine's
thread's roots are its nodes (``autograd::engine::evaluate_function: ConvolutionBackward0``, ...).
A root's **host time** is its duration plus the gap since the previous root ended on its thread
(the Python of ``nn.Module.__call__`` before a forward op, the engine's scheduling before a
node), less the profiler's own ``Activity Buffer Request`` stalls in that interval (one of
675 µs inside the batch-32 trace's first backward node), so a phase's host times add up to its
span. Launches are the kernel-launch calls in a root (``cudaLaunchKernel``,
``cudaLaunchKernelExC``, ``cuLaunchKernelEx``, ``cudaLaunchCooperativeKernel``);
``cudaMemsetAsync`` is counted apart.

**Layers.** Roots are grouped per layer as ddlsim's ResNet trace has them
(``ddlsim/workloads/resnet/build.py``: one op per layer and pass): a forward batch norm is its
``num_batches_tracked.add_(1)`` (the ``aten::add_`` just before ``aten::batch_norm``) and the
``aten::batch_norm``; a convolution is split into its autocast cast (``cast``: the ``aten::to``
inside ``aten::conv2d``; in the backward the ``ToCopyBackward0`` after the convolution's node)
and the rest (``conv``: ``cudnn_convolution``; ``ConvolutionBackward0`` with its weight's
``AccumulateGrad``); a batch norm's backward is its ``CudnnBatchNormBackward0`` and two
``AccumulateGrad``. The fully connected layer carries the loss (forward: ``linear`` to
``ones_like``: the loss, ``scaler.scale`` and ``backward()``'s seed; backward: every node from
the first to ``AddmmBackward0``, then its ``TBackward0``, casts and grads), the average pool
its ``flatten`` (backward: ``AsStrided``, ``Mean`` and ``View`` nodes). The update: the
GradScaler's ops before and after the step as one op, the first of them without the main
thread's wait for the backward, ``found_inf.item()`` by its gap alone (its duration is the
device's); ``Optimizer.step`` and ``Optimizer.zero_grad`` as recorded.

**Units.** The profiler lengthens every event it records, so the table's microseconds are a
profiled host's. Each kind is also given in units of the trace's own tiny op, the
``num_batches_tracked.add_(1)`` (one 1-element in-place add, one launch: the op
``benchmarks/device/launch_time.py`` times in a loop for the device's eager host time per op),
its median duration: the profiler's cost of its two events is in both, and cancels to first
order. Nothing is fitted to a step time.
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
from pathlib import Path

RUN4 = Path(__file__).parent / "data" / "device_h200_2026-11-30" / "run4" / "resnet"
TRACES = (RUN4 / "resnet_amp_nhwc_32_trace.json.gz", RUN4 / "resnet_amp_nhwc_256_trace.json.gz")
LAUNCHES = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx",
                      "cudaLaunchCooperativeKernel", "cuLaunchKernel"})
_CATS = frozenset({"cpu_op", "cuda_runtime", "cuda_driver", "user_annotation"})
_NODE = "autograd::engine::evaluate_function: "
#: forward module op → layer kind (module docstring)
_FORWARD = {"aten::conv2d": "conv", "aten::batch_norm": "bn", "aten::relu_": "relu",
            "aten::add_": "add", "aten::max_pool2d": "maxpool",
            "aten::adaptive_avg_pool2d": "avgpool", "aten::flatten": "avgpool",
            "aten::linear": "fc"}
#: backward node → layer kind (AccumulateGrad and ToCopyBackward0 join the layer before them)
_BACKWARD = {"ConvolutionBackward0": "conv", "CudnnBatchNormBackward0": "bn",
             "ReluBackward0": "relu", "AddBackward0": "add",
             "MaxPool2DWithIndicesBackward0": "maxpool", "MeanBackward1": "avgpool",
             "ViewBackward0": "avgpool", "AsStridedBackward1": "avgpool"}
#: the update's roots → ddlsim's update op (``build._update``)
_UPDATE = {"Optimizer.step#SGD.step": "optimizer", "Optimizer.zero_grad#SGD.zero_grad":
           "zero_grad"}


def roots(path: Path) -> dict[int, list[dict]]:
    """Per host thread, its root events in time order, each with ``host_us`` (duration + gap
    since the previous root, less the profiler's own ``Activity Buffer Request`` stalls inside
    that interval), ``launches``, ``memsets`` and ``events`` (itself and nested)."""
    with gzip.open(path) as fh:
        trace = json.load(fh)["traceEvents"]
    events = [e for e in trace if e.get("ph") == "X" and e.get("cat") in _CATS]
    stalls = [(e["ts"], e["ts"] + e["dur"]) for e in trace
              if e.get("ph") == "X" and e.get("cat") == "overhead"]
    out = {}
    for tid in sorted({e["tid"] for e in events}, key=str):
        stack, tops = [], []
        for e in sorted((e for e in events if e["tid"] == tid),
                        key=lambda e: (e["ts"], -e["dur"])):
            while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"]:
                stack.pop()
            if not stack:
                tops.append(dict(e, launches=0, memsets=0, events=0, cast_us=0.0,
                                 cast_launches=0))
            elif len(stack) == 1 and e["name"] == "aten::to":
                tops[-1]["cast_us"] += e["dur"]         # a direct child: autocast's cast
            elif len(stack) > 1 and stack[1]["name"] == "aten::to":
                tops[-1]["cast_launches"] += e["name"] in LAUNCHES
            tops[-1]["events"] += 1
            tops[-1]["launches"] += e["name"] in LAUNCHES
            tops[-1]["memsets"] += e["name"] == "cudaMemsetAsync"
            stack.append(e)
        end = None
        for r in tops:
            start = r["ts"] if end is None else end
            stop = r["ts"] + r["dur"]
            stalled = sum(max(0.0, min(stop, b) - max(start, a)) for a, b in stalls)
            r["gap_us"] = r["ts"] - start
            r["host_us"] = stop - start - stalled
            end = stop
        out[tid] = tops
    return out


def _threads(path: Path) -> tuple[list[dict], list[dict]]:
    """(main thread's roots, autograd thread's roots)."""
    threads = list(roots(path).values())
    engine = [t for t in threads if any(r["name"].startswith(_NODE) for r in t)]
    main = [t for t in threads if any(r["name"] == "aten::conv2d" for r in t)]
    if len(engine) != 1 or len(main) != 1:
        raise ValueError(f"{path}: expected one main and one autograd thread, found "
                         f"{len(main)} and {len(engine)}")
    return main[0], engine[0]


def _cost(*rs: dict, less: dict | None = None) -> dict:
    """Host µs, launches and memsets of roots ``rs`` together, less ``less``'s."""
    out = {k: sum(r[k] for r in rs) for k in ("host_us", "launches", "memsets")}
    return {k: v - (less[k] if less else 0) for k, v in out.items()}


def _forward(main: list[dict], stop: int) -> list[tuple[str, str, dict]]:
    """The forward's ops (module docstring): each convolution split into its autocast cast
    (its ``aten::to`` child) and the rest."""
    names = [r["name"] for r in main]
    ops: list[tuple[str, str, dict]] = []
    linear = names.index("aten::linear")
    for i in range(names.index("aten::conv2d"), stop):
        r, kind = main[i], _FORWARD.get(names[i])
        if names[i] == "aten::add_" and names[i + 1] == "aten::batch_norm":
            continue                    # the batch norm's num_batches_tracked.add_(1): below
        if kind == "bn" and names[i - 1] == "aten::add_":
            ops.append(("fwd", "bn", _cost(main[i - 1], r)))
        elif kind == "conv":
            cast = {"host_us": r["cast_us"], "launches": r["cast_launches"], "memsets": 0}
            ops += [("fwd", "cast", cast), ("fwd", "conv", _cost(r, less=cast))]
        elif names[i] == "aten::flatten" or (kind is None and i > linear):
            ops[-1] = ops[-1][:2] + (_cost(r, less=_cost(less=ops[-1][2])),)  # with the op before
        elif kind is not None:
            ops.append(("fwd", kind, _cost(r)))
        else:
            raise ValueError(f"forward root {names[i]!r} is not a known layer op")
    return ops


def _backward(engine: list[dict]) -> list[tuple[str, str, dict]]:
    """The backward's ops: the loss's nodes up to ``AddmmBackward0`` as the fc layer's, each
    convolution's cast (``ToCopyBackward0``) apart, every other node (``AccumulateGrad``,
    ``TBackward0``) with the layer op before it."""
    nodes = [r["name"].removeprefix(_NODE) for r in engine]
    head = nodes.index("AddmmBackward0")
    ops: list[tuple[str, str, dict]] = [("bwd", "fc", _cost(*engine[:head + 1]))]
    for r, node in zip(engine[head + 1:], nodes[head + 1:]):
        kind = _BACKWARD.get(node)
        if node == "ToCopyBackward0" and ops[-1][1] == "conv":
            ops.append(("bwd", "cast", _cost(r)))
        elif kind is not None and not (kind == "avgpool" and ops[-1][1] == "avgpool"):
            ops.append(("bwd", kind, _cost(r)))
        else:
            at = max(i for i, o in enumerate(ops) if o[1] != "cast")
            ops[at] = ops[at][:2] + (_cost(r, less=_cost(less=ops[at][2])),)
    return ops


def _update(main: list[dict], start: int) -> list[tuple[str, str, dict]]:
    """The update's ops, one per kind (the GradScaler's ops run before and after the step):
    the first root after the wait for the backward without that wait, ``found_inf.item()``
    by its gap alone (its duration is the device's)."""
    update: dict[str, dict] = {}
    for i, r in enumerate(main[start:]):
        if r["cat"] not in ("cpu_op", "user_annotation"):
            continue            # the harness's event record and synchronisation after the step
        if i == 0 or r["name"] == "aten::item":
            r = dict(r, host_us=r["host_us"] - r["gap_us"] if i == 0 else r["gap_us"])
        kind = _UPDATE.get(r["name"], "grad_scaler")
        update[kind] = _cost(r, less=_cost(less=update[kind])) if kind in update else _cost(r)
    return [("update", kind, cost) for kind, cost in update.items()]


def layer_ops(path: Path) -> list[tuple[str, str, dict]]:
    """``(pass, kind, cost)`` per ddlsim op of the step (module docstring): ``cost`` sums the
    roots' ``host_us``, ``launches``, ``memsets``; pass ``fwd``, ``bwd`` or ``update``."""
    main, engine = _threads(path)
    names = [r["name"] for r in main]
    loss = names.index("aten::cross_entropy_loss")
    waited = max(range(loss + 1, len(main)),          # the main thread waits for the backward
                 key=lambda i: main[i]["ts"] - main[i - 1]["ts"] - main[i - 1]["dur"])
    return _forward(main, waited) + _backward(engine) + _update(main, waited)


def tiny_op_us(path: Path) -> float:
    """Median duration (µs) of the trace's ``num_batches_tracked.add_(1)`` roots."""
    main, _ = _threads(path)
    names = [r["name"] for r in main]
    return statistics.median(r["dur"] for i, r in enumerate(main[:-1])
                             if r["name"] == "aten::add_" and names[i + 1] == "aten::batch_norm")


def kind_table(path: Path) -> dict[tuple[str, str], dict]:
    """Per ``(pass, kind)``: ``count``, ``median_us`` and ``total_us`` of host time,
    ``launches`` and ``memsets`` per op (means), and ``units`` = median / :func:`tiny_op_us`."""
    ref = tiny_op_us(path)
    groups: dict[tuple[str, str], list[dict]] = {}
    for pss, kind, cost in layer_ops(path):
        groups.setdefault((pss, kind), []).append(cost)
    return {key: {"count": len(v), "median_us": statistics.median(c["host_us"] for c in v),
                  "total_us": sum(c["host_us"] for c in v),
                  "launches": statistics.mean(c["launches"] for c in v),
                  "memsets": statistics.mean(c["memsets"] for c in v),
                  "units": statistics.median(c["host_us"] for c in v) / ref}
            for key, v in groups.items()}


def mean_units(paths=TRACES) -> dict[tuple[str, str], float]:
    """Per ``(pass, kind)``, the mean over ``paths`` of :func:`kind_table`'s ``units``: the
    figures of ``ddlsim/workloads/resnet/host.py``'s ``HOST_UNITS``."""
    tables = [kind_table(Path(p)) for p in paths]
    keys = dict.fromkeys(k for t in tables for k in t)
    return {k: statistics.mean(t[k]["units"] for t in tables if k in t) for k in keys}


def ddlsim_launches(dtype: str = "fp16") -> dict[tuple[str, str], float]:
    """Per ``(pass, kind)``, the kernels ddlsim's ResNet-50 trace launches for the op (median
    over the layers of that kind; AMP channels-last, zeroed gradients, GradScaler, as the
    traced step ran), each charged the device's tiny-op host time ``h`` before
    ``ddlsim/workloads/resnet/host.py``."""
    import ddlsim
    from ddlsim.workloads.resnet.build import build_resnet
    cfg = ddlsim.load_config({
        "model": {"preset": "resnet50", "weight_decay": "all", "zero_grad": "zero",
                  "memory_format": "channels_last", "grad_scaler": dtype == "fp16"},
        "train": {"micro_batch_size": 32, "global_batch_size": 32, "seq_length": 1,
                  "dtype": dtype, "optimizer": "sgd"},
        "system": {"preset": "dgx-h200", "nodes": 1, "devices_per_node": 1}})
    kind = {layer.name: layer.kind for layer in cfg.model.layers}
    counts: dict[tuple[str, str], list[int]] = {}
    for block in build_resnet(cfg).classes[0].program.blocks.values():
        for op in block.ops:
            if op.stream != "compute" or not getattr(op.payload, "kernels", None):
                continue
            pss, _, name = op.name.partition(".")
            key = (pss, kind[name]) if name in kind else ("update", op.name)
            counts.setdefault(key, []).append(len(op.payload.kernels))
    return {k: statistics.median(v) for k, v in counts.items()}


def main(argv: list[str] | None = None) -> int:
    paths = [Path(p) for p in (argv if argv else TRACES)]
    tables = {p: kind_table(p) for p in paths}
    means = mean_units(paths)
    launched = ddlsim_launches()
    keys = list(dict.fromkeys(k for t in tables.values() for k in t))
    head = f"{'pass':7} {'kind':12} {'n':>4}" + "".join(
        f" | {'med us':>8} {'total ms':>8} {'launch':>6} {'units':>6}" for _ in paths) \
        + " | mean units | ddlsim launches"
    print("host time per ddlsim op, profiled (" + "; ".join(p.name for p in paths) + ")")
    print(head)
    for key in keys:
        cells = []
        n = next(t[key]["count"] for t in tables.values() if key in t)
        for p in paths:
            c = tables[p].get(key)
            cells.append(" | " + (f"{c['median_us']:8.1f} {c['total_us'] / 1e3:8.2f} "
                                  f"{c['launches']:6.2f} {c['units']:6.2f}" if c else " " * 33))
        ours = launched.get(key)
        print(f"{key[0]:7} {key[1]:12} {n:4d}" + "".join(cells) + f" | {means[key]:10.2f}"
              + (f" | {ours:15g}" if ours is not None else " |" + " " * 16))
    print("ddlsim launches: the kernels of ddlsim's op (each charged h; a convolution's cast is "
          "in its conv op: 'cast' has none of its own)")
    for p in paths:
        total = sum(c["total_us"] for c in tables[p].values())
        print(f"{p.name}: tiny op (num_batches_tracked.add_(1)) {tiny_op_us(p):.1f} us; "
              f"host time of the step's ops {total / 1e3:.2f} ms = "
              f"{total / tiny_op_us(p):.0f} tiny ops")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
