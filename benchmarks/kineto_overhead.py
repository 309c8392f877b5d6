"""Measure the PyTorch profiler's own cost per recorded event on this machine (CPU).

``ddlsim traces kineto --profiler-overhead FILE`` removes the profiler's instrumentation from a
profiled step (docs/traces.md). This script measures what to remove, on microbenchmarks only
(never on the training step it will correct): loops of a Python no-op call, a built-in call,
a ``torch.add`` on one-element tensors, an ``F.linear`` on a 4×4 input, an ``nn.Identity``
module call and a forward and backward of that linear (the autograd engine's events), each timed with the profiler off and on (CPU activity, ``with_stack=True``,
``record_shapes`` as given), and the events each iteration leaves in the exported trace
counted per category (``ddlsim.traces.kineto_overhead.CATEGORIES``: ``cpu_op``, the
RecordFunction events of ATen ops and annotations; ``python_function`` and ``c_function``, the
Python tracer's events of Python frames and of built-in calls). The per-event costs are the least-squares
solution of ``Δt_loop = Σ_cat n_cat × cost_cat`` over the loops (``numpy.linalg.lstsq``, rows
weighted by ``1/Δt_loop``), with each loop's residual printed.

Two costs of the profiler are kept apart, as PyTorch documents them:

- the start of a profiling session is slow (the first profiled iterations are many times
  slower: pytorch/kineto#328; hence ``torch.profiler.schedule``'s warm-up steps, traced and
  discarded). Every timed loop here runs after a warm-up loop in the same session, and
  ``benchmarks/kineto_gpt2.py`` profiles its step after a warm-up step the same way;
- the steady cost per event: the RecordFunction callbacks around every op and, with
  ``with_stack``, the Python tracer's ``PyEval_SetProfile`` hook on every Python call and return
  (pytorch/pytorch#67407; its post-processing runs after the session, outside the step).

    PYTHONPATH=/tmp/torchenv python benchmarks/kineto_overhead.py -o overhead.json

Needs torch (``pip install 'ddlsim[torch]'``); one thread (``torch.set_num_threads(1)``), as
``kineto_gpt2.py``. Loops are timed in process CPU time by default (``--clock wall`` for the
wall clock), so other jobs on the cores stretch them little; run it twice and compare (it
prints ``os.getloadavg``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

from ddlsim.traces.kineto_overhead import CATEGORIES, category_of

_MARK = "ddlsim_overhead_loop"


def _noop():
    return None


def _loops() -> dict:
    """name -> (a function running ``n`` iterations of one microbenchmark, the share of
    ``--iterations`` it runs: a backward leaves ~25 events per iteration)."""
    a, b, c = torch.ones(1), torch.ones(1), torch.empty(1)
    x, w, bias = torch.ones(4, 4), torch.ones(4, 4), torch.ones(4)
    ident, seq = torch.nn.Identity(), [1, 2]

    def python_call(n):
        for _ in range(n):
            _noop()

    def builtin_call(n):
        for _ in range(n):
            len(seq)

    def aten_add(n):
        for _ in range(n):
            torch.add(a, b, out=c)

    def aten_linear(n):
        for _ in range(n):
            F.linear(x, w, bias)

    def module_call(n):
        for _ in range(n):
            ident(x)

    xg = torch.ones(4, 4, requires_grad=True)

    def autograd_step(n):
        for _ in range(n):
            F.linear(xg, w, bias).sum().backward()

    return {f.__name__: (f, share) for f, share in (
        (python_call, 1), (builtin_call, 1), (aten_add, 1), (aten_linear, 1), (module_call, 1),
        (autograd_step, 0.1))}


#: the clocks a loop can be timed with: the process's CPU time (what the profiler's
#: instrumentation adds, whatever else shares the cores) or the wall clock
CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
_clock = CLOCKS["cpu"]


def _timed(loop, n: int) -> float:
    t0 = _clock()
    loop(n)
    return _clock() - t0


def _profiled(loop, n: int, record_shapes: bool) -> tuple[float, dict]:
    """Seconds of ``n`` iterations under the profiler (after a warm-up loop in the same
    session) and the events per category inside the timed loop's annotation."""
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                  with_stack=True, record_shapes=record_shapes)
    with prof:
        loop(n)  # warm-up: the session's start-up cost lands here
        with torch.profiler.record_function(_MARK):
            seconds = _timed(loop, n)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "t.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    mark = next(e for e in events if e.get("name") == _MARK)
    lo, hi = mark["ts"], mark["ts"] + mark["dur"]
    counts = dict.fromkeys(CATEGORIES, 0)
    for e in events:
        cat = category_of(e)
        if cat is not None and e.get("ph") == "X" and lo < e["ts"] < hi:
            counts[cat] += 1
    return seconds, counts


def measure(iterations: int, repeats: int, record_shapes: bool) -> list[dict]:
    """One row per loop: seconds per iteration off and on, and added by the profiler (the
    pair of ``repeats`` off/on pairs with the median difference), and the events per
    iteration of each category."""
    rows = []
    for name, (loop, share) in _loops().items():
        n = max(1, int(iterations * share))
        loop(n)
        pairs = []
        for _ in range(repeats):  # off and on in turn, so both see the same load
            off = _timed(loop, n)
            on, counts = _profiled(loop, n, record_shapes)
            pairs.append((on - off, off, on))
        added, off, on = statistics.median_low(pairs)
        rows.append({"loop": name, "iterations": n, "off_s": off / n, "on_s": on / n,
                     "added_s": added / n, "events": {c: counts[c] / n for c in CATEGORIES}})
    return rows


def fit(rows: list[dict]) -> tuple[dict, list[float]]:
    """Least-squares cost per event of each category (s), each row weighted by its own
    added time (so every loop counts alike, whatever its length), and each row's relative
    residual."""
    a = np.array([[r["events"][c] for c in CATEGORIES] for r in rows])
    y = np.array([r["added_s"] for r in rows])
    cost, *_ = np.linalg.lstsq(a / y[:, None], np.ones_like(y), rcond=None)
    residual = (a @ cost - y) / y
    return dict(zip(CATEGORIES, map(float, cost))), [float(v) for v in residual]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-o", "--out", required=True, help="JSON file for ddlsim's --profiler-overhead")
    p.add_argument("--iterations", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--record-shapes", action="store_true")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                   help="cpu: process CPU time, unaffected by other jobs on the cores (default)")
    args = p.parse_args()
    global _clock
    _clock = CLOCKS[args.clock]
    torch.set_num_threads(1)
    load = os.getloadavg()
    rows = measure(args.iterations, args.repeats, args.record_shapes)
    cost, residual = fit(rows)
    for r, e in zip(rows, residual):
        print(f"{r['loop']:13} off {r['off_s'] * 1e6:7.2f} us  on {r['on_s'] * 1e6:7.2f} us  "
              + "  ".join(f"{c} {r['events'][c]:.0f}" for c in CATEGORIES)
              + f"  fit residual {e * 100:+.1f} %")
    print("cost per event: " + ", ".join(f"{c} {v * 1e6:.2f} us" for c, v in cost.items())
          + f"; load average before {load[0]:.1f}, after {os.getloadavg()[0]:.1f}")
    doc = {"ddlsim_kineto_overhead": 1, "seconds_per_event": cost,
           "settings": {"activities": ["CPU"], "with_stack": True,
                        "record_shapes": args.record_shapes, "threads": 1},
           "clock": args.clock,
           "torch": torch.__version__, "host": platform.node(),
           "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "load_average": [load[0], os.getloadavg()[0]], "rows": rows,
           "fit_residuals": residual}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
