"""Predicted vs published iteration time of Megatron-Core MoE runs on DGX H100 (Megatron-Bridge).

Run:  python benchmarks/validate_moe.py [--engine analytical|des] [--markdown] [--write-docs]
      [--des-rank-ops N]

The published rows (NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md: Qwen3-235B-A22B
on 256 H100s and Qwen3-30B-A3B on 16, FP8 current scaling, NeMo containers 26.02 to 26.06) and the
run settings read in that repository's performance recipes are in ``data/bridge_h100_moe.csv``,
with their provenance. Each row is predicted on ``dgx-h100`` with the ``megatron-core-2025``
stack: expert TP 1 with EP folded over TP x DP (Megatron-Core's MoE parallel folding), the
row's dispatcher (dispatcher_as_run: alltoall, or flex with DeepEP's or HybridEP's kernels,
docs/moe.md), grouped GEMM (Transformer Engine's GroupedLinear: one cuBLAS GEMM per local
expert on four streams, docs/moe.md "Grouped GEMM as Transformer Engine runs it"), fused
permutation, forced load balance (router imbalance 1),
distributed optimizer (ZeRO-1) with both overlaps, bf16 gradient reduction, no recomputation.
Megatron-Core's expert-parallel communication overlap is set per row as the recipes set it
(``a2a_overlap``: Bridge's moe_a2a_overlap, i.e. overlap_moe_expert_parallel_comm with
delay_wgrad_compute, the combined 1F1B schedule that runs one micro-batch's dispatch/combine
all-to-alls beside another micro-batch's compute: docs/moe.md). What the runs do that is not
modelled are in the "not modelled" column (docs/moe.md, "The layer's kernels, and what
validate_moe leaves open", checks each recipe setting). The distributed optimizer's parameter
all-gather overlaps the next forward as the recipes run it (``--overlap-param-gather``; the
dense buffer's and the experts' own, each but its first bucket: decoder/param_gather.py; until
2026-11-30 ddlsim refused that overlap with EP > 1 and the rows ran with the gather exposed,
each row then 0-0.6 % slower). The router runs as each source sets it (:data:`BRIDGE_ROUTER`, :data:`ZOO_ROUTER`:
its top-k, load-balancing loss and the loss's all-reduce over TP × CP, fused or not;
``decoder/moe_router.py``). The tables'
FP8-CS runs with Transformer Engine's current scaling (``fp8_recipe: te_current``: its amax
passes, TP amax all-reduces, per-expert quantize kernels; docs/compute.md, "FP8"). The
dispatchers' host waits for the device in each forward and the host's forward work between them
are modelled (``decoder/moe_host.py``, ``moe_host_chain.py``: after the last wait the host's work
up to the combine step by step before the device ops it launches; docs/moe.md, "The
dispatcher's host synchronisation"); of the backward's host time only the experts' grouped
linears' per-expert calls into torch are. No per-row factors and nothing tuned.

A second table: the Qwen3-235B step times that Megatron-LM's MoE developers publish on 256 H100s
(yanring/Megatron-MoE-ModelZoo, BF16; ``data/modelzoo_h100_moe.csv`` with its provenance), among
them the same plan without and with the expert-parallel overlap (its A/B), each row with the
settings of that repository's scripts; a row ddlsim does not model is listed, not predicted.

A third table: the same developers' long-sequence runs of that model (16k-128k tokens, TP4 PP8
VP4 EP8, context parallelism 1-8, DeepEP, BF16; ``data/modelzoo_h100_moe_long_context.csv``),
published as TFLOP/s per GPU and turned into step times with Megatron-LM's own FLOP count
(:func:`megatron_flops`). Forced-balance rows are predicted; the dropless ones (aux loss 1e-3,
not forced) too, since ddlsim derives their hottest EP rank's load over the mean
(``router_imbalance`` unset: ``decoder/moe_balance.py``, a lower bound from Wang et al. 2024's
published per-expert MaxVio_global and top-k sampling, about 1.08 at EP 8), which loads that
rank's experts; DeepEP's traffic stays at the mean (its kernels are modelled under balanced
routing only). Published dropless is 9-25 % slower than forced there; that gap is this check,
never the default's source.

Every Bridge row runs forced balance (the recipes' ``moe_router_force_load_balancing``), as do
ModelZoo step-time rows 1-2 (run_235b.sh's ``--moe-router-force-load-balancing``; rows 3-5 take
that benchmark setting, ``forced_balance: assumed``), so the default moves none of them.
"""

from __future__ import annotations

import json
import sys

from ddlsim.errors import ConfigError
from public_runs import (DATA, print_notes, print_table, read_csv, result_cells, rows_summary,
                         run_script, time_record)

TABLE = DATA / "bridge_h100_moe.csv"
ZOO_TABLE = DATA / "modelzoo_h100_moe.csv"
LONG_TABLE = DATA / "modelzoo_h100_moe_long_context.csv"
AB_TABLE = DATA / "bridge_h100_moe_overlap_ab.csv"
HF = DATA.parent.parent / "ddlsim" / "data" / "hf"
STACK = "megatron-core-2025"
GPUS_PER_NODE = 8
#: the CSV's dispatcher_as_run -> parallel.moe's dispatcher fields. Every HybridEP row is a
#: Megatron-Bridge run, whose scripts give HybridEP 32 SMs: the tables' recipes through
#: scripts/performance/utils/overrides.py _set_common_perf_overrides (v0.3.0 line 69, v0.4.0
#: line 71: moe_hybridep_num_sms = 32), the A/B runs' through 7ded17da
#: src/megatron/bridge/perf_recipes/_common.py line 82 (the same); Megatron-Core's default is 16
#: (simulator/collectives/flex.py KERNEL_SMS). DeepEP rows keep Megatron-Core's 20 (no script
#: of these tables sets it)
DISPATCHERS = {"alltoall": {"token_dispatcher_type": "alltoall"},
               "flex-deepep": {"token_dispatcher_type": "flex",
                               "flex_dispatcher_backend": "deepep"},
               "flex-hybridep": {"token_dispatcher_type": "flex",
                                 "flex_dispatcher_backend": "hybridep",
                                 "flex_dispatcher_num_sms": 32}}


def rows() -> list[dict]:
    """The Megatron-Bridge rows (``set`` = ``bridge``)."""
    return [{**r, "set": "bridge"} for r in read_csv(TABLE)]


def zoo_rows() -> list[dict]:
    """The Megatron-MoE-ModelZoo rows (``set`` = ``modelzoo``)."""
    return [{**r, "set": "modelzoo"} for r in read_csv(ZOO_TABLE)]


def long_rows() -> list[dict]:
    """The Megatron-MoE-ModelZoo long-context rows (``set`` = ``long``)."""
    return [{**r, "set": "long"} for r in read_csv(LONG_TABLE)]


def ab_rows() -> list[dict]:
    """Megatron-Bridge's EP-overlap A/B runs (``set`` = ``ab``)."""
    return [{**r, "set": "ab"} for r in read_csv(AB_TABLE)]


def _int(row: dict, *keys: str) -> list[int]:
    return [int(row[k]) for k in keys]


def config(row: dict) -> dict:
    """The ddlsim run config of one row (the table's plan, the recipes' or scripts' options)."""
    if row["set"] == "long":
        return long_config(row)
    if row["set"] == "modelzoo":
        return zoo_config(row)
    if row["set"] == "ab":
        return ab_config(row)
    return _run(row, expert_tp=1,
                moe={"router_force_load_balancing": True,
                     # Bridge's moe_a2a_overlap: Megatron-Core's combined 1F1B
                     "overlap_expert_parallel_comm": row["a2a_overlap"] == "true",
                     "delay_wgrad_compute": row["delay_wgrad_compute"] == "true",
                     "shared_expert_overlap": row["moe_shared_expert_overlap"] == "true",
                     **BRIDGE_ROUTER},
                train={"dtype": "fp8", "recompute": "none"},
                kernels={"grad_reduce_dtype": "param", **TE_CROSS_ENTROPY,
                         # the tables' FP8-CS (validate_bridge.FP8_RECIPE's sources),
                         # with its FP8 parameters (mixed_precision.py 067f987d line 302,
                         # bf16_with_fp8_current_scaling_mixed: fp8_param_gather = True)
                         "fp8_recipe": "te_current", "fp8_param_gather": True})


#: every table's cross-entropy: Transformer Engine's fused one (software.yaml
#: cross_entropy_fusion_impl; simulator/kernels/step_passes.py): the Bridge rows' recipes
#: (Megatron-Bridge v0.3.0 and v0.4.0 scripts/performance/utils/overrides.py
#: _set_common_perf_overrides: cross_entropy_fusion_impl = "te"; src/megatron/bridge/recipes/
#: qwen/qwen3_moe.py cross_entropy_loss_fusion True), the A/B runs' (7ded17da
#: src/megatron/bridge/perf_recipes/_common.py _benchmark_common(cross_entropy_impl="te"),
#: which qwen/h100/qwen3_moe.py calls), the ModelZoo's (c1ad0b5c
#: model_configs/benchmarking/Qwen3-235B-A22B.yaml lines 40-41: --cross-entropy-loss-fusion
#: --cross-entropy-fusion-impl te)
TE_CROSS_ENTROPY = {"fused_cross_entropy": True, "cross_entropy_fusion_impl": "te"}

#: the Bridge recipes' router: aux_loss balancing with coefficient 1e-3 (Megatron-Bridge v0.3.0
#: src/megatron/bridge/models/qwen/qwen_provider.py lines 391-392; v0.4.0 qwen3_moe_bridge.py
#: lines 56-57) and the fused router (scripts/performance/configs/qwen/qwen3_llm_pretrain.py
#: line 36 at both tags: cfg.model.moe_router_fusion = True)
BRIDGE_ROUTER = {"aux_loss_coeff": 1e-3, "router_fusion": True}
#: the ModelZoo runs' router: Qwen3-235B-A22B.yaml's --moe-aux-loss-coeff 1e-3 (there since
#: b06a6d8, 2025-05-26) with aux_loss balancing; the step-time table (published at 8017e11,
#: 2025-05-27) ran before the fused router existed (Megatron-LM's --moe-router-fusion came in
#: c08d89bea0, 2025-08-17; Transformer Engine's kernels in 62acae059, 2025-07-10), the
#: long-context table (published at b0b92ff, 2025-11-04) with the yaml's --moe-router-fusion
#: (there since 274316a, 2025-08-20); both with the yaml's --moe-router-dtype fp32
#: (model_configs/benchmarking/Qwen3-235B-A22B.yaml line 106 at c1ad0b5c, there since b06a6d8,
#: 2025-05-26: the router's GEMM on fp32 casts, decoder/moe_router.py router_gemm). The Bridge
#: recipes leave it unset (Megatron-Bridge v0.3.0 qwen_provider.py sets moe_router_dtype "fp32"
#: for Qwen3-Next only, line 453; v0.4.0 for no Qwen3 model; scripts/performance: none)
ZOO_ROUTER = {"aux_loss_coeff": 1e-3, "router_fusion": False, "router_dtype": "fp32"}


def ab_config(row: dict) -> dict:
    """An EP-overlap A/B run's config (``data/bridge_h100_moe_overlap_ab.csv``'s header): the
    Bridge router, forced balance, BF16 without recomputation, the row's dispatcher, fused
    permutation or not, and the overlap without delayed weight gradients."""
    return _run(row, expert_tp=1,
                moe={"router_force_load_balancing": True,
                     "permute_fusion": row["permute_fusion"] == "true",
                     "overlap_expert_parallel_comm": row["a2a_overlap"] == "true",
                     "delay_wgrad_compute": False, **BRIDGE_ROUTER},
                train={"dtype": "bf16", "recompute": "none"},
                kernels={"grad_reduce_dtype": "param", **TE_CROSS_ENTROPY})


def _run(row: dict, expert_tp: int, moe: dict, train: dict, kernels: dict) -> dict:
    """What both tables' configs share: the row's plan on ``dgx-h100`` (TP with sequence
    parallelism, expert TP ``expert_tp``, the interleaving and, where its recipe says so,
    Megatron-Core's account of the embedding and the loss in the pipeline split), the
    distributed optimizer with both overlaps, the row's dispatcher with grouped GEMM and fused
    permutation, its batch and sequence; ``moe``, ``train`` and the :data:`STACK`'s
    ``kernels`` add each table's settings."""
    gpus, tp, pp, cp, vp, ep = _int(row, "gpus", "tp", "pp", "cp", "vp", "ep")
    parallel = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
                "context_parallel_size": cp, "expert_model_parallel_size": ep,
                "expert_tensor_parallel_size": expert_tp, "sequence_parallel": tp > 1,
                # the recipes overlap the parameter all-gather too: the dense buffer's and
                # the experts' own, each but its first bucket beside the first forward
                # (decoder/param_gather.py, "Expert parallelism")
                "zero_stage": 1, "overlap_grad_reduce": True, "overlap_param_gather": True,
                "moe": {**DISPATCHERS[row["dispatcher_as_run"]], "grouped_gemm": True,
                        "permute_fusion": True, **moe}}
    if vp > 1:
        parallel.update(schedule="interleaved", virtual_pipeline_model_parallel_size=vp)
    if row["split"] == "embedding+loss":
        parallel.update(account_for_embedding_in_pipeline_split=True,
                        account_for_loss_in_pipeline_split=True)
    return {"model": row["preset"], "parallel": parallel,
            "train": {"micro_batch_size": int(row["mbs"]), "global_batch_size": int(row["gbs"]),
                      "seq_length": int(row["seq"]), **train},
            "system": {"preset": "dgx-h100", "nodes": gpus // GPUS_PER_NODE,
                       "software": {"stack": STACK, "kernels": {**NO_MASK, **kernels}}}}


#: neither source's batch carries the dataset's attention mask: Megatron-Bridge skips it
#: (067f987d training/gpt_step.py line 360, skip_getting_attention_mask_from_dataset=True);
#: the ModelZoo's model_configs/benchmarking/Qwen3-235B-A22B.yaml (e865051) passes
#: --no-create-attention-mask-in-dataloader (workloads/decoder/batch_input.py)
NO_MASK = {"batch_attention_mask": "none"}


#: the ModelZoo table's recompute column -> ``train`` fields (the scripts' flags)
ZOO_RECOMPUTE = {"full": {"recompute": "full"}, "": {"recompute": "none"},
                 "norm, act": {"recompute": "selective",
                               "recompute_modules": ["moe_act", "layernorm"]},
                 "layernorm, moe": {"recompute": "selective",
                                    "recompute_modules": ["layernorm", "moe"]}}


def zoo_config(row: dict) -> dict:
    """A ModelZoo row's run config: the table's plan with the settings its scripts give
    (``data/modelzoo_h100_moe.csv``'s header) and its router (:data:`ZOO_ROUTER`; the
    long-context rows' fused): BF16, the overlap where the row ran it, the
    distributed optimizer with both overlaps, fp32
    gradient reduction (the stack's default with --bf16), TE cross-entropy fusion. Full
    recomputation where the table says ``full``; its ``norm, act`` is run_235b.sh's
    ``--recompute-granularity selective --recompute-modules moe_act layernorm``
    (``train.recompute_modules``)."""
    overlap = row["a2a_overlap"] == "true"
    cfg = _run(row, expert_tp=int(row["etp"]),
               moe={"router_force_load_balancing": row["forced_balance"] != "false",
                    "overlap_expert_parallel_comm": overlap, "delay_wgrad_compute": overlap,
                    **ZOO_ROUTER, "router_fusion": row["set"] == "long"},
               train={"dtype": row["precision"], **ZOO_RECOMPUTE[row["recompute"]]},
               kernels=TE_CROSS_ENTROPY)
    return megatron_fsdp(cfg) if row.get("fsdp") == "On" else cfg


def megatron_fsdp(cfg: dict) -> dict:
    """``cfg`` run under Megatron-FSDP, as the table's ``FSDP On`` (row 3): Megatron-Core's
    custom FSDP at the row's commit 1e057005 (``--use-custom-fsdp
    --data-parallel-sharding-strategy optim_grads_params``, which forces both overlaps on,
    with ``--no-gradient-accumulation-fusion``, as its docs/source/api-guide/custom_fsdp.md
    gives them; the table publishes no command): ZeRO-3 with zero3_implementation
    megatron_fsdp (decoder/megatron_fsdp.py; its per-layer gathers and reduce-scatters are
    the overlaps), the experts sharded over the expert data-parallel group."""
    parallel = {k: v for k, v in cfg["parallel"].items()
                if k not in ("overlap_grad_reduce", "overlap_param_gather")}
    software = cfg["system"]["software"]
    software = {**software, "kernels": {**software["kernels"],
                                        "gradient_accumulation_fusion": False},
                "overlap": {"zero3_implementation": "megatron_fsdp"}}
    return {**cfg, "parallel": {**parallel, "zero_stage": 3},
            "system": {**cfg["system"], "software": software}}


def long_config(row: dict) -> dict:
    """A long-context row's run config: :func:`zoo_config`'s, with the model's position
    limit raised to the sequence where it is shorter, as the table's script does
    (sbatch_benchmarking.sh: --max-position-embeddings SEQ_LEN when SEQ_LEN exceeds the
    config's)."""
    cfg = zoo_config(row)
    hf = json.loads((HF / f"{row['preset']}.json").read_text())
    if int(row["seq"]) > hf["max_position_embeddings"]:
        cfg["model"] = {"preset": row["preset"], "max_position_embeddings": int(row["seq"])}
    return cfg


def approximated(row: dict) -> str:
    """What the row's run does that ddlsim does not model ("-": nothing listed): Megatron-
    FSDP's reduce-scatter queue cap (ModelZoo row 3, decoder/megatron_fsdp.py). The parameter
    all-gather beside the next forward (decoder/param_gather.py; listed until 2026-11-30),
    the router's kernels and FP8 current scaling are modelled on every row."""
    if row.get("fsdp") == "On":
        return "RS queue cap"
    return "-"


def megatron_flops(row: dict) -> float:
    """Megatron-LM's FLOP count of one global batch of ``row`` (its model's config.json), as
    its training log reports TFLOP/s: ``3 × (L·(attention + MoE) + logits)`` forward FLOPs, the
    attention ``4·T·h·p·(h + h·g/a) + 2·Σs²·h·p`` (``p = d_head·a/h``, ``g`` query groups: the
    core counted causal), the MoE ``4·T·h·f_e·k·3/2`` (gated), the logits ``2·T·h·V``;
    ``T`` = GBS × seq tokens, ``Σs²`` = GBS × seq².

    References
    ----------
    NVIDIA/Megatron-LM d98e8a64dd ``megatron/training/training.py``
    ``num_floating_point_operations`` (``attn_layer_flops``, ``moe_layer_flops``, the logits
    term); it gives back modelzoo_h100_moe.csv's TFLOPS column from its step times within 0.6 %.
    """
    hf = json.loads((HF / f"{row['preset']}.json").read_text())
    h, a, g = hf["hidden_size"], hf["num_attention_heads"], hf["num_key_value_heads"]
    gbs, seq = int(row["gbs"]), int(row["seq"])
    tokens, squares = gbs * seq, gbs * seq * seq
    p = hf["head_dim"] * a / h
    attn = 4 * tokens * h * p * (h + h * g / a) + 2 * squares * h * p
    moe = 4 * tokens * h * hf["moe_intermediate_size"] * hf["num_experts_per_tok"] * 1.5
    logits = 2 * tokens * h * hf["vocab_size"]
    return 3.0 * (hf["num_hidden_layers"] * (attn + moe) + logits)


def published_time(row: dict) -> float:
    if row["set"] == "modelzoo":
        return float(row["step_time_s"])
    if row["set"] == "ab":
        return float(row["published_s"])
    if row["set"] == "long":
        return megatron_flops(row) / (int(row["gpus"]) * float(row["tflops"]) * 1e12)
    gpus, gbs, seq, tput = _int(row, "gpus", "gbs", "seq", "tokens_per_s_per_gpu")
    return gbs * seq / (tput * gpus)


#: the long-context table's reason for its dropless rows (``modelled``): no published per-rank
#: load; a row with it is predicted when ddlsim derives the default from a published statistic
DROPLESS_REASON = "no: dropless routing, its per-rank load imbalance not published"


def _derived_default(row: dict) -> bool:
    """Whether ddlsim derives the row's hot-rank load (``router_imbalance`` unset, dropless,
    the router's statistic published: ``plan.moe.imbalance_basis == "derived"``,
    :mod:`ddlsim.workloads.decoder.moe_balance`)."""
    import warnings

    from ddlsim import load_config
    from ddlsim.workloads.decoder.moeplan import resolve_moe
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = resolve_moe(load_config(config(row)))
    return plan is not None and plan.imbalance_basis == "derived"


def _record(row: dict, engine: str, limits) -> dict:
    """One row's record (:func:`public_runs.time_record`); a row ddlsim does not model (the
    table says so, or ddlsim refuses its plan) gets none, with the reason as ``skipped``. A
    dropless row the table lists for want of a published per-rank load is predicted when
    ddlsim derives that load (:func:`_derived_default`)."""
    modelled = row.get("modelled", "yes")
    if modelled == DROPLESS_REASON and _derived_default(row):
        modelled = "yes"
    why = modelled.removeprefix("no: ") if modelled != "yes" else ""
    if not why:
        try:
            return time_record(row, config(row), engine, limits, published_time(row))
        except ConfigError as exc:
            why = f"ddlsim refuses the plan: {exc}"
    return {"row": row, "result": None, "refused": "", "skipped": why,
            "published": published_time(row)}


def evaluate(engine: str = "analytical", only: list[dict] | None = None,
             limits=None) -> list[dict]:
    """Every row's record (Bridge's, then the ModelZoo's), or those of ``only``."""
    return [_record(row, engine, limits)
            for row in (rows() + zoo_rows() + long_rows() + ab_rows() if only is None
                        else only)]


def _label(o: dict) -> str:
    row = o["row"]
    if row["set"] == "modelzoo":
        return f"ModelZoo Qwen3-{row['model']} row {row['row']}"
    if row["set"] == "long":
        return f"ModelZoo Qwen3-{row['model']} {row['row']} {row['routing']}"
    if row["set"] == "ab":
        return (f"Bridge Qwen3-{row['model']} {row['run']} overlap "
                f"{'on' if row['a2a_overlap'] == 'true' else 'off'}")
    return f"{row['model']} on {row['gpus']} GPUs ({row['release']})"


def _print_zoo(out: list[dict], markdown: bool) -> None:
    head = ["row", "dispatcher", "TP", "PP", "VP", "EP", "DP", "MBS", "GBS", "recompute",
            "a2a overlap", "not modelled", "published (s)", "predicted (s)", "error"]
    lines = []
    for o in out:
        row = o["row"]
        cells = [row["row"], row["dispatcher_as_run"], row["tp"], row["pp"], row["vp"],
                 row["ep"], row["dp"], row["mbs"], row["gbs"], row["recompute"] or "-",
                 row["a2a_overlap"], approximated(row), f"{o['published']:.1f}"]
        lines.append(cells + result_cells(o, 2, missing="not modelled"))
    print_table(head, lines, markdown)


def _print_long(out: list[dict], markdown: bool) -> None:
    head = ["seq", "TP", "CP", "EP", "PP", "VP", "GBS", "routing", "published TFLOP/s/GPU",
            "published (s)", "predicted (s)", "error"]
    lines = []
    for o in out:
        row = o["row"]
        cells = [row["seq"], row["tp"], row["cp"], row["ep"], row["pp"], row["vp"], row["gbs"],
                 row["routing"], row["tflops"], f"{o['published']:.2f}"]
        lines.append(cells + result_cells(o, 2, missing="not modelled"))
    print_table(head, lines, markdown)


def _print_ab(out: list[dict], markdown: bool) -> None:
    head = ["run", "dispatcher", "EP", "fused permute", "a2a overlap", "not modelled",
            "published (s)", "predicted (s)", "error"]
    lines = []
    for o in out:
        row = o["row"]
        cells = [row["run"], row["dispatcher_as_run"], row["ep"], row["permute_fusion"],
                 row["a2a_overlap"], row["not_modelled"] or "-", f"{o['published']:.2f}"]
        lines.append(cells + result_cells(o, 2, missing="not modelled"))
    print_table(head, lines, markdown)


def _print(out: list[dict], markdown: bool) -> None:
    ab = [o for o in out if o["row"]["set"] == "ab"]
    long_ = [o for o in out if o["row"]["set"] == "long"]
    zoo = [o for o in out if o["row"]["set"] == "modelzoo"]
    out = [o for o in out if o["row"]["set"] == "bridge"]
    head = ["release", "model", "GPUs", "TP", "PP", "VP", "EP", "GBS", "not modelled",
            "published tok/s/GPU", "published (s)", "predicted (s)", "error"]
    lines = []
    for o in out:
        row = o["row"]
        cells = [row["release"], row["model"], row["gpus"], row["tp"], row["pp"], row["vp"],
                 row["ep"], row["gbs"], approximated(row), row["tokens_per_s_per_gpu"],
                 f"{o['published']:.2f}"]
        lines.append(cells + result_cells(o, 2))
    if lines:
        print_table(head, lines, markdown)
        print_notes(out, _label, markdown)
    if zoo:
        print("\nMegatron-MoE-ModelZoo, Qwen3-235B-A22B, BF16, 256 H100s:\n")
        _print_zoo(zoo, markdown)
        print_notes(zoo, _label, markdown)
    if long_:
        print("\nMegatron-MoE-ModelZoo long context, Qwen3-235B-A22B, BF16, DeepEP, 256 H100s "
              "(published TFLOP/s to seconds by Megatron-LM's FLOP count):\n")
        _print_long(long_, markdown)
        print_notes(long_, _label, markdown)
    if ab:
        print("\nMegatron-Bridge, Qwen3-30B-A3B on 16 H100s, BF16: the expert-parallel overlap "
              "off and on (published A/B runs):\n")
        _print_ab(ab, markdown)
        print_notes(ab, _label, markdown)


def summary(out: list[dict], engine: str) -> str:
    """The Bridge rows' summary line, the ModelZoo rows' and their overlap A/B, then the
    long-context rows'."""
    parts = []
    for name, set_ in (("Bridge", "bridge"), ("ModelZoo", "modelzoo"),
                       ("ModelZoo long context", "long")):
        rows_ = [o for o in out if o["row"]["set"] == set_]
        if any(o["result"] is not None for o in rows_):
            parts.append(f"{name}: {rows_summary(rows_, engine, _label)}")
    ab = {o["row"]["a2a_overlap"]: o for o in out if o["row"]["set"] == "modelzoo"
          and o["row"]["row"] in ("1", "2") and o["result"] is not None}
    if len(ab) == 2:
        off, on = ab["false"], ab["true"]
        parts.append("ModelZoo overlap A/B (rows 1, 2): published "
                     f"{off['published']:.1f} -> {on['published']:.1f} s "
                     f"({100 * (1 - on['published'] / off['published']):.1f} % faster), "
                     f"predicted {off['predicted']:.2f} -> {on['predicted']:.2f} s "
                     f"({100 * (1 - on['predicted'] / off['predicted']):.1f} % faster)")
    for run in dict.fromkeys(o["row"]["run"] for o in out if o["row"]["set"] == "ab"):
        pair = {o["row"]["a2a_overlap"]: o for o in out if o["row"]["set"] == "ab"
                and o["row"]["run"] == run and o["result"] is not None}
        if len(pair) == 2:
            off, on = pair["false"], pair["true"]
            parts.append(f"Bridge overlap A/B ({run}): published "
                         f"{off['published']:.2f} -> {on['published']:.2f} s "
                         f"({100 * (1 - on['published'] / off['published']):.1f} % faster), "
                         f"predicted {off['predicted']:.2f} -> {on['predicted']:.2f} s "
                         f"({100 * (1 - on['predicted'] / off['predicted']):.1f} % faster)")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    return run_script("validate_moe", __doc__, argv, evaluate, _print, summary)


if __name__ == "__main__":
    sys.exit(main())
