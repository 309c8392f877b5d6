"""Where the two engines part on MoE plans: links shared between collective families.

The analytical engine shares a link only among the groups of one collective family issued
together; the discrete-event engine replays every flow, so collectives of different families
that run at once (a gradient bucket's reduction beside the dispatcher's all-to-all, the dense
and the expert reductions) share the NICs and NVLinks they cross. This prints both engines'
iteration time and exposed expert-parallel (``ep``) and data-parallel (``dp``) time for
Qwen3-30B-A3B cut to two layers (16 sequences of 4,096 tokens, micro-batch 1, Megatron-Core
2025, forced balance), with the gradient-reduce overlap on and off:

* on: the buckets' reductions run during the backward, beside the all-to-alls: the DES is the
  slower where they cross the same links;
* off: the dense and then the expert gradients are reduced after the backward, one after the
  other as Megatron-Core calls them (docs/moe.md, "Gradients"): the engines agree.

``--bridge`` adds Bridge's published Qwen3-30B HybridEP row without the EP overlap (48 layers,
1,024 sequences on 16 H100s; the DES takes about half a minute), as
``benchmarks/validate_moe.py`` configures it.

Run: ``python benchmarks/moe_engine_sharing.py [--bridge] [--markdown]``
"""

from __future__ import annotations

import argparse
import copy
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import ddlsim  # noqa: E402
from public_runs import print_table  # noqa: E402

#: (label, nodes, EP, the dispatcher's options)
CASES = [
    ("HybridEP, EP 16 on 2 nodes", 2, 16, {"token_dispatcher_type": "flex",
                                           "flex_dispatcher_backend": "hybridep"}),
    ("HybridEP, EP 8 on 2 nodes", 2, 8, {"token_dispatcher_type": "flex",
                                         "flex_dispatcher_backend": "hybridep"}),
    ("DeepEP, EP 8 on 1 node", 1, 8, {"token_dispatcher_type": "flex",
                                      "flex_dispatcher_backend": "deepep"}),
    ("all-to-all, EP 8 on 2 nodes", 2, 8, {"token_dispatcher_type": "alltoall"}),
]


def config(nodes: int, ep: int, moe: dict, overlap: bool, zero: int = 1) -> dict:
    """The cut Qwen3-30B-A3B run of one case."""
    return {"model": {"preset": "qwen3-30b-a3b", "num_hidden_layers": 2},
            "parallel": {"expert_model_parallel_size": ep, "zero_stage": zero,
                         "overlap_grad_reduce": overlap, "overlap_param_gather": overlap,
                         "moe": {**moe, "grouped_gemm": True, "permute_fusion": True,
                                 "router_force_load_balancing": True}},
            "train": {"micro_batch_size": 1, "global_batch_size": 8 * nodes,
                      "seq_length": 4096},
            "system": {"preset": "dgx-h100", "nodes": nodes,
                       "software": {"stack": "megatron-core-2025"}}}


def both(cfg: dict) -> dict:
    """Both engines' iteration time and exposed ep and dp seconds."""
    loaded = ddlsim.load_config(cfg)
    out = {}
    for engine in ("analytical", "des"):
        r = ddlsim.predict(loaded, engine=engine, check_fit=False)
        out[engine] = (r.iteration_time_s, r.breakdown.exposed_comm_s.get("ep", 0.0),
                       r.breakdown.exposed_comm_s.get("dp", 0.0))
    return out


def rows(bridge: bool) -> list[list[str]]:
    lines = []
    for label, nodes, ep, moe in CASES:
        for overlap in (True, False):
            r = both(config(nodes, ep, moe, overlap))
            a, d = r["analytical"], r["des"]
            lines.append([label, "on" if overlap else "off",
                          f"{a[0] * 1e3:.2f}", f"{d[0] * 1e3:.2f}", f"{100 * (d[0] / a[0] - 1):+.1f}%",
                          f"{a[1] * 1e3:.2f}", f"{d[1] * 1e3:.2f}",
                          f"{a[2] * 1e3:.2f}", f"{d[2] * 1e3:.2f}"])
    if bridge:
        import validate_moe
        row = validate_moe.ab_rows()[0]        # hybridep, no EP overlap
        r = both(validate_moe.ab_config(row))
        a, d = r["analytical"], r["des"]
        lines.append(["Bridge Qwen3-30B HybridEP row (48 layers)", "on",
                      f"{a[0] * 1e3:.0f}", f"{d[0] * 1e3:.0f}", f"{100 * (d[0] / a[0] - 1):+.1f}%",
                      f"{a[1] * 1e3:.0f}", f"{d[1] * 1e3:.0f}",
                      f"{a[2] * 1e3:.1f}", f"{d[2] * 1e3:.1f}"])
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bridge", action="store_true",
                    help="also Bridge's published Qwen3-30B HybridEP row (about 30 s)")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lines = rows(args.bridge)
    print_table(["case", "grad-reduce overlap", "analytical (ms)", "DES (ms)", "DES vs analytical",
                 "ep analytical (ms)", "ep DES (ms)", "dp analytical (ms)", "dp DES (ms)"],
                lines, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
