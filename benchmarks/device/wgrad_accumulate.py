"""Time, on one GPU, a weight-gradient GEMM that accumulates into an fp32 ``main_grad`` against
the same GEMM writing a 16-bit gradient: what Megatron's gradient-accumulation fusion really
saves (issue 29, the search winner; docs/search.md, "How far to trust the winner").

ddlsim times the fused GEMM (``D = Xᵀ·dY + main_grad``, ``β = 1``, ``C`` and ``D`` fp32) with
its fp32 read and write in a roofline ``max(FLOPs, bytes)`` (ddlsim/workloads/decoder/
wgrad.py) and, on A100 (``device.gemm_epilogue: serialized``: cuBLAS's kernels run one thread
block per SM with the epilogue after the main loop), the epilogue's bytes beyond a bf16 store
after each wave's main loop (ddlsim/simulator/kernels/gemm.py; docs/compute.md, "The epilogue
of an accumulating GEMM"), derived, not measured: no published measurement of it was found.
This script measures it; ddlsim is not needed where it runs.

Run on a machine with a CUDA GPU and PyTorch (its pip wheel; the cuBLAS it loaded is called):

    python benchmarks/device/wgrad_accumulate.py --out OUTDIR [--limit N]

For each shape of :func:`shapes` (GPT-3 175B's four linears at TP 4 and 8, ``K`` = 2,048 and
4,096 tokens: micro-batch 1 and 2 at sequence 2,048), it writes ``OUTDIR/wgrad.csv``, one row
per variant with its median seconds:

* ``gemmex_bf16`` — ``cublasGemmEx``, bf16 inputs, bf16 output, ``β = 0`` (the unfused GEMM);
* ``gemmex_fp32_accumulate`` — the same call with an fp32 ``C``, ``β = 1``: the arguments of
  apex's ``wgrad_gemm_accum_fp32`` (NVIDIA/apex ``csrc/megatron/
  fused_weight_gradient_dense_cuda.cu``: ``CUBLAS_OP_N, CUBLAS_OP_T``, ``CUDA_R_32F`` output,
  ``CUBLAS_COMPUTE_32F``, ``CUBLAS_GEMM_DEFAULT_TENSOR_OP``), which Megatron-LM's
  ``LinearWithGradAccumulationAndAsyncCommunication`` calls;
* ``gemmex_fp32_overwrite`` — fp32 ``C``, ``β = 0`` (Transformer Engine's first micro-batch);
* ``add_pass`` — ``main_grad.add_(grad)``, the unfused accumulation pass;
* ``copy`` — a streaming copy of ``main_grad`` (the bandwidth the bytes are read against).

and ``env.json`` (GPU, clocks, power limit, versions). The figure ddlsim would take from it:
``(t_accumulate − t_bf16) / (M·N)`` seconds per weight element against the copy's bandwidth,
i.e. how many of the ``C`` bytes the fused epilogue exposes.

Timing: CUDA events around a loop lasting ≥ 20 ms (≥ 3 calls) after warm-up; the median of 5.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import json
import os
import sys

HIDDEN = 12288                    # GPT-3 175B (Brown et al. 2020, Table 2.1)
TOKENS = (2048, 4096)             # micro-batch 1 and 2 at sequence 2,048
TPS = (4, 8)
SAMPLE_S, SAMPLES = 0.02, 5
#: cuBLAS enums (cublas_api.h, library_types.h)
OP_N, OP_T = 0, 1
R_32F, R_16BF = 0, 14
COMPUTE_32F, GEMM_DEFAULT_TENSOR_OP = 68, 99


def shapes() -> list[dict]:
    """The weight-gradient GEMMs of one GPT-3 175B layer: ``out × inp`` weight, ``k`` tokens.

    Returns
    -------
    list of dict : ``name, tp, out, inp, k`` (elements), QKV, projection, fc1, fc2 per TP and
    token count.
    """
    h, rows = HIDDEN, []
    for tp in TPS:
        for k in TOKENS:
            for name, out, inp in (("qkv", 3 * h // tp, h), ("proj", h, h // tp),
                                   ("fc1", 4 * h // tp, h), ("fc2", h, 4 * h // tp)):
                rows.append({"name": name, "tp": tp, "out": out, "inp": inp, "k": k})
    return rows


def _cublas():
    """The ``libcublas`` PyTorch itself loaded (``libcublas.so.12`` of a cu12 wheel,
    ``.so.13`` of a cu13 one), found in this process's memory map once torch has made its
    cuBLAS handle, so that the handle and the library agree."""
    import torch
    torch.cuda.current_blas_handle()
    with open("/proc/self/maps") as fh:
        paths = sorted({line.split()[-1] for line in fh
                        if "/libcublas.so" in line and "Lt" not in line.split("/")[-1]})
    if not paths:
        raise RuntimeError("PyTorch has loaded no libcublas.so: cannot call cublasGemmEx")
    lib = ctypes.CDLL(paths[0])
    lib.cublasGemmEx.restype = ctypes.c_int
    return lib


def _gemmex(lib, handle, x, dy, c, beta: float):
    """A closure: ``c[out, inp] = x[k, inp]ᵀ·dy[k, out] (+ β·c)``, apex's column-major call."""
    import torch
    k, inp = x.shape
    out = dy.shape[1]
    ctype = R_32F if c.dtype == torch.float32 else R_16BF
    alpha, b = ctypes.c_float(1.0), ctypes.c_float(beta)

    def call():
        status = lib.cublasGemmEx(
            ctypes.c_void_p(handle), OP_N, OP_T, inp, out, k, ctypes.byref(alpha),
            ctypes.c_void_p(x.data_ptr()), R_16BF, inp, ctypes.c_void_p(dy.data_ptr()), R_16BF,
            out, ctypes.byref(b), ctypes.c_void_p(c.data_ptr()), ctype, inp, COMPUTE_32F,
            GEMM_DEFAULT_TENSOR_OP)
        if status:
            raise RuntimeError(f"cublasGemmEx returned status {status}")
    return call


def timed(fn) -> float:
    """Median seconds of one call of ``fn``: the device suite's timer
    (``h100_kernels.timed``; module docstring), imported here so that loading this script
    needs no torch."""
    from h100_kernels import timed as suite_timed
    return suite_timed(fn)


def measure(shape: dict, lib) -> list[dict]:
    """The rows of one shape, one per variant (module docstring)."""
    import torch
    k, inp, out = shape["k"], shape["inp"], shape["out"]
    x = torch.randn(k, inp, device="cuda").to(torch.bfloat16)
    dy = torch.randn(k, out, device="cuda").to(torch.bfloat16)
    grad = torch.empty(out, inp, device="cuda", dtype=torch.bfloat16)
    main_grad = torch.randn(out, inp, device="cuda")
    spare = torch.empty_like(main_grad)
    handle = torch.cuda.current_blas_handle()
    variants = {"gemmex_bf16": _gemmex(lib, handle, x, dy, grad, 0.0),
                "gemmex_fp32_accumulate": _gemmex(lib, handle, x, dy, main_grad, 1.0),
                "gemmex_fp32_overwrite": _gemmex(lib, handle, x, dy, spare, 0.0),
                "add_pass": lambda: main_grad.add_(grad),
                "copy": lambda: spare.copy_(main_grad)}
    flops = 2.0 * k * inp * out
    rows = []
    for name, fn in variants.items():
        t = timed(fn)
        rows.append({**shape, "variant": name, "seconds": t,
                     "tflops": flops / t / 1e12 if name.startswith("gemmex") else "",
                     "GBps": 8.0 * inp * out / t / 1e9 if name == "copy" else ""})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--limit", type=int, default=0, help="first N shapes only (a dry run)")
    args = ap.parse_args(argv)
    import subprocess
    try:
        import torch
    except ImportError:
        print("error: needs PyTorch with CUDA (pip install torch)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    p = torch.cuda.get_device_properties(0)
    info = {"gpu": p.name, "sm_count": p.multi_processor_count, "torch": torch.__version__,
            "cuda": torch.version.cuda}
    info["nvidia_smi"] = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,power.limit",
         "--format=csv"], capture_output=True, text=True, timeout=20).stdout.strip()
    with open(os.path.join(args.out, "env.json"), "w") as fh:
        json.dump(info, fh, indent=1)
    lib, rows = _cublas(), []
    for shape in shapes()[:args.limit or None]:
        rows += measure(shape, lib)
        print(json.dumps(rows[-5:]), flush=True)
    with open(os.path.join(args.out, "wgrad.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
