"""Do the two engines agree without contention? Single collectives on a switch and a ring.

Each case is one collective (op × algorithm × bytes × group size) on a small cluster with
``g`` ranks per node: a non-blocking single switch, or a ring of nodes (a 1-D torus, one hop
between neighbours). The analytical engine times the closed form; the DES replays the
algorithm's phases as routed flows. Where the closed form's assumptions hold (every flow of a
step gets the bandwidth the formula gives it) they must agree within 1 %; where they do not
(multi-hop flows on a ring share links) the DES is slower, as it should be.

Run:  python benchmarks/engine_agreement.py [--full]   (from the repository root)

It prints the tables quoted in docs/engines.md: single collectives, GPT on one DGX node, the
wiki's 9-rank case, NCCL across nodes, single-node plans, and the bundled examples (``--full``
adds the examples whose DES takes a minute or more). The cases are built by ``tests/simulator/scenarios.py``, whose
assertions are ``tests/simulator/test_agreement.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "simulator"))

from ddlsim.api import predict  # noqa: E402
from ddlsim.config import COLLECTIVE_OPS  # noqa: E402
from ddlsim.simulator.collectives import algorithms_for  # noqa: E402
from scenarios import AgreementCase, exact, run_case  # noqa: E402

#: The settings of the table: (label, ranks per node as a function of p, fabric)
SETTINGS = (("switch, 1 rank/node", lambda p: 1, "switch"),
            ("one node (NVSwitch)", lambda p: p, "switch"),
            ("switch, 2 nodes", lambda p: p // 2, "switch"),
            ("ring of nodes", lambda p: 1, "ring"))


def default_cases() -> list[tuple[str, str, float, int, int, str]]:
    """Every op × algorithm, two sizes (64 kB: latency-bound; 256 MB: bandwidth-bound), two
    group sizes, in every :data:`SETTINGS`."""
    out = []
    for op in COLLECTIVE_OPS:
        for algo in algorithms_for(op, "mpi"):
            for _label, g_of, fabric in SETTINGS:
                for p in (4, 8):
                    for n in (64e3, 256e6):
                        out.append((op, algo, n, p, g_of(p), fabric))
    return out


def agreement_table(cases: list[AgreementCase]) -> str:
    """A markdown table: DES − analytical per case."""
    lines = ["| collective | algorithm | bytes | p | ranks/node | fabric | analytical | DES | Δ |",
             "|---|---|---:|---:|---:|---|---:|---:|---:|"]
    for c in cases:
        lines.append(f"| {c.op} | {c.algorithm} | {c.nbytes:.3g} | {c.p} | {c.g} | {c.fabric} | "
                     f"{c.analytical_s * 1e3:.4f} ms | {c.des_s * 1e3:.4f} ms | "
                     f"{100 * c.relative:+.2f}% |")
    return "\n".join(lines)


def _cell(cases: list[AgreementCase]) -> str:
    lo, hi = min(c.relative for c in cases), max(c.relative for c in cases)
    if max(abs(lo), abs(hi)) < 5e-5:
        return "0.00%"
    return f"{100 * lo:+.2f}%" if abs(hi - lo) < 5e-5 else f"{100 * lo:+.2f}% … {100 * hi:+.2f}%"


def summary_table(cases: list[AgreementCase]) -> str:
    """Per op × algorithm and setting, the range of DES / analytical − 1 over sizes."""
    head = "| collective | algorithm | " + " | ".join(s[0] for s in SETTINGS) + " |"
    lines = [head, "|---|---|" + "---:|" * len(SETTINGS)]
    keys = list(dict.fromkeys((c.op, c.algorithm) for c in cases))
    for op, algo in keys:
        cells = []
        for _label, g_of, fabric in SETTINGS:
            mine = [c for c in cases if (c.op, c.algorithm, c.fabric) == (op, algo, fabric)
                    and c.g == g_of(c.p)]
            cells.append(_cell(mine) if mine else "")
        lines.append(f"| {op} | {algo} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: Whole iterations on one DGX A100 node (no contention expected beyond what is noted).
GPT_NODE = {"model": "gpt3-1.3b",
            "train": {"micro_batch_size": 1, "global_batch_size": 16, "seq_length": 2048},
            "system": {"preset": "dgx-a100", "nodes": 1}}
GPT_PLANS = {"TP8": {"tensor_model_parallel_size": 8},
             "TP2×PP2×DP2": {"tensor_model_parallel_size": 2,
                             "pipeline_model_parallel_size": 2},
             "TP2×PP2×DP2, no overlap": {"tensor_model_parallel_size": 2,
                                         "pipeline_model_parallel_size": 2,
                                         "overlap_grad_reduce": False}}


def gpt_table() -> str:
    """GPT-3 1.3B on one DGX A100 node, both engines."""
    lines = ["| plan | analytical | DES | Δ | exposed tp (A / D) | bubble (A / D) |",
             "|---|---:|---:|---:|---:|---:|"]
    for label, plan in GPT_PLANS.items():
        cfg = {**GPT_NODE, "parallel": plan}
        a, d = predict(cfg, "analytical"), predict(cfg, "des")
        lines.append(
            f"| {label} | {a.iteration_time_s * 1e3:.3f} ms | {d.iteration_time_s * 1e3:.3f} ms |"
            f" {100 * (d.iteration_time_s / a.iteration_time_s - 1):+.3f}% | "
            f"{a.breakdown.exposed_comm_s['tp'] * 1e3:.3f} / "
            f"{d.breakdown.exposed_comm_s['tp'] * 1e3:.3f} ms | "
            f"{a.breakdown.bubble_s * 1e3:.3f} / {d.breakdown.bubble_s * 1e3:.3f} ms |")
    return "\n".join(lines)


def wiki_table(examples: str | Path = ROOT / "examples") -> str:
    """The seed wiki's 9-rank GPT-2 case: the three update strategies, node 0's NIC."""
    lines = ["| dp_strategy | analytical | DES | bytes into node 0 | NIC bound | busiest link |",
             "|---|---:|---:|---:|---:|---|"]
    for strategy in ("reduce_broadcast", "sliced_reduce_broadcast", "reduce_scatter"):
        path = Path(examples) / f"wiki-gpt2-9ranks-{strategy}.yaml"
        a, d = predict(path, "analytical"), predict(path, "des")
        nic = next(ln for ln in d.links if ln["link"] == "switch0->node0/nic0")
        top = d.links[0]
        lines.append(f"| {strategy} | {a.iteration_time_s:.4f} s | {d.iteration_time_s:.4f} s | "
                     f"{nic['bytes'] / 1e6:.1f} MB | {nic['bytes'] / nic['bandwidth_Bps']:.4f} s |"
                     f" {top['link']} ({100 * top['utilisation']:.1f}%) |")
    return "\n".join(lines)


def _preset_system(preset: str, nodes: int):
    from ddlsim.config import SystemConfig, resolve_section
    return SystemConfig.model_validate(resolve_section("system", {"preset": preset,
                                                                   "nodes": nodes}))


def nccl_multi_node_table() -> tuple[str, float]:
    """One collective on all GPUs of 2–8 DGX nodes (NCCL backend, striped over the NICs)."""
    from ddlsim.simulator.analytical.engine import simulate_analytical
    from ddlsim.simulator.costs import CostModel
    from ddlsim.simulator.des import run_des
    from scenarios import single_collective
    lines = ["| system | nodes | collective | bytes | algorithm | analytical | DES | Δ |",
             "|---|---:|---|---:|---|---:|---:|---:|"]
    worst = 0.0
    for preset, nodes in (("dgx-a100", 2), ("dgx-a100", 8), ("dgx-h100", 4), ("dgx1-v100", 2)):
        system = _preset_system(preset, nodes)
        for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
            for n in (64e3, 256 * 2**20):
                wl = single_collective(op, None, n, system.num_devices)
                cost = CostModel(system, wl)
                a = simulate_analytical(wl, cost).timings[0].end
                d = run_des(wl, CostModel(system, wl), record_spans=False)[0].timings[0].end
                label = cost.choice(wl.classes[0].program.blocks["b"].ops[0].payload).label
                worst = max(worst, abs(d / a - 1))
                lines.append(f"| {preset} | {nodes} | {op} | {n:.3g} | {label} | "
                             f"{a * 1e3:.4f} ms | {d * 1e3:.4f} ms | {100 * (d / a - 1):+.3f}% |")
    return "\n".join(lines), worst


def single_node_plans_table(per_preset: int = 6) -> tuple[str, float]:
    """Random contention-free plans (TP × PP, seeded) on one node of every system preset."""
    import random

    from ddlsim.presets import list_presets
    model = {"name": "gpt-tiny", "num_hidden_layers": 4, "hidden_size": 512,
             "num_attention_heads": 8, "vocab_size": 8192, "max_position_embeddings": 1024}
    train = {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 512, "dtype": "fp32"}
    lines = ["| preset | plans | worst Δ |", "|---|---:|---:|"]
    worst_all = 0.0
    for preset in sorted(list_presets("system")["system"]):
        d = _preset_system(preset, 1).devices_per_node
        valid = [(tp, pp) for tp in (1, 2, 4, 8) for pp in (1, 2, 4)
                 if d % (tp * pp) == 0 and tp * pp > 1]
        plans = random.Random(preset).sample(valid, min(per_preset, len(valid)))
        worst = 0.0
        for tp, pp in sorted(plans):
            cfg = {"model": model, "train": train, "system": {"preset": preset, "nodes": 1},
                   "parallel": {"tensor_model_parallel_size": tp,
                                "pipeline_model_parallel_size": pp}}
            a = predict(cfg, "analytical", check_fit=False).iteration_time_s
            b = predict(cfg, "des", check_fit=False).iteration_time_s
            worst = max(worst, abs(b / a - 1))
        worst_all = max(worst_all, worst)
        lines.append(f"| {preset} | {len(plans)} | {100 * worst:.3f}% |")
    return "\n".join(lines), worst_all


#: The bundled examples, both engines: each example's reason when they differ by over 2 %
#: (docs/engines.md, "The bundled examples"). Under ``--full`` also the slow DES runs.
EXAMPLES = {
    "proxies/bert_large.yaml": "sharing bound",
    "proxies/gpt2_large.yaml": "sharing bound",
    "proxies/gpt3_one_pipe_step.yaml": "sharing bound",
    "proxies/gpt3_moe_one_pipe_step.yaml": "sharing bound",
    "proxies/resnet50.yaml": "", "proxies/resnet50_ring.yaml": "",
    "proxies/resnet152.yaml": "", "proxies/resnet152_scal.yaml": "",
    "proxies/cosmoflow.yaml": "", "proxies/dlrm.yaml": "",
    "gpt2-2ranks-one-node.yaml": "", "gpt2-dp32-4-dgx-h100.yaml": "",
    "wiki-gpt2-9ranks-ddp.yaml": "", "wiki-gpt2-9ranks-reduce_broadcast.yaml": "",
    "wiki-gpt2-9ranks-reduce_scatter.yaml": "",
    "wiki-gpt2-9ranks-sliced_reduce_broadcast.yaml": "slices stretched 9×",
    "cp-ring-llama3-8b-128k.yaml": "", "mixtral-8x7b-ep8.yaml": "",
    "tp-2d-64.yaml": "", "tp-2p5d-64.yaml": "row and column broadcasts together",
    "tp-3d-64.yaml": "row and column broadcasts together",
}
#: DES runs of a minute or more on the 2-core machine: only with ``--full``.
SLOW_EXAMPLES = {"gpt3-175b-1024-a100.yaml": "", "llama2-70b-64-h100.yaml": "",
                 "proxies/gpt3.yaml": "", "proxies/gpt3_moe.yaml": ""}


def collective_durations(result) -> dict[tuple[str, str, str], list[float]]:
    """Seconds of each collective span of each class's representative rank, in order, keyed
    by (class, stream, group kind): the two engines run the same ops in the same order on a
    stream, so the lists of an analytical and a DES result line up op for op."""
    first: dict[str, int] = {}
    for s in result.spans:
        first.setdefault(s.class_name, s.rank)
    out: dict[tuple[str, str, str], list[float]] = {}
    for s in sorted(result.spans, key=lambda s: (s.class_name, s.stream, s.start_s)):
        if s.rank == first[s.class_name] and s.kind not in (
                "compute", "optimizer", "send", "recv"):
            out.setdefault((s.class_name, s.stream, s.kind), []).append(s.end_s - s.start_s)
    return out


def _bound(a, d) -> str:
    """The largest DES / analytical − 1 over the collectives, op for op, on the streams
    whose collectives line up (the analytical engine writes a loop whose iterations start
    and end with every stream drained once, its ops repeated: ``Block.lean``); ``n/a``
    where none does, ``*`` where some do not."""
    ta, td = collective_durations(a), collective_durations(d)
    same = [k for k in ta if len(ta[k]) == len(td.get(k, ()))]
    worst = max((y / x - 1 for k in same for x, y in zip(ta[k], td[k]) if x > 0), default=None)
    if worst is None:
        return "n/a"
    return f"{100 * worst:+.2f}%" + ("*" if len(same) < len(set(ta) | set(td)) else "")


def examples_table(full: bool = False) -> str:
    """Every bundled example on both engines, with the largest per-collective DES excess."""
    lines = ["| example | analytical | DES | Δ | worst collective Δ | reason |",
             "|---|---:|---:|---:|---:|---|"]
    for name, why in {**EXAMPLES, **(SLOW_EXAMPLES if full else {})}.items():
        path = ROOT / "examples" / name
        a = predict(path, "analytical", check_fit=False, record_spans=True)
        d = predict(path, "des", check_fit=False, spans="representative")
        delta = d.iteration_time_s / a.iteration_time_s - 1
        lines.append(f"| {name} | {a.iteration_time_s * 1e3:.3f} ms | "
                     f"{d.iteration_time_s * 1e3:.3f} ms | {100 * delta:+.2f}% | "
                     f"{_bound(a, d)} | {why if abs(delta) > 0.02 else ''} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import sys

    argv = sys.argv[1:] if argv is None else argv
    cases = [run_case(*args) for args in default_cases()]
    print(agreement_table(cases) if "--full" in argv else summary_table(cases))
    exact_cases = [c for c in cases if exact(c)]
    worst = max(exact_cases, key=lambda c: abs(c.relative))
    print(f"\n{len(cases)} cases; largest |Δ| of the {len(exact_cases)} where the closed form is "
          f"exact: {100 * abs(worst.relative):.5f}% ({worst.op}/{worst.algorithm}, p={worst.p}, "
          f"g={worst.g}, {worst.fabric}); smallest Δ of all: "
          f"{100 * min(c.relative for c in cases):+.4f}%\n")
    print(gpt_table())
    print()
    print(wiki_table())
    print()
    table, worst = nccl_multi_node_table()
    print(table)
    print(f"\nmulti-node NCCL collectives: largest |Δ| {100 * worst:.4f}%\n")
    table, worst = single_node_plans_table()
    print(table)
    print(f"\nsingle-node plans on every preset: largest |Δ| {100 * worst:.4f}%\n")
    print(examples_table("--full" in argv))


if __name__ == "__main__":
    main()
