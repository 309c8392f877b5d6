"""What the measured start rule of an overlapped expert-parallel kernel would add, at most, to
the EP-overlap rows of validate_moe (an estimate, not a model setting: docs/moe.md, "At a node
boundary").

The rule (``benchmarks/stream_start_rule.py``, run10 and run12 of the lent H200): when the
compute op an ``ep``-stream op waits for ends and the compute stream's next op is a GEMM ready
to run, the ``ep`` kernel loses the race with probability ``p`` (32 of 72 repeats) and then
starts only when that GEMM's last, partial round of tiles begins; an all-to-all over ``n``
ranks starts when its last member has, so the chain loses with ``q = 1 − (1 − p)^n``. The
expected delay of one race is ``q · floor(r)/r · t`` for the GEMM kernel's time ``t`` (ddlsim's
kernel model on the row's device) and ``r`` = its tiles over the SMs (``r < 1``: SMs are free,
no delay). Tiles: cuBLAS's ``256 × 128`` (the tile every measured GEMM but the largest square ran
with in run10 and run12: an assumption for other shapes).

For each row this reads ddlsim's own DES timeline of one rank (its spans) and, for every
``ep``-stream op, the compute kernel at its start (the kernels of a compute span laid end to end
over it): ready while a GEMM is in a full round, the op waits for the GEMM's last round (run10:
every time); ready as a GEMM starts, it waits with probability ``q`` (run12). The sum of these
first-order delays is what the rule would add if each lay on the step's critical path and
caused no others: a first-order size, not a prediction.

Run: ``python benchmarks/ep_start_estimate.py``
"""

from __future__ import annotations

import bisect
import math
import sys

import validate_moe as vm
from public_runs import print_table

#: the boundary race's losses (run12: 32 of 72 repeats)
P_LOSE = 32 / 72
#: the DES work this needs (ModelZoo row 2, 256 GPUs: 21.7 million rank-ops, over the default)
DES_RANK_OPS = 3e7
#: cuBLAS's tile for these GEMMs (run10, run12: nvjet_sm90_tst_256x128_*)
TILE = (256, 128)


def _last_round(kernel, sms: int) -> float:
    """``floor(r)/r`` of a GEMM kernel's tiles over ``sms`` (0 where SMs are left free)."""
    m, n, _ = kernel.shape
    rounds = math.ceil(m / TILE[0]) * math.ceil(n / TILE[1]) * kernel.batch / sms
    return 0.0 if rounds < 1 else math.floor(rounds) / rounds


def _kernel_windows(span, payload, dev) -> list[tuple[float, float, object]]:
    """The kernels of a compute span laid end to end over it (their model times scaled to the
    span: its launch gaps spread evenly)."""
    from ddlsim.simulator.kernels import kernel_time
    kernels = list(getattr(payload, "kernels", None) or ())
    times = [kernel_time(k, dev) for k in kernels]
    total = sum(times)
    if not kernels or total <= 0:
        return []
    scale, t, out = (span.end_s - span.start_s) / total, span.start_s, []
    for k, dt in zip(kernels, times):
        out.append((t, t + dt * scale, k))
        t += dt * scale
    return out


def delays(spans, payloads: dict, dev, q: float) -> tuple[float, int, int]:
    """First-order delays of the rule on one rank's DES timeline (module docstring): their sum
    (s), and how many ``ep`` ops were ready mid-GEMM and how many raced a GEMM's start."""
    compute = sorted((s for s in spans if s.stream == "compute"), key=lambda s: s.start_s)
    starts = [s.start_s for s in compute]
    total, mid, edge = 0.0, 0, 0
    for s in spans:
        if s.stream != "ep":
            continue
        t = s.start_s
        i = max(bisect.bisect_right(starts, t + 1e-12) - 1, 0)
        running = [c for c in compute[i:i + 2] if c.start_s - 1e-12 <= t < c.end_s]
        if not running:
            continue
        for k0, k1, k in _kernel_windows(running[0], payloads.get(running[0].name), dev):
            if k.kind != "gemm" or not k0 - 1e-12 <= t < k1:
                continue
            last = k0 + _last_round(k, dev.sm_count) * (k1 - k0)
            if abs(t - k0) <= 1e-9:                   # ready as the GEMM starts: the race
                total, edge = total + q * max(0.0, last - t), edge + 1
            elif t < last:                            # ready mid-GEMM, in a full round
                total, mid = total + (last - t), mid + 1
            break
    return total, mid, edge


def estimate(row: dict) -> dict:
    """The row's DES prediction and the rule's first-order delays on its first rank."""
    import ddlsim
    from ddlsim.api import build_workload
    from ddlsim.simulator.kernels import kernel_device
    cfg = ddlsim.load_config(vm.config(row))
    dev = kernel_device(cfg.system)
    q = 1 - (1 - P_LOSE) ** cfg.parallel.ep
    payloads: dict = {}
    for block in build_workload(cfg).classes[0].program.blocks.values():
        for op in block.flat.ops:
            payloads.setdefault(getattr(op.payload, "name", ""), op.payload)
    from ddlsim.limits import Limits
    result = ddlsim.predict(cfg, engine="des", limits=Limits(des_rank_ops=DES_RANK_OPS))
    rank = min(s.rank for s in result.spans)
    added, mid, edge = delays([s for s in result.spans if s.rank == rank], payloads, dev, q)
    return {"predicted": result.iteration_time_s, "added": added, "q": q, "mid": mid,
            "edge": edge}


def main() -> int:
    lines = []
    for row in vm.ab_rows() + vm.zoo_rows():
        if row["a2a_overlap"] != "true":
            continue
        e = estimate(row)
        label = f"A/B {row['run']}" if row["set"] == "ab" else f"ModelZoo row {row['row']}"
        lines.append([label, f"{e['q']:.3f}", str(e["mid"]), str(e["edge"]),
                      f"{vm.published_time(row):.2f}", f"{e['predicted']:.2f}",
                      f"{e['added']:.3f}"])
        print("  ".join(lines[-1]), flush=True)
    print_table(["overlap-on row", "q", "ep ops ready mid-GEMM", "boundary races",
                 "published (s)", "predicted, DES (s)", "first-order delays (s)"], lines, False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
