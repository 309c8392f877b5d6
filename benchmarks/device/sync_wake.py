"""Measure, on one GPU, the host's round trip through a device→host wait: the figure ddlsim
charges per wait of Megatron-Core's MoE dispatchers (``SYNC_WAKE_S`` in
ddlsim/workloads/decoder/moe_host.py, docs/moe.md "The dispatcher's host synchronisation"): a
microbenchmark, no ddlsim needed.

Run on a machine with a CUDA GPU and PyTorch:

    python benchmarks/device/sync_wake.py [--repeats 2000] [--out sync.json]

Two probes, each the median over ``--repeats`` trials with the device idle before each:

* ``event`` — the alltoall dispatcher's pattern (``_maybe_dtoh_and_synchronize``): a tiny
  kernel, a ``non_blocking`` copy of its result to pinned host memory on a side stream that
  waits for the compute stream, an event recorded there, then ``event.synchronize()``;
* ``item`` — a tiny kernel then ``.item()`` (the pattern of ``tensor[mask]`` and
  ``repeat_interleave`` in DeepEP's multihot conversion, and of the minimind probe,
  jingyaogong/minimind PR #837: 26.11 µs on an RTX 3090). Its H200 figure (17.87 µs,
  benchmarks/data/device_h200_2026-11-30/run1/sync.json) is ddlsim's ``SYNC_WAKE_S``.

Each is the host's time from before the kernel's launch to the wait's return, so it includes
one launch and the tiny kernel; the kernel's own device time is printed so it can be taken out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def _probe(step, repeats: int, torch) -> float:
    """Median host seconds of ``step()`` (launch, copy, wait) with the device idle before it."""
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def measure(repeats: int) -> dict:
    """Both probes (s), the tiny kernel's device time (s) and the environment."""
    import torch

    x = torch.zeros(8, device="cuda", dtype=torch.long)
    host = torch.empty(8, dtype=torch.long, pin_memory=True)
    side = torch.cuda.Stream()

    def event_step():
        x.add_(1)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            host.copy_(x, non_blocking=True)
            done = side.record_event()
        done.synchronize()

    def item_step():
        x.add_(1)
        x[0].item()

    for step in (event_step, item_step):      # warm-up
        _probe(step, 50, torch)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    x.add_(1)
    end.record()
    torch.cuda.synchronize()
    return {"event_s": _probe(event_step, repeats, torch),
            "item_s": _probe(item_step, repeats, torch),
            "tiny_kernel_s": start.elapsed_time(end) * 1e-3,
            "env": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                    "cuda": torch.version.cuda}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2000, help="trials per probe")
    ap.add_argument("--out", default=None, help="also write the figures as JSON here")
    args = ap.parse_args(argv)
    got = measure(args.repeats)
    print(", ".join(f"{k}: {v * 1e6:.2f} us" for k, v in got.items() if k.endswith("_s"))
          + f" ({got['env']['gpu']}, torch {got['env']['torch']})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(got, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
