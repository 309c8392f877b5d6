"""ZeRO-3 against PTD-P (3-D parallelism): predicted vs published, and the ordering of each pair.

Run:  python benchmarks/validate_zero3.py [--engine analytical|des] [--markdown] [--write-docs]
      [--des-rank-ops N] [--zero3-software MAPPING] [--breakdown]

``--breakdown`` prints, per ZeRO-3 row, the seconds each stream is busy per iteration (the
compute, the gathers and reduce-scatters, the host's issue of them), each op timed alone.

Narayanan et al. 2021 (SC'21, arXiv:2104.04473), Sec. 5.2 and Table 2, ran GPT-3 175B and the
530B model on Selene (DGX A100) with ZeRO-3 and no model parallelism (DeepSpeed) and with PTD-P,
at the same global batch and several GPU counts. ``data/megatron_sc21_zero3.csv`` holds the
table and, for every setting the paper does not state, where it was taken from (the paper's own
sc21 scripts for the same layout). No per-row factors and nothing tuned; ``dgx-a100`` preset,
software stack ``deepspeed-2021`` (DeepSpeed v0.3.13 as the paper ran it: per-tensor gathers on
demand) for ZeRO-3, configured as DeepSpeed's own Megatron ZeRO-3 example stood before the
paper's runs (:data:`ZERO3_SOFTWARE`), and ``megatron-lm-2021`` for PTD-P.

Published and predicted throughput use the paper's FLOP count, eq. (3) with V = 51,200, so the
published iteration time is ``eq3 / (TFLOP/s per GPU · GPUs)`` and the error is the error in
iteration time (positive: ddlsim too slow). The key check is the ordering: for each model and
GPU count, is PTD-P faster per GPU than ZeRO-3, and by how much (the paper: 6 % and 24 % at
the fewest GPUs, about 70 % once the GPUs are doubled). The 530B pair at the fewest GPUs
compares 640 ZeRO-3 GPUs (batch 2,560) with 560 PTD-P GPUs (batch 2,240), as the paper does.
"""

from __future__ import annotations

import copy
import sys

from public_runs import (DATA, error_stats, padded_vocab, print_notes, print_table, read_csv,
                         run_script, time_record)

TABLE = DATA / "megatron_sc21_zero3.csv"
SEQ = 2048                 # sc21 CONFIG.sh: --seq-length 2048
PAPER_VOCAB = 51200        # the paper's V in eq. (3)
GPT2_VOCAB = 50257         # GPT2BPETokenizer, padded to 128·TP by Megatron
GPUS_PER_NODE = 8          # DGX A100
#: ``system.software`` of the ZeRO-3 rows. The paper names no DeepSpeed option, so the rows take
#: DeepSpeed's own ZeRO-3 configuration for Megatron-LM as published before the paper's runs
#: (arXiv v1 2021-04-09): DeepSpeedExamples 2cd968f2bd123aa2ea7f9371e1ebd8512b3ed0d4
#: (2021-03-08) Megatron-LM-v1.1.5-ZeRO3/examples/ds_zero_stage_3_config.json, the file the
#: CSV already takes contiguous_gradients from (without it v0.3.13 all-reduces the gradients,
#: stage3.py buffered_reduce_fallback). It sets stage3_max_live_parameters 1e8 and
#: stage3_max_reuse_distance 1e8 (DeepSpeed's defaults, deepspeed-2021's, are 1e9; the example
#: took 1e9 only from 13851060, 2021-04-18, after the paper). DeepSpeed v0.3.13's own ZeRO-3
#: tutorial for Megatron-LM (docs/_tutorials/zero.md) also sets reuse 1e8 and live 6e6. Its
#: reduce_bucket_size 5e7 (DeepSpeed's default, the stack's, is 5e8): every GEMM weight of
#: both models is over it, so each is reduce-scattered by itself from the next gradient hook,
#: issued once its module's backward has ended (``zero3_reduce_bucket_size``). Its other keys
#: change nothing ddlsim models: overlap_comm and contiguous_gradients true (the stack's),
#: stage3_prefetch_bucket_size 2.5e7 (still one tensor, every one being larger), and the
#: persistence threshold's key is misspelled, so 1e5 holds.
ZERO3_SOFTWARE = {"stack": "deepspeed-2021",
                  "overlap": {"zero3_max_live_parameters": 100_000_000,
                              "zero3_max_reuse_distance": 100_000_000,
                              "zero3_reduce_bucket_size": 50_000_000}}
STACKS = {"zero3": ZERO3_SOFTWARE, "ptdp": "megatron-lm-2021"}


def rows() -> list[dict]:
    """Table 2's rows with their settings (see the CSV's header)."""
    return read_csv(TABLE)


def config(row: dict) -> dict:
    """The ddlsim run config of one row."""
    gpus, tp, pp = int(row["gpus"]), int(row["tp"]), int(row["pp"])
    parallel = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
                "data_parallel_size": gpus // (tp * pp), "schedule": "1f1b"}
    if row["scheme"] == "zero3":
        parallel["zero_stage"] = 3
    if row["layers_per_virtual_stage"]:
        vpp = int(row["layers"]) // pp // int(row["layers_per_virtual_stage"])
        parallel.update(schedule="interleaved", virtual_pipeline_model_parallel_size=vpp)
    model = {"name": f"gpt-{row['params_b']}b", "architecture": "gpt",
             "num_hidden_layers": int(row["layers"]), "hidden_size": int(row["hidden"]),
             "num_attention_heads": int(row["heads"]), "vocab_size": padded_vocab(GPT2_VOCAB, tp),
             "max_position_embeddings": SEQ}
    return {"model": model, "parallel": parallel,
            "train": {"micro_batch_size": int(row["micro_batch"]),
                      "global_batch_size": int(row["batch"]), "seq_length": SEQ,
                      "dtype": "fp16", "recompute": "full"},
            "system": {"preset": "dgx-a100", "nodes": gpus // GPUS_PER_NODE,
                       "software": copy.deepcopy(STACKS[row["scheme"]])}}


def paper_flops(row: dict) -> float:
    """One iteration's FLOPs, eq. (3): 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))."""
    B, l, h = int(row["batch"]), int(row["layers"]), int(row["hidden"])
    return 96.0 * B * SEQ * l * h * h * (1 + SEQ / (6 * h) + PAPER_VOCAB / (16 * l * h))


def evaluate(engine: str = "analytical", only: list[dict] | None = None,
             limits=None) -> list[dict]:
    """One record per row: published and predicted iteration time and TFLOP/s per GPU."""
    out = []
    for row in rows() if only is None else only:
        gpus = int(row["gpus"])
        published = paper_flops(row) / (float(row["tflops_per_gpu"]) * 1e12 * gpus)
        rec = time_record(row, config(row), engine, limits, published)
        if rec["result"] is not None:
            rec["tflops"] = paper_flops(row) / rec["predicted"] / gpus / 1e12
        out.append(rec)
    return out


def pairs(out: list[dict]) -> list[tuple[dict, dict]]:
    """(ZeRO-3, PTD-P) records of the same model, matched in order of GPU count."""
    by = {}
    for o in out:
        by.setdefault((o["row"]["params_b"], o["row"]["scheme"]), []).append(o)
    result = []
    for (params, scheme), zs in by.items():
        if scheme == "zero3":
            ps = by[(params, "ptdp")]
            key = lambda o: int(o["row"]["gpus"])  # noqa: E731
            result += list(zip(sorted(zs, key=key), sorted(ps, key=key)))
    return result


def ordering(z: dict, p: dict) -> dict:
    """Published and predicted PTD-P / ZeRO-3 per-GPU throughput ratios, and if they agree."""
    pub = float(p["row"]["tflops_per_gpu"]) / float(z["row"]["tflops_per_gpu"])
    if z["result"] is None or p["result"] is None:
        return {"published": pub, "predicted": None, "same_order": None}
    pred = p["tflops"] / z["tflops"]
    return {"published": pub, "predicted": pred, "same_order": (pub > 1) == (pred > 1)}


def _time_cells(o: dict) -> list[str]:
    if o["result"] is None:
        return ["not run (work limit)", "-", "-"]
    note = " (does not fit; check_fit=False)" if o["refused"] else ""
    return [f"{o['tflops']:.1f}", f"{o['predicted']:.2f}{note}", f"{100 * o['error']:+.1f}%"]


def _label(o: dict) -> str:
    return f"{o['row']['params_b']}B {o['row']['scheme']} on {o['row']['gpus']} GPUs"


def _print(out: list[dict], markdown: bool) -> None:
    head = ["model", "scheme", "GPUs", "TP", "PP", "VPP-layers", "mbs", "batch",
            "published TFLOP/s", "published (s)", "predicted TFLOP/s", "predicted (s)", "error"]
    lines = [[f"{o['row']['params_b']}B", o["row"]["scheme"], o["row"]["gpus"], o["row"]["tp"],
              o["row"]["pp"], o["row"]["layers_per_virtual_stage"] or "-",
              o["row"]["micro_batch"], o["row"]["batch"], o["row"]["tflops_per_gpu"],
              f"{o['published']:.2f}", *_time_cells(o)] for o in out]
    print_table(head, lines, markdown)
    print()
    head = ["model", "GPUs (ZeRO-3 / PTD-P)", "published PTD-P ÷ ZeRO-3",
            "predicted PTD-P ÷ ZeRO-3", "ddlsim orders as measured"]
    lines = []
    for z, p in pairs(out):
        o = ordering(z, p)
        pred = "-" if o["predicted"] is None else f"{o['predicted']:.2f}×"
        same = {None: "-", True: "yes", False: "**no**" if markdown else "NO"}[o["same_order"]]
        lines.append([f"{z['row']['params_b']}B", f"{z['row']['gpus']} / {p['row']['gpus']}",
                      f"{o['published']:.2f}×", pred, same])
    print_table(head, lines, markdown)
    print_notes(out, _label, markdown)


def summary(out: list[dict], engine: str) -> str:
    """Mean |error|, worst row, and how many pairs ddlsim orders as measured."""
    ran = [o for o in out if o["result"] is not None]
    orders = [ordering(z, p)["same_order"] for z, p in pairs(out)]
    judged = [s for s in orders if s is not None]
    return (f"{error_stats(out, _label)}; ordering as measured in {sum(judged)} of "
            f"{len(judged)} pairs ({engine} engine, {len(ran)} of {len(out)} rows; positive "
            "error = ddlsim too slow)")


#: breakdown columns: (label, stream, op-name prefix) summed per iteration by :func:`busy`
BUSY = (("compute", "compute", ""), ("all-gathers", "dp", "param.all_gather"),
        ("reduce-scatters", "dp", "grad.reduce_scatter"), ("dp passes", "dp", "zero3."),
        ("host: gather issue", "host", "zero3.host_gather"),
        ("host: copy-out", "host", "zero3.host_copy_out"),
        ("host: zero-fill", "host", "zero3.zero_fill"),
        ("host: reduce issue", "host", "zero3.host_reduce"),
        ("host: persistent", "host", "zero3.persistent_"))


def busy(cfg) -> dict[str, float]:
    """Seconds each stream of the first rank class is busy per iteration, by :data:`BUSY`
    column: every op of every block, timed alone by the cost model the engines use (no
    waits, no overlap), times its repeats and its block's steps. Where these add up beyond
    the predicted iteration, the engine overlapped them; the host's column is a floor on
    the iteration (one host thread issues everything)."""
    from collections import Counter

    from ddlsim.api import build_workload
    from ddlsim.simulator.costs import CostModel, place_ranks_on_system
    from ddlsim.workloads.trace import Collective, Compute

    w = build_workload(cfg)
    cost = CostModel(cfg.system, w, cfg.parallel.collective_algorithm,
                     devices=place_ranks_on_system(cfg.system, w.world_size))
    program = w.classes[0].program
    steps = program.steps
    runs = Counter(steps.names if hasattr(steps, "names") else [x.block for x in steps])
    out = dict.fromkeys([label for label, _, _ in BUSY], 0.0)
    for block, k in runs.items():
        for op in program.blocks[block].flat.ops:
            p = op.payload
            if not isinstance(p, (Compute, Collective)):
                continue
            seconds = cost.compute(p) if isinstance(p, Compute) else cost.collective(p)
            label = next((lab for lab, stream, head in BUSY
                          if op.stream == stream and p.name.startswith(head)), None)
            if label is not None:
                out[label] += seconds * op.repeat * k
    return out


def print_busy(markdown: bool = False) -> None:
    """``--breakdown``: :func:`busy` of every ZeRO-3 row beside its predicted and published
    iteration (seconds)."""
    import ddlsim
    from ddlsim.config import build_config

    lines = []
    for row in [r for r in rows() if r["scheme"] == "zero3"]:
        cfg = build_config(config(row), [])
        predicted = ddlsim.predict(cfg, check_fit=False).iteration_time_s
        published = paper_flops(row) / (float(row["tflops_per_gpu"]) * 1e12 * int(row["gpus"]))
        lines.append([f"{row['params_b']}B", row["gpus"], f"{published:.2f}",
                      f"{predicted:.2f}", *(f"{x:.2f}" for x in busy(cfg).values())])
    print_table(["model", "GPUs", "published (s)", "predicted (s)",
                 *(label for label, _, _ in BUSY)], lines, markdown)


def breakdown(rest: list[str]) -> int:
    """``--breakdown`` with the other options ``rest``: :func:`print_busy`, which takes
    ``--markdown`` only (its predicted column is the analytical engine's); any other option
    is refused, not ignored (exit status 2)."""
    if "--write-docs" in rest:
        print("error: --breakdown and --write-docs do not go together: the docs' table "
              "is the predictions'", file=sys.stderr)
        return 2
    other = [a for a in rest if a != "--markdown"]
    if other:
        print(f"error: --breakdown takes --markdown (and --zero3-software) only, not "
              f"{' '.join(other)}: its predicted column is the analytical engine's",
              file=sys.stderr)
        return 2
    print_busy("--markdown" in rest)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``--zero3-software MAPPING`` (YAML/JSON) runs the ZeRO-3 rows under another
    ``system.software`` — the alternatives docs/validation.md compares; not with
    ``--write-docs``, whose table is the default's."""
    import argparse
    import json

    import yaml
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--zero3-software")
    ap.add_argument("--breakdown", action="store_true")
    known, rest = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    if known.zero3_software is not None:
        if "--write-docs" in rest:
            print("error: --zero3-software and --write-docs do not go together: the docs' "
                  "table is the default stack's", file=sys.stderr)
            return 2
        try:
            software = yaml.safe_load(known.zero3_software)
        except yaml.YAMLError as exc:
            print(f"error: --zero3-software is not YAML or JSON: {exc}", file=sys.stderr)
            return 2
        from ddlsim.config import build_config
        from ddlsim.errors import ConfigError
        default, STACKS["zero3"] = STACKS["zero3"], software
        try:
            build_config(config(next(r for r in rows() if r["scheme"] == "zero3")), [])
        except ConfigError as exc:
            STACKS["zero3"] = default
            print(f"error: --zero3-software: {exc}", file=sys.stderr)
            return 2
        print(f"ZeRO-3 rows under system.software = {json.dumps(STACKS['zero3'])}\n")
    if known.breakdown:
        return breakdown(rest)
    return run_script("validate_zero3", __doc__, rest, evaluate, _print, summary)


if __name__ == "__main__":
    sys.exit(main())
