"""Host and device time of Transformer Engine's GroupedLinear as Megatron-Core's experts run it.

On one GPU: ``GroupedLinear`` as Megatron-Core's ``TEGroupedMLP`` runs the experts, host time
and device time of one forward and one forward + backward, by local experts and tokens per
expert. The measurement docs/moe.md asks for ("A per-layer floor in the
published runs": the time ddlsim misses per MoE layer grows with the local experts, 0.2-0.45 ms
each, and neither the kernels nor TE's C++ multi-stream path carries it): a microbenchmark, no
ddlsim needed. Not yet run (no GPU was lent to the session that wrote it).

Run on a machine with a CUDA GPU, PyTorch and Transformer Engine:

    python benchmarks/device/grouped_linear_host.py [--repeats 50] [--out grouped.json]

For each model's expert shape (Qwen3-235B-A22B: hidden 4096, expert FFN 1536; Qwen3-30B-A3B:
2048 and 768; gated, so fc1 is ``h → 2·f``), local experts ``e`` in 4, 8, 16 and tokens per
expert in 512, 1024, 2048, 4096: fc1 and fc2 as two ``GroupedLinear`` modules in BF16 with
Megatron's gradient-accumulation fusion (``fuse_wgrad_accumulation``, an fp32 ``main_grad`` per
weight, as ``--gradient-accumulation-fusion`` gives), the activation between them, the backward
from a random output gradient. Each timing queues ``torch.cuda._sleep`` first so the device is
busy while the host issues the work: the host's wall time of the issue is then host time alone,
and CUDA events around the work measure device time without the host's gaps. The median of
``--repeats`` trials after five warm-ups.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

#: (name, hidden, expert FFN): the experts of the validated runs (their config.json)
SHAPES = (("qwen3-235b-a22b", 4096, 1536), ("qwen3-30b-a3b", 2048, 768))
EXPERTS = (4, 8, 16)
TOKENS = (512, 1024, 2048, 4096)
SLEEP_CYCLES = 50_000_000           # ~25 ms at H100 clocks: longer than any issue timed here


def _layer(e: int, hidden: int, ffn: int, te, torch):
    """fc1 (h → 2f) and fc2 (f → h) of ``e`` experts, with an fp32 ``main_grad`` per weight."""
    mods = [te.pytorch.GroupedLinear(e, hidden, 2 * ffn, bias=False, params_dtype=torch.bfloat16,
                                     fuse_wgrad_accumulation=True),
            te.pytorch.GroupedLinear(e, ffn, hidden, bias=False, params_dtype=torch.bfloat16,
                                     fuse_wgrad_accumulation=True)]
    for mod in mods:
        for p in mod.parameters():
            p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device="cuda")
    return mods


def _timed(step, repeats: int, torch) -> tuple[float, float]:
    """Median host seconds of issuing ``step()`` and median device seconds of its kernels."""
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    host, device = [], []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SLEEP_CYCLES)
        start.record()
        t0 = time.perf_counter()
        step()
        host.append(time.perf_counter() - t0)
        end.record()
        torch.cuda.synchronize()
        device.append(start.elapsed_time(end) / 1e3)
    return statistics.median(host), statistics.median(device)


def measure_one(name: str, hidden: int, ffn: int, e: int, tokens: int, repeats: int) -> dict:
    """One configuration's forward and forward + backward times (s)."""
    import torch
    import transformer_engine as te

    fc1, fc2 = _layer(e, hidden, ffn, te, torch)
    # a list, as Megatron-LM d7288711 passes tokens_per_expert.tolist() to TE 2.7-2.9; newer TE
    # releases document a tensor
    release = tuple(int(x) for x in te.__version__.split(".")[:2] if x.isdigit())
    splits = [tokens] * e if release < (2, 10) else torch.tensor([tokens] * e)
    x = torch.randn(e * tokens, hidden, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    dy = torch.randn(e * tokens, hidden, dtype=torch.bfloat16, device="cuda")

    def forward():
        gate, up = fc1(x, splits).chunk(2, dim=-1)
        return fc2(torch.nn.functional.silu(gate) * up, splits)

    def forward_backward():
        forward().backward(dy)

    fwd = _timed(forward, repeats, torch)
    both = _timed(forward_backward, repeats, torch)
    return {"model": name, "experts": e, "tokens_per_expert": tokens,
            "forward_host_s": fwd[0], "forward_device_s": fwd[1],
            "fwd_bwd_host_s": both[0], "fwd_bwd_device_s": both[1]}


def measure(repeats: int) -> dict:
    """Every configuration, with the environment."""
    import torch
    import transformer_engine as te

    rows = [measure_one(name, h, f, e, t, repeats)
            for name, h, f in SHAPES for e in EXPERTS for t in TOKENS]
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "transformer_engine": te.__version__, "cuda": torch.version.cuda,
            "repeats": repeats, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=50, help="timed trials per configuration")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    out = measure(args.repeats)
    for r in out["rows"]:
        print(f"{r['model']:16s} e={r['experts']:2d} m={r['tokens_per_expert']:5d}  fwd host "
              f"{r['forward_host_s'] * 1e6:8.1f} us device {r['forward_device_s'] * 1e6:8.1f} us"
              f"  fwd+bwd host {r['fwd_bwd_host_s'] * 1e6:8.1f} us device "
              f"{r['fwd_bwd_device_s'] * 1e6:8.1f} us")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
