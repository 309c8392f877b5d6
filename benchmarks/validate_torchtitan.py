"""Predicted vs published iteration time of torchtitan's Llama 3 runs (FSDP2) on H100 and A100.

Run:  python benchmarks/validate_torchtitan.py [--engine analytical|des] [--markdown]
      [--write-docs] [--des-rank-ops N]
      python benchmarks/validate_torchtitan.py --cp-split [--markdown]   (:func:`cp_split`)
      python benchmarks/validate_torchtitan.py --a100-hosts [--efa-fraction F] [--breakdown]
                                               [--markdown]
                                               (:func:`a100_hosts`)

The published throughputs and their provenance are in ``data/torchtitan_tps.csv``
(torchtitan's own benchmark files of 2024-12 and 2025-06, and its docs/performance.md of
2024-04 on A100). Each row runs on the software stack of its date (``torchtitan-2024`` for
9dec370's runs and for April 2024's, whose code runs FSDP2, op-level AC and AdamW the same
way; ``torchtitan-2025`` for the June 2025 ones; ``ddlsim/data/software.yaml``), on the
row's system preset, with the row's settings (a ``fused_rmsnorm`` row: ``fused_layernorm``): FSDP over ``dp_shard × cp``
(ZeRO-3, inside the pipeline stages where PP > 1), TP with sequence parallelism, async TP as
``tp_comm_overlap: torch_async`` (torch's fused all-gather-matmul and matmul-reduce-scatter,
``ddlsim/workloads/decoder/torch_tp.py``), CP's default ``allgather`` rotation as ``cp_comm_type:
all_gather`` (compiled, so each exchange of the ring is waited as soon as it is issued:
``partition/torch_cp.py``), ``compile`` as the stack's ``compile``, op-level selective AC
as ``recompute: selective`` under the stack's ``every_second_mm`` policy, ``selective_ac_option
'2'`` as ``recompute: full`` with ``recompute_every_n_layers: 2``, the pipelined rows'
micro-batches and layer split as torchtitan derives them (CSV header). No per-row factors and
nothing tuned.

The published iteration time is ``global_batch · seq / (tokens/s/GPU · GPUs)``; the error is
``predicted / published − 1`` (positive: ddlsim too slow). Rows are marked:

* ``≈ fp8``: float8 runs as ddlsim's ``fp8`` with the row's recipe as torchao runs it
  (``fp8_recipe``: tensorwise or rowwise; docs/compute.md, "FP8": its cast passes from
  torchao's roofline model, each GEMM's kernel, rowwise's rescale passes, one FP8 linear per
  ``nn.Linear``), the compiled rowwise recipe's input/gradient passes and rescales at the
  bandwidth share fitted to half of torchao's per-linear table (``ROWWISE_PASS_SHARE``,
  ``fit_fp8_rowwise_passes.py``; the other casts at the roofline of their bytes), and fast
  accumulation at the split accumulator's ceiling. The rows whose config turns on FSDP's
  float8 all-gather with precomputed scales (CSV column ``fsdp_float8_all_gather``: the 2024
  405B rows but ``FSDP 1, CP 8``) set the stack's ``enable_fsdp_float8_all_gather`` and
  ``precompute_float8_dynamic_scale_for_fsdp`` (``ddlsim/workloads/decoder/fsdp_float8.py``);

The H100 rows run on ``grand-teton-h100``: the runs' H100s with 96 GB of HBM2e (94 GiB
visible) at 2.4 TB/s, 8 per host on NVLink, 400 Gb/s RDMA per GPU (``ddlsim/data/systems.yaml``,
from torchtitan's Hardware section and Ujeniya et al. 2026), at the runs' default 500 W
limit: its matmul ceilings are the 700 W ones of the H100 SXM (MAMF), and at 500 W no GEMM
runs faster than the rate a cuBLAS 8192³ GEMM sustained on an H100 capped at 500 W (557
TFLOP/s, 0.563 of peak; fp8 derived by the same clock ratio) and the attention kernels run at
0.86 of their 700 W curves (``device.power_limits``; docs/compute.md, "The H100 of
torchtitan's runs").
The A100 rows run on ``aws-p4de-a100`` (EC2 p4de.24xlarge: A100 SXM 80 GB, 400 W, 8 per node
on NVSwitch, 4 × 100 Gb/s EFA per node). performance.md does not state the runs' network; the
repo's launch script at the same commit, ``multinode_trainer.slurm``, is "optimized for AWS with
EFA" and sets ``FI_PROVIDER=efa`` "for A100" (CSV header): an inference, not the table's word
(docs/compute.md, "The A100 of torchtitan's April 2024 runs", with their breakdown and what was
checked).
"""

from __future__ import annotations

import sys

from ddlsim.importers.torchtitan_split import split_2024, split_2025
from public_runs import (DATA, error_stats, print_notes, print_table, read_csv, result_cells,
                         rows_summary, run_script, records)

TABLE = DATA / "torchtitan_tps.csv"
GPUS_PER_NODE = 8
STACKS = {"2024-04": "torchtitan-2024", "2024": "torchtitan-2024", "2025": "torchtitan-2025"}


def rows(table=TABLE) -> list[dict]:
    return read_csv(table)


def _int(row: dict, *keys: str) -> list[int]:
    return [int(row[k]) for k in keys]


def config(row: dict) -> dict:
    """The ddlsim run config of one row (module docstring)."""
    gpus, shard, cp, tp, pp, local, gbs, seq = _int(
        row, "gpus", "dp_shard", "cp", "tp", "pp", "local_batch", "global_batch", "seq")
    parallel = {"zero_stage": 3, "data_parallel_size": shard, "context_parallel_size": cp,
                "tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp}
    if tp > 1:
        parallel["sequence_parallel"] = True
    if cp > 1:      # context_parallel_rotate_method 'allgather' (9dec370 config_manager.py
        parallel["cp_comm_type"] = "all_gather"     # lines 365-367; 07c00d9's default too)
    if row["async_tp"] == "1":
        parallel["tp_comm_overlap"] = "torch_async"
    mbs = local
    if pp > 1:
        mbs = local // pp            # one micro-batch per stage (CSV header)
        parallel.update(_pipeline(row, pp))
    software = {"stack": STACKS[row["set"]], "compile": row["compile"] == "1"}
    kernels = {}
    if row["float8"] != "none":
        kernels["fp8_recipe"] = row["float8"]
    if row["fsdp_float8_all_gather"] == "1":     # torchao's float8 all-gather (CSV header)
        kernels["enable_fsdp_float8_all_gather"] = True
        kernels["precompute_float8_dynamic_scale_for_fsdp"] = True
    if row["norm_type"] == "fused_rmsnorm":     # torchtitan's Triton RMSNorm kernel
        kernels["fused_layernorm"] = True
    if kernels:
        software["kernels"] = kernels
    return {"model": {"preset": row["model"], "max_position_embeddings": max(seq, 8192)},
            "parallel": parallel,
            "train": {"micro_batch_size": mbs, "global_batch_size": gbs, "seq_length": seq,
                      "dtype": "fp8" if row["float8"] != "none" else "bf16",
                      **_recompute(row["ac"])},
            "system": {"preset": row["system"], "nodes": gpus // GPUS_PER_NODE,
                       "software": software}}


def _pipeline(row: dict, pp: int) -> dict:
    """The schedule and the layer split of a pipelined row as torchtitan of the row's date
    derives them (``ddlsim/importers/torchtitan_split.py``): 1F1B over ``pp`` stages, or
    Interleaved1F1B over two virtual stages per rank (Llama 3.1 405B: 15, 16, …, 16, 15 over
    8 stages; 7, 8, …, 8, 7 over 16)."""
    from ddlsim.configload import resolve_section
    layers = resolve_section("model", row["model"])["num_hidden_layers"]
    v = 2 if row["schedule"] == "interleaved" else 1
    split = split_2025(layers, pp * v) if row["set"] == "2025" else split_2024(layers, pp * v)
    out = {"schedule": row["schedule"], "layers_per_virtual_stage": split}
    if v > 1:
        out["virtual_pipeline_model_parallel_size"] = v
    return out


def _recompute(ac: str) -> dict:
    """The train fields of a row's checkpointing: ``selective_layer`` (selective_ac_option
    '2') is every second block checkpointed fully, as torchtitan counts them
    (``ddlsim/workloads/decoder/sac.py``)."""
    if ac == "selective_layer":
        return {"recompute": "full", "recompute_every_n_layers": 2}
    return {"recompute": ac}


def published_time(row: dict) -> float:
    """Seconds per iteration implied by the published tokens/s/GPU."""
    gpus, gbs, seq = _int(row, "gpus", "global_batch", "seq")
    return gbs * seq / (float(row["tps_per_gpu"]) * gpus)


def evaluate(engine: str = "analytical", only: list[dict] | None = None,
             limits=None) -> list[dict]:
    """One record per row: published and predicted iteration time, error, fit note."""
    return records(rows() if only is None else only, config, published_time, engine, limits)


def _label(o: dict) -> str:
    row = o["row"]
    return f"{row['set']} table {row['table']} {row['techniques']} ({row['model']})"


def _print(out: list[dict], markdown: bool) -> None:
    head = ["set", "table", "row", "model", "GPUs", "FSDP", "CP", "TP", "PP", "seq",
            "published tok/s/GPU", "published (s)", "predicted (s)", "error"]
    lines = []
    for o in out:
        row = o["row"]
        mark = " ≈ fp8" if row["float8"] != "none" else ""
        cells = [row["set"], row["table"], row["techniques"] + mark, row["model"], row["gpus"],
                 row["dp_shard"], row["cp"], row["tp"], row["pp"], row["seq"],
                 row["tps_per_gpu"], f"{o['published']:.3f}"]
        lines.append(cells + result_cells(o, missing="not run (work limit)"))
    print_table(head, lines, markdown)
    print_notes([o for o in out if not o["refused"]], _label, markdown)


def summary(out: list[dict], engine: str) -> str:
    """Mean |error|, worst row and signed mean over the rows that ran, also without fp8."""
    bf16 = [o for o in out if o["result"] is not None and o["row"]["float8"] == "none"]
    text = rows_summary(out, engine, _label)
    if bf16:
        text += f"; bf16 rows only: {error_stats(bf16, _label)}"
    return text


def cp_split(only: list[dict] | None = None) -> list[dict]:
    """Where the analytical prediction of each unpipelined context-parallel table's rows goes,
    beside the published time: a diagnostic of the CP rows' error, not a fit.

    Parameters
    ----------
    only : list of dict, optional
        The rows to split (default: every row of a table with a CP > 1 row and PP 1, its
        CP 1 row included).

    Returns
    -------
    list of dict
        Per row: ``row``, ``published`` and ``predicted`` iteration time, ``attention`` the
        seconds of the attention kernels on the first rank class
        (``kernel_breakdown.step_breakdown``'s ``attention``: the attention core's ops, forward,
        recomputed and backward: every ring step's flash call and, in torch's ring, its fp32
        merge or accumulation), ``rest`` the prediction without them, and
        ``attention_factor`` = ``(published − rest) / attention``, the factor the attention
        kernels would need for the row to match if everything else were exact (1: they
        account for the published time), ``ring_steps`` the ring steps one iteration runs
        on that rank (:func:`ring_steps`; 0 without context parallelism) and
        ``residual_per_step`` = ``(published − predicted) / ring_steps`` (None without a
        ring), the time each ring step would have to add for the row to match if the
        shortfall were all the ring's, all in seconds but the factor and the count.
    """
    import warnings

    import ddlsim
    from kernel_breakdown import step_breakdown
    if only is None:
        tables = {r["table"] for r in rows() if r["cp"] != "1" and r["pp"] == "1"}
        only = [r for r in rows() if r["table"] in tables and r["set"] != "2025"]
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for row in only:
            cfg = ddlsim.load_config(config(row))
            predicted = ddlsim.predict(cfg, check_fit=False).iteration_time_s
            attention = step_breakdown(cfg)[0]["attention"]
            published, rest = published_time(row), predicted - attention
            steps = ring_steps(cfg)
            out.append({"row": row, "published": published, "predicted": predicted,
                        "attention": attention, "rest": rest,
                        "attention_factor": (published - rest) / attention,
                        "ring_steps": steps,
                        "residual_per_step": (published - predicted) / steps if steps else None})
    return out


def ring_steps(cfg) -> int:
    """Ring steps (the ``*.attn_core.step`` ops of torch's ring, ``partition/torch_cp.py``,
    and TE's, ``partition/context.py``: forward, recomputed and backward) one iteration of
    ``cfg`` runs on its first rank class; 0 where no ring runs (no context parallelism, or
    TE's all-gather)."""
    from ddlsim.api import build_workload
    prog = build_workload(cfg).classes[0].program
    return sum(op.repeat for step in prog.steps for op in prog.blocks[step.block].flat.ops
               if getattr(op.payload, "name", "").endswith("attn_core.step"))


def _print_cp_split(argv: list[str]) -> int:
    """``--cp-split``: print :func:`cp_split`'s table."""
    import argparse
    ap = argparse.ArgumentParser(description=cp_split.__doc__.splitlines()[0])
    ap.add_argument("--cp-split", action="store_true", required=True)
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args(argv)
    head = ["model", "CP", "seq", "published (s)", "predicted (s)", "attention (s)",
            "rest (s)", "attention factor", "ring steps", "residual per step (ms)"]
    lines = [[o["row"]["model"], o["row"]["cp"], o["row"]["seq"], f"{o['published']:.3f}",
              f"{o['predicted']:.3f}", f"{o['attention']:.3f}", f"{o['rest']:.3f}",
              f"{o['attention_factor']:.3f}", str(o["ring_steps"]),
              "" if o["residual_per_step"] is None else f"{1e3 * o['residual_per_step']:.1f}"]
             for o in cp_split()]
    print_table(head, lines, args.markdown)
    return 0


#: NCCL over EFA on p4d: NVIDIA/nccl issue 527 (NCCL 2.9.9, 2022), 1 GiB all-reduce on 3-4
#: nodes, 29.6-31.8 GB/s bus bandwidth of the instance's 400 Gb/s (50 GB/s): about 0.6 of line
#: rate, the one published p4d figure found (docs/compute.md, "The A100 of torchtitan's April
#: 2024 runs"); a what-if of ``--a100-hosts``, not what the validation runs
EFA_FRACTION = 0.6


def a100_hosts(fraction: float = EFA_FRACTION, only: list[dict] | None = None,
               breakdown: bool = False) -> list[dict]:
    """The 2024-04 A100 rows on three hosts: ``dgx-a100`` (8 × 200 Gb/s InfiniBand a node),
    their preset ``aws-p4de-a100`` (4 × 100 Gb/s EFA, as validated) and that preset with each
    NIC at ``fraction`` of its line rate (``system.nic.bandwidth_Bps``).

    Parameters
    ----------
    fraction : float
        Each NIC's share of its line rate in the third host, in (0, 1].
    only : list of dict, optional
        The rows to run (default: every 2024-04 row).
    breakdown : bool
        Also give each prediction's compute by kind (``kinds``).

    Returns
    -------
    list of dict
        Per row and host: ``row``, ``host`` (a label), ``published`` and ``predicted``
        iteration time and ``exposed_dp`` (the data-parallel communication left exposed on the
        critical path, analytical engine), in seconds; with ``breakdown``, ``kinds``: the first
        rank's compute seconds by kind (``kernel_breakdown.step_breakdown``).
    """
    import warnings

    import ddlsim
    from ddlsim.configload import build_config
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for row in [r for r in rows() if r["set"] == "2024-04"] if only is None else only:
            nic = build_config(config(row), []).system.nic.bandwidth_Bps
            hosts = {"dgx-a100": ["system.preset=dgx-a100"], row["system"]: [],
                     f"{row['system']}, EFA at {fraction:g} of line rate":
                         [f"system.nic.bandwidth_Bps={fraction * nic!r}"]}
            for host, sets in hosts.items():
                cfg = build_config(config(row), sets)
                r = ddlsim.predict(cfg, check_fit=False)
                out.append({"row": row, "host": host, "published": published_time(row),
                            "predicted": r.iteration_time_s,
                            "exposed_dp": r.breakdown.exposed_comm_s.get("dp", 0.0)})
                if breakdown:
                    from kernel_breakdown import step_breakdown
                    out[-1]["kinds"] = step_breakdown(cfg)[0]
    return out


def _print_kinds(out: list[dict], markdown: bool) -> None:
    """One table per host: compute seconds by kind (rows) of each A100 row (columns)."""
    for host in dict.fromkeys(o["host"] for o in out):
        on = [o for o in out if o["host"] == host]
        kinds = list(dict.fromkeys(k for o in on for k in o["kinds"]))
        print(f"\nseconds on {host}: the first rank's compute by kind, then the exposed "
              "data-parallel communication")
        print_table(["kind", *(o["row"]["techniques"] for o in on)],
                    [[k, *(f"{o['kinds'].get(k, 0.0):.3f}" for o in on)] for k in kinds]
                    + [["exposed data-parallel communication",
                        *(f"{o['exposed_dp']:.3f}" for o in on)]], markdown)


def _print_a100_hosts(argv: list[str]) -> int:
    """``--a100-hosts [--efa-fraction F]``: print :func:`a100_hosts`'s table; any other
    option, or a fraction outside (0, 1], is refused (exit 2)."""
    import argparse
    ap = argparse.ArgumentParser(description=a100_hosts.__doc__.splitlines()[0])
    ap.add_argument("--a100-hosts", action="store_true", required=True)
    ap.add_argument("--efa-fraction", type=float, default=EFA_FRACTION,
                    help="each EFA's share of its line rate (default %(default)s)")
    ap.add_argument("--breakdown", action="store_true",
                    help="also each prediction's compute by kind, one table per host")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args(argv)
    if not 0 < args.efa_fraction <= 1:
        ap.error(f"--efa-fraction {args.efa_fraction:g}: a share of the line rate, in (0, 1]")
    out = a100_hosts(args.efa_fraction, breakdown=args.breakdown)
    head = ["row", "host", "published (s)", "predicted (s)", "error", "exposed DP (s)"]
    lines = [[o["row"]["techniques"], o["host"], f"{o['published']:.3f}",
              f"{o['predicted']:.3f}", f"{100 * (o['predicted'] / o['published'] - 1):+.1f}%",
              f"{o['exposed_dp']:.3f}"] for o in out]
    print_table(head, lines, args.markdown)
    if args.breakdown:
        _print_kinds(out, args.markdown)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--cp-split" in argv:
        return _print_cp_split(argv)
    if "--a100-hosts" in argv:
        return _print_a100_hosts(argv)
    if "--efa-fraction" in argv:
        print("error: --efa-fraction is a what-if of --a100-hosts; give both", file=sys.stderr)
        return 2
    return run_script("validate_torchtitan", __doc__, argv, evaluate, _print, summary)


if __name__ == "__main__":
    sys.exit(main())
