"""When does a kernel on a second stream start while GEMMs hold the GPU? On one GPU.

Run on a machine with a CUDA GPU and PyTorch (ddlsim is not needed there):

    python benchmarks/device/stream_start.py --out DIR [--repeats 12]

The lead of docs/moe.md ("Expert-parallel communication overlap"): under Megatron-Core's combined
1F1B an expert-parallel all-to-all is queued on its own stream while the other micro-batch's
GEMMs run; if a GEMM kernel holds every SM until it ends (a persistent kernel: as many blocks as
SMs, each looping over tiles), the communication kernel cannot start before that GEMM ends,
and the overlap hides less than the streams' two timelines promise. This measures it: stream A
runs a chain of identical GEMMs; stream B first spins (``torch.cuda._sleep``, so its next kernel
becomes ready at a time the host does not decide), then runs the side kernel (an element-wise add over a small
or a large buffer, or, where NCCL initialises on one rank, a one-rank all-reduce), on a stream of
normal or high priority. From the profiler's kernel timestamps, per repeat: ``ready`` (the spin's
end), the side kernel's ``start``, and the GEMM running at ``ready`` (its start and end). The
delay ``start - ready`` is set beside the two rules: the side kernel starts at once (delay about
0), or when the running GEMM ends (delay = ``gemm_end - ready``). ``stream_start.json`` holds every
repeat and the medians per case, with the GEMM kernels' names and grid sizes.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

#: GEMM shapes of stream A (M, N, K, bf16): an expert's fc1 at 4,096 tokens (Qwen3-235B),
#: a dense layer's fc1 (Llama 3 70B at 8,192 tokens, TP 8), a large square
GEMMS = {"expert_fc1": (4096, 3072, 4096), "dense_fc1": (8192, 3584, 8192),
         "square8k": (8192, 8192, 8192)}
#: side kernels: bytes of an element-wise add (a small and a large buffer)
SIDE_COPY = {"add_1MiB": 1 << 20, "add_64MiB": 64 << 20}
CHAIN = 8                     # GEMMs queued on stream A per repeat
SPIN_CYCLES = 600_000         # ~0.3 ms at 1,980 MHz: the side kernel is ready mid-chain


def _events(path: Path) -> tuple[list[dict], dict]:
    """The trace's kernels, and its launch calls (runtime or driver API) by correlation id."""
    trace = json.loads(gzip.open(path, "rt").read()) if path.suffix == ".gz" else \
        json.loads(path.read_text())
    ev = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    launches = {e["args"]["correlation"]: e for e in ev
                if e.get("cat") in ("cuda_runtime", "cuda_driver")
                and "correlation" in e.get("args", {})}
    return [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy")], launches


def _profiled(once, repeats: int, path: Path, cpu: bool) -> tuple[list[dict], dict]:
    """Three warm-up calls of ``once``, then ``repeats`` under the profiler (with the host's
    launch calls where ``cpu``): :func:`_events` of the trace, which is then deleted."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        once()
    acts = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if cpu else [])
    with profile(activities=acts) as prof:
        for _ in range(repeats):
            once()
    prof.export_chrome_trace(str(path))
    out = _events(path)
    path.unlink()
    return out


def _spin(kernel: dict) -> bool:
    name = kernel["name"].lower()
    return "sleep" in name or "spin" in name


def analyse(kernels: list[dict], gemm_stream: int, launches: dict | None = None) -> list[dict]:
    """Per spin: ready (its end), the start of the first other kernel off the GEMM stream that
    starts after the spin began (the side kernel: on the spin's stream, or NCCL's own), and the
    GEMM running at ready (µs, the trace's clock); and the spin's own start after its launch
    call (it waits for nothing on its stream: ``spin_delay_us``) beside the end of the GEMM
    running at that call."""
    spins = sorted((k for k in kernels if _spin(k)), key=lambda k: k["ts"])
    others = sorted((k for k in kernels if not _spin(k)
                     and k["args"].get("stream") != gemm_stream), key=lambda k: k["ts"])
    gemms = sorted((k for k in kernels if k["args"].get("stream") == gemm_stream),
                   key=lambda k: k["ts"])
    out = []
    for spin in spins:
        nxt = next((k for k in others if k["ts"] >= spin["ts"]), None)
        ready = spin["ts"] + spin["dur"]
        running = [g for g in gemms if g["ts"] <= ready < g["ts"] + g["dur"]]
        rec = {"ready": ready} if nxt is None else {
            "ready": ready, "start": nxt["ts"], "delay_us": nxt["ts"] - ready,
            "side_kernel": nxt["name"][:80], "side_stream": nxt["args"].get("stream"),
            "side_dur_us": nxt["dur"], "side_grid": nxt["args"].get("grid")}
        if running:
            g = running[0]
            rec.update(gemm_start=g["ts"], gemm_end=g["ts"] + g["dur"],
                       to_gemm_end_us=g["ts"] + g["dur"] - ready, gemm_kernel=g["name"][:80],
                       gemm_grid=g["args"].get("grid"), gemm_dur_us=g["dur"])
        call = (launches or {}).get(spin["args"].get("correlation"))
        if call is not None:
            t = call["ts"] + call["dur"]
            at_call = [g for g in gemms if g["ts"] <= t < g["ts"] + g["dur"]]
            rec.update(spin_delay_us=spin["ts"] - t)
            if at_call:
                rec.update(spin_to_gemm_end_us=at_call[0]["ts"] + at_call[0]["dur"] - t)
        out.append(rec)
    return out


def run(out: Path, repeats: int) -> dict:
    import torch
    torch.cuda.set_device(0)
    nccl = None
    try:
        import os

        import torch.distributed as dist
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29541")
        dist.init_process_group("nccl", rank=0, world_size=1)
        nccl = dist
    except Exception as exc:        # keep the copies' cases
        print(f"no NCCL case: {type(exc).__name__}: {exc}", flush=True)
    results = {"env": {"utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       "torch": torch.__version__, "cuda": torch.version.cuda,
                       "gpu": torch.cuda.get_device_name(0),
                       "sm_count": torch.cuda.get_device_properties(0).multi_processor_count},
               "chain": CHAIN, "spin_cycles": SPIN_CYCLES, "cases": []}
    sides = dict(SIDE_COPY)
    if nccl is not None:
        sides["nccl_allreduce_1MiB"] = -(1 << 20)
    for gname, (m, n, k) in GEMMS.items():
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        for sname, nbytes in sides.items():
            src = torch.empty(abs(nbytes) // 2, device="cuda", dtype=torch.bfloat16)
            dst = torch.empty_like(src)
            for priority in (0, -1):
                sa = torch.cuda.Stream()
                sb = torch.cuda.Stream(priority=priority)

                def once():
                    with torch.cuda.stream(sa):
                        for _ in range(CHAIN):
                            torch.mm(a, b, out=c)
                    with torch.cuda.stream(sb):
                        torch.cuda._sleep(SPIN_CYCLES)
                        if nbytes > 0:          # an SM kernel (a same-dtype copy_ is a
                            torch.add(src, 1.0, out=dst)    # copy engine's memcpy)
                        else:
                            nccl.all_reduce(src)
                    torch.cuda.synchronize()
                name = f"{gname}_{sname}_p{-priority}"
                kernels, launches = _profiled(once, repeats, out / f"{name}_trace.json",
                                              cpu=True)
                streams = {}
                for kern in kernels:
                    streams.setdefault(kern["args"].get("stream"), []).append(kern["name"])
                gemm_stream = max(streams, key=lambda s: sum(
                    1 for x in streams[s] if "sleep" not in x.lower()
                    and "spin" not in x.lower()))
                reps = analyse(kernels, gemm_stream, launches)
                delays = [r["delay_us"] for r in reps if "delay_us" in r]
                to_end = [r["to_gemm_end_us"] for r in reps if "to_gemm_end_us" in r]
                spin = [r["spin_delay_us"] for r in reps if "spin_delay_us" in r]
                spin_end = [r["spin_to_gemm_end_us"] for r in reps
                            if "spin_to_gemm_end_us" in r]
                case = {"case": name, "gemm": gname, "mnk": [m, n, k], "side": sname,
                        "priority": priority, "repeats": reps,
                        "median_delay_us": statistics.median(delays) if delays else None,
                        "median_to_gemm_end_us": statistics.median(to_end) if to_end else None,
                        "median_spin_delay_us": statistics.median(spin) if spin else None,
                        "median_spin_to_gemm_end_us":
                            statistics.median(spin_end) if spin_end else None,
                        "kernel_names": sorted({x[:80] for v in streams.values() for x in v})}
                results["cases"].append(case)
                print(f"{name:40s} delay {case['median_delay_us']} us, running GEMM ends "
                      f"{case['median_to_gemm_end_us']} us after ready; spin starts "
                      f"{case['median_spin_delay_us']} us after its launch, the GEMM running "
                      f"then ends {case['median_spin_to_gemm_end_us']} us after it "
                      f"({len(reps)} repeats)", flush=True)
                (out / "stream_start.json").write_text(json.dumps(results, indent=1))
    return results


def boundary(kernels: list[dict], gemm_stream: int, per_repeat: int = 4) -> list[dict]:
    """Per repeat of the boundary mode (``per_repeat`` GEMMs each: X, then the Ys): the side
    kernel's and the next GEMM's (Y) starts after X ended, with Y's time and grid."""
    gemms = sorted((k for k in kernels if k["args"].get("stream") == gemm_stream),
                   key=lambda k: k["ts"])
    sides = sorted((k for k in kernels if k["args"].get("stream") != gemm_stream
                    and not _spin(k)), key=lambda k: k["ts"])
    out = []
    for i, side in enumerate(sides):
        if per_repeat * i + 1 >= len(gemms):
            break
        x, y = gemms[per_repeat * i], gemms[per_repeat * i + 1]
        x_end = x["ts"] + x["dur"]
        out.append({"side_after_x_us": side["ts"] - x_end, "side_kernel": side["name"][:80],
                    "x_dur_us": x["dur"], "y_after_x_us": y["ts"] - x_end,
                    "y_dur_us": y["dur"], "y_grid": y["args"].get("grid"),
                    "y_kernel": y["name"][:80]})
    return out


def run_boundary(out: Path, repeats: int) -> dict:
    """Megatron's issue order at a node boundary: GEMM X on stream A, an event after it; on
    stream B a wait for that event and the side kernel; then GEMMs Y on stream A. Who starts
    first when X ends: the side kernel (issued before Y) or Y?"""
    import torch
    torch.cuda.set_device(0)
    results = {"env": {"utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)},
               "mode": "boundary", "cases": []}
    for gname, (m, n, k) in GEMMS.items():
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        src = torch.empty((1 << 20) // 2, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        for priority in (0, -1):
            sa, sb = torch.cuda.Stream(), torch.cuda.Stream(priority=priority)

            def once():
                with torch.cuda.stream(sa):
                    torch.mm(a, b, out=c)                  # X
                    done = torch.cuda.Event()
                    done.record(sa)
                with torch.cuda.stream(sb):
                    sb.wait_event(done)
                    torch.add(src, 1.0, out=dst)           # the side kernel
                with torch.cuda.stream(sa):
                    for _ in range(3):
                        torch.mm(a, b, out=c)              # Y ...
                torch.cuda.synchronize()
            name = f"boundary_{gname}_p{-priority}"
            kernels, _ = _profiled(once, repeats, out / f"{name}_trace.json", cpu=False)
            gemm_stream = max({kk["args"].get("stream") for kk in kernels},
                              key=lambda st: sum(kk["args"].get("stream") == st
                                                 for kk in kernels))
            reps = boundary(kernels, gemm_stream)
            side = [r["side_after_x_us"] for r in reps]
            ystart = [r["y_after_x_us"] for r in reps if "y_after_x_us" in r]
            case = {"case": name, "gemm": gname, "mnk": [m, n, k], "priority": priority,
                    "repeats": reps,
                    "median_side_after_x_us": statistics.median(side) if side else None,
                    "median_y_after_x_us": statistics.median(ystart) if ystart else None}
            results["cases"].append(case)
            print(f"{name:34s} side starts {case['median_side_after_x_us']} us after X, "
                  f"Y {case['median_y_after_x_us']} us after X ({len(reps)} repeats)",
                  flush=True)
            (out / "stream_boundary.json").write_text(json.dumps(results, indent=1))
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--mode", choices=("ready", "boundary"), default="ready",
                    help="ready: the side kernel ready mid-GEMM (a spin first); boundary: it "
                         "waits for a GEMM's event, issued before the next GEMMs")
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (torch.cuda.is_available() is False)")
    args.out.mkdir(parents=True, exist_ok=True)
    (run if args.mode == "ready" else run_boundary)(args.out, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
