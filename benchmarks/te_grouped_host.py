"""Host time per local expert of Transformer Engine's ``GroupedLinear`` as Megatron-Core runs the
experts, measured by running TE's own Python on CPU, beside what ddlsim charges per expert.

Run:  python benchmarks/te_grouped_host.py                 (table from the committed result)
      PYTHONPATH=<torch> python benchmarks/te_grouped_host.py --te <TransformerEngine tree>
          --te-commit <sha> --megatron <Megatron-LM tree> --megatron-commit <sha> [--save]
          (measure again: needs torch; the trees' commits are read with git where they are
          checkouts, else taken from the flags)

docs/moe.md ("A per-layer floor in the published runs") finds that the published Megatron-Core
MoE runs take 0.2-0.45 ms more per MoE layer and micro-batch for each local expert than ddlsim
predicts, and that neither the experts' kernels nor TE's C++ multi-stream path carries it; left
were the Python of ``GroupedLinear``'s per-expert loops, autograd's C++ per input of
``_GroupedLinear.apply`` and Megatron's DDP hook per expert weight. This tool runs all three
(:mod:`te_grouped_host_run`): fc1 (h -> 2f) and fc2 (f -> h) of ``TEGroupedMLP`` in BF16 with
``fuse_wgrad_accumulation`` (an fp32 ``main_grad`` per weight, Megatron's
``grad_added_to_main_grad``) and Megatron-LM's own backward post-hook on every weight, at 4, 8 and
16 local experts, and measures per pass the thread CPU time of the forward and the backward with
the GEMM stand-in's time taken out, at two token counts (``T`` and ``8T`` per expert: the CPU
kernels' own execution, which grows with the tokens, is taken out as
benchmarks/moe_host_ops.py does, ``x(T) - (x(8T) - x(T))/7``). The slope over the local experts
is the host time per expert. It also counts the calls into torch per pass and where they are
made. What is stood in for: benchmarks/data/te_grouped_host/README.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "te_grouped_host"
#: the tiny expert shape measured (hidden, expert FFN; fc1 is hidden -> 2 FFN): the result
#: file; the shape checks at a half and four times it: :func:`result_path`
SHAPE = (64, 32)
SHAPE_CHECKS = ((32, 16), (256, 128))
#: local experts measured: the validated runs' 4, 8 and 16 (docs/moe.md, the per-layer floor)
LOCAL_EXPERTS = (4, 8, 16)
#: tokens per expert of the two timed passes: ``T`` and ``8T`` (:func:`host_us`)
TOKENS = (2, 16)
#: the per-expert slope docs/moe.md reads off the published runs, µs per layer and micro-batch
GAP_SLOPE_US = (200.0, 450.0)


def result_path(hidden: int, ffn: int) -> Path:
    """The result file of one expert shape."""
    return DATA / f"te_v2.9_bf16_h{hidden}_f{ffn}.json"


def _commit(tree: Path, given: str | None, flag: str) -> str:
    """The commit of ``tree``: git's where it is a checkout, else ``given``."""
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip() if (tree / ".git").exists() else ""
    if head:
        return head
    if not given:
        raise SystemExit(f"te_grouped_host: {tree} is not a git checkout; give its commit "
                         f"with {flag}")
    return given


def _load() -> dict:
    """/proc/loadavg's 1-minute figure and this process's CPU count, for the provenance."""
    return {"loadavg_1min": float(Path("/proc/loadavg").read_text().split()[0]),
            "cpus": len(__import__("os").sched_getaffinity(0))}


def measure(te: Path, megatron: Path, passes: int, warmup: int, rounds: int,
            shape: tuple = SHAPE) -> dict:
    """Every local expert count of :data:`LOCAL_EXPERTS`: timed passes at :data:`TOKENS`, with
    Megatron's DDP hooks as they run (``plain``) and with each hook timed on its own
    (``hooks``: only its ``hook_us`` is read), ``rounds`` rounds of ``passes`` after
    ``warmup`` each (the rounds interleave the configurations), and one counted pass."""
    import torch

    import te_grouped_host_run as run
    run.HIDDEN, run.FFN = shape
    torch.set_num_threads(1)
    tally = run.Tally()
    grouped, ddp, bucket = run.load(te, megatron, torch, tally)
    mods = {(e, h): run.experts(torch, grouped, ddp, bucket, e, tally if h else None,
                                timed_hooks=h)
            for e in LOCAL_EXPERTS for h in (False, True)}
    timings: dict = {}
    for r in range(rounds):
        for (e, h), m in mods.items():
            for t in TOKENS:
                key = f"{e}|{'hooks' if h else 'plain'}|{t}"
                timings.setdefault(key, []).append(
                    run.timed(torch, m, tally, e, t, passes, warmup))
    counts = {str(e): run.counted(torch, run.experts(torch, grouped, ddp, bucket, e,
                                                     tally=tally), tally, e, TOKENS[0])
              for e in LOCAL_EXPERTS}
    return {"timings": timings, "counts": counts, "torch": torch.__version__,
            "shape": {"hidden": shape[0], "ffn": shape[1]}}


def host_us(rounds: list, part: str) -> float:
    """Host µs of ``part`` (``fwd``, ``bwd``, ``fwd_body``, ``bwd_body``, ``hook``) at ``T``
    from the rounds at ``T`` and ``8T`` (``rounds``: the two lists): the median over the
    rounds of ``x(T) - (x(8T) - x(T))/7``."""
    at_t, at_8t = rounds
    return statistics.median(a[f"{part}_us"] - (b[f"{part}_us"] - a[f"{part}_us"]) / 7
                             for a, b in zip(at_t, at_8t))


def slope(xs: list, ys: list) -> float:
    """Least-squares slope of ``ys`` over ``xs`` (µs per local expert)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def per_expert(data: dict) -> dict:
    """The result read: host µs per pass by local experts (``host``), their slopes per local
    expert (``slope``: forward, backward, the two bodies of ``_GroupedLinear``, Megatron's
    DDP hooks), and the counted calls per local expert and linear (``counts``)."""
    t = data["timings"]
    host = {}
    for e in LOCAL_EXPERTS:
        plain, hooks = ([t[f"{e}|{h}|{n}"] for n in TOKENS] for h in ("plain", "hooks"))
        host[e] = {"fwd": host_us(plain, "fwd"), "bwd": host_us(plain, "bwd"),
                   "fwd_body": host_us(plain, "fwd_body"),
                   "bwd_body": host_us(plain, "bwd_body"), "hook": host_us(hooks, "hook")}
    xs = list(LOCAL_EXPERTS)
    slopes = {k: slope(xs, [host[e][k] for e in xs]) for k in host[xs[0]]}
    per_round = [slope(xs, [host_us([t[f"{e}|plain|{n}"][i:i + 1] for n in TOKENS], part)
                            for e in xs])
                 for part in ("fwd", "bwd") for i in range(len(t[f"{xs[0]}|plain|{TOKENS[0]}"]))]
    return {"host": host, "slope": slopes, "counts": count_slopes(data["counts"]),
            "rounds_range": _by_part(per_round)}


def _by_part(per_round: list) -> dict:
    """The per-round slopes (forward's, then backward's) as ``{part: [min, max]}``."""
    n = len(per_round) // 2
    return {p: [min(v), max(v)] for p, v in (("fwd", per_round[:n]), ("bwd", per_round[n:]))}


def count_slopes(counts: dict) -> dict:
    """Calls per local expert and linear (fc1, fc2), per pass part and kind (``calls`` into
    torch, tensor ``attrs`` read or written, ``gpu`` stand-ins), from the counts at the fewest
    and the most local experts; each kind's per-expert sites (``file:line name``) too."""
    lo, hi = str(LOCAL_EXPERTS[0]), str(LOCAL_EXPERTS[-1])
    per = 2 * (LOCAL_EXPERTS[-1] - LOCAL_EXPERTS[0])
    out = {}
    for part in ("fwd", "bwd"):
        for kind in ("calls", "attrs", "gpu"):
            a, b = counts[lo][part][kind], counts[hi][part][kind]
            sites = {k: (b.get(k, 0) - a.get(k, 0)) / per for k in sorted({*a, *b})
                     if b.get(k, 0) != a.get(k, 0)}
            out[f"{part}.{kind}"] = {"per_expert_linear": sum(sites.values()), "sites": sites}
    return out


def ddlsim_charge_us() -> dict:
    """What ddlsim charges per further local expert and layer (µs, fc1 and fc2), from this
    result (:data:`~ddlsim.workloads.decoder.moe_host_chain.GROUPED_LINEAR_FWD_S` and
    ``_BWD_S``), and what it charged before: the backward's
    ``2 × GROUPED_LINEAR_BWD_OPS`` counted calls at the dgx-h100 preset's host rule."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import validate_moe as vm

    import ddlsim
    from ddlsim.simulator.kernels.host import launch_costs
    from ddlsim.software import resolve_software
    from ddlsim.workloads.decoder import moe_host_chain as chain
    cfg = ddlsim.load_config(vm.config(vm.zoo_rows()[0]))
    op_s = launch_costs(cfg.system.device.launch, resolve_software(vm.STACK).host_dispatch).host_s
    return {"fwd": 2 * chain.GROUPED_LINEAR_FWD_S * 1e6,
            "bwd": 2 * chain.GROUPED_LINEAR_BWD_S * 1e6,
            "counted_bwd": 2 * chain.GROUPED_LINEAR_BWD_OPS * op_s * 1e6, "op_us": op_s * 1e6,
            "ops": 2 * chain.GROUPED_LINEAR_BWD_OPS}


def table(data: dict, checks: tuple = ()) -> str:
    """The result beside ddlsim's charge (and the slopes of the shape ``checks``), as text."""
    r, charge = per_expert(data), ddlsim_charge_us()
    shape = data["shape"]
    lines = ["Transformer Engine GroupedLinear (fc1 + fc2, BF16, fuse_wgrad_accumulation, "
             "Megatron DDP hooks), host µs per pass, thread CPU time, GEMMs taken out; "
             f"hidden {shape['hidden']}, expert FFN {shape['ffn']}",
             f"{'local experts':>14} {'forward':>9} {'backward':>9} {'of which: fwd body':>19} "
             f"{'bwd body':>9} {'DDP hooks':>10}"]
    for e, h in r["host"].items():
        lines.append(f"{e:>14} {h['fwd']:9.1f} {h['bwd']:9.1f} {h['fwd_body']:19.1f} "
                     f"{h['bwd_body']:9.1f} {h['hook']:10.1f}")
    s = r["slope"]
    lines.append(f"{'per expert':>14} {s['fwd']:9.2f} {s['bwd']:9.2f} {s['fwd_body']:19.2f} "
                 f"{s['bwd_body']:9.2f} {s['hook']:10.2f}")
    for other in checks:
        o, sh = per_expert(other)["slope"], other["shape"]
        lines.append(f"{'(h ' + str(sh['hidden']) + ', f ' + str(sh['ffn']) + ')':>14} "
                     f"{o['fwd']:9.2f} {o['bwd']:9.2f} {o['fwd_body']:19.2f} "
                     f"{o['bwd_body']:9.2f} {o['hook']:10.2f}   (shape check, per expert)")
    rr = r["rounds_range"]
    lines.append(f"{'rounds':>14} {rr['fwd'][0]:4.1f}-{rr['fwd'][1]:<4.1f} "
                 f"{rr['bwd'][0]:4.1f}-{rr['bwd'][1]:<4.1f}   (per expert, the rounds' own slopes)")
    lines.append(f"ddlsim charges per further expert (moe_host_chain): forward "
                 f"{charge['fwd']:.1f} µs, backward {charge['bwd']:.1f} µs; before this result "
                 f"forward nothing, backward {charge['counted_bwd']:.1f} µs ({charge['ops']} "
                 f"counted calls × {charge['op_us']:.1f} µs)")
    total = s["fwd"] + s["bwd"]
    lines.append(f"measured forward + backward per expert {total:.1f} µs: "
                 f"{total / GAP_SLOPE_US[1]:.0%}-{total / GAP_SLOPE_US[0]:.0%} of the published "
                 f"runs' {GAP_SLOPE_US[0]:.0f}-{GAP_SLOPE_US[1]:.0f} µs per expert")
    lines.append("calls per local expert and linear (counted pass):")
    for key, v in r["counts"].items():
        sites = ", ".join(f"{k} {n:g}" for k, n in v["sites"].items())
        lines.append(f"  {key:10s} {v['per_expert_linear']:g}" + (f"  ({sites})" if sites else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--te", type=Path, help="a TransformerEngine source tree (v2.9)")
    ap.add_argument("--te-commit", help="its commit, where the tree is not a git checkout")
    ap.add_argument("--megatron", type=Path, help="a Megatron-LM source tree (d7288711)")
    ap.add_argument("--megatron-commit", help="its commit, where it is not a git checkout")
    ap.add_argument("--passes", type=int, default=201, help="timed passes per round")
    ap.add_argument("--warmup", type=int, default=20, help="untimed passes before each round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds over every configuration")
    ap.add_argument("--shape", type=int, nargs=2, default=SHAPE, metavar=("HIDDEN", "FFN"),
                    help=f"the expert shape (default {SHAPE[0]} {SHAPE[1]})")
    ap.add_argument("--save", action="store_true", help="write the result file of the shape")
    args = ap.parse_args(argv)
    if args.te is None:
        checks = tuple(json.loads(result_path(*s).read_text()) for s in SHAPE_CHECKS
                       if result_path(*s).is_file())
        print(table(json.loads(result_path(*SHAPE).read_text()), checks))
        return 0
    if args.megatron is None:
        raise SystemExit("te_grouped_host: --te needs --megatron (Megatron-LM's DDP hook code)")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    before = _load()
    data = measure(args.te, args.megatron, args.passes, args.warmup, args.rounds,
                   tuple(args.shape))
    data["provenance"] = {
        "te_commit": _commit(args.te, args.te_commit, "--te-commit"),
        "megatron_commit": _commit(args.megatron, args.megatron_commit, "--megatron-commit"),
        "torch": data.pop("torch"), "python": platform.python_version(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": _cpu(), "load_before": before, "load_after": _load(),
        "passes": args.passes, "warmup": args.warmup, "rounds": args.rounds,
        "tokens_per_expert": list(TOKENS), "local_experts": list(LOCAL_EXPERTS),
        "stand_ins": "benchmarks/data/te_grouped_host/README.md",
        "command": "python benchmarks/te_grouped_host.py --te <TransformerEngine v2.9> "
                   f"--megatron <Megatron-LM d7288711> --shape {args.shape[0]} {args.shape[1]} "
                   f"--passes {args.passes} --warmup {args.warmup} --rounds {args.rounds} "
                   "--save"}
    print(table(data))
    if args.save:
        DATA.mkdir(parents=True, exist_ok=True)
        result_path(*args.shape).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return 0


def _cpu() -> str:
    """The CPU's model name (lscpu)."""
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((ln.split(":", 1)[1].strip() for ln in out.splitlines()
                 if ln.startswith("Model name")), platform.processor())


if __name__ == "__main__":
    raise SystemExit(main())
