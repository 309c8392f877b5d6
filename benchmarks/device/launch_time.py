"""Measure, on one GPU, the four launch facts of ddlsim's host model (``device.launch`` in
ddlsim/data/systems.yaml; docs/compute.md, "Host and launch time"): a microbenchmark, no
ddlsim needed.

Run on a machine with a CUDA GPU and PyTorch:

    python benchmarks/device/launch_time.py [--kernels 2000] [--out launch.json]

It prints (and writes as JSON, with the GPU, driver and versions) a ``launch:`` entry to paste
into a device preset:

* ``eager_op_s + host_launch_s`` — host seconds per op of a Python loop of tiny in-place adds
  (``x.add_(1)``, 1-element tensor, no synchronisation): Python, the dispatcher and the launch;
* ``host_launch_s`` — host seconds per op of the same loop compiled by TorchScript
  (``torch.jit.script``: the dispatcher and the launch, no Python per op);
* ``stream_gap_s`` — device interval per kernel of that loop minus the kernel's own duration,
  with the host held ahead: a ``torch.cuda._sleep`` kernel first, then the loop, timed by CUDA
  events around the loop only;
* ``graph_gap_s`` — the same loop captured in a CUDA graph and replayed.

The kernel's own duration comes from the PyTorch profiler's CUDA events (0 where it gives
none: the gaps are then upper bounds); it is printed so the gaps can be re-derived. The method is that of A. Gray, "Getting Started with CUDA Graphs"
(NVIDIA Technical Blog, 2019), whose V100 figures the presets carry until this is run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def _host_per_op(fn, x, n: int, torch) -> float:
    """Host seconds per op of ``fn(x, n)`` (the device may still be running: no sync inside)."""
    samples = []
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(x, n)
        samples.append((time.perf_counter() - t0) / n)
        torch.cuda.synchronize()
    return statistics.median(samples)


def _device_per_op(run, n: int, torch) -> float:
    """Device seconds per op of ``run()`` (``n`` ops) with the host ahead of the device."""
    samples = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        torch.cuda._sleep(50_000_000)          # the device busy while the host queues the ops
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1e-3 / n)
    return statistics.median(samples)


def _graph(body, torch):
    """``body`` captured in a CUDA graph, returned as its replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        body()                                  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return graph.replay


def measure(n: int) -> dict:
    """The four facts (s) and what they were derived from."""
    import torch

    def loop(x, k: int):
        for _ in range(k):
            x.add_(1)

    @torch.jit.script
    def scripted(x: torch.Tensor, k: int):
        for _ in range(k):
            x.add_(1)

    x = torch.zeros(1, device="cuda")
    loop(x, 100), scripted(x, 100)              # warm-up, TorchScript profiling runs
    eager = _host_per_op(loop, x, n, torch)
    launch = _host_per_op(scripted, x, n, torch)
    stream_interval = _device_per_op(lambda: loop(x, n), n, torch)
    graph_interval = _device_per_op(_graph(lambda: loop(x, n), torch), n, torch)
    kernel = _kernel_duration(lambda: loop(x, 200), torch)
    return {"host_launch_s": launch, "eager_op_s": max(eager - launch, 0.0),
            "stream_gap_s": max(stream_interval - kernel, 0.0),
            "graph_gap_s": max(graph_interval - kernel, 0.0),
            "derived_from": {"eager_host_per_op_s": eager, "scripted_host_per_op_s": launch,
                             "stream_interval_s": stream_interval,
                             "graph_interval_s": graph_interval, "kernel_s": kernel,
                             "kernels_per_loop": n},
            "env": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "cuda": torch.version.cuda, "driver": _driver(torch)}}


def _kernel_duration(run, torch) -> float:
    """The add kernel's own device seconds (median), from the PyTorch profiler's CUDA events;
    0 where the profiler gives none (the gaps are then the whole intervals: upper bounds)."""
    try:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run()
            torch.cuda.synchronize()
        times = [e.device_time for e in prof.events()
                 if "add" in e.name.lower() and getattr(e, "device_time", 0) > 0]
        return statistics.median(times) * 1e-6 if times else 0.0
    except Exception:   # an old PyTorch, no CUPTI: report upper bounds
        return 0.0


def _driver(torch) -> str | None:
    try:
        import subprocess
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True).stdout.strip() or None
    except OSError:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=2000, help="ops per timed loop")
    ap.add_argument("--out", default=None, help="also write the figures as JSON here")
    args = ap.parse_args(argv)
    got = measure(args.kernels)
    us = {k: f"{v * 1e6:.2f} us" for k, v in got.items() if k.endswith("_s")}
    print("launch: {" + ", ".join(f"{k}: {v}" for k, v in us.items())
          + f', source: "benchmarks/device/launch_time.py on {got["env"]["gpu"]}, '
          f'torch {got["env"]["torch"]}"}}')
    print(json.dumps(got["derived_from"], indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(got, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
