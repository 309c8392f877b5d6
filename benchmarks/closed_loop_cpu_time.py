"""The closed loop's compute half in process CPU time: a check that a busy machine allows.

    python benchmarks/closed_loop_cpu_time.py

One process, one BLAS thread, no MPI. Everything is timed with ``time.process_time``, which
other work on the machine does not inflate (time-slicing is not counted; shared caches and
memory bandwidth still are): the numpy GEMM sweep of ``ddlsim calibrate compute``'s default
shapes (64-1024; the best of 5 samples of >= 20 ms each), fitted with the calibration's own
saturation model; ``z = x + y`` on 8 MiB arrays; then, per model, the median and minimum of
5 training iterations of the reference GPT-2 (forward, backward, Adam) against ``ddlsim
predict`` on one rank with a system and profile made of those rates. Communication is not
part of it (one rank). Prints one line per model with the error against the minimum.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import time  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import ddlsim  # noqa: E402
from ddlsim.calibration.build import build_profile  # noqa: E402
from ddlsim.calibration.compute_bench import default_gemm_shapes  # noqa: E402
from ddlsim.reference.gpt2 import GPT2, Adam  # noqa: E402
from ddlsim.reference.loop import REFERENCE, SMALL, LoopModel  # noqa: E402
from ddlsim.reference.machine import local_system  # noqa: E402


def cpu_rate(fn, work: float, samples: int = 5, least_s: float = 0.02) -> float:
    """Best ``work`` per CPU second of ``fn`` over ``samples`` samples of >= ``least_s``."""
    fn()
    best = 0.0
    for _ in range(samples):
        c, n = time.process_time(), 0
        while time.process_time() - c < least_s:
            fn()
            n += 1
        best = max(best, work * n / (time.process_time() - c))
    return best


def gemm_table() -> pd.DataFrame:
    rows = []
    for m, n, k in default_gemm_shapes(1024, 64):
        a = np.random.rand(m, k).astype(np.float32)
        b = np.random.rand(k, n).astype(np.float32)
        flops = 2.0 * m * n * k
        rows.append({"backend": "numpy", "device": "cpu", "kind": "gemm", "dtype": "fp32",
                     "flops": flops, "flops_per_s": cpu_rate(lambda: a @ b, flops)})
    return pd.DataFrame(rows)


def iteration_cpu_s(model: LoopModel, n: int = 5) -> tuple[float, float]:
    """(median, min) CPU seconds of one training iteration of ``model`` on one rank."""
    shape = model.shape
    net, opt = GPT2(shape), Adam(shape.padded)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, shape.vocab, (shape.batch, shape.seq))
    tgt = rng.integers(0, shape.vocab, (shape.batch, shape.seq))
    times = []
    for i in range(n + 2):
        c = time.process_time()
        _, acts = net.forward(idx, tgt)
        net.backward(acts)
        opt.step(net.p, net.g)
        if i >= 2:
            times.append(time.process_time() - c)
    return float(np.median(times)), float(np.min(times))


def main() -> None:
    gemm = gemm_table()
    profile = build_profile(compute=gemm, peaks={"fp32": float(gemm["flops_per_s"].max())})
    peak = float(gemm["flops_per_s"].max())
    x = np.ones(2 ** 21, dtype=np.float32)
    y, z = x.copy(), np.empty_like(x)
    stream = cpu_rate(lambda: np.add(x, y, out=z), 3.0 * x.nbytes)
    fit = profile.doc.compute[0]
    print(f"GEMM plateau {fit.rate_max_flops_per_s / 1e9:.1f} GFLOP/s (fit error "
          f"{fit.rel_rmse:.1%}), z = x + y {stream / 1e9:.2f} GB/s, in CPU time")
    for model in (REFERENCE, SMALL):
        system = local_system(1, peak, stream, (0.0, 1e12), 1e10, "CPU time")
        cfg = ddlsim.load_config(model.run_config(1, "ddp", system))
        pred = ddlsim.predict(cfg, calibration=profile).iteration_time_s
        med, low = iteration_cpu_s(model)
        print(f"{model.layers} layer(s), h {model.hidden}, vocab {model.vocab}, seq "
              f"{model.seq}, batch {model.batch}: CPU {low * 1e3:.1f} ms (median "
              f"{med * 1e3:.1f}), predicted {pred * 1e3:.1f} ms ({pred / low - 1:+.1%})")


if __name__ == "__main__":
    main()
