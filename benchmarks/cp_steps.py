"""What ddlsim predicts for each piece of torch's ring attention on torchtitan's CP rows, beside
what ``benchmarks/device/ring_attention.py`` measured where a measurement is given: the
per-step view of ``validate_torchtitan.py --cp-split`` (issue 28/29).

Run:  python benchmarks/cp_steps.py [--table 2|6] [--system PRESET] [--measured DIR]
      [--markdown]

For each unpipelined-or-not CP row of the table (default: Table 2, Llama 3.1 8B on one host)
the first rank class's trace (``partition/torch_cp.py``) gives, in seconds:

* ``flash fwd step 0`` / ``flash bwd step 0``: the causal ``2c × 2c`` call of step 0;
* ``flash fwd later`` / ``flash bwd later``: one later step of rank 0, ``c × 2c``;
* ``merge``: the forward merge of a later (partial) step, its memory kernels (at CP 2 that step
  is the last, so its cast of the output back to bf16 is counted too);
* ``accumulate``: a later backward step's dK/dV and dQ accumulation;
* ``ring fwd`` and ``ring fwd+bwd``: the serial sum of the ring's ops of one layer (K/V pack,
  the exchanges, every step, the accumulations and the casts; one transfer per send/receive
  pair) — under ``compile`` ddlsim waits for every exchange at once, so this is the layer's
  attention core as ddlsim schedules it.

``--measured DIR`` reads ``kernels.csv`` and ``ring.csv`` of ``ring_attention.py`` (the
compiled rows for the pieces that have both modes, the ring of the row's CP degree) and adds
the measured seconds and measured / predicted, for rows with the measured shape (query heads,
sequences and tokens per sequence on a rank). ``--system`` predicts on another system preset (e.g.
``dgx-h100``, an H100 SXM at 700 W) to match the GPU measured. Nothing is fitted.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

#: measured piece -> (kernels.csv piece, pass) of ring_attention.py
MEASURED = {"flash fwd step 0": ("step0", "fwd"), "flash bwd step 0": ("step0", "bwd"),
            "flash fwd later": ("later_rank0", "fwd"), "flash bwd later": ("later_rank0", "bwd"),
            "merge": ("merge", "fwd"), "accumulate": ("accumulate", "bwd")}


def _layer_ops(cfg) -> list:
    """The ring's ops of one layer's forward and backward (not the recomputed forward) on the
    first rank, in order, from the layer partitioner the builder uses."""
    from ddlsim.workloads.decoder.partition import make_partitioner
    from ddlsim.workloads.decoder.plan import resolve_plan
    part = make_partitioner(resolve_plan(cfg, cfg.model.shape()))
    names = [op.payload for op in part.layer_forward() + part.layer_backward(0.0)]
    return [p for p in names if not p.name.startswith("recompute.")
            and ("attn_core" in p.name or ".kv." in p.name or ".dkv." in p.name)]


def _seconds(cfg, workload, ops: list) -> list[tuple[object, float]]:
    """Each op with its duration: compute by the kernel model, collectives and transfers by
    the cost model (ranks 0 → 1 for a transfer)."""
    from ddlsim.simulator.costs import CostModel
    from ddlsim.simulator.kernels import kernel_device, op_time
    from ddlsim.workloads.trace import Collective, Compute, P2P
    dev = kernel_device(cfg.system)
    costs = CostModel(cfg.system, workload, cfg.parallel.collective_algorithm)
    out = []
    for p in ops:
        if isinstance(p, Compute):
            out.append((p, op_time(p, dev)))
        elif isinstance(p, Collective):
            out.append((p, costs.collective(p)))
        elif isinstance(p, P2P) and p.kind == "recv":      # one transfer per pair
            out.append((p, costs.p2p(p, 0, 1)))
    return out


def _split(p, dev) -> tuple[float, float]:
    """(flash kernel, other kernels) seconds of a ring step op."""
    from ddlsim.simulator.kernels import kernel_time
    flash = sum(kernel_time(k, dev) for k in p.kernels if k.kind == "flash")
    return flash, sum(kernel_time(k, dev) for k in p.kernels if k.kind != "flash")


def pieces(cfg) -> dict[str, float]:
    """Predicted seconds of each piece of the module docstring for run config ``cfg``."""
    from ddlsim.api import build_workload
    from ddlsim.simulator.kernels import kernel_device
    dev = kernel_device(cfg.system)
    timed = _seconds(cfg, build_workload(cfg), _layer_ops(cfg))
    steps = {t: [p for p, _ in timed if p.name == f"{t}.attn_core.step"] for t in ("fwd", "bwd")}
    acc = [s for p, s in timed if p.name == "bwd.attn_core.accumulate"]
    out = {"flash fwd step 0": _split(steps["fwd"][0], dev)[0],
           "flash fwd later": _split(steps["fwd"][1], dev)[0],
           "merge": _split(steps["fwd"][1], dev)[1],
           "flash bwd step 0": _split(steps["bwd"][0], dev)[0],
           "flash bwd later": _split(steps["bwd"][1], dev)[0],
           "accumulate": acc[1]}
    out["ring fwd"] = sum(s for p, s in timed if p.name.startswith("fwd."))
    out["ring fwd+bwd"] = out["ring fwd"] + sum(s for p, s in timed if p.name.startswith("bwd."))
    return out


def measured(directory: Path) -> tuple[dict, list[dict]]:
    """``({(piece, pass, mode): row}, ring rows)`` of ring_attention.py's CSVs in
    ``directory`` (a missing file gives nothing)."""
    from public_runs import read_csv
    kern = directory / "kernels.csv"
    ring = directory / "ring.csv"
    k = {(r["piece"], r["pass"], r["mode"]): r for r in read_csv(kern)} if kern.exists() else {}
    return k, read_csv(ring) if ring.exists() else []


def _same_shape(r: dict, heads: int, batch: int, tokens: int) -> bool:
    """Whether a measured row is of a rank with ``heads`` query heads and ``batch`` sequences
    of ``tokens`` tokens."""
    return (int(r["heads"]), int(r["batch"]), int(r["local_tokens"])) == (heads, batch, tokens)


def _measured_piece(name: str, k: dict, ring: list[dict], cp: int, shape: tuple
                    ) -> float | None:
    """The measured seconds of piece ``name`` on a rank of ``shape`` (:func:`_shape_of`): compiled
    where both modes exist; the ring of CP ``cp`` with the default ``allgather`` rotation."""
    if name in MEASURED:
        piece, pass_ = MEASURED[name]
        row = k.get((piece, pass_, "compiled")) or k.get((piece, pass_, "eager"))
        return float(row["seconds"]) if row and _same_shape(row, *shape) else None
    column = "fwd_s_slowest" if name == "ring fwd" else "fwd_bwd_s_slowest"
    got = [r for r in ring if int(r["cp"]) == cp and r["rotate"] == "allgather"
           and r["mode"] == "compiled" and _same_shape(r, *shape)]
    return float(got[0][column]) if got else None


def _shape_of(cfg) -> tuple[int, int, int]:
    """(query heads per rank, sequences per micro-batch, tokens of each on a CP rank) of a run
    config."""
    p, m, t = cfg.parallel, cfg.model, cfg.train
    return (m.num_attention_heads // p.tensor_model_parallel_size, t.micro_batch_size,
            t.seq_length // p.context_parallel_size)


def table(table_id: str, system: str | None, directory: Path | None) -> list[list[str]]:
    """One line per CP row and piece (module docstring)."""
    import validate_torchtitan as vt
    from ddlsim.configload import build_config
    k, ring = measured(directory) if directory else ({}, [])
    lines = []
    for row in [r for r in vt.rows() if r["table"] == table_id and r["cp"] != "1"
                and r["set"] == "2024"]:
        cfg = build_config(vt.config(row), [f"system.preset={system}"] if system else [])
        shape = _shape_of(cfg)
        for name, sec in pieces(cfg).items():
            got = _measured_piece(name, k, ring, int(row["cp"]), shape)
            lines.append([row["model"], row["cp"], name, f"{sec * 1e3:.2f}",
                          "" if got is None else f"{got * 1e3:.2f}",
                          "" if got is None else f"{got / sec:.3f}"])
    return lines


def main(argv: list[str] | None = None) -> int:
    from public_runs import print_table
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", default="2", choices=("2", "6"))
    ap.add_argument("--system", help="predict on this system preset instead of the row's")
    ap.add_argument("--measured", type=Path, help="ring_attention.py's output folder")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args(argv)
    if args.measured is not None and not args.measured.is_dir():
        ap.error(f"--measured {args.measured}: not a folder")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lines = table(args.table, args.system, args.measured)
    print_table(["model", "CP", "piece", "predicted (ms)", "measured (ms)",
                 "measured / predicted"], lines, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
