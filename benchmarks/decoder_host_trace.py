"""Host (CPU) time per ddlsim op of an eager torchtitan Llama block, read from a Kineto trace
(issues 29 and 30: the H200's sequence-2048 steps are host-bound): the measurement behind
``ddlsim/workloads/decoder/eager_host.py``.

Run:  python benchmarks/decoder_host_trace.py [TRACE.json.gz ...]

Default traces: ``benchmarks/data/device_h200_2026-11-30/run5/none_s2048`` and ``run5/full_s2048``
(``benchmarks/device/llama_step.py``: 8 Llama 3.1 8B blocks, FSDP2 on one H200, torch 2.11,
eager, no activation checkpointing and full AC; README.md there).

**What is read** (``resnet_host_trace.roots``: each host thread's root events, a root's host
time its duration plus the gap since the previous root on its thread, less the profiler's own
stalls). The main thread's roots between a block's ``FSDP::pre_forward (layers.i)`` and
``FSDP::post_forward (layers.i)`` are its forward ops; the autograd thread's nodes
(``autograd::engine::evaluate_function: ...``) are its backward, each tied to its block and
forward op by its autograd sequence number (``AccumulateGrad``, which has none, with the node
before it). Under full AC the recompute's forward ops run on the autograd thread inside the
node that unpacks the block's saved input; they are counted as that block's ``recompute``.
FSDP2's own ranges (``FSDP::...``, nested in a root or a root themselves, and the
``RegisterPostBackwardFunctionBackward`` node) are taken off: ``fsdp2_host.HOOK_TINY_OPS``
charges them.

**Classes** (ddlsim's layer ops, ``layerkernels``: ``attn`` the QKV, rotary embedding,
attention and output projection; ``mlp`` the three MLP GEMMs; ``elementwise`` the norms, the
residual adds, SiLU and the gate's product): a forward root is ``elementwise`` if it is an
``aten::rms_norm``, ``aten::add``, ``aten::silu`` or the ``aten::mul`` after the block's fourth
``aten::linear``; ``mlp`` a linear after the fourth; ``attn`` the rest (the views and casts of
the attention). A backward node takes its forward op's class.

**Units.** Each class's median host time per block over the blocks, also in units of the
trace's tiny op: the median duration of its ``aten::add_`` events (autograd's sums of a block's
input gradients, ``InputBuffer::add``: 24 a step, one launch each, no Python), as
``ddlsim/workloads/resnet/host.py`` takes ResNet's ``num_batches_tracked.add_(1)``. A ratio of
two profiled times: the profiler's cost per recorded event (``with_stack``) is in both and
cancels to first order. ``ddlsim/workloads/decoder/eager_host.py`` charges the units at the
device's eager host time per tiny op. Nothing is fitted to a step time.

**``--chunk-cat``** prints each FSDP2 unit's ``aten::_chunk_cat`` host duration per trace
(FSDP2's ``post_backward``: ``get_chunk_cat_metadata`` fills one entry per 2 KiB block of the
output on the host, ``fsdp2_host.CHUNK_CAT_HOST_TINY_OPS``), beside its kernel's.

**Phases.** Per trace, the kernels' summed time by phase (forward: launched from the main
thread before the backward; backward: from the autograd thread; optimizer: from the main thread
after it), beside the untraced steps' phases (``llama_step.json``, CUDA events): where a phase
lasts longer than its kernels the device waited for the host.
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
from pathlib import Path

from resnet_host_trace import roots

RUN5 = Path(__file__).parent / "data" / "device_h200_2026-11-30" / "run5"
TRACES = (RUN5 / "none_s2048" / "llama_step_trace.json.gz",
          RUN5 / "full_s2048" / "llama_step_trace.json.gz")
_NODE = "autograd::engine::evaluate_function: "
_POST = "RegisterPostBackwardFunctionBackward"
_ELEMENTWISE = frozenset({"aten::rms_norm", "aten::add", "aten::silu"})
CLASSES = ("attn", "mlp", "elementwise")


def _fsdp_us(root: dict, events: list[dict]) -> float:
    """Microseconds of FSDP2's ranges nested in ``root`` (outermost only)."""
    end, total = root["ts"] + root["dur"], 0.0
    inner = [e for e in events if e["tid"] == root["tid"] and e["name"].startswith("FSDP::")
             and root["ts"] <= e["ts"] < end and e is not root]
    last = -1.0
    for e in sorted(inner, key=lambda e: (e["ts"], -e["dur"])):
        if e["ts"] >= last:
            total += e["dur"]
            last = e["ts"] + e["dur"]
    return total


def forward_ops(main: list[dict]) -> list[tuple[int | None, str | None, dict]]:
    """``(block, class, root)`` of every forward root of the main thread (module docstring);
    block and class None outside the blocks (the embedding, the head, the loss, FSDP2's)."""
    out, block, linears = [], None, 0
    for r in main:
        name = r["name"]
        if name.startswith("FSDP::pre_forward (layers."):
            block, linears = int(name.split(".")[-1].rstrip(")")), 0
        elif name.startswith("FSDP::post_forward (layers."):
            block = None
        if block is None or name.startswith("FSDP::"):
            out.append((None, None, r))
            continue
        linears += name == "aten::linear"
        if name in _ELEMENTWISE or (name == "aten::mul" and linears >= 4):
            kind = "elementwise"
        else:
            kind = "mlp" if linears > 4 else "attn"
        out.append((block, kind, r))
    return out


def _owner(fwd: list[tuple[int | None, str | None, dict]]):
    """A function from an autograd sequence number to the ``(block, class)`` of the forward
    root that made the node: the root with the largest sequence number not above it (a root's
    inner ops number its nodes from its own number on)."""
    import bisect
    marks = sorted((r["args"]["Sequence number"], b, k) for b, k, r in fwd
                   if r.get("args", {}).get("Sequence number") is not None)
    keys = [m[0] for m in marks]

    def owner(seq: int):
        i = bisect.bisect_right(keys, seq) - 1
        return (marks[i][1], marks[i][2]) if i >= 0 and marks[i][1] is not None else None
    return owner


def layer_host(path: Path) -> dict:
    """Per ``(pass, class)``, the host µs of each block (FSDP2's ranges off), and ``unit_us``:
    the median duration of the trace's ``aten::add_`` events."""
    threads = roots(path)
    nested = [e for e in _events(path) if e.get("cat") in ("cpu_op", "user_annotation")]
    main = next(rs for rs in threads.values() if any(r["name"].startswith(
        "FSDP::pre_forward (layers.") for r in rs))
    engine = next(rs for rs in threads.values() if any(r["name"].startswith(_NODE)
                                                       for r in rs))
    fwd = forward_ops(main)
    owner = _owner(fwd)
    table: dict[tuple[str, str], dict[int, float]] = {}
    launches: dict[tuple[str, str], dict[int, int]] = {}

    def add(pss, kind, block, r, us):
        table.setdefault((pss, kind), {}).setdefault(block, 0.0)
        table[pss, kind][block] += us
        launches.setdefault((pss, kind), {}).setdefault(block, 0)
        launches[pss, kind][block] += r["launches"]

    for block, kind, r in fwd:
        if block is not None:
            add("fwd", kind, block, r, r["host_us"] - _fsdp_us(r, nested))
    last = None
    for r in engine:
        node = r["name"].removeprefix(_NODE)
        if not r["name"].startswith(_NODE) or node == _POST:
            continue
        seq = r.get("args", {}).get("Sequence number")
        if seq is None and node == "torch::autograd::AccumulateGrad":
            where = last
        else:
            where = None if seq is None else owner(seq)
        last = where
        if where is not None:
            add("bwd", where[1], where[0], r, r["host_us"] - _fsdp_us(r, nested))
    unit = statistics.median(e["dur"] for e in nested if e["name"] == "aten::add_")
    return {"unit_us": unit, "blocks": table, "launches": launches}


def _events(path: Path) -> list[dict]:
    """The trace's complete (``X``) events."""
    with gzip.open(path) as fh:
        return [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]


def chunk_cat(path: Path) -> list[tuple[float, float]]:
    """(host µs, kernel µs) of each ``aten::_chunk_cat`` of the trace, in time order."""
    events = _events(path)
    host = sorted((e for e in events if e["name"] == "aten::_chunk_cat"), key=lambda e: e["ts"])
    kern = sorted((e for e in events if e.get("cat") == "kernel" and "chunk_cat" in e["name"]),
                  key=lambda e: e["ts"])
    return [(h["dur"], k["dur"]) for h, k in zip(host, kern)]


def phases(path: Path) -> dict[str, float]:
    """Kernel µs per phase (module docstring): ``fwd``, ``bwd``, ``opt``."""
    events = _events(path)
    launch = {e["args"]["correlation"]: e for e in events
              if e.get("cat") in ("cuda_runtime", "cuda_driver")
              and "correlation" in e.get("args", {})}
    cpu = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation")]
    engine = {e["tid"] for e in cpu if e["name"].startswith(_NODE)}
    step = min(e["ts"] for e in cpu if e["name"].startswith("Optimizer.step"))
    out = {"fwd": 0.0, "bwd": 0.0, "opt": 0.0}
    for k in (e for e in events if e.get("cat") == "kernel"):
        r = launch.get(k["args"].get("correlation"))
        if r is None:
            continue
        out["bwd" if r["tid"] in engine else "opt" if r["ts"] >= step else "fwd"] += k["dur"]
    return out


def kind_table(path: Path) -> dict[tuple[str, str], dict]:
    """Per ``(pass, class)``: the median over blocks of host µs, launches and units."""
    got = layer_host(path)
    out = {}
    for key, per in got["blocks"].items():
        med = statistics.median(per.values())
        out[key] = {"blocks": len(per), "median_us": med,
                    "launches": statistics.median(got["launches"][key].values()),
                    "units": med / got["unit_us"]}
    return {"unit_us": got["unit_us"], "rows": out}


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    cat = "--chunk-cat" in argv
    paths = [Path(p) for p in argv if p != "--chunk-cat"] or list(TRACES)
    for p in paths:
        name = f"{p.parent.name}/{p.name}"
        if cat:
            rows = chunk_cat(p)
            print(f"{name}: aten::_chunk_cat host / kernel us, in order: "
                  + ", ".join(f"{h:.0f}/{k:.0f}" for h, k in rows))
            continue
        t = kind_table(p)
        print(f"{name}: tiny op (median aten::add_) {t['unit_us']:.1f} us")
        for (pss, kind), c in sorted(t["rows"].items()):
            print(f"  {pss:4} {kind:12} blocks {c['blocks']}  {c['median_us']:8.1f} us "
                  f"{c['launches']:5.1f} launches  {c['units']:7.2f} units")
        total = {pss: sum(c["units"] for (q, _), c in t["rows"].items() if q == pss)
                 for pss in ("fwd", "bwd")}
        print("  per block: " + ", ".join(f"{k} {v:.1f} units" for k, v in total.items()))
        measured = p.parent / "llama_step.json"
        k = phases(p)
        line = ", ".join(f"{ph} {us / 1e3:.1f}" for ph, us in k.items())
        if measured.exists():
            v = json.loads(measured.read_text())["variants"][0]
            line += (f"; untraced step (ms): fwd {v['forward_s'] * 1e3:.1f}, bwd "
                     f"{v['backward_s'] * 1e3:.1f}, opt {v['optimizer_s'] * 1e3:.1f}")
        print(f"  kernels by phase (ms): {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
