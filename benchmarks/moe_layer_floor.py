"""Per MoE layer and micro-batch: the published runs of validate_moe against ddlsim's parts.

Run:  python benchmarks/moe_layer_floor.py [--markdown]

For each row that ``validate_moe.py`` predicts (analytical engine), the step time divided by
``L/PP · m`` (layers per pipeline rank × micro-batches per pipeline, ``m = GBS / (MBS · DP)``),
for the published time and for each part of ddlsim's breakdown: compute, exposed EP
(all-to-all) communication, the other exposed communication (TP, PP, DP), and the bubble with
the optimizer step; ``gap`` is published minus predicted (the long-context rows' published
time is validate_moe's, from their TFLOP/s by Megatron's FLOP count). With it, the local
experts per rank and the tokens each computes (``n = etp · ep · T · k / E``,
``T = MBS · seq / (CP · TP)``: the sequence-parallel shard a rank routes, forced balance).
Nothing is fitted; the script only divides what ``validate_moe`` already prints (docs/moe.md, "A per-layer floor in the published
runs"). ``per-expert host`` is the host time per layer and micro-batch that ddlsim counts for
the local experts' Transformer Engine grouped linears, measured in TE's own code
(:func:`expert_host_ms`), to set beside
the gap's growth with the local experts. ``random-routing excess`` is how much more than the
mean the most loaded expert-parallel rank computes when the rows' forced balance routes as
Megatron-Core's benchmark mode does, by random logits (:func:`random_routing_excess`, an
independent check: the ranks taken independent, an upper bound), which ddlsim's forced balance
derives since 2026-12-01 (decoder/moe_balance.py ``random_routing_load``; until then it took
exact balance): the size of that effect, to set beside the gap.
``host-bound ms`` is how much of ddlsim's own prediction the host sets: the row predicted
again with ``host_dispatch: cuda_graphs`` (no per-op host time; the dispatcher's sync wakes
and the TE modules' fixed host time stay), the difference per layer and micro-batch
(:func:`host_bound_ms`), to set beside the published runs' CUDA-graph gains
(docs/moe.md, "Published breakdowns, searched").
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import validate_moe as vm
from public_runs import print_table, time_record

HF = Path(__file__).resolve().parents[1] / "ddlsim" / "data" / "hf"


def _model(preset: str) -> dict:
    """The preset's config.json (layers, experts, top-k)."""
    return json.loads((HF / f"{preset}.json").read_text())


def layer_parts(o: dict) -> dict:
    """One predicted row's per-layer figures, in milliseconds (module docstring)."""
    row, r = o["row"], o["result"]
    hf = _model(row["preset"])
    tp, cp, ep, mbs, seq = (int(row[k]) for k in ("tp", "cp", "ep", "mbs", "seq"))
    etp = int(row.get("etp") or 1)
    per = per_layer_ms(row)
    b = r.breakdown
    tokens = mbs * seq / (cp * tp)
    return {"local": hf["num_experts"] // ep,
            "n": etp * ep * tokens * hf["num_experts_per_tok"] / hf["num_experts"],
            "published": o["published"] * per, "predicted": o["predicted"] * per,
            "compute": b.compute_s * per, "ep": b.exposed_comm_s.get("ep", 0.0) * per,
            "other": sum(v for k, v in b.exposed_comm_s.items() if k != "ep") * per,
            "bubble": (b.bubble_s + b.optimizer_s) * per,
            "gap": (o["published"] - o["predicted"]) * per}


def per_layer_ms(row: dict) -> float:
    """Milliseconds per layer and micro-batch in one second of ``row``'s step: ``1e3 / (L/PP ·
    m)``, ``m = GBS / (MBS · DP)`` (the module docstring's divisor)."""
    hf = _model(row["preset"])
    gpus, tp, pp, cp, mbs, gbs = (int(row[k]) for k in ("gpus", "tp", "pp", "cp", "mbs", "gbs"))
    return 1e3 / (hf["num_hidden_layers"] / pp * gbs / (mbs * gpus // (tp * pp * cp)))


def graphed_config(cfg: dict) -> dict:
    """``cfg`` with the stack's host dispatch set to CUDA graphs (no per-op host time)."""
    software = cfg["system"]["software"]
    kernels = {**software.get("kernels", {}), "host_dispatch": "cuda_graphs"}
    return {**cfg, "system": {**cfg["system"], "software": {**software, "kernels": kernels}}}


def host_bound_ms(o: dict, graphed_s: float) -> float:
    """Milliseconds per layer and micro-batch of ``o``'s prediction that its host time sets:
    the eager prediction less ``graphed_s``, the same row under :func:`graphed_config`."""
    return (o["predicted"] - graphed_s) * per_layer_ms(o["row"])


def _graphed_s(row: dict) -> float:
    """``row`` predicted (analytical) under :func:`graphed_config`, seconds."""
    cfg = graphed_config(vm.config(row))
    return time_record(row, cfg, "analytical", None, vm.published_time(row))["predicted"]


def expert_host_ms(local: int) -> float:
    """Host milliseconds per layer and micro-batch that ddlsim charges for ``local`` experts'
    two Transformer Engine grouped linears beyond one expert's: forward
    :data:`~ddlsim.workloads.decoder.moe_host_chain.GROUPED_LINEAR_FWD_S` per linear and
    expert past the first, backward :data:`~ddlsim.workloads.decoder.moe_host_chain.
    GROUPED_LINEAR_BWD_S` per linear and expert (both measured in TE's own code:
    benchmarks/te_grouped_host.py)."""
    from ddlsim.workloads.decoder.moe_host_chain import GROUPED_LINEAR_BWD_S, GROUPED_LINEAR_FWD_S
    return 2 * (local * GROUPED_LINEAR_BWD_S + max(local - 1, 0) * GROUPED_LINEAR_FWD_S) * 1e3


def expected_max_normal(n: int) -> float:
    """``E[max(Z_1 … Z_n)]`` of ``n`` independent standard normals,
    ``∫ x·n·φ(x)·Φ(x)^(n−1) dx`` on a fixed grid (deterministic; 1/√π for ``n`` = 2)."""
    from scipy.special import ndtr
    x = np.linspace(-12.0, 12.0, 48_001)
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    return float(np.trapezoid(x * n * pdf * ndtr(x) ** (n - 1), x))


def random_routing_excess(ranks: int, tokens: float, experts: int, top_k: int,
                          ep: int) -> float:
    """Expected load of the most loaded of ``ep`` expert-parallel ranks over the mean, less 1,
    when each of the ``ranks × tokens`` routed tokens picks ``top_k`` distinct experts of
    ``experts`` uniformly at random (``experts/ep`` on each rank).

    Megatron-Core's ``--moe-router-force-load-balancing`` replaces the router's logits by
    normal noise (``RandomSTE``), so each token's top-k is a uniform random subset: balanced
    in expectation, not exactly. A token's copies on one rank are hypergeometric
    (``k`` draws from ``E`` with ``x = E/ep`` marked): mean ``k·x/E``, variance
    ``k·(x/E)·(1 − x/E)·(E − k)/(E − 1)``; a rank's load over ``ranks × tokens`` tokens is
    then near-normal, and the hottest of ``ep`` sits :func:`expected_max_normal` standard
    deviations above the mean (the ranks taken independent: their loads' fixed sum makes
    this an upper bound).

    Parameters
    ----------
    ranks : int
        ranks of the dispatch group that route tokens to each expert (``etp · ep``).
    tokens : float
        tokens each of them routes per micro-batch and layer (``T``).
    experts, top_k, ep : int
        experts ``E``, experts per token ``k``, expert-parallel size.

    Returns
    -------
    float
        the relative excess of the hottest rank (0.014: 1.4 % more than the mean).

    References
    ----------
    NVIDIA/Megatron-LM 1e057005 ``megatron/core/transformer/moe/moe_utils.py`` lines 785-822
    (``RandomSTE``: ``logits.clone().normal_()``), ``router.py`` lines 449-451 (applied when
    ``moe_router_force_load_balancing``); d7288711 ``moe_utils.py`` lines 1194-1231 (the same
    under the expert-parallel RNG tracker; ``router.py`` lines 697-699).
    """
    share = (experts // ep) / experts
    var = top_k * share * (1.0 - share) * (experts - top_k) / (experts - 1)
    mean = top_k * share
    n = ranks * tokens
    return expected_max_normal(ep) * math.sqrt(n * var) / (n * mean)


def _excess(row: dict) -> float:
    """:func:`random_routing_excess` of a validate_moe row."""
    hf = _model(row["preset"])
    ep, etp = int(row["ep"]), int(row.get("etp") or 1)
    tokens = int(row["mbs"]) * int(row["seq"]) / (int(row["cp"]) * int(row["tp"]))
    return random_routing_excess(etp * ep, tokens, hf["num_experts"],
                                 hf["num_experts_per_tok"], ep)


def _label(row: dict) -> str:
    if row["set"] == "modelzoo":
        return f"ModelZoo row {row['row']}"
    if row["set"] == "long":
        return f"ModelZoo {row['row']} {row['routing']}"
    if row["set"] == "ab":
        return f"Bridge A/B {row['model']} {row['run']}"
    return f"Bridge {row['model']} {row['release']}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args(argv)
    head = ["run", "dispatcher", "TP", "EP", "overlap", "local experts", "tokens/expert",
            "published ms", "predicted ms", "compute", "exposed EP", "other comm",
            "bubble+opt", "gap ms", "per-expert host ms", "host-bound ms",
            "random-routing excess"]
    lines = []
    for o in vm.evaluate("analytical"):
        if o["result"] is None:
            continue
        row, p = o["row"], layer_parts(o)
        lines.append([_label(row), row["dispatcher_as_run"], row["tp"], row["ep"],
                      row["a2a_overlap"], str(p["local"]), f"{p['n']:.0f}"]
                     + [f"{p[k]:.2f}" for k in ("published", "predicted", "compute", "ep",
                                                 "other", "bubble", "gap")]
                     + [f"{expert_host_ms(p['local']):.2f}",
                        f"{host_bound_ms(o, _graphed_s(row)):.2f}",
                        f"{100 * _excess(row):.1f}%"])
    print_table(head, lines, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
