"""Predicted vs published iteration time of Megatron-Bridge's other MoE runs on DGX H100.

Run:  python benchmarks/validate_moe_models.py [--engine analytical|des] [--markdown]
      [--des-rank-ops N] [--write-docs]

The rows (``data/bridge_h100_moe_models.csv``, with its provenance): every DGX-H100 MoE
pre-training row of NVIDIA-NeMo/Megatron-Bridge's performance summaries for a model ddlsim has a
preset for that ``validate_moe.py``'s table does not already hold: GPT-OSS 120B (BF16, 64 GPUs,
NeMo containers 25.11 to 26.04.01), the 25.11 Qwen3 rows (FP8 current scaling) and the 25.09
rows (DeepSeek-V3 dropless on 1,024 GPUs, Qwen3 with token dropping). Each row runs with the
settings its release's recipes give (the CSV's columns, read at the tag named in
``recipes_at``), on ``dgx-h100`` with the ``megatron-core-2025`` stack, as
``validate_moe.py`` runs its rows: expert TP 1 folded over TP x DP, the row's dispatcher,
grouped GEMM and fused permutation, the fused router, the distributed optimizer with the
gradient reduction and the parameter gather overlapped (bf16: the recipes' grad_reduce_in_fp32
False; the gather's overlap, refused with EP > 1 until 2026-11-30, is modelled since:
decoder/param_gather.py), TE cross-entropy fusion, no dataset
attention mask. Per row: precision (``fp8-cs``: Transformer Engine's current scaling), the
expert-parallel overlap (Megatron-Core's combined 1F1B with delayed weight gradients), the
recomputed modules, the router's balancing loss, forced balance, and token dropping
(``capacity_factor``: capacity 1.0 with every expert padded to it, Bridge's
``apply_moe_token_drop``). A row the CSV marks ``no: <reason>`` is listed, not predicted, with
what ddlsim says of its config (its refusal, or its warning that a part is not modelled); a
plan ddlsim refuses is listed with the refusal. Nothing tuned, no per-row factors.

A model with attention sinks (GPT-OSS: a learnable softmax) runs the attention its release's
container ran (:func:`attention_as_run`): TransformerEngine turns FlashAttention off for it
and runs cuDNN's fused attention where the container's cuDNN takes a sink (9.13.1 on,
:func:`ddlsim.simulator.kernels.attention.cudnn_runs_sinks`), else its unfused attention.
Every GPT-OSS row's container has such a cuDNN (:data:`CONTAINERS`): cuDNN's fused kernel
with the sinks and the 128-token window, as ddlsim's ``cudnn`` times it.
"""

from __future__ import annotations

import sys
import warnings
from functools import lru_cache

import ddlsim
from ddlsim.errors import ConfigError
from ddlsim.simulator.kernels.attention import cudnn_runs_sinks
from public_runs import (DATA, print_notes, print_table, read_csv, result_cells, run_script,
                         rows_summary, time_record)
from validate_moe import DISPATCHERS, GPUS_PER_NODE, NO_MASK, STACK, TE_CROSS_ENTROPY

TABLE = DATA / "bridge_h100_moe_models.csv"
#: the CSV's precision_as_run -> ``train.dtype`` and the stack's ``fp8_recipe``
#: (fp8-cs with its FP8 parameters: Megatron-Bridge's bf16_with_fp8_current_scaling_mixed sets
#: fp8_param_gather = True, src/megatron/bridge/training/mixed_precision.py line 302 at 067f987d,
#: 289 at 97ad8cc6 and c0b9a000; simulator/kernels/fp8_weights.py)
PRECISIONS = {"bf16": ("bf16", {}),
              "fp8-cs": ("fp8", {"fp8_recipe": "te_current", "fp8_param_gather": True})}
#: NeMo container (the release less a ``.01`` patch, which is assumed to keep its release's
#: libraries: none is published for it) -> (Transformer Engine, cuDNN): NVIDIA-NeMo/
#: Megatron-Bridge 067f987d docs/releases/software-versions.md, "NeMo Framework 25.09" to
#: "26.04"; the recipes' own pins agree (v0.2.0 pyproject.toml TransformerEngine release_v2.9,
#: v0.3.0 5671fd36 = v2.12, v0.4.0 71bbefbf = 2.14)
CONTAINERS = {"25.09": ("2.7.0", (9, 11, 0, 98)), "25.11": ("2.9", (9, 13, 1, 26)),
              "26.02": ("2.12", (9, 18, 0, 50)), "26.04": ("2.14+71bbefb", (9, 20, 0, 48))}


def rows() -> list[dict]:
    """The table's rows."""
    return read_csv(TABLE)


def _ints(row: dict, *keys: str) -> list[int]:
    return [int(row[k]) for k in keys]


def _moe(row: dict) -> dict:
    """``parallel.moe`` of a row: its dispatcher, overlap, router and token dropping."""
    overlap = row["a2a_overlap"] == "true"
    moe = {**DISPATCHERS[row["dispatcher_as_run"]], "grouped_gemm": True,
           "permute_fusion": True, "router_fusion": True,
           "router_force_load_balancing": row["forced_balance"] == "true",
           "router_load_balancing_type": row["load_balancing"],
           "overlap_expert_parallel_comm": overlap, "delay_wgrad_compute": overlap,
           "shared_expert_overlap": False}
    if row["aux_loss_coeff"]:
        moe["aux_loss_coeff"] = float(row["aux_loss_coeff"])
    if row["capacity_factor"]:
        moe["pad_expert_input_to_capacity"] = True
    return moe


def _precision(row: dict) -> tuple[str, dict]:
    """``(train.dtype, kernels)`` of a row's precision_as_run (:data:`PRECISIONS`). A listed row
    (``modelled`` not ``yes``) whose precision ddlsim cannot run or that is unknown gets bf16's:
    its config only asks ddlsim what it says of the plan (:func:`what_ddlsim_says`)."""
    key = row["precision_as_run"]
    if key in PRECISIONS:
        return PRECISIONS[key]
    if row["modelled"] != "yes":
        return PRECISIONS["bf16"]
    raise ValueError(f"precision_as_run = {key!r} ({row['release']} {row['model']}): allowed "
                     f"{sorted(PRECISIONS)}, or a row marked 'no: <reason>'")


def _train(row: dict) -> dict:
    """``train`` of a row: its batch, sequence, precision and recomputed modules."""
    dtype, _ = _precision(row)
    train = {"micro_batch_size": int(row["mbs"]), "global_batch_size": int(row["gbs"]),
             "seq_length": int(row["seq"]), "dtype": dtype, "recompute": "none"}
    if row["recompute_modules"]:
        train.update(recompute="selective", recompute_modules=row["recompute_modules"].split())
    return train


def attention_as_run(row: dict) -> tuple[str, str]:
    """``(software.kernels.attention, why)`` of a row whose model has attention sinks: cuDNN's
    fused attention where its container's cuDNN runs sinks, else TransformerEngine's unfused
    attention (module docstring). Megatron-Bridge runs TransformerEngine >= 2.8 there, which
    hands Megatron-Core's softmax_type to it (else the provider falls back to Megatron-Core's
    local attention: v0.2.0-v0.3.0 gpt_oss_provider.py ``provide``)."""
    te, cudnn = CONTAINERS[row["release"].removesuffix(".01")]
    version = ".".join(map(str, cudnn))
    if tuple(int(x) for x in te.split("+")[0].split(".")[:2]) < (2, 8):
        return "unfused", (f"TE {te} (< 2.8) takes no softmax_type: Megatron-Core's local "
                           "attention, its torch softmax with the sink")
    if cudnn_runs_sinks(cudnn):
        return "cudnn", (f"TE {te}, cuDNN {version}: cuDNN's fused attention with the sinks "
                         "in its kernel")
    return "unfused", f"TE {te}, cuDNN {version} (< 9.13.1): TE's unfused attention"


@lru_cache(maxsize=None)
def _has_sinks(preset: str) -> bool:
    """Whether the model preset's attention has sinks."""
    cfg = ddlsim.load_config({"model": preset, "parallel": {}, "train": {
        "micro_batch_size": 1, "global_batch_size": 8, "seq_length": 8},
        "system": {"preset": "dgx-h100", "nodes": 1, "software": {"stack": STACK}}})
    return cfg.model.shape().attention_sinks


def config(row: dict) -> dict:
    """The ddlsim run config of one row: the published plan with its recipe's settings (module
    docstring)."""
    gpus, tp, pp, cp, vp, ep, etp = _ints(row, "gpus", "tp", "pp", "cp", "vp", "ep", "etp")
    parallel = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
                "context_parallel_size": cp, "expert_model_parallel_size": ep,
                "expert_tensor_parallel_size": etp, "sequence_parallel": tp > 1,
                "zero_stage": 1, "overlap_grad_reduce": True, "overlap_param_gather": True,
                "moe": _moe(row)}
    if vp > 1:
        parallel.update(schedule="interleaved", virtual_pipeline_model_parallel_size=vp)
    if row["split"] == "embedding+loss":
        parallel.update(account_for_embedding_in_pipeline_split=True,
                        account_for_loss_in_pipeline_split=True)
    model = {"preset": row["preset"]}
    if row["split"].startswith("layout "):   # Megatron-Core's layout string and its MTP layers
        layout = row["split"].removeprefix("layout ")
        parallel["pipeline_model_parallel_layout"] = layout
        # the recipe's mtp_num_layers: Megatron-Core asserts the layout's 'm' count equals it
        model["mtp_num_layers"] = layout.count("m")
    if row["capacity_factor"]:
        model["capacity_factor"] = float(row["capacity_factor"])
    model = model if len(model) > 1 else row["preset"]
    _, fp8 = _precision(row)
    kernels = {**NO_MASK, "grad_reduce_dtype": "param", **TE_CROSS_ENTROPY, **fp8}
    if _has_sinks(row["preset"]):
        kernels["attention"] = attention_as_run(row)[0]
    return {"model": model, "parallel": parallel, "train": _train(row),
            "system": {"preset": "dgx-h100", "nodes": gpus // GPUS_PER_NODE,
                       "software": {"stack": STACK, "kernels": kernels}}}


def published_time(row: dict) -> float:
    """``gbs * seq / (tokens_per_s_per_gpu * gpus)``, seconds."""
    gpus, gbs, seq, tput = _ints(row, "gpus", "gbs", "seq", "tokens_per_s_per_gpu")
    return gbs * seq / (tput * gpus)


def what_ddlsim_says(row: dict) -> str:
    """ddlsim's own word on a row the table lists: the refusal of its config or of its plan
    (built, not timed), else its warnings about what it does not model, else nothing."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ddlsim.build_workload(ddlsim.load_config(config(row)))
        except (ConfigError, ValueError) as exc:
            return f"ddlsim refuses the plan: {exc}"
    said = [str(w.message) for w in caught if "not modelled" in str(w.message)]
    return f"ddlsim: {said[0]}" if said else ""


def _record(row: dict, engine: str, limits) -> dict:
    """One row's record (:func:`public_runs.time_record`), or, for a row the table lists or a
    plan ddlsim refuses, none with the reason as ``skipped``."""
    why = row["modelled"].removeprefix("no: ") if row["modelled"] != "yes" else ""
    if not why:
        try:
            return time_record(row, config(row), engine, limits, published_time(row))
        except ConfigError as exc:
            why = f"ddlsim refuses the plan: {exc}"
    else:
        said = what_ddlsim_says(row)
        why = f"{why}; {said}" if said else why
    return {"row": row, "result": None, "refused": "", "skipped": why,
            "published": published_time(row)}


def evaluate(engine: str = "analytical", only: list[dict] | None = None,
             limits=None) -> list[dict]:
    """Every row's record, or those of ``only``."""
    return [_record(row, engine, limits) for row in (rows() if only is None else only)]


def _label(o: dict) -> str:
    row = o["row"]
    return f"{row['model']} on {row['gpus']} GPUs ({row['release']})"


def _print(out: list[dict], markdown: bool) -> None:
    head = ["release", "model", "GPUs", "precision", "TP", "PP", "VP", "EP", "MBS", "GBS",
            "dispatcher", "a2a overlap", "recompute", "routing", "published tok/s/GPU",
            "published (s)", "predicted (s)", "error"]
    lines = []
    for o in out:
        row = o["row"]
        routing = "forced" if row["forced_balance"] == "true" else (
            f"capacity {row['capacity_factor']}" if row["capacity_factor"] else "dropless")
        cells = [row["release"], row["model"], row["gpus"], row["precision_as_run"] or "?",
                 row["tp"], row["pp"], row["vp"], row["ep"], row["mbs"], row["gbs"],
                 row["dispatcher_as_run"], row["a2a_overlap"],
                 row["recompute_modules"] or "-", routing, row["tokens_per_s_per_gpu"],
                 f"{o['published']:.2f}"]
        over_budget = row["modelled"] == "yes" and not o["skipped"].startswith("ddlsim refuses")
        missing = "not run (work limit)" if over_budget else "not modelled"
        lines.append(cells + result_cells(o, 2, missing=missing))
    print_table(head, lines, markdown)
    sinks = {o["row"]["release"].removesuffix(".01"): attention_as_run(o["row"])
             for o in out if _has_sinks(o["row"]["preset"])}
    if sinks:
        print("\nattention with sinks as run: " + "; ".join(
            f"{release} {why} ({kind})" for release, (kind, why) in sorted(sinks.items())))
    print_notes(out, _label, markdown)


def summary(out: list[dict], engine: str) -> str:
    """The table's summary line (:func:`public_runs.rows_summary`)."""
    if not any(o["result"] is not None for o in out):
        return f"no row predicted ({engine} engine, 0 of {len(out)} rows)"
    return rows_summary(out, engine, _label)


def main(argv: list[str] | None = None) -> int:
    return run_script("validate_moe_models", __doc__, argv, evaluate, _print, summary)


if __name__ == "__main__":
    sys.exit(main())
