"""Time, on one GPU, the kernels ddlsim's compute model predicts: a microbenchmark, no ddlsim.

Run on a machine with a CUDA GPU and PyTorch (ddlsim is not needed there):

    python benchmarks/device/h100_kernels.py --shapes benchmarks/device/kernel_shapes.json \
        --out OUTDIR

It writes to OUTDIR:

* ``env.json`` — GPU, driver, clocks, PyTorch / CUDA / cuBLAS / cuDNN versions, date;
* ``gemm.csv`` — every GEMM of ``kernel_shapes.json`` (the validation runs' own shapes) and a
  grid of square / skinny / wave-boundary shapes: ``m, n, k, batch, dtype, layout, seconds``.
  16-bit GEMMs run as ``torch.nn.functional.linear`` does (``Y = X·Wᵀ``, W stored ``[N, K]``),
  batched ones as ``torch.bmm``, FP8 ones as ``torch._scaled_mm`` (e4m3 × e4m3 → bf16, per-tensor
  scales), the recipe Transformer Engine's FP8 GEMMs use, and ``fp8_rowwise`` rows with one fp32
  scale per row of A and per column of B (torchao's float8 rowwise recipe) on the grid's squares
  and the validation runs' FP8 shapes;
* ``attention.csv`` — ``scaled_dot_product_attention``, causal, per backend (flash = FlashAttention-2
  in PyTorch, cudnn = cuDNN's fused attention), forward and forward + backward;
* ``memory.csv`` — streaming kernels: copy, LayerNorm / RMSNorm forward and backward, GeLU,
  softmax forward and backward over ``s²`` scores, dropout, the FP8 cast, and the fused AdamW
  step, each with the bytes it must move;
* ``sustained.csv`` — square GEMMs (n = 4096, 8192, 16384; fp16, bf16, FP8) called back to
  back for 3 s, the median call at sustained clocks beside the short-burst median, with the SM
  clock, power and throttle reasons at the end: the protocol of the A100's cuBLAS 11 ceiling
  (mli/transformers-benchmarks), for the same figure under this GPU's cuBLAS;
* ``launch.csv`` — the per-call cost of small copies issued one after another, as PyTorch's
  list-form ``all_gather``/``reduce_scatter`` copy each rank's chunk out of (into) a flat
  buffer (``ProcessGroupNCCL::allgather``): ``chunks`` views of ``elements`` each, copied by one
  ``copy_`` per chunk; and a device synchronisation after a one-element kernel
  (DeepSpeed 2021's ``torch.cuda.synchronize()`` before each gather). ddlsim does not yet
  model these host-bound costs (docs/overlap.md, "Per-tensor gathers").

Timing: CUDA events around a loop of calls long enough to last ≥ 20 ms (≥ 3 calls), after
warm-up; the median of 5 such samples. Operands are random normal (zeros run faster on H100).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import traceback

import torch
import torch.nn.functional as F

DT = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
SAMPLES = 5
SAMPLE_S = 0.02


def timed(fn, device: str = "cuda") -> float:
    """Median seconds of one call of ``fn`` (module docstring)."""
    for _ in range(2):
        fn()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    import time
    t0 = time.perf_counter()
    fn()
    sync()
    one = max(time.perf_counter() - t0, 1e-6)
    reps = max(3, min(2000, math.ceil(SAMPLE_S / one)))
    out = []
    for _ in range(SAMPLES):
        if device == "cuda":
            out.append(event_seconds(fn, reps))
        else:
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            out.append((time.perf_counter() - t0) / reps)
    return statistics.median(out)


def event_seconds(fn, reps: int) -> float:
    """Seconds per call of ``fn`` over one loop of ``reps`` calls, between two CUDA events
    (the device's own clock: the host's launches overlap the kernels)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 1e3 / reps


def env(device: str) -> dict:
    from importlib import metadata
    info = {"utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "device": device}
    for pkg in ("nvidia-cublas", "nvidia-cublas-cu12", "nvidia-cudnn-cu13", "triton"):
        try:
            info[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, sm_count=p.multi_processor_count,
                    memory_GiB=round(p.total_memory / 2 ** 30, 1),
                    cudnn=torch.backends.cudnn.version())
        try:
            info["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,"
                 "power.limit,temperature.gpu", "--format=csv"],
                capture_output=True, text=True, timeout=20).stdout.strip()
        except Exception as exc:  # noqa: BLE001 - provenance only
            info["nvidia_smi"] = repr(exc)
    return info


def profiled_step(step, path: str, cuda: bool) -> None:
    """Run ``step()`` once under the PyTorch profiler (Kineto: CPU ops, and CUDA kernels where
    ``cuda``, with shapes and the ``nn.Module`` stack that ``ddlsim traces kineto`` places ops
    by) and write its Chrome trace gzipped to ``path`` (``….json.gz``)."""
    import gzip
    import shutil
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts, record_shapes=True, with_stack=True) as prof:
        step()
        if cuda:
            torch.cuda.synchronize()
    raw = path.removesuffix(".gz")
    prof.export_chrome_trace(raw)
    with open(raw, "rb") as src, gzip.open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.remove(raw)


def _randn(shape, dtype, device):
    return torch.randn(shape, device=device, dtype=torch.float32).to(dtype)


def gemm_fn(m, n, k, batch, dtype, device, layout="TN"):
    """A closure running one GEMM as the stacks do (module docstring) and its layout label.

    16-bit ``layout``: how A[M,K] and B[K,N] are stored, BLAS-style from the row-major view:
    ``TN`` = B stored as ``[N, K]`` (``F.linear``, the forward), ``NN`` = both row-major (the
    data gradient ``dY·W``), ``NT`` = A stored as ``[K, M]`` (the weight gradient ``dYᵀ·X``)."""
    if dtype in ("fp8", "fp8_rowwise"):
        a = _randn((m, k), torch.float32, device).to(torch.float8_e4m3fn)
        b = _randn((n, k), torch.float32, device).to(torch.float8_e4m3fn).t()  # column-major
        if dtype == "fp8":
            sa = sb = torch.ones((), device=device)
        else:   # torchao's float8 rowwise recipe: one fp32 scale per row of A, per column of B
            sa, sb = torch.ones((m, 1), device=device), torch.ones((1, n), device=device)
        return (lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb,
                                         out_dtype=torch.bfloat16)), "scaled_mm TN"
    t = DT[dtype]
    if batch > 1:
        a, b = _randn((batch, m, k), t, device), _randn((batch, k, n), t, device)
        return (lambda: torch.bmm(a, b)), "bmm NN"
    if layout == "TN":
        x, w = _randn((m, k), t, device), _randn((n, k), t, device)
        return (lambda: F.linear(x, w)), "linear TN"
    if layout == "NN":
        x, w = _randn((m, k), t, device), _randn((k, n), t, device)
        return (lambda: x @ w), "matmul NN"
    x, w = _randn((k, m), t, device), _randn((k, n), t, device)
    return (lambda: x.t() @ w), "matmul NT"


def grid() -> list[tuple[int, int, int]]:
    """Shapes that probe the shape model: squares, skinny M, and an N sweep across waves."""
    out = [(s, s, s) for s in (256, 512, 1024, 2048, 4096, 8192, 16384)]
    out += [(m, 8192, 8192) for m in (64, 128, 256, 512, 1024, 2048, 4096)]
    out += [(8192, 8192, k) for k in (64, 128, 256, 512, 1024, 2048)]
    out += [(4096, n, 4096) for n in range(256, 8193, 256)]
    out += [(4096, n, 4096) for n in (1000, 1500, 3000, 5000, 6000, 7000)]
    return out


def run_gemms(shapes: list[dict], device: str, rows: list, log) -> None:
    todo = [(g["m"], g["n"], g["k"], g["batch"], g["dtype"], "TN", "validation")
            for g in shapes]
    if device == "cuda":
        todo += [(m, n, k, 1, "bf16", "TN", "grid") for m, n, k in grid()]
        todo += [(m, n, k, 1, "bf16", lay, "layout") for m, n, k in grid()[:14]
                 for lay in ("NN", "NT")]
        todo += [(m, n, k, 1, "fp8", "TN", "grid") for m, n, k in grid()[:7]]
        todo += [(m, n, k, 1, "fp8_rowwise", "TN", "grid") for m, n, k in grid()[:7]]
        todo += [(g["m"], g["n"], g["k"], 1, "fp8_rowwise", "TN", "validation")
                 for g in shapes if g["dtype"] == "fp8" and g["batch"] == 1]
    for m, n, k, batch, dtype, lay, origin in todo:
        try:
            fn, layout = gemm_fn(m, n, k, batch, dtype, device, lay)
            sec = timed(fn, device)
        except Exception as exc:  # noqa: BLE001 - one shape must not stop the sweep
            log(f"gemm {m}x{n}x{k} b{batch} {dtype}: {str(exc)[:200]!r}")
            sec, layout = float("nan"), "failed"
        rows.append({"m": m, "n": n, "k": k, "batch": batch, "dtype": dtype, "layout": layout,
                     "origin": origin, "seconds": sec,
                     "tflops": 2.0 * m * n * k * batch / sec / 1e12})
        if device == "cuda":
            torch.cuda.empty_cache()


def run_attention(shapes: list[dict], device: str, rows: list, log) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                "math": SDPBackend.MATH}
    want = ("flash", "cudnn") if device == "cuda" else ("math",)
    for shape in shapes:
        b, h, s, d, kv = (shape[x] for x in ("b", "heads", "seq", "head_dim", "kv_heads"))
        for name in want:
            for dtype in ("bf16",):
                try:
                    q = _randn((b, h, s, d), DT[dtype], device).requires_grad_()
                    k = _randn((b, h, s, d), DT[dtype], device).requires_grad_()
                    v = _randn((b, h, s, d), DT[dtype], device).requires_grad_()
                    grad = _randn((b, h, s, d), DT[dtype], device)

                    def fwd():
                        with torch.no_grad(), sdpa_kernel([backends[name]]):
                            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

                    def fwd_bwd():
                        with sdpa_kernel([backends[name]]):
                            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                        return torch.autograd.grad(out, (q, k, v), grad)

                    t_f, t_fb = timed(fwd, device), timed(fwd_bwd, device)
                except Exception as exc:  # noqa: BLE001
                    log(f"attention {name} b{b} h{h} s{s} d{d}: {str(exc)[:200]!r}")
                    t_f = t_fb = float("nan")
                rows.append({"backend": name, "dtype": dtype, "b": b, "heads": h, "seq": s,
                             "head_dim": d, "causal": True, "fwd_s": t_f, "fwd_bwd_s": t_fb,
                             "cases": " ".join(shape.get("cases", []))})
                if device == "cuda":
                    torch.cuda.empty_cache()


def run_memory(device: str, rows: list, log, small: bool) -> None:
    """Streaming kernels with the bytes each must move at least (read + write)."""
    def add(name, fn, nbytes, **extra):
        try:
            sec = timed(fn, device)
        except Exception as exc:  # noqa: BLE001
            log(f"memory {name}: {exc!r}")
            sec = float("nan")
        rows.append({"kernel": name, "bytes": nbytes, "seconds": sec,
                     "GBps": nbytes / sec / 1e9, **extra})

    bf = torch.bfloat16
    n = (1 << 20) if small else (1 << 29)             # 1 GiB of bf16
    a, b = _randn((n,), bf, device), _randn((n,), bf, device)
    add("copy", lambda: b.copy_(a), 4 * n, elements=n)
    add("add", lambda: torch.add(a, b), 6 * n, elements=n)
    add("gelu_tanh", lambda: F.gelu(a, approximate="tanh"), 4 * n, elements=n)
    del a, b
    for tokens, hidden in ((8192, 12288), (16384, 4096), (32768, 2048)) if not small else ((64, 256),):
        x = _randn((tokens, hidden), bf, device).requires_grad_()
        w = torch.ones(hidden, device=device, dtype=bf, requires_grad=True)
        bias = torch.zeros(hidden, device=device, dtype=bf, requires_grad=True)
        g = _randn((tokens, hidden), bf, device)
        el = tokens * hidden
        add("layernorm_fwd", lambda: F.layer_norm(x.detach(), (hidden,), w.detach(), bias.detach()),
            4 * el, elements=el, hidden=hidden)
        y = F.layer_norm(x, (hidden,), w, bias)
        add("layernorm_bwd", lambda: torch.autograd.grad(y, (x, w, bias), g, retain_graph=True),
            6 * el, elements=el, hidden=hidden)
        if hasattr(F, "rms_norm"):
            add("rmsnorm_fwd", lambda: F.rms_norm(x.detach(), (hidden,), w.detach()),
                4 * el, elements=el, hidden=hidden)
        run_eager_passes(x.detach(), w.detach(), add)
        del x, y, g
    bh, s = (2, 128) if small else (64, 2048)          # b·heads score matrices of s × s
    sc = _randn((bh, s, s), bf, device)
    S = bh * s * s
    add("softmax_fwd", lambda: torch.softmax(sc, dim=-1), 4 * S, elements=S)
    p = torch.softmax(sc, dim=-1)
    add("softmax_bwd", lambda: torch._softmax_backward_data(sc, p, -1, bf), 6 * S, elements=S)
    add("dropout_fwd", lambda: F.dropout(sc, 0.1, training=True), 5 * S, elements=S)
    causal = torch.ones((s, s), device=device, dtype=torch.bool).triu_(1)
    add("scale_mask_fill", lambda: sc.mul(0.125).masked_fill_(causal, -1e4), 8 * S,
        elements=S, note="two kernels: scale (read, write) and masked fill in place (read, write)")
    del sc, p
    if device == "cuda":
        x = _randn((n // 2,), bf, device)
        add("fp8_cast", lambda: x.to(torch.float8_e4m3fn), 3 * (n // 2), elements=n // 2)
        del x
    params = (1 << 16) if small else (1 << 27)         # 134 M fp32 parameters
    pieces = [torch.nn.Parameter(torch.randn(params // 64, device=device)) for _ in range(64)]
    for p_ in pieces:
        p_.grad = torch.randn_like(p_)
    for fused in ((True, False) if device == "cuda" else (False,)):
        opt = torch.optim.AdamW(pieces, lr=1e-4, fused=fused, foreach=not fused)
        opt.step()
        add("adamw_fused" if fused else "adamw_foreach", opt.step, 28 * params,
            elements=params, note="fp32 p, g, m, v: read 16 B, write 12 B per parameter")
    torch.cuda.empty_cache() if device == "cuda" else None


def run_eager_passes(x, w, add) -> None:
    """Torch eager element-wise kernels as an unfused stack runs them, with the bytes ddlsim
    gives each (ddlsim/simulator/kernels/elementwise.py): torch's composite RMSNorm in fp32
    (torchtitan's, 8 kernels, 36 B per element), its broadcasting multiply alone (the
    non-vectorised TensorIterator path), and SiLU times up on contiguous tensors (torchtitan's
    w1/w3 outputs) against the same on the two halves of one tensor (Megatron's fc1 chunks,
    strided: the path Liger-Kernel's megatron_swiglu 'torch' rows measured)."""
    hidden, el = x.shape[-1], x.numel()

    def composite():
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x) * w
    add("rmsnorm_composite_fwd", composite, 36 * el, elements=el, hidden=hidden)
    h, r = x.float(), torch.rand(x.shape[0], 1, device=x.device)
    add("mul_row_broadcast_fp32", lambda: h * r, 8 * el, elements=el, hidden=hidden)
    up = torch.randn_like(x)
    add("silu_mul_contiguous", lambda: F.silu(x) * up, 10 * el, elements=el, hidden=hidden,
        note="two kernels: silu (read, write), mul (read two, write)")
    both = torch.cat([x, up], dim=-1)
    gate, lin = torch.chunk(both, 2, -1)
    add("silu_mul_chunked", lambda: F.silu(gate) * lin, 10 * el, elements=el, hidden=hidden,
        note="as silu_mul_contiguous on strided halves of one tensor")


def run_launch(device: str, rows: list, log, small: bool) -> None:
    """Per-chunk seconds of a loop of small ``copy_`` calls, and of a synchronisation."""
    bf = torch.float16
    for chunks in (64, 1536) if not small else (8,):
        for elements in (8, 4096, 294912):      # a bias, a small tensor, a 175B QKV / 1,536
            flat = torch.zeros(chunks * elements, dtype=bf, device=device)
            src = torch.ones(chunks * elements, dtype=bf, device=device)
            outs = [flat.narrow(0, j * elements, elements) for j in range(chunks)]
            ins = [src.narrow(0, j * elements, elements) for j in range(chunks)]

            def copies():
                for o, i in zip(outs, ins):
                    o.copy_(i, non_blocking=True)
            try:
                sec = timed(copies, device)
            except Exception as exc:  # noqa: BLE001
                log(f"launch copies {chunks}x{elements}: {exc!r}")
                sec = float("nan")
            rows.append({"kernel": "copy_chunks", "chunks": chunks, "elements": elements,
                         "seconds": sec, "seconds_per_chunk": sec / chunks})
            del flat, src, outs, ins
    one = torch.zeros(1, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step_and_sync():
        one.add_(1)
        sync()
    rows.append({"kernel": "add_then_synchronize", "chunks": 1, "elements": 1,
                 "seconds": timed(step_and_sync, device)})


#: seconds of back-to-back calls per sustained sample (mli/transformers-benchmarks'
#: ``blocked_autorange(min_run_time=3)``, the protocol of the A100's cuBLAS 11 ceiling)
SUSTAINED_S = 3.0


def _clocks() -> str:
    """SM clock, power and throttle reasons now (``nvidia-smi``), or "" off a GPU."""
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,"
                               "clocks_throttle_reasons.active", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def run_sustained(device: str, rows: list, log, small: bool) -> None:
    """Square GEMMs of n = 8192 (and 4096, 16384) run back to back for ``SUSTAINED_S``
    seconds: the median call over that stretch, i.e. at the clocks the GPU holds under a
    sustained load, beside :func:`timed`'s short-burst median, per dtype. The ratio to the
    datasheet peak over the shape's wave quantisation is the GEMM ceiling ddlsim's presets
    take per library (docs/compute.md); the sample's clocks and throttle reasons are kept."""
    import time
    sizes = (256,) if small else (4096, 8192, 16384)
    dtypes = ("fp32",) if small else ("fp16", "bf16", "fp8")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for n in sizes:
        for dtype in dtypes:
            try:
                fn, layout = gemm_fn(n, n, n, 1, dtype, device, "TN")
                burst = timed(fn, device)
                calls, t_end = [], time.perf_counter() + (0.05 if small else SUSTAINED_S)
                while time.perf_counter() < t_end:
                    t0 = time.perf_counter()
                    fn()
                    sync()
                    calls.append(time.perf_counter() - t0)
                clocks = _clocks() if device == "cuda" else ""
                sec = statistics.median(calls)
            except Exception as exc:  # noqa: BLE001 - one shape must not stop the sweep
                log(f"sustained {n}^3 {dtype}: {str(exc)[:200]!r}")
                burst = sec = float("nan")
                calls, clocks, layout = [], "", "failed"
            rows.append({"n": n, "dtype": dtype, "layout": layout, "calls": len(calls),
                         "burst_seconds": burst, "sustained_seconds": sec,
                         "burst_tflops": 2.0 * n ** 3 / burst / 1e12,
                         "sustained_tflops": 2.0 * n ** 3 / sec / 1e12, "clocks": clocks})
            if device == "cuda":
                torch.cuda.empty_cache()


def write_csv(path: str, rows: list[dict]) -> None:
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="gemm,attention,memory,launch,sustained")
    ap.add_argument("--limit", type=int, default=0, help="first N shapes only (a dry run)")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    logf = open(os.path.join(args.out, "log.txt"), "a")

    def log(msg: str) -> None:
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    info = env(device)
    log(json.dumps(info))
    with open(os.path.join(args.out, "env.json"), "w") as fh:
        json.dump(info, fh, indent=1)
    with open(args.shapes) as fh:
        shapes = json.load(fh)
    lim = args.limit or None
    import time
    for part in args.only.split(","):
        t0, rows = time.perf_counter(), []
        try:
            if part == "gemm":
                run_gemms(shapes["gemm"][:lim], device, rows, log)
            elif part == "attention":
                run_attention(shapes["attention"][:lim], device, rows, log)
            elif part == "memory":
                run_memory(device, rows, log, small=device != "cuda")
            elif part == "launch":
                run_launch(device, rows, log, small=device != "cuda")
            elif part == "sustained":
                run_sustained(device, rows, log, small=device != "cuda")
        except Exception:  # noqa: BLE001 - keep what was measured
            log(traceback.format_exc())
        write_csv(os.path.join(args.out, f"{part}.csv"), rows)
        log(f"{part}: {len(rows)} rows in {time.perf_counter() - t0:.1f} s")
    if device == "cuda":   # clocks and power after the sweep (throttling shows here)
        log(subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw,"
                            "temperature.gpu,clocks_throttle_reasons.active", "--format=csv"],
                           capture_output=True, text=True, timeout=20).stdout.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
