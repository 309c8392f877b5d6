"""The host time torch's selective activation checkpointing (SAC) adds per ATen op in eager mode,
read from a measured Kineto trace (issue 29 cause 1; ddlsim/workloads/decoder/sac.py cites it).

    python benchmarks/sac_host_cost.py [TRACE ...] [--cpu]

Each ``TRACE`` is the PyTorch profiler trace of one ``selective_op`` step of
``benchmarks/device/llama_step.py`` (8 blocks of Llama 3.1 8B, torchtitan's op-level SAC policy,
FSDP2 on one H200, torch 2.11, eager); by default the two in
benchmarks/data/device_h200_2026-11-30/: ``run4/llama_s2048`` (sequence 2048, a host-bound step:
the figures ddlsim uses) and ``run1/llama`` (sequence 8192, device-bound, an earlier call).
``torch.utils.checkpoint.create_selective_checkpoint_contexts`` runs every ATen op of a
checkpointed block through a ``TorchDispatchMode`` whose Python calls the policy (forward:
``_CachingTorchDispatchMode``; recompute: ``_CachedTorchDispatchMode``); the profiler records each
such call as a ``PythonDispatchMode`` event around the op. Read here, per block and pass:

* ``ops``: the ATen ops through the mode (``PythonDispatchMode`` events), and the kernel launches
  (``cudaLaunchKernel``, ``cuLaunchKernelEx``, ``cudaMemsetAsync``) and host wall time of the pass;
* ``extra``: the host time SAC adds per op through the mode, from the ops the model also runs
  outside the checkpointed blocks (``aten::rms_norm``, ``aten::linear``, ``aten::to``,
  ``aten::flatten``: the root's final norm, output projection and the loss's cast and flatten, on
  the same thread of the same step): Σ (an in-block op's host time − the mean host time of the
  same top-level op outside the blocks) / the ops through the mode within them. The forward is
  the blocks' forward on the main thread; the recompute the backward node that unpacks the
  block's first saved tensor (where the recompute runs) on the autograd thread.

Profiler overhead is in both sides of the difference. The trace's forward host time (first op to
the loss) is printed beside the forward of the same call's untraced steps (its
``llama_step.json``, between CUDA events): where the step is host-bound they agree as far as the
profiler adds nothing.

``--cpu``: also the same mechanism on this machine's CPU (torch CPU, tiny tensors): a 1-element
``add`` chain plain and under the forward SAC mode, per op (a cross-check of the mechanism's
order of magnitude; not used by ddlsim).
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torchbench as tb

DATA = Path(__file__).parent / "data" / "device_h200_2026-11-30"
TRACES = (DATA / "run4" / "llama_s2048" / "llama_step_trace.json.gz",
          DATA / "run1" / "llama" / "llama_step_trace.json.gz")
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernelEx", "cudaMemsetAsync")
#: top-level ops the model also runs outside the checkpointed blocks (the root's norm, output
#: projection, the loss's cast and flatten)
MATCHED = ("aten::rms_norm", "aten::linear", "aten::to", "aten::flatten")


def load_tree(path: Path) -> dict[int, list[dict]]:
    """The trace's complete events per thread, nested: each gets ``kids`` and ``parent``;
    returns each thread's top-level events in time order."""
    events = [e for e in json.load(gzip.open(path))["traceEvents"]
              if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation",
                                                         "cuda_runtime", "cuda_driver")]
    events.sort(key=lambda e: (e["tid"], e["ts"], -e["dur"]))
    stacks: dict[int, list[dict]] = {}
    tops: dict[int, list[dict]] = defaultdict(list)
    for e in events:
        e["kids"], e["parent"] = [], None
        s = stacks.setdefault(e["tid"], [])
        while s and s[-1]["ts"] + s[-1]["dur"] <= e["ts"]:
            s.pop()
        if s:
            e["parent"] = s[-1]
            s[-1]["kids"].append(e)
        else:
            tops[e["tid"]].append(e)
        s.append(e)
    return tops


def walk(e: dict):
    yield e
    for k in e["kids"]:
        yield from walk(k)


def count(events, name) -> int:
    return sum(x["name"] in name if isinstance(name, tuple) else x["name"] == name
               for e in events for x in walk(e))


def forward_blocks(main: list[dict]) -> list[list[dict]]:
    """Each checkpointed block's forward: the main thread's top-level ops from the checkpoint's
    ``_NoopSaveInputs`` to the block's ``FSDP::post_forward``."""
    out = []
    for i, e in enumerate(main):
        if e["name"] == "_NoopSaveInputs":
            j = next(k for k in range(i, len(main))
                     if main[k]["name"].startswith("FSDP::post_forward"))
            out.append(main[i:j])
    return out


def recompute_passes(autograd: list[dict]) -> list[list[dict]]:
    """Each block's recompute: the top-level ops of the backward node that runs it (the node
    whose subtree goes through the dispatch mode), up to the node's own backward ops."""
    out = []
    for e in autograd:
        if count([e], "PythonDispatchMode"):
            node = e["kids"][0]
            ops = node["kids"]
            # the node's own backward starts at its first transpose of the weight (MmBackward0)
            end = next(i for i, k in enumerate(ops) if k["name"] == "aten::t")
            out.append(ops[:end])
    return out


def root_means(main: list[dict], blocks: list[list[dict]]) -> dict[str, float]:
    """Mean host time of each MATCHED op on the main thread outside the blocks."""
    inside = {id(e) for b in blocks for e in b}
    got = defaultdict(list)
    for e in main:
        if e["name"] in MATCHED and id(e) not in inside:
            got[e["name"]].append(e["dur"])
    return {k: statistics.mean(v) for k, v in got.items()}


def extra_per_op(passes: list[list[dict]], base: dict[str, float]) -> float:
    """Host seconds SAC adds per op through the mode: matched ops in the passes against the
    same ops outside the blocks (module doc)."""
    extra, ops = 0.0, 0
    for p in passes:
        for e in p:
            if e["name"] in base:
                extra += e["dur"] - base[e["name"]]
                ops += count([e], "PythonDispatchMode")
    return extra / ops * 1e-6


def describe(kind: str, passes: list[list[dict]], per_op: float) -> dict:
    n = [count(p, "PythonDispatchMode") for p in passes]
    k = [count(p, LAUNCHES) for p in passes]
    wall = [(p[-1]["ts"] + p[-1]["dur"] - p[0]["ts"]) * 1e-6 for p in passes]
    row = {"pass": kind, "blocks": len(passes), "ops_per_block": statistics.mean(n),
           "launches_per_block": statistics.mean(k), "host_wall_s": statistics.mean(wall),
           "extra_per_op_s": per_op, "extra_per_block_s": per_op * statistics.mean(n)}
    print(f"  {kind:9s}: {row['blocks']} blocks, {row['ops_per_block']:.0f} ATen ops through the "
          f"SAC mode and {row['launches_per_block']:.0f} launches per block, host wall "
          f"{row['host_wall_s'] * 1e3:.2f} ms per block; SAC adds {per_op * 1e6:.1f} us per op "
          f"= {row['extra_per_block_s'] * 1e3:.2f} ms per block")
    return row


def cpu_mechanism(calls: int = 2000, reps: int = 20) -> None:
    """Per-op host seconds of a 1-element ``add`` on this CPU, plain and inside the forward
    SAC mode (``create_selective_checkpoint_contexts`` with a policy that recomputes all)."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    a, c = torch.ones(1), torch.ones(1)

    def chain() -> None:
        x = a
        for _ in range(calls):
            x = torch.add(x, c)

    def least(fn) -> float:
        return tb.least_cpu(fn, reps) / calls

    plain = least(chain)
    fwd_ctx, _ = create_selective_checkpoint_contexts(
        lambda ctx, func, *args, **kw: CheckpointPolicy.PREFER_RECOMPUTE)

    def under_mode() -> None:
        with fwd_ctx:
            chain()
    sac = least(under_mode)
    print(f"cpu (torch {torch.__version__}): plain add {plain * 1e6:.2f} us, under the SAC "
          f"forward mode {sac * 1e6:.2f} us: +{(sac - plain) * 1e6:.2f} us per op")


def report(path: Path) -> None:
    """Print the figures of one trace (module doc)."""
    print(f"{path.relative_to(DATA) if path.is_relative_to(DATA) else path}:")
    tops = load_tree(path)
    main_tid = next(t for t, ev in tops.items() if any(e["name"] == "_NoopSaveInputs" for e in ev))
    auto_tid = next(t for t in tops if t != main_tid and any(
        e["name"].startswith("autograd::engine::evaluate_function") for e in tops[t]))
    main, autograd = tops[main_tid], tops[auto_tid]
    blocks = forward_blocks(main)
    base = root_means(main, blocks)
    print("  outside the blocks (us): " + ", ".join(f"{k} {v:.1f}" for k, v in base.items()))
    describe("forward", blocks, extra_per_op(blocks, base))
    describe("recompute", recompute_passes(autograd), extra_per_op(recompute_passes(autograd),
                                                                   base))
    loss = next(e for e in main if e["name"] == "aten::cross_entropy_loss")
    traced = (loss["ts"] + loss["dur"] - main[0]["ts"]) * 1e-6
    run = json.loads((path.parent / "llama_step.json").read_text())
    fwd = next(v["forward_s"] for v in run["variants"] if v["variant"] == "selective_op")
    print(f"  forward host time in the trace (first op to the loss): {traced * 1e3:.1f} ms; the "
          f"untraced steps' forward (seq {run['seq']}): {fwd * 1e3:.1f} ms")


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv if not a.startswith("--")] or list(TRACES)
    for path in paths:
        report(path)
    if "--cpu" in argv:
        cpu_mechanism()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
