"""What one cold grid of ``search_speed.py`` builds, beside how many distinct values it needs.

    python benchmarks/search_counts.py

The search tier is fast where it builds each thing once per *distinct* input (issue 27,
item 6): a stage piece per op list, a group network per family layout, a config probe per
combination of the fields a rule group reads. This script runs the speed grid of
``search_speed.py`` (GPT-3 175B on 1,024 A100s) cold, once, with counters on the search's
steps (no timing), and prints per step how often it ran and how many distinct inputs (or
outputs) those runs had; a step that runs far more often than it has distinct inputs is
where a canonical signature would save work:

* stage pieces: the plans' signatures (micro-batch, TP, SP, recomputation, ZeRO-3), the
  builders made (one per signature), the pieces built by their keys
  (``search.blocks._piece_keys``), the distinct op lists among them (what is lowered and
  timed) and the distinct compute ops (what the kernel model times);
* meshes' networks: the distinct meshes (TP, PP, DP), their world sizes (one cost model
  each), the group networks measured (``netmodel.family_net``, one per distinct family
  layout: the rows of member ranks) per family, the distinct inter-node flow patterns
  among them (node pairs and their multiplicities, what the fair shares are solved on) and
  the point-to-point rates (``netmodel.p2p_node_bw``);
* config rules: the probes the rule groups judge and the configs validated for them;
* NCCL: the forms computed (``nccl.model.nccl_form``'s cache misses).
"""

from __future__ import annotations

import collections
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import search_speed as speed  # noqa: E402


def _counted(owner, name: str, record) -> tuple:
    """Wrap ``owner.name`` so that ``record(*args)`` sees every call; returns the undo."""
    raw = owner.__dict__[name]
    f = raw.__func__ if isinstance(raw, classmethod) else raw

    def wrapper(*args, **kwargs):
        record(*args)
        return f(*args, **kwargs)
    if hasattr(f, "cache_clear"):
        wrapper.cache_clear = f.cache_clear
    setattr(owner, name, classmethod(wrapper) if isinstance(raw, classmethod) else wrapper)
    return owner, name, raw


def grid_counts() -> dict[str, tuple[int, int | None]]:
    """``{step: (runs, distinct)}`` of one cold run of the speed grid (``distinct`` None
    where the runs are of distinct inputs by construction)."""
    from ddlsim.search import blocks, planconfig
    from ddlsim.simulator import netmodel
    from ddlsim.simulator.collectives.nccl import model
    from ddlsim.workloads.decoder.builder import StageBuilder

    seen: dict[str, list] = collections.defaultdict(list)
    pieces = dict(blocks._PIECES)

    def piece(name, make):
        def build(sb):
            ops = tuple(make(sb))
            seen["pieces"].append((name, ops))
            return ops
        return build

    def family(system, topo, devices, members, *rest):
        dev = devices[members]
        node = topo.node_of_device
        src, dst = node[dev.ravel()], node[netmodel._ring_step(dev)]
        keep = src != dst
        pairs, mult, _ = netmodel._unique_pairs(src[keep], dst[keep])
        seen["families"].append((members.shape, dev.tobytes()))
        if keep.any():
            seen["inter"].append((pairs.tobytes(), mult.tobytes()))

    undo = [
        _counted(StageBuilder, "from_config", lambda cls, cfg, shape: seen["builders"].append(
            (cfg.parallel, cfg.train))),
        _counted(blocks, "lower_ops", lambda ops, compute_s: seen["lowered"].append(ops)),
        _counted(blocks, "_signatures", lambda plans, *rest: seen["plans"].append(len(plans))),
        _counted(netmodel, "family_net", family),
        _counted(netmodel, "p2p_node_bw", lambda topo, devices, members: seen["p2p"].append(
            devices[members].tobytes())),
        _counted(planconfig, "plan_config",
                 lambda sections, base, plan, *rest: seen["probes"].append(
                     repr(sorted(plan.items())))),
    ]
    meshes = []
    decoder = sys.modules["ddlsim.search.decoder"]
    undo.append(_counted(decoder, "mesh_networks", lambda cfg, m: meshes.append(m)))
    for name, make in pieces.items():
        blocks._PIECES[name] = piece(name, make)
    try:
        speed.cache_clear()
        before = model.nccl_form.cache_info().misses
        grid = speed.grid_seconds()[1]
        forms = model.nccl_form.cache_info().misses - before
    finally:
        blocks._PIECES.update(pieces)
        for owner, name, raw in undo:
            setattr(owner, name, raw)
    built = seen["pieces"]
    by_piece = collections.Counter(name for name, _ in built)
    distinct_lists = {ops for _, ops in built}
    compute_ops = {op for ops in distinct_lists for op in _payloads(ops)}
    worlds = {int(m.prod()) for ms in meshes for m in ms}
    out = {
        "plans in the grid / valid": (grid.total, len(grid.frame)),
        "stage pieces: signatures": (sum(seen["plans"]), _signatures(grid)),
        "  builders made (one a signature)": (len(seen["builders"]),
                                              len({(id(p), id(t)) for p, t in seen["builders"]})),
        "  pieces built (by key) / op lists": (len(built), len(distinct_lists)),
        "  op lists lowered": (len(seen["lowered"]), len(set(seen["lowered"]))),
        "  compute ops in them": (None, len(compute_ops)),
        "meshes (TP, PP, DP) / world sizes": (sum(len(m) for m in meshes), len(worlds)),
        "  family networks measured / layouts": (len(seen["families"]),
                                                 len(set(seen["families"]))),
        "  inter-node flow patterns": (len(seen["inter"]), len(set(seen["inter"]))),
        "  point-to-point rates (p2p_node_bw)": (len(seen["p2p"]), len(set(seen["p2p"]))),
        "config probes validated": (len(seen["probes"]), len(set(seen["probes"]))),
        "NCCL forms computed": (forms, None),
    }
    for name, n in by_piece.items():
        out[f"    piece {name}: built / op lists"] = (
            n, len({ops for p, ops in built if p == name}))
    return out


def _payloads(ops) -> list:
    """The compute payloads of an op list, loops unrolled as the engine unrolls them."""
    from ddlsim.workloads.trace import Block, Compute
    return [op.payload for op in Block("piece", "forward", tuple(ops)).lean.ops
            if isinstance(op.payload, Compute)]


def _signatures(grid) -> int:
    """Distinct (micro-batch, TP, SP, recomputation, ZeRO-3) among the grid's valid plans."""
    f = grid.frame
    cols = ["train.micro_batch_size", "parallel.tensor_model_parallel_size",
            "parallel.sequence_parallel", "train.recompute"]
    return len(set(zip(*(f[c] for c in cols), f["parallel.zero_stage"] == 3)))


def main() -> None:
    warnings.filterwarnings("ignore", ".*not modelled by ddlsim")
    speed.evaluate_grid(speed.GPT3, None, [], speed.SPEED_AXES, speed.Constraints())  # imports
    print("one cold grid of search_speed.py's GPT-3 175B / 1,024 A100 grid: runs, distinct")
    for label, (runs, distinct) in grid_counts().items():
        runs_s = "" if runs is None else f"{runs:,}"
        print(f"  {label:40}{runs_s:>9}{'' if distinct is None else f'{distinct:>9,}'}")


if __name__ == "__main__":
    main()
