"""Megatron-Core's own MoE layer, forward and backward, on one GPU: wall time per pass and the
kernels of each part, at the per-rank shapes of the validated Qwen3 MoE rows.

Run on a machine with a CUDA GPU and PyTorch (Transformer Engine is not needed, nor ddlsim):

    python benchmarks/device/moe_layer_step.py --megatron <Megatron-LM checkout> --out DIR
        [--cases zoo4,zoo5,...] [--passes 20] [--device cpu]   (cpu: a dry run, no timing value)

Megatron-LM's ``MoELayer`` (the checkout's, d7288711 for the committed data: Megatron-Bridge
v0.4.0's pin) built as ``benchmarks/moe_host_ops_megatron.py`` builds it for the host-operation
count, here at full size on one rank: expert parallelism 1, so there is no all-to-all and the
layer's time is its router, the ``alltoall`` dispatcher's local permutation and its host
syncs, the experts and the un-permutation. The local spec: the experts are ``SequentialMLP``
(one fc1, activation and fc2 per expert: without Transformer Engine there is no grouped GEMM
in that commit), the router and permutation unfused (both fusions are TE or Triton kernels),
``torch.compile`` off (``TORCHDYNAMO_DISABLE=1``: the activation runs eagerly), bf16, no
gradient-accumulation fusion (apex's kernel). Each case is a rank's share of a validated row:
``E`` experts, top-``k`` and ``T`` tokens so that each expert computes ``T·k/E`` tokens, the
row's tokens per local expert (``benchmarks/moe_layer_floor.py`` prints them).

Per case: ``--passes`` timed passes after five warm-ups, each forward + backward between two
``torch.cuda.synchronize()`` (the wall time a training step sees for the layer, host and
device), forward alone likewise; then two passes under the PyTorch profiler (Kineto), each
part of the layer under a ``record_function`` range (``router``, ``dispatch.*``, ``experts``,
``combine.*``, ``backward``) so the kernels' device time per part is summed on the device,
and the trace saved (``<case>_trace.json.gz``); then (``host_issue``) the host's own time of
the router's and the experts' forward and of the backward, each issued behind a queued
``torch.cuda._sleep`` so that the device never waits for the host while it is timed, and the
backward's device time with no host gaps. ``moe_layer.json`` holds every case, the
device, library versions and the UTC time.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import sys
import time
import types
from datetime import datetime, timezone
from pathlib import Path

#: name -> (hidden, expert FFN, experts E, top-k, tokens T, router dtype): a rank's share of a
#: validated row (tokens per local expert T·k/E as benchmarks/moe_layer_floor.py prints them);
#: the Qwen3 shapes from their config.json (ddlsim/data/hf): 235B-A22B hidden 4096, expert FFN
#: 1536; 30B-A3B 2048 and 768
CASES = {
    # ModelZoo rows 4 and 5 (Qwen3-235B, EP 8: 16 local experts, 1,024 and 512 tokens each),
    # the ModelZoo's router in fp32
    "zoo4": (4096, 1536, 16, 8, 2048, "fp32"),
    "zoo5": (4096, 1536, 16, 8, 1024, "fp32"),
    # the same expert load (1,024 tokens) at 8, 4, 2 and 32 local experts: the slope per expert
    "e8": (4096, 1536, 8, 8, 1024, "fp32"),
    "e4": (4096, 1536, 4, 4, 1024, "fp32"),
    "e2": (4096, 1536, 2, 2, 1024, "fp32"),
    "e32": (4096, 1536, 32, 8, 4096, "fp32"),
    # Bridge Qwen3-235B (EP 32: 4 local experts, 4,096 tokens each), router in the layer's bf16
    "bridge235": (4096, 1536, 4, 4, 4096, None),
    # Bridge Qwen3-30B: DeepEP EP 8 (16 local experts, 2,048 tokens), HybridEP EP 16 (8, 4,096)
    "q30e16": (2048, 768, 16, 8, 4096, None),
    "q30e8": (2048, 768, 8, 8, 4096, None),
}
WARMUP = 5
#: GPU clock cycles ``torch.cuda._sleep`` spins before a timed issue (about 50 ms at the H200's
#: 1,980 MHz): longer than any issue timed here, so the host's wall time of the issue is host
#: time alone, the device still busy when it ends (checked per pass: ``device_busy``)
SLEEP_CYCLES = 100_000_000


def _env(torch) -> dict:
    env = {"utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "python": sys.version.split()[0], "torch": torch.__version__,
           "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, sm_count=p.multi_processor_count,
                   memory_GiB=round(p.total_memory / 2**30, 1))
    return env


def _setup(torch, megatron: str, device: str):
    """Megatron's process groups on one rank (TP, EP, expert TP 1)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29531", TORCHDYNAMO_DISABLE="1")
    import torch.distributed as dist
    sys.path.insert(0, megatron)
    if device == "cpu":     # the count's stand-ins for the CUDA calls (a dry run of the script)
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        import moe_host_ops_megatron as mhm
        stub = types.ModuleType("megatron.core.fusions.fused_indices_converter")
        stub.fused_indices_to_multihot = None
        sys.modules[stub.__name__] = stub
        mhm._cuda_stand_ins(torch, mhm.Tally())
    else:
        torch.cuda.set_device(0)
    dist.init_process_group("gloo" if device == "cpu" else "nccl", rank=0, world_size=1)
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.moe import token_dispatcher as td
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1,
                                             expert_model_parallel_size=1,
                                             expert_tensor_parallel_size=1)
    model_parallel_cuda_manual_seed(123)
    if device == "cpu":
        td.maybe_move_tensor_to_cpu = lambda t, as_numpy=False, record_stream=False: (
            t.numpy() if as_numpy and torch.is_tensor(t) else t)


def _layer(torch, case: tuple, device: str):
    """The MoE layer of one case (local spec), on ``device``."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.transformer_config import TransformerConfig
    hidden, ffn, experts, topk, _, router_dtype = case
    cfg = TransformerConfig(
        num_layers=1, hidden_size=hidden, num_attention_heads=32, ffn_hidden_size=ffn,
        moe_ffn_hidden_size=ffn, num_moe_experts=experts, moe_router_topk=topk,
        moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-3,
        moe_router_force_load_balancing=True, moe_router_dtype=router_dtype,
        moe_token_dispatcher_type="alltoall", moe_permute_fusion=False, moe_grouped_gemm=False,
        tensor_model_parallel_size=1, sequence_parallel=False, expert_model_parallel_size=1,
        expert_tensor_parallel_size=1, bf16=True, params_dtype=torch.bfloat16,
        add_bias_linear=False, gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        use_cpu_initialization=device == "cpu", gradient_accumulation_fusion=False)
    spec = get_gpt_layer_local_spec(num_experts=experts, moe_grouped_gemm=False)
    layer = MoELayer(cfg, spec.submodules.mlp.submodules).to(device=device, dtype=torch.bfloat16)
    layer.train()
    layer.set_layer_number(1)
    return layer


def _ranges(torch, layer) -> None:
    """Each step of the layer under a profiler range named after its part."""
    d = layer.token_dispatcher

    def ranged(obj, name, label):
        fn = getattr(obj, name)

        def wrap(*a, **k):
            with torch.profiler.record_function(label):
                return fn(*a, **k)
        setattr(obj, name, wrap)
    ranged(layer.router, "forward", "router")
    ranged(layer.experts, "forward", "experts")
    for name in ("dispatch_preprocess", "token_dispatch", "dispatch_postprocess",
                 "combine_preprocess", "token_combine", "combine_postprocess"):
        ranged(d, name, name.replace("token_", "").split("_")[0] + "." + name)


def _sync(torch, device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize()


def _passes(torch, layer, case: tuple, device: str, n: int, backward: bool) -> list[float]:
    """Wall seconds of ``n`` passes, each between two synchronizations."""
    hidden, tokens = case[0], case[4]
    x = torch.randn(tokens, 1, hidden, dtype=torch.bfloat16, device=device, requires_grad=True)
    g = torch.randn(tokens, 1, hidden, dtype=torch.bfloat16, device=device)
    out = []
    for _ in range(n):
        _sync(torch, device)
        t0 = time.perf_counter()
        y = layer(x)[0]
        if backward:
            with torch.profiler.record_function("backward"):
                y.backward(g)
        _sync(torch, device)
        out.append(time.perf_counter() - t0)
    return out


def kernel_parts(trace: dict) -> dict:
    """Device µs of the kernels launched inside each range (the innermost range holding the
    launch's CPU time; cuBLAS launches through the driver API), their count, the GPU's busy
    time (union of kernel intervals) and the span from the first kernel's start to the last's
    end, over the trace's passes."""
    ev = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    ranges = [e for e in ev if e.get("cat") == "user_annotation"]
    launches = {e["args"].get("correlation"): e for e in ev     # runtime and driver API
                if e.get("cat") in ("cuda_runtime", "cuda_driver")
                and "correlation" in e.get("args", {})}
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    parts: dict = {}
    for k in kernels:
        launch = launches.get(k["args"].get("correlation"))
        label = "other"
        if launch is not None:
            inside = [r for r in ranges if r["ts"] <= launch["ts"] <= r["ts"] + r["dur"]]
            if inside:
                label = min(inside, key=lambda r: r["dur"])["name"]
        p = parts.setdefault(label, {"kernels": 0, "us": 0.0})
        p["kernels"] += 1
        p["us"] += k["dur"]
    spans = sorted((k["ts"], k["ts"] + k["dur"]) for k in kernels)
    busy, end = 0.0, float("-inf")
    for a, b in spans:
        if b > end:
            busy += b - max(a, end)
            end = b
    return {"parts": parts, "busy_us": busy, "kernels": len(kernels),
            "span_us": (spans[-1][1] - spans[0][0]) if spans else 0.0}


def _profiled(torch, layer, case: tuple, device: str, out: Path, name: str) -> dict:
    """Two passes under the profiler: the kernels per part, the trace saved."""
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device != "cpu" else [])
    with profile(activities=acts) as prof:
        for _ in range(2):
            with torch.profiler.record_function("pass"):
                _passes(torch, layer, case, device, 1, backward=True)
    path = out / f"{name}_trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    with gzip.open(f"{path}.gz", "wt") as f:
        json.dump(trace, f)
    path.unlink()
    summary = kernel_parts(trace)
    summary["passes"] = 2
    return summary


def _host_issue(torch, layer, case: tuple, n: int) -> dict:
    """Host seconds of issuing the router's forward, the experts' forward and the layer's
    backward while the device is still busy with a queued sleep (medians of ``n`` passes),
    and the backward's device seconds from the sleep's end (its kernels all queued by then: no
    host gaps). The forward's dispatcher waits for the device, so only these parts are timed."""
    timed: dict = {"router": [], "experts": []}
    busy = []

    def issued(obj, name, label):
        fn = getattr(obj, name)

        def wrap(*a, **k):
            if not timing:
                return fn(*a, **k)
            torch.cuda._sleep(SLEEP_CYCLES)
            done = torch.cuda.Event()
            t0 = time.perf_counter()
            out = fn(*a, **k)
            timed[label].append(time.perf_counter() - t0)
            done.record()
            busy.append(not done.query())
            return out
        setattr(obj, name, wrap)
    timing = False
    issued(layer.router, "forward", "router")
    issued(layer.experts, "forward", "experts")
    hidden, tokens = case[0], case[4]
    x = torch.randn(tokens, 1, hidden, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    g = torch.randn(tokens, 1, hidden, dtype=torch.bfloat16, device="cuda")
    bwd_host, bwd_device = [], []
    for _ in range(n):
        timing = True
        y = layer(x)[0]
        timing = False
        torch.cuda.synchronize()
        torch.cuda._sleep(SLEEP_CYCLES)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        y.backward(g)
        bwd_host.append(time.perf_counter() - t0)
        busy.append(not start.query())
        end.record()
        torch.cuda.synchronize()
        bwd_device.append(start.elapsed_time(end) / 1e3)
    return {"passes": n, "router_fwd_s": statistics.median(timed["router"]),
            "experts_fwd_s": statistics.median(timed["experts"]),
            "backward_s": statistics.median(bwd_host),
            "backward_device_s": statistics.median(bwd_device),
            "device_busy": all(busy), "samples": {**timed, "backward": bwd_host,
                                                   "backward_device": bwd_device}}


def run_case(torch, name: str, device: str, passes: int, out: Path) -> dict:
    case = CASES[name]
    layer = _layer(torch, case, device)
    _ranges(torch, layer)
    _passes(torch, layer, case, device, WARMUP, backward=True)
    both = _passes(torch, layer, case, device, passes, backward=True)
    with torch.no_grad():
        fwd = _passes(torch, layer, case, device, passes, backward=False)
    hidden, ffn, experts, topk, tokens, router_dtype = case
    rec = {"case": name, "hidden": hidden, "expert_ffn": ffn, "experts": experts, "topk": topk,
           "tokens": tokens, "tokens_per_expert": tokens * topk // experts,
           "router_dtype": router_dtype, "passes": passes,
           "fwd_bwd_s": statistics.median(both), "fwd_bwd_samples_s": both,
           "fwd_nograd_s": statistics.median(fwd), "fwd_nograd_samples_s": fwd,
           "kineto": _profiled(torch, layer, case, device, out, name)}
    if device != "cpu":
        try:
            rec["host_issue"] = _host_issue(torch, layer, case, passes // 2)
        except Exception as exc:     # keep the case's other figures
            rec["host_issue"] = {"error": f"{type(exc).__name__}: {exc}"}
        rec["peak_allocated_GiB"] = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.reset_peak_memory_stats()
    del layer
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--megatron", required=True, help="a Megatron-LM checkout (its root)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--cases", default=",".join(CASES),
                    help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--passes", type=int, default=20)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = ap.parse_args(argv)
    names = [c for c in args.cases.split(",") if c]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        ap.error(f"--cases: unknown {', '.join(unknown)}; allowed: {', '.join(CASES)}")
    if not (Path(args.megatron) / "megatron" / "core").is_dir():
        ap.error(f"--megatron {args.megatron}: no megatron/core folder there")
    import torch
    args.out.mkdir(parents=True, exist_ok=True)
    _setup(torch, args.megatron, args.device)
    result = {"env": _env(torch), "megatron": args.megatron, "device": args.device, "cases": []}
    for name in names:
        try:
            rec = run_case(torch, name, args.device, args.passes, args.out)
        except Exception as exc:     # keep the other cases' results (a lease is short)
            rec = {"case": name, "error": f"{type(exc).__name__}: {exc}"}
        result["cases"].append(rec)
        print(json.dumps({k: v for k, v in rec.items() if not k.endswith("samples_s")}),
              flush=True)
        (args.out / "moe_layer.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
