"""The unfused MoE permutation's kernels on one GPU: gather, its backward (a scatter-add with
``k`` copies of each token colliding) and the un-permutation's scatter-add, by shape.

Run on a machine with a CUDA GPU and PyTorch (ddlsim is not needed there):

    python benchmarks/device/moe_permute_kernels.py --out DIR [--repeats 20]

Megatron-Core's unfused ``moe_utils.permute`` gathers the ``T·k`` routed copies of ``T`` tokens
with ``index_select`` (its backward: ``index_add_`` of the copies' gradients into ``T`` rows,
each row receiving ``k``), and ``unpermute`` multiplies by the probabilities and
``scatter_add_``s the copies back to ``T`` rows (Megatron-LM d7288711
``megatron/core/transformer/moe/moe_utils.py`` ``permute``/``unpermute``, the paths without
``fused``). The Megatron-Core MoE layer timed on one H200
(``benchmarks/data/device_h200_2026-11-30/run8/moe``) spent 0.54 ms in the ``index_add_`` of
16,384 copies of hidden 4,096 (``IndexSelectBackward0``), where reading and writing its bytes at
the streaming rate takes about a tenth of that. Each row here is one kernel timed alone with CUDA
events (the median of ``--repeats`` after three warm-ups), the routing as forced balance gives
it (each token's ``k`` experts distinct, the copies sorted by expert), beside the bytes the
kernel must move (``bytes``: read the source and the index, read and write the destination).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

#: tokens T, copies per token k, hidden H, dtype
SHAPES = [(t, k, h, dt) for dt in ("bf16", "fp32") for h in (2048, 4096, 7168)
          for t in (1024, 4096) for k in (1, 2, 4, 8)]


def _timed(fn, repeats: int, torch) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return statistics.median(out)


def _routing(t: int, k: int, torch):
    """The copies' token indices, sorted by expert as the permutation orders them: each token
    sent to ``k`` distinct experts of ``8·k`` (forced balance: a random permutation each)."""
    experts = 8 * k
    choice = torch.rand(t, experts, device="cuda").argsort(dim=1)[:, :k]     # k distinct
    order = (choice * t + torch.arange(t, device="cuda")[:, None]).flatten().argsort()
    return (torch.arange(t, device="cuda")[:, None].expand(t, k).flatten())[order].contiguous()


def measure(repeats: int) -> list[dict]:
    import torch
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    rows = []
    for t, k, h, dt in SHAPES:
        dtype = dtypes[dt]
        idx = _routing(t, k, torch)
        x = torch.randn(t, h, device="cuda", dtype=dtype)
        copies = torch.randn(t * k, h, device="cuda", dtype=dtype)
        dest = torch.zeros(t, h, device="cuda", dtype=dtype)
        size = torch.finfo(dtype).bits // 8
        moved = {"index_select": (t * k * h * 2) * size + t * k * 8,
                 "index_add": (t * k * h + 2 * t * h) * size + t * k * 8,
                 "scatter_add": (t * k * h + 2 * t * h) * size + t * k * h * 8}
        full_idx = idx[:, None].expand(t * k, h)
        kernels = {"index_select": lambda: torch.index_select(x, 0, idx),
                   "index_add": lambda: dest.index_add_(0, idx, copies),
                   "scatter_add": lambda: dest.scatter_add_(0, full_idx, copies)}
        for name, fn in kernels.items():
            s = _timed(fn, repeats, torch)
            rows.append({"kernel": name, "tokens": t, "k": k, "hidden": h, "dtype": dt,
                         "bytes": moved[name], "seconds": s, "GBps": moved[name] / s / 1e9})
        del x, copies, dest, full_idx
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (torch.cuda.is_available() is False)")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = measure(args.repeats)
    with open(args.out / "permute_kernels.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    env = {"utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "torch": torch.__version__, "cuda": torch.version.cuda,
           "gpu": torch.cuda.get_device_name(0), "repeats": args.repeats}
    (args.out / "env.json").write_text(json.dumps(env, indent=1))
    for r in rows:
        print(f"{r['kernel']:13s} T={r['tokens']:5d} k={r['k']} h={r['hidden']} {r['dtype']} "
              f"{r['seconds'] * 1e6:8.1f} us {r['GBps']:7.1f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
