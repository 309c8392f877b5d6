"""How many torch operations one Megatron-Core MoE layer runs on the host, measured by running
Megatron-LM's own ``MoELayer`` on CPU, beside what ddlsim's trace carries for the same layer.

Run:  python benchmarks/moe_host_ops.py                      (table from the committed counts)
      PYTHONPATH=<torch> python benchmarks/moe_host_ops.py --megatron <Megatron-LM checkout>
          --commit 1e057005 [--local-experts 4 16] [--save]  (count again; needs torch, einops)
          [--time [--passes 61]]        (time the parts' host work instead: moe_host_ops_timing)
      python benchmarks/moe_host_ops.py --write-data   (ddlsim/data/moe_host_measured.yaml from
          the committed timings: :func:`data_file`)

The count (``moe_host_ops_megatron.worker``) builds ``MoELayer`` with Megatron's local (non-TE)
spec as the validated rows configure it: top-8, softmax, forced balance (``RandomSTE``),
aux-loss balancing (coefficient 1e-3), the ``alltoall`` dispatcher, TP 2 with sequence
parallelism and EP 2 with expert TP 1 (MoE parallel folding) on two gloo ranks, bf16, the router
in fp32 at 1e057005 (the ModelZoo rows) and in bf16 at d7288711 (the Bridge rows),
``num_moe_experts`` = 2 x the local experts (the counts depend on the local experts, not on E or
EP). Tiny shapes (16 tokens, hidden 64): the count is a property of the code. It counts, per
part of the layer (``router``, ``dispatch``, ``experts``, ``combine``), the forward's calls into
torch (a ``TorchFunctionMode``: torch functions, tensor methods, ``torch.distributed`` calls;
plus each ``autograd.Function.apply``; not attribute reads) and its ATen ops (a
``TorchDispatchMode``: ``kernel`` ops, which launch on a GPU, apart from views, allocations and
c10d), and the backward's autograd nodes (tagged with the part that created them) and ATen ops.

Patched to run on CPU: the CUDA stream, event, device and RNG calls and the dispatcher's
device-to-host copies (stand-ins that count the calls a GPU run makes, ``gpu_calls``), a stub
for a module that imports triton, ``TORCHDYNAMO_DISABLE=1``; each is listed in
``data/moe_host_ops/README.md``. Unfused paths only: permute and router fusion are CUDA
kernels, so both run their torch fallbacks (the rows ran them fused); the experts are the local
spec's ``SequentialMLP``, not the ``GroupedLinear`` that ran. The count's host µs (thread CPU
time, eager kernels inline) are a side figure. ``--time`` measures, per part and pass, the host
seconds the GPU path would spend (:func:`host_seconds`: the transport's CPU time and the CPU
kernels' own execution taken out), which ddlsim charges per counted call
(``ddlsim.workloads.decoder.moe_host_measured.measured_host``).

ddlsim's column: one layer's forward and backward ops of Qwen3-235B-A22B on dgx-h100 with the
same router, EP 128/local experts (:func:`ddlsim_parts`): the host operations its host rule
charges (the dispatcher's counted work,
:data:`~ddlsim.workloads.decoder.moe_host.DISPATCHER_HOST`, split by part as its ``source``
gives it, and the backward's per-expert host ops) and the kernels of its device ops in each
part, whose launches the same rule times.
"""

from __future__ import annotations

import argparse
import collections
import json
from datetime import date
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "moe_host_ops"
#: the token counts of the timed passes: the tiny shape and eight times it (:func:`host_seconds`)
TOKENS = (16, 128)
PARTS = ("router", "dispatch", "experts", "combine")
#: the commits the rows ran (benchmarks/data/modelzoo_h100_moe.csv rows 3-5, Megatron-Bridge
#: v0.4.0's pin: bridge_h100_moe.csv) -> the router each ran: the ModelZoo's unfused router in
#: fp32 (validate_moe.ZOO_ROUTER), Bridge's fused one (validate_moe.BRIDGE_ROUTER)
COMMITS = {"1e057005": {"router_dtype": "fp32", "router_fusion": False},
           "d7288711": {"router_dtype": None, "router_fusion": True}}
#: DISPATCHER_HOST["alltoall"]'s counted forward work by part, as its ``source`` gives it
#: (router 16; dispatch_preprocess 36, the probs' all_to_all 4, the tokens' 4 (``issue_ops``),
#: dispatch_postprocess 2; experts 3; combine_preprocess 3, token_combine 4, postprocess 2)
ALLTOALL_SPLIT = {"router": 16, "dispatch": 36 + 4 + 4 + 2, "experts": 3, "combine": 3 + 4 + 2}
#: ddlsim's op names (after ``fwd.``/``bwd.``) -> part
OP_PART = {"router": "router", "permute": "dispatch", "dispatch": "dispatch", "sort": "dispatch",
           "experts": "experts", "unsort": "combine", "combine": "combine",
           "unpermute": "combine"}


def checkout_commit(megatron: Path, commit: str) -> str:
    """The commit of the Megatron-LM tree at ``megatron``: its git HEAD, or for a tree exported
    without git (``git archive``, as carried to a lent GPU) the full hash in its
    ``MEGATRON_COMMIT`` file; SystemExit unless it is ``commit``."""
    import subprocess
    head = subprocess.run(["git", "-C", str(megatron), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    stamp = megatron / "MEGATRON_COMMIT"
    if stamp.is_file() and not (megatron / ".git").exists():
        head = stamp.read_text().strip()
    if not head.startswith(commit):
        raise SystemExit(f"moe_host_ops: the checkout is at {head or 'no commit'}, not {commit}")
    return head


def count(megatron: Path, commit: str, local: int) -> dict:
    """Run ``moe_host_ops_megatron.worker`` on two gloo ranks over the Megatron-LM checkout
    ``megatron`` (at ``commit``) with ``local`` local experts; its counts with provenance."""
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        raise SystemExit(f"moe_host_ops: torch is needed to count ({e}); put it on PYTHONPATH")
    if not (megatron / "megatron" / "core" / "transformer" / "moe" / "moe_layer.py").is_file():
        raise SystemExit(f"moe_host_ops: --megatron {megatron} is not a Megatron-LM checkout "
                         "(no megatron/core/transformer/moe/moe_layer.py)")
    head = checkout_commit(megatron, commit)
    out = DATA / f".{commit}_{local}.tmp.json"
    from moe_host_ops_megatron import worker
    mp.spawn(worker, args=(2, str(megatron), local, COMMITS[commit]["router_dtype"], str(out)),
             nprocs=2)
    result = json.loads(out.read_text())
    out.unlink()
    result["provenance"] = {
        "megatron_commit": head, "local_experts": local, "torch": torch.__version__,
        "date": date.today().isoformat(), "ranks": "2 gloo (TP 2, EP 2, expert TP 1)",
        "patched": "benchmarks/data/moe_host_ops/README.md"}
    return result


def time_host(megatron: Path, commit: str, local: int, passes: int) -> dict:
    """Run ``moe_host_ops_megatron.timing_worker`` on two gloo ranks (as :func:`count`) at
    :data:`TOKENS` tokens, ``passes`` timed passes each; its medians with provenance."""
    import platform
    import subprocess

    import torch
    import torch.multiprocessing as mp
    head = checkout_commit(megatron, commit)
    out = DATA / f".{commit}_{local}.time.tmp.json"
    from moe_host_ops_timing import timing_worker
    mp.spawn(timing_worker, args=(2, str(megatron), local, COMMITS[commit]["router_dtype"],
                                  str(out), passes, TOKENS), nprocs=2)
    result = json.loads(out.read_text())
    out.unlink()
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((ln.split(":", 1)[1].strip() for ln in cpu.splitlines()
                  if ln.startswith("Model name")), platform.processor())
    result["provenance"] = {
        "megatron_commit": head, "local_experts": local, "torch": torch.__version__,
        "date": date.today().isoformat(), "ranks": "2 gloo (TP 2, EP 2, expert TP 1)",
        "cpu": model, "passes": passes, "tokens": list(TOKENS),
        "patched": "benchmarks/data/moe_host_ops/README.md",
        "command": f"python benchmarks/moe_host_ops.py --megatron <Megatron-LM at {commit}> "
                   f"--commit {commit} --local-experts {local} --time --save"}
    return result


def host_seconds(data: dict) -> dict:
    """Per part (router, dispatch, combine) and pass (fwd, bwd): the host seconds the GPU path
    would spend, from a timing file (:func:`time_host`). At ``T`` and ``rT`` tokens each
    part's thread CPU time less its :data:`~moe_host_ops_timing.C10D` calls' (gloo's
    transport; on a GPU NCCL launches, which ddlsim charges per collective) and, in the
    backward, less the timing hook's cost per node (the hooked backward's total less the bare
    one's, per hooked node): ``x(T)``. The CPU kernels' own execution grows with the tokens,
    the host's glue does not: the kernels' share at ``T`` is ``(x(rT) − x(T))/(r − 1)``
    (``kernels_s``), the glue ``x(T)`` less it (``host_s``).
    """
    t = data["timing"]
    small, large = (str(n) for n in sorted(int(k) for k in t))
    part = lambda label: label.removeprefix("bwd.").split(".")[0]    # noqa: E731

    def x(run: dict) -> dict:
        tot = run["bwd_total_us"]
        per_node = (tot["hooks"] - tot["bare"]) / max(1, sum(run["bwd_nodes"].values()))
        out = collections.Counter()
        for label, us in run["us"].items():
            if part(label) not in ("router", "dispatch", "combine"):
                continue
            key = ("bwd" if label.startswith("bwd.") else "fwd", part(label))
            out[key] += us - run["c10d_us"].get(label, 0.0) \
                - run["bwd_nodes"].get(label, 0) * per_node
        return out
    a, b, r = x(t[small]), x(t[large]), int(large) / int(small)
    kernels = {key: (b[key] - a[key]) / (r - 1) for key in a}
    return {f"{k}.{p}": {"host_s": round((a[k, p] - kernels[k, p]) * 1e-6, 7),
                         "kernels_s": round(kernels[k, p] * 1e-6, 7)} for k, p in sorted(a)}


#: the package's data file of measured host seconds (ddlsim.workloads.decoder.moe_host_chain)
PACKAGE_DATA = DATA.parents[2] / "ddlsim" / "data" / "moe_host_measured.yaml"
#: what each commit is, for the data file
CODE_NOTE = {"1e057005": "Megatron-MoE-ModelZoo step-time rows 3-5's main(1e057005), 2025-05-24; "
                         "router in fp32",
             "d7288711": "Megatron-Bridge v0.4.0's pin, 2026-04-09; router in the layer's bf16"}
DATA_HEADER = """\
# Host seconds of one Megatron-Core MoE layer's router, dispatch and combine, per pass, measured
# by running Megatron-LM's own MoELayer on CPU (benchmarks/moe_host_ops.py --time; written by
# its --write-data from benchmarks/data/moe_host_ops/<commit>_<local>{,_host_s}.json; what was
# patched to run on CPU: benchmarks/data/moe_host_ops/README.md). ddlsim charges them per
# counted call (ddlsim/workloads/decoder/moe_host_measured.py measured_host).
#
# host_s: the thread CPU seconds of the part (median of the timed passes) less those inside
#   torch.distributed calls (gloo's transport; on a GPU NCCL launches, which ddlsim charges per
#   collective), less the CPU kernels' own execution (kernels_s: from the same part at 8x the
#   tokens, (x(8T) - x(T)) / 7), the backward's also less the timing hook's own cost per node;
#   no CUDA launch is in them (the CPU run makes none: ddlsim's device ops carry their kernels'
#   launches).
# calls: the forward's calls into torch of the part, the GPU path's CUDA calls included
#   (benchmarks/data/moe_host_ops/<commit>_<local>.json), the count the seconds are per.
# Unfused router and permutation (both are CUDA kernels when fused), SequentialMLP experts
#   (not timed: TE's GroupedLinear is what the rows ran).
# The CPU: this machine's, a KVM guest of an AMD EPYC (family 25 model 17: Zen 4) on 2 cores;
#   the validated runs' hosts are DGX H100s (2 x Xeon Platinum 8480C). No published
#   single-thread comparison of the two was found: their per-thread speed is taken as equal
#   (ratio 1), not scaled.
"""


def data_file() -> dict:
    """The package data file's content (:data:`PACKAGE_DATA`) from the committed counts and
    timings: per commit and local experts, each part's forward calls, host and CPU kernel
    seconds per pass, with provenance."""
    out = {}
    for commit in sorted(COMMITS):
        runs = {}
        for local in (4, 16):
            timing = json.loads((DATA / f"{commit}_{local}_host_s.json").read_text())
            counts = measured(json.loads((DATA / f"{commit}_{local}.json").read_text()))
            secs, prov = host_seconds(timing), timing["provenance"]
            runs[local] = {
                "calls": {p: counts[p]["calls"] for p in ("router", "dispatch", "combine")},
                **{key: {pss: {p: secs[f"{pss}.{p}"][key] for p in ("router", "dispatch",
                                                                     "combine")}
                         for pss in ("fwd", "bwd")} for key in ("host_s", "kernels_s")},
                "provenance": {**{k: prov[k] for k in (
                    "megatron_commit", "torch", "cpu", "date", "passes", "tokens", "ranks",
                    "patched", "command")},
                    "files": f"benchmarks/data/moe_host_ops/{commit}_{local}{{,_host_s}}.json"}}
        out[commit] = {"megatron": f"NVIDIA/Megatron-LM {runs[4]['provenance']['megatron_commit']}"
                                   f" ({CODE_NOTE[commit]})", "local_experts": runs}
    return {"code": out}


def measured(data: dict) -> dict:
    """Per part: the forward's calls and GPU-only calls, ATen kernel ops and thread CPU µs on
    the CPU that counted (a side figure); the backward's autograd nodes and ATen kernel ops."""
    t = collections.defaultdict(collections.Counter)
    part = lambda label: label.removeprefix("bwd.").split(".")[0]    # noqa: E731
    for k, v in data["fwd"]["calls"].items():
        t[part(k)]["calls"] += v
    for k, v in data["fwd"]["gpu_calls"].items():
        t[part(k.split("|")[0])]["calls"] += v
    for d, key in (("fwd", "kernels"), ("bwd", "bwd_kernels")):
        for k, v in data[d]["aten"].items():
            label, kind = k.split("|")
            t[part(label)][key] += v if kind == "kernel" else 0
    for k, v in data["bwd"]["nodes"].items():
        t[part(k)]["nodes"] += v
    for k, v in data.get("fwd_part_us", {}).items():
        t[part(k)]["us"] += v
    return t


def ddlsim_parts(commit: str, local: int) -> dict:
    """Per part of one layer in ddlsim's trace: forward host operations and kernels, backward
    host operations and kernels (Qwen3-235B-A22B, dgx-h100, EP 128/``local``, the commit's
    router)."""
    import warnings

    import ddlsim
    from ddlsim.workloads.decoder.moe_host import DISPATCHER_HOST, dispatcher_host
    from ddlsim.workloads.decoder.moeplan import resolve_moe
    ep = 128 // local
    router = {"router_fusion": COMMITS[commit]["router_fusion"],
              "router_dtype": COMMITS[commit]["router_dtype"]}
    cfg = {"model": {"preset": "qwen3-235b-a22b", "num_hidden_layers": 2},
           "parallel": {"expert_model_parallel_size": ep, "expert_tensor_parallel_size": 1,
                        "moe": {"token_dispatcher_type": "alltoall", "grouped_gemm": True,
                                "permute_fusion": True, "router_force_load_balancing": True,
                                "aux_loss_coeff": 1e-3,
                                **{k: v for k, v in router.items() if v is not None}}},
           "train": {"micro_batch_size": 1, "global_batch_size": ep, "seq_length": 4096,
                     "dtype": "bf16"},
           "system": {"preset": "dgx-h100", "nodes": ep // 8,
                      "software": {"stack": "megatron-core-2025"}}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = ddlsim.load_config(cfg)
        w = ddlsim.build_workload(loaded)
    host, base = dispatcher_host(resolve_moe(loaded)), DISPATCHER_HOST["alltoall"]
    if sum(ALLTOALL_SPLIT.values()) != base.work_ops + sum(x.issue_ops for x in base.waits):
        raise RuntimeError("ALLTOALL_SPLIT no longer sums to DISPATCHER_HOST['alltoall']")
    t = collections.defaultdict(collections.Counter)
    for part, n in ALLTOALL_SPLIT.items():
        t[part]["host"] = n
    t["router"]["host"] += host.work_ops - base.work_ops
    blocks = w.classes[0].program.blocks        # one micro-batch's forward and backward
    ops = [o for name in ("F0", "B0") for o in blocks[name].flat.ops]
    for o in ops:
        pre, _, rest = o.payload.name.partition(".")
        part = OP_PART.get(rest.split(".")[0])
        if part is None or pre not in ("fwd", "bwd") or (pre, o.stream) == ("fwd", "host"):
            continue            # the forward's host work is ALLTOALL_SPLIT's
        key = ("" if pre == "fwd" else "bwd_") + ("host" if o.stream == "host" else "kernels")
        t[part][key] += len(getattr(o.payload, "kernels", ()) or ())
    layers = max(1, sum(1 for o in ops if o.payload.name == "fwd.router"))
    return {p: {k: v if k == "host" else v // layers for k, v in c.items()}
            for p, c in t.items()}


def table(commit: str, local: int) -> list[list]:
    """Rows: part, then measured and ddlsim figures side by side."""
    data = json.loads((DATA / f"{commit}_{local}.json").read_text())
    m, d = measured(data), ddlsim_parts(commit, local)
    return [[commit, local, p, m[p]["calls"], d.get(p, {}).get("host", 0),
             m[p]["kernels"], d.get(p, {}).get("kernels", 0), m[p]["nodes"],
             m[p]["bwd_kernels"], d.get(p, {}).get("bwd_kernels", 0),
             d.get(p, {}).get("bwd_host", 0), round(m[p]["us"])] for p in PARTS]


HEADER = ["commit", "local", "part", "fwd calls", "ddlsim host ops", "fwd ATen kernels",
          "ddlsim kernels", "bwd nodes", "bwd ATen kernels", "ddlsim bwd kernels",
          "ddlsim bwd host", "fwd µs (this CPU)"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--megatron", type=Path, help="a Megatron-LM checkout: count again")
    ap.add_argument("--commit", choices=sorted(COMMITS), help="the checkout's commit")
    ap.add_argument("--local-experts", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--save", action="store_true", help="write the counts under data/")
    ap.add_argument("--time", action="store_true",
                    help="with --megatron: time the parts' host work instead of counting")
    ap.add_argument("--passes", type=int, default=61, help="timed passes per token count")
    ap.add_argument("--write-data", action="store_true",
                    help="write ddlsim/data/moe_host_measured.yaml from the timings under data/")
    args = ap.parse_args(argv)
    if args.megatron is not None:
        if args.commit is None:
            raise SystemExit("moe_host_ops: --megatron needs --commit (1e057005 or d7288711)")
        for local in args.local_experts:
            result = (time_host(args.megatron, args.commit, local, args.passes) if args.time
                      else count(args.megatron, args.commit, local))
            name = f"{args.commit}_{local}{'_host_s' if args.time else ''}.json"
            if args.save:
                (DATA / name).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    if args.write_data:
        import yaml
        PACKAGE_DATA.write_text(DATA_HEADER + yaml.safe_dump(data_file(), sort_keys=True,
                                                              width=100))
    rows = [r for c in sorted(COMMITS) for n in args.local_experts
            if (DATA / f"{c}_{n}.json").is_file() for r in table(c, n)]
    widths = [max(len(str(x)) for x in col) for col in zip(HEADER, *rows)]
    for r in [HEADER, *rows]:
        print("  ".join(str(x).rjust(w) for x, w in zip(r, widths)))
    print("\nmeasured: unfused router and permutation, SequentialMLP experts (the rows ran TE's "
          "fused paths and GroupedLinear); fwd calls include the GPU path's CUDA calls")


if __name__ == "__main__":
    main()
