"""The torch job's calibration samples (:mod:`.torch_job`, steps 1 and 2), each in process CPU
time: GEMMs in fp32 with their operands out of the last-level cache (:func:`gemm_rows`, after
:func:`flush_bytes` of writes), the element-wise classes ddlsim times apart as calls with the
bytes ddlsim counts for them (:func:`class_kernels`), the STREAM "Add" rate of the gradient
buffer and the time torch's eager dispatch adds per op (:func:`op_overhead_s`).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["class_kernels", "op_overhead_s", "flush_bytes", "flush_buffer", "gemm_rows"]

#: Square GEMMs beside the run's own shapes (as :data:`.interleaved.SQUARES`).
SQUARES = ((64, 64, 64), (128, 128, 128), (256, 256, 256), (512, 512, 512))


def _least_s(call, reps: int = 3, before=None) -> float:
    """The least process CPU time of ``reps`` calls (s), ``before()`` untimed before each."""
    best = np.inf
    for _ in range(reps):
        if before is not None:
            before()
        t0 = time.process_time()
        call()
        best = min(best, time.process_time() - t0)
    return max(best, 1e-9)


def op_overhead_s(calls: int = 200) -> float:
    """CPU seconds torch's eager dispatch takes per op on this CPU: the least over three
    loops of ``calls`` additions of two 1-element tensors, over ``calls`` (the work itself
    is one float; what is left is Python, the dispatcher and the allocator, per op).

    Returns
    -------
    float
        Seconds per op.
    """
    a, b = torch.ones(1), torch.ones(1)

    def loop() -> None:
        for _ in range(calls):
            torch.add(a, b)
    loop()
    return _least_s(loop) / calls


#: Bytes written between two timed GEMM calls where the machine's last-level cache cannot be
#: read: Triton's ``do_bench`` (triton/testing.py, ``cache_size = 256 * 1024 * 1024``) zeroes
#: as much before each timed call, more than any device's last-level cache
DEFAULT_FLUSH_BYTES = 256 * 2 ** 20
#: the least flush: four times the 2 MiB L2 per core of the machine the loop was built on
#: (``lscpu``), the flush before the last-level cache was read
MIN_FLUSH_BYTES = 8 * 2 ** 20


def flush_bytes(llc_bytes: int | None) -> int:
    """Bytes to write before each timed GEMM call (:func:`gemm_rows`): twice the last-level
    cache, so that the call reads its operands from memory, as in a training iteration.

    There each weight is read once per pass, and between two uses of it the optimizer's step
    streams the parameters, their gradients and Adam's two moments (16 B per parameter in
    fp32: 80 MB for the ``--small`` model's 5.1 M parameters), more than the 32 MiB L3 of
    the machine the loop was built on; an 8 MiB flush (out of L2 only) left the operands in
    L3, and the run's GEMMs took 5.7 % longer inside the iteration than so timed, 0.5 % at
    a 64 MiB flush (``benchmarks/torch_loop_ops.py``, 2026-11-30 06:00 UTC, load 2.2: 84.0
    ms of GEMMs an iteration inside, 79.5 ms alone after 8 MiB, 83.6 ms after 64 MiB).

    Parameters
    ----------
    llc_bytes : int or None
        The last-level cache (:func:`.mpijobs.last_level_cache_bytes`); None where unknown.

    Returns
    -------
    int
        ``max(2 · llc_bytes, MIN_FLUSH_BYTES)``, or :data:`DEFAULT_FLUSH_BYTES` without a
        size.
    """
    if llc_bytes is None:
        return DEFAULT_FLUSH_BYTES
    return max(2 * llc_bytes, MIN_FLUSH_BYTES)


def flush_buffer() -> torch.Tensor:
    """An fp32 buffer of :func:`flush_bytes` of this machine's last-level cache
    (:func:`.mpijobs.last_level_cache_bytes`), which a sample zeroes before each timed call."""
    from .mpijobs import last_level_cache_bytes
    return torch.empty(flush_bytes(last_level_cache_bytes()) // 4)


def gemm_rows(shapes, seed: int, reps: int = 3) -> list[dict]:
    """Process-CPU-time samples of each GEMM ``(m, n, k)`` or stacked ``(m, n, k, batch)``
    (``batch`` GEMMs in one torch ``matmul``, as the attention core runs its heads), fp32,
    each call timed alone after writing :func:`flush_bytes` (twice the last-level cache),
    ``reps`` calls;
    rows in the ``calibrate compute`` format. (``calibrate compute --backend torch`` times
    wall time over back-to-back calls, whose operands stay in cache, and refuses stacks.)"""
    from ..calibration.compute_bench import _row, gemm_flops
    gen, rows = torch.Generator().manual_seed(seed), []
    flush = flush_buffer()
    for shape in shapes:
        m, n, k, *stack = shape
        a = torch.randn((*stack, m, k), generator=gen)
        b = torch.randn((*stack, k, n), generator=gen)
        a @ b  # warm-up (allocator, code)
        samples = np.empty(reps)
        for i in range(reps):
            flush.zero_()
            t0 = time.process_time()
            a @ b
            samples[i] = max(time.process_time() - t0, 1e-9)
        dims = {"m": m, "n": n, "k": k, **({"batch": stack[0]} if stack else {})}
        rows.append(_row("torch", f"torch {torch.__version__} (cpu)", "cpu", "gemm", "fp32",
                         dims, gemm_flops(m, n, k) * (stack[0] if stack else 1), samples))
    return rows


def _gemm_round(shape, seed: int):
    """One sample per GEMM shape of the run (:func:`~.machine.gemm_shapes`) and the squares."""
    from ..calibration.compute_bench import _frame
    from .machine import gemm_shapes
    return _frame(gemm_rows(sorted(set(SQUARES) | set(gemm_shapes(shape))), seed))


def _softmax_calls(shape, in_fp32: bool) -> dict:
    """The trainer's attention-score kernels (:class:`.torch_train.Block`: the scale by
    ``1/√d``, the causal mask and the softmax) forward, and their backward, on the run's
    ``b · heads · s²`` scores, with the bytes ddlsim's unfused softmax counts for them
    (:func:`~ddlsim.simulator.kernels.elementwise.unfused_softmax_passes`: the mask and the
    softmax; the trainer's scale is a pass of its own, which ddlsim places in the QKᵀ GEMM,
    so it is in the measured time and lowers the class's rate)."""
    from ..simulator.kernels.elementwise import unfused_softmax_passes
    b, a, s = shape.batch, shape.heads, shape.seq
    raw = torch.randn(b, a, s, s, requires_grad=True)
    mask, scale = torch.ones(s, s, dtype=torch.bool).triu(1), math.sqrt(shape.hidden // a)

    def forward(scores: torch.Tensor) -> torch.Tensor:
        return (scores / scale).masked_fill(mask, float("-inf")).softmax(-1)
    out = forward(raw)
    grad = torch.randn_like(out)
    counted = [sum(unfused_softmax_passes(4, in_fp32, backward)) * b * a * s * s
               for backward in (False, True)]
    return {"softmax": (lambda: forward(raw.detach()), counted[0]),
            "softmax_backward": (lambda: torch.autograd.grad(out, raw, grad,
                                                             retain_graph=True), counted[1])}


def class_kernels(shape, params, stack: dict) -> dict:
    """Each element-wise class's torch kernel as a call, with the bytes ddlsim counts for it
    under the torch stack's kernel flags (``stack``: :data:`.torch_loop.TORCH_STACK`).

    Parameters
    ----------
    shape : GPTShape
        The reference model and micro-batch.
    params : list of torch.Tensor
        The model's parameters (the optimizer class steps a copy of them).
    stack : dict
        The ``software`` section the loop predicts with.

    Returns
    -------
    dict
        Class name → (a call, bytes ddlsim counts for it).
    """
    from ..simulator.kernels.elementwise import (activation_passes, norm_passes,
                                                 optimizer_bytes_per_param)
    k = stack["kernels"]
    t, h = shape.batch * shape.seq, shape.hidden
    x = torch.randn(t, h, requires_grad=True)
    w, b = torch.ones(h, requires_grad=True), torch.zeros(h, requires_grad=True)
    y = torch.randn(t, 4 * h, requires_grad=True)
    norm_out, gelu_out = F.layer_norm(x, (h,), w, b), F.gelu(y, approximate="tanh")
    gn, gg = torch.randn_like(norm_out), torch.randn_like(gelu_out)
    copies = [p.detach().clone() for p in params]
    for c in copies:
        c.grad = torch.randn_like(c) * 1e-3
    adam = torch.optim.Adam(copies, lr=1e-3)
    n_params = sum(c.numel() for c in copies)
    norm = sum(norm_passes(k["fused_layernorm"], "layernorm", 4, h)) * t * h
    gelu = activation_passes(False, True, k["fused_bias_gelu"], 4)[-1] * t * 4 * h
    step = optimizer_bytes_per_param("adam", k["fused_optimizer"], 4, 4, False) * n_params
    calls = {
        "norm": (lambda: F.layer_norm(x.detach(), (h,), w.detach(), b.detach()), norm),
        "norm_backward": (lambda: torch.autograd.grad(norm_out, (x, w, b), gn,
                                                      retain_graph=True), 2 * norm),
        "activation": (lambda: F.gelu(y.detach(), approximate="tanh"), gelu),
        "activation_backward": (lambda: torch.autograd.grad(gelu_out, y, gg,
                                                            retain_graph=True), 2 * gelu),
        "optimizer": (adam.step, step)}
    from ..software import SoftwareSpec, resolve_software
    in_fp32 = resolve_software(SoftwareSpec.model_validate(stack)).softmax_in_fp32
    return {**calls, **_softmax_calls(shape, in_fp32)}


def _rates(arrays, kernels, cold=None, flush=None) -> dict[str, float]:
    """This rank's B/s of ``z = x + y`` (``gradients``), of each class (``class.<name>``:
    ``kernels``, and ``cold``'s each after zeroing ``flush``), and the per-op dispatch time
    (``op_overhead_s``, seconds)."""
    x, y, z = arrays
    out = {"gradients": 3.0 * x.numel() * x.element_size()
           / _least_s(lambda: torch.add(x, y, out=z))}
    for name, (call, counted) in kernels.items():
        out[f"class.{name}"] = counted / _least_s(call, 1 if name == "optimizer" else 3)
    for name, (call, counted) in (cold or {}).items():
        out[f"class.{name}"] = counted / _least_s(call, 3, flush.zero_)
    out["op_overhead_s"] = op_overhead_s()
    return out
