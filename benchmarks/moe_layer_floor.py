"""Per MoE layer and micro-batch: the published runs of validate_moe against ddlsim's parts.

Run:  python benchmarks/moe_layer_floor.py [--markdown]

For each row that ``validate_moe.py`` predicts (analytical engine), the step time divided by
``L/PP · m`` (layers per pipeline rank × micro-batches per pipeline, ``m = GBS / (MBS · DP)``),
for the published time and for each part of ddlsim's breakdown: compute, exposed EP
(all-to-all) communication, the other exposed communication (TP, PP, DP), and the bubble with
the optimizer step; ``gap`` is published minus predicted (the long-context rows' published
time is validate_moe's, from their TFLOP/s by Megatron's FLOP count). With it, the local
experts per rank and the tokens each computes (``n = etp · ep · T · k / E``,
``T = MBS · seq / (CP · TP)``: the sequence-parallel shard a rank routes, forced balance). Nothing is fitted; the script only
divides what ``validate_moe`` already prints (docs/moe.md, "A per-layer floor in the published
runs"). ``per-expert host`` is the host time per layer and micro-batch that ddlsim counts for
the local experts' Transformer Engine grouped linears (:func:`expert_host_ms`), to set beside
the gap's growth with the local experts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import validate_moe as vm
from public_runs import print_table

HF = Path(__file__).resolve().parents[1] / "ddlsim" / "data" / "hf"


def _model(preset: str) -> dict:
    """The preset's config.json (layers, experts, top-k)."""
    return json.loads((HF / f"{preset}.json").read_text())


def layer_parts(o: dict) -> dict:
    """One predicted row's per-layer figures, in milliseconds (module docstring)."""
    row, r = o["row"], o["result"]
    hf = _model(row["preset"])
    gpus, tp, pp, cp, ep, mbs, gbs, seq = (int(row[k]) for k in (
        "gpus", "tp", "pp", "cp", "ep", "mbs", "gbs", "seq"))
    etp = int(row.get("etp") or 1)
    m = gbs / (mbs * gpus // (tp * pp * cp))
    per = 1e3 / (hf["num_hidden_layers"] / pp * m)
    b = r.breakdown
    tokens = mbs * seq / (cp * tp)
    return {"local": hf["num_experts"] // ep,
            "n": etp * ep * tokens * hf["num_experts_per_tok"] / hf["num_experts"],
            "published": o["published"] * per, "predicted": o["predicted"] * per,
            "compute": b.compute_s * per, "ep": b.exposed_comm_s.get("ep", 0.0) * per,
            "other": sum(v for k, v in b.exposed_comm_s.items() if k != "ep") * per,
            "bubble": (b.bubble_s + b.optimizer_s) * per,
            "gap": (o["published"] - o["predicted"]) * per}


def expert_host_ms(local: int, host_op_s: float) -> float:
    """Host milliseconds per layer and micro-batch counted for ``local`` experts' GroupedLinear
    calls into torch (forward none, backward :data:`~ddlsim.workloads.decoder.moe_host_chain.
    GROUPED_LINEAR_BWD_OPS` per expert and linear, fc1 and fc2), at ``host_op_s`` each (the
    device's host rule)."""
    from ddlsim.workloads.decoder.moe_host_chain import GROUPED_LINEAR_BWD_OPS
    return 2 * GROUPED_LINEAR_BWD_OPS * local * host_op_s * 1e3


def _host_op_s() -> float:
    """The dgx-h100 preset's host time per operation under the validate_moe stack's dispatch."""
    import ddlsim
    from ddlsim.simulator.kernels.host import launch_costs
    from ddlsim.software import resolve_software
    cfg = ddlsim.load_config(vm.config(vm.zoo_rows()[0]))
    return launch_costs(cfg.system.device.launch, resolve_software(vm.STACK).host_dispatch).host_s


def _label(row: dict) -> str:
    if row["set"] == "modelzoo":
        return f"ModelZoo row {row['row']}"
    if row["set"] == "long":
        return f"ModelZoo {row['row']} {row['routing']}"
    return f"Bridge {row['model']} {row['release']}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args(argv)
    head = ["run", "dispatcher", "TP", "EP", "overlap", "local experts", "tokens/expert",
            "published ms", "predicted ms", "compute", "exposed EP", "other comm",
            "bubble+opt", "gap ms", "per-expert host ms"]
    lines, host_op_s = [], _host_op_s()
    for o in vm.evaluate("analytical"):
        if o["result"] is None:
            continue
        row, p = o["row"], layer_parts(o)
        lines.append([_label(row), row["dispatcher_as_run"], row["tp"], row["ep"],
                      row["a2a_overlap"], str(p["local"]), f"{p['n']:.0f}"]
                     + [f"{p[k]:.2f}" for k in ("published", "predicted", "compute", "ep",
                                                 "other", "bubble", "gap")]
                     + [f"{expert_host_ms(p['local'], host_op_s):.2f}"])
    print_table(head, lines, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
