"""How many torch operations one Megatron-Core MoE layer runs on the host, measured by running
Megatron-LM's own ``MoELayer`` on CPU, beside what ddlsim's trace carries for the same layer.

Run:  python benchmarks/moe_host_ops.py                      (table from the committed counts)
      PYTHONPATH=<torch> python benchmarks/moe_host_ops.py --megatron <Megatron-LM checkout>
          --commit 1e057005 [--local-experts 4 16] [--save]  (count again; needs torch, einops)

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
spec's ``SequentialMLP``, not the ``GroupedLinear`` that ran. Host µs (thread CPU time) are this
CPU's, eager kernels inline: a side figure, never a model constant.

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
    import subprocess
    head = subprocess.run(["git", "-C", str(megatron), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    if not head.startswith(commit):
        raise SystemExit(f"moe_host_ops: the checkout is at {head or 'no commit'}, not {commit}")
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
    args = ap.parse_args(argv)
    if args.megatron is not None:
        if args.commit is None:
            raise SystemExit("moe_host_ops: --megatron needs --commit (1e057005 or d7288711)")
        for local in args.local_experts:
            result = count(args.megatron, args.commit, local)
            if args.save:
                (DATA / f"{args.commit}_{local}.json").write_text(
                    json.dumps(result, indent=1, sort_keys=True) + "\n")
    rows = [r for c in sorted(COMMITS) for n in args.local_experts
            if (DATA / f"{c}_{n}.json").is_file() for r in table(c, n)]
    widths = [max(len(str(x)) for x in col) for col in zip(HEADER, *rows)]
    for r in [HEADER, *rows]:
        print("  ".join(str(x).rjust(w) for x, w in zip(r, widths)))
    print("\nmeasured: unfused router and permutation, SequentialMLP experts (the rows ran TE's "
          "fused paths and GroupedLinear); fwd calls include the GPU path's CUDA calls")


if __name__ == "__main__":
    main()
