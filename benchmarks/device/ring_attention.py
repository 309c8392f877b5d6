"""Time PyTorch's context-parallel ring attention, and its pieces, as torchtitan runs it: the
measurement that would tell where ddlsim's torchtitan CP rows lose time (a microbenchmark, no
ddlsim; ddlsim's side: ``benchmarks/cp_steps.py``).

Run on GPUs with PyTorch >= 2.6 (ddlsim is not needed there):

    python benchmarks/device/ring_attention.py kernels --out OUTDIR \
        [--heads 32 --head-dim 128 --local-tokens 32768 --batch 1]
    torchrun --nproc_per_node=CP benchmarks/device/ring_attention.py ring --out OUTDIR [...]

The defaults are one rank of torchtitan's Table 2 rows (Llama 3.1 8B, 32768 tokens per rank,
K/V repeated to the 32 query heads by ``repeat_kv``); ``--heads 16`` is a TP 8 rank of the
405B rows (Table 6).

``kernels`` (one GPU) writes ``kernels.csv``: the calls one ring step makes on rank 0, at the
shapes ``torch/distributed/tensor/experimental/_attention.py`` launches them (``c`` = half
the rank's tokens): the flash forward and backward of step 0 (causal, ``2c × 2c``), of a later
step of rank 0 (second query chunk on both key chunks, ``c × 2c``) and of the other ranks'
later steps (``2c × c``), through ``scaled_dot_product_attention`` restricted to FlashAttention
(as torchtitan's ``sdpa_kernel([FLASH_ATTENTION, EFFICIENT_ATTENTION])`` picks it); the forward
merge of a partial step (fp32 cast, ``out − sigmoid(lse_b − lse)·(out − out_b)``,
``lse − logsigmoid(lse − lse_b)``, written back with ``torch.cat``) and the backward
accumulation (fp32 dK/dV plus the step's gradients, concatenated for the send; dQ's second
half), each eager and under ``torch.compile``. Columns: ``piece, pass, mode, s_q, s_k, causal,
batch, heads, head_dim, local_tokens, seconds``.

``ring`` (``torchrun``, the CP group = every rank of one host) writes ``ring.csv``: one
attention core, forward and forward + backward, run through torch's own ``context_parallel``
on a ``[b, heads, local_tokens·CP, d]`` causal problem, per rotate method (``allgather``,
torchtitan's default, and ``alltoall``), eager and compiled: the slowest and fastest rank's
seconds per call. This is the ring with its collectives, waits and merges as they run,
without the rest of the layer.

Timing: CUDA events around a loop of calls (the count agreed by all ranks in ``ring``),
the median of 5 samples, after warm-up; operands are random normal.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from h100_kernels import env, event_seconds, timed  # noqa: E402  (the suite's timer and provenance)

BF16 = torch.bfloat16
SAMPLES = 5
SAMPLE_S = 0.2


def _randn(shape, dtype=BF16):
    return torch.randn(shape, device="cuda", dtype=torch.float32).to(dtype)


def _flash(q, k, v, causal: bool):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _flash_times(b: int, h: int, s_q: int, s_k: int, d: int, causal: bool) -> tuple:
    """(forward, backward) seconds of one flash call of ``s_q`` queries on ``s_k`` keys."""
    q = _randn((b, h, s_q, d)).requires_grad_()
    k, v = (_randn((b, h, s_k, d)).requires_grad_() for _ in range(2))
    g = _randn((b, h, s_q, d))

    def fwd():
        with torch.no_grad():
            return _flash(q, k, v, causal)

    def fwd_bwd():
        return torch.autograd.grad(_flash(q, k, v, causal), (q, k, v), g)
    t_f, t_fb = timed(fwd), timed(fwd_bwd)
    return t_f, t_fb - t_f


def flash_rows(b: int, h: int, L: int, d: int) -> list[dict]:
    """Forward and backward seconds of the ring's three flash shapes (module docstring)."""
    c, rows = L // 2, []
    for piece, s_q, s_k, causal in (("step0", L, L, True), ("later_rank0", c, L, False),
                                    ("later_other", L, c, False)):
        times = _flash_times(b, h, s_q, s_k, d, causal)
        for pass_, sec in zip(("fwd", "bwd"), times):
            rows.append(dict(piece=piece, pass_=pass_, mode="eager", s_q=s_q, s_k=s_k,
                             causal=causal, batch=b, heads=h, head_dim=d, local_tokens=L,
                             seconds=sec))
        torch.cuda.empty_cache()
    return rows


def _merge(acc_out, acc_lse, blk_out, blk_lse):
    """A partial step's merge on rank 0: its second query half against the accumulators."""
    blk_out, blk_lse = blk_out.float(), blk_lse.float().unsqueeze(-1)
    head, out = acc_out.chunk(2, dim=2)
    lse_head, lse = acc_lse.chunk(2, dim=2)
    out = out - torch.sigmoid(blk_lse - lse) * (out - blk_out)
    lse = lse - F.logsigmoid(lse - blk_lse)
    return torch.cat([head, out], dim=2), torch.cat([lse_head, lse], dim=2)


def _accumulate(recv, dq_acc, dk, dv, dq_half):
    """A backward step on rank 0: dK/dV into the received fp32 buffer, concatenated for the
    send, and dQ's second half added."""
    n = dk.numel()
    gk, gv = recv[:n].view(dk.shape), recv[n:].view(dv.shape)
    gk += dk
    gv += dv
    send = torch.cat([gk.flatten(), gv.flatten()])
    head, tail = dq_acc.chunk(2, dim=2)
    return send, torch.cat([head, tail + dq_half], dim=2)


def elementwise_rows(b: int, h: int, L: int, d: int) -> list[dict]:
    """Seconds of the merge and the accumulation, eager and compiled (module docstring)."""
    c, rows = L // 2, []
    merge_in = (_randn((b, h, L, d), torch.float32), _randn((b, h, L, 1), torch.float32),
                _randn((b, h, c, d)), _randn((b, h, c), torch.float32))
    acc_in = (_randn((2 * b * h * L * d,), torch.float32), _randn((b, h, L, d), torch.float32),
              _randn((b, h, L, d)), _randn((b, h, L, d)), _randn((b, h, c, d)))
    for piece, fn, args, pass_ in (("merge", _merge, merge_in, "fwd"),
                                   ("accumulate", _accumulate, acc_in, "bwd")):
        for mode, run in (("eager", fn), ("compiled", torch.compile(fn))):
            sec = timed(lambda run=run, args=args: run(*args))
            rows.append(dict(piece=piece, pass_=pass_, mode=mode, s_q=c, s_k=L, causal=False,
                             batch=b, heads=h, head_dim=d, local_tokens=L, seconds=sec))
    return rows


def _agreed_reps(fn) -> int:
    """Calls per sample, the same on every rank (the ring's collectives must pair)."""
    import torch.distributed as dist
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    reps = torch.tensor([max(3, min(50, math.ceil(SAMPLE_S / max(a.elapsed_time(b) / 1e3,
                                                                   1e-6))))], device="cuda")
    dist.all_reduce(reps, op=dist.ReduceOp.MAX)
    return int(reps.item())


def _timed_ring(fn) -> float:
    """Median seconds per call of ``fn`` on this rank over ``SAMPLES`` agreed loops."""
    import torch.distributed as dist
    reps, out = _agreed_reps(fn), []
    for _ in range(SAMPLES):
        dist.barrier()
        out.append(event_seconds(fn, reps))
    return statistics.median(out)


def _spread(sec: float) -> tuple[float, float]:
    """(slowest, fastest) rank's seconds."""
    import torch.distributed as dist
    hi, lo = torch.tensor([sec], device="cuda"), torch.tensor([-sec], device="cuda")
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MAX)
    return float(hi.item()), float(-lo.item())


def _ring_config(mesh, shape, rotate: str, compiled: bool) -> dict:
    """One rotate method × compile setting of :func:`ring_rows`."""
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch._dynamo.reset()
    set_rotate_method(rotate)
    q, k, v, g = (_randn(shape) for _ in range(4))

    def core(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    run = torch.compile(core) if compiled else core
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]), \
            context_parallel(mesh, buffers=[q, k, v, g], buffer_seq_dims=[2, 2, 2, 2],
                             no_restore_buffers={q, k, v, g}):
        def fwd():
            with torch.no_grad():
                return run(q, k, v)

        def fwd_bwd():
            qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
            return torch.autograd.grad(run(qq, kk, vv), (qq, kk, vv), g)
        t_f, t_fb = _spread(_timed_ring(fwd)), _spread(_timed_ring(fwd_bwd))
    return dict(rotate=rotate, mode="compiled" if compiled else "eager",
                fwd_s_slowest=t_f[0], fwd_s_fastest=t_f[1],
                fwd_bwd_s_slowest=t_fb[0], fwd_bwd_s_fastest=t_fb[1])


def ring_rows(b: int, h: int, L: int, d: int, log) -> list[dict]:
    """Torch's ``context_parallel`` over every rank of the job (module docstring)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    cp = dist.get_world_size()
    mesh = init_device_mesh("cuda", (cp,), mesh_dim_names=("cp",))
    rows = []
    for rotate in ("allgather", "alltoall"):
        for compiled in (False, True):
            try:
                got = _ring_config(mesh, (b, h, L * cp, d), rotate, compiled)
            except Exception as exc:  # noqa: BLE001 - one setting must not stop the rest
                log(f"ring {rotate} compiled={compiled}: {str(exc)[:300]!r}")
                continue
            rows.append(dict(cp=cp, batch=b, heads=h, local_tokens=L, head_dim=d, **got))
            torch.cuda.empty_cache()
    return rows


def _write(path: str, rows: list[dict]) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=[k.rstrip("_") for k in keys])
        w.writeheader()
        w.writerows({k.rstrip("_"): v for k, v in r.items()} for r in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=("kernels", "ring"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32, help="query heads on the rank")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--local-tokens", type=int, default=32768, help="tokens per CP rank")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    shape = (args.batch, args.heads, args.local_tokens, args.head_dim)
    torch.manual_seed(0)
    if args.part == "ring":
        import torch.distributed as dist
        dist.init_process_group("nccl")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    rank0 = args.part == "kernels" or torch.distributed.get_rank() == 0
    os.makedirs(args.out, exist_ok=True)

    def log(msg: str) -> None:
        if rank0:
            print(msg, flush=True)
    if rank0:
        with open(os.path.join(args.out, f"env_{args.part}.json"), "w") as fh:
            json.dump(env("cuda"), fh, indent=1)
    rows = (flash_rows(*shape) + elementwise_rows(*shape) if args.part == "kernels"
            else ring_rows(*shape, log))
    if rank0:
        _write(os.path.join(args.out, f"{args.part}.csv"), rows)
        log(f"{args.part}: {len(rows)} rows written to {args.out}")
    if args.part == "ring":
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
