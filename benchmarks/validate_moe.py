"""Predicted vs published iteration time of Megatron-Core MoE runs on DGX H100 (Megatron-Bridge).

Run:  python benchmarks/validate_moe.py [--engine analytical|des] [--markdown] [--write-docs]
      [--des-rank-ops N]

The published rows (NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md: Qwen3-235B-A22B
on 256 H100s and Qwen3-30B-A3B on 16, FP8 current scaling, NeMo containers 26.02 to 26.06) and the
run settings read in that repository's performance recipes are in ``data/bridge_h100_moe.csv``,
with their provenance. Each row is predicted on ``dgx-h100`` with the ``megatron-core-2025``
stack: expert TP 1 with EP folded over TP x DP (Megatron-Core's MoE parallel folding), the
row's dispatcher (dispatcher_as_run: alltoall, or flex with DeepEP's or HybridEP's kernels,
docs/moe.md), grouped GEMM, fused permutation, forced load balance (router imbalance 1),
distributed optimizer (ZeRO-1) with both overlaps, bf16 gradient reduction, no recomputation.
Megatron-Core's expert-parallel communication overlap is set per row as the recipes set it
(``a2a_overlap``: Bridge's moe_a2a_overlap, i.e. overlap_moe_expert_parallel_comm with
delay_wgrad_compute, the combined 1F1B schedule that runs one micro-batch's dispatch/combine
all-to-alls beside another micro-batch's compute: docs/moe.md). What the runs do that is not
modelled, on every row (the "not modelled" column; docs/moe.md, "The layer's kernels, and what
validate_moe leaves open", checks each recipe setting): the distributed optimizer's overlapped
parameter all-gather (ddlsim refuses that overlap with EP > 1, so the gather after the step is
exposed), FP8 current scaling (the tables' FP8-CS, run with the stack's delayed-scaling casts:
no amax passes) and Bridge's ``moe_router_fusion`` (the router is its GEMM alone here). No
per-row factors and nothing tuned.
"""

from __future__ import annotations

import sys

from public_runs import (DATA, print_notes, print_table, read_csv, result_cells, rows_summary,
                         run_script, time_record)

TABLE = DATA / "bridge_h100_moe.csv"
STACK = "megatron-core-2025"
GPUS_PER_NODE = 8
#: the CSV's dispatcher_as_run -> parallel.moe's dispatcher fields
DISPATCHERS = {"alltoall": {"token_dispatcher_type": "alltoall"},
               "flex-deepep": {"token_dispatcher_type": "flex",
                               "flex_dispatcher_backend": "deepep"},
               "flex-hybridep": {"token_dispatcher_type": "flex",
                                 "flex_dispatcher_backend": "hybridep"}}


def rows() -> list[dict]:
    return read_csv(TABLE)


def _int(row: dict, *keys: str) -> list[int]:
    return [int(row[k]) for k in keys]


def config(row: dict) -> dict:
    """The ddlsim run config of one row (the table's plan, the recipes' options)."""
    gpus, tp, pp, cp, vp, ep = _int(row, "gpus", "tp", "pp", "cp", "vp", "ep")
    parallel = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
                "context_parallel_size": cp, "expert_model_parallel_size": ep,
                "expert_tensor_parallel_size": 1, "sequence_parallel": tp > 1,
                # the recipes overlap the parameter all-gather too; ddlsim does not model that
                # overlap with EP > 1 (docs/overlap.md) and refuses it: the gather is exposed
                "zero_stage": 1, "overlap_grad_reduce": True, "overlap_param_gather": False,
                "moe": {**DISPATCHERS[row["dispatcher_as_run"]], "grouped_gemm": True,
                        "permute_fusion": True, "router_force_load_balancing": True,
                        # Bridge's moe_a2a_overlap: Megatron-Core's combined 1F1B
                        "overlap_expert_parallel_comm": row["a2a_overlap"] == "true",
                        "delay_wgrad_compute": row["delay_wgrad_compute"] == "true",
                        "shared_expert_overlap": row["moe_shared_expert_overlap"] == "true"}}
    if vp > 1:
        parallel.update(schedule="interleaved", virtual_pipeline_model_parallel_size=vp)
    if row["split"] == "embedding+loss":
        parallel.update(account_for_embedding_in_pipeline_split=True,
                        account_for_loss_in_pipeline_split=True)
    return {"model": row["preset"], "parallel": parallel,
            "train": {"micro_batch_size": int(row["mbs"]), "global_batch_size": int(row["gbs"]),
                      "seq_length": int(row["seq"]), "dtype": "fp8", "recompute": "none"},
            "system": {"preset": "dgx-h100", "nodes": gpus // GPUS_PER_NODE,
                       "software": {"stack": STACK, "kernels": {
                           "grad_reduce_dtype": "param", "fused_cross_entropy": True}}}}


def approximated(row: dict) -> str:
    """What the row's run does that ddlsim does not model, on every row: the distributed
    optimizer's parameter all-gather overlapped with the next forward (exposed here), FP8
    current scaling's amax passes (timed as delayed scaling) and the fused router kernels."""
    return "param-gather overlap, FP8-CS amax, router kernels"


def published_time(row: dict) -> float:
    gpus, gbs, seq, tput = _int(row, "gpus", "gbs", "seq", "tokens_per_s_per_gpu")
    return gbs * seq / (tput * gpus)


def evaluate(engine: str = "analytical", only: list[dict] | None = None,
             limits=None) -> list[dict]:
    return [time_record(row, config(row), engine, limits, published_time(row))
            for row in (rows() if only is None else only)]


def _label(o: dict) -> str:
    return f"{o['row']['model']} on {o['row']['gpus']} GPUs ({o['row']['release']})"


def _print(out: list[dict], markdown: bool) -> None:
    head = ["release", "model", "GPUs", "TP", "PP", "VP", "EP", "GBS", "not modelled",
            "published tok/s/GPU", "published (s)", "predicted (s)", "error"]
    lines = []
    for o in out:
        row = o["row"]
        cells = [row["release"], row["model"], row["gpus"], row["tp"], row["pp"], row["vp"],
                 row["ep"], row["gbs"], approximated(row) or "-", row["tokens_per_s_per_gpu"],
                 f"{o['published']:.2f}"]
        lines.append(cells + result_cells(o, 2))
    print_table(head, lines, markdown)
    print_notes(out, _label, markdown)


def summary(out: list[dict], engine: str) -> str:
    return rows_summary(out, engine, _label)


def main(argv: list[str] | None = None) -> int:
    return run_script("validate_moe", __doc__, argv, evaluate, _print, summary)


if __name__ == "__main__":
    sys.exit(main())
