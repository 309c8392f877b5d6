"""Predicted vs published iteration time of NeMo 24.07's FP8 pre-training runs on DGX H100.

Run:  python benchmarks/validate_h100.py [--engine analytical|des] [--markdown] [--write-docs]
      [--des-rank-ops N]

The published table (NVIDIA/NeMo docs/source/performance/performance_summary.md, NeMo 24.07,
DGX-H100, FP8) and its provenance are in ``data/nemo_2407_h100_fp8.csv``; the model and run
options the table leaves out, read from NeMo-Framework-Launcher's training configs at tag
24.07, are in ``data/nemo_2407_h100_settings.csv``, each column with the config key it comes
from. No per-row factors and nothing tuned: the prediction is ddlsim's model as it stands, on
the ``dgx-h100`` preset with the ``megatron-core-2024`` software stack.

The table states throughput in tokens per second per GPU, so the published iteration time is
``GBS · seq / (tokens/s/GPU · GPUs)`` with no FLOP convention involved; the error is the error in
iteration time, ``predicted / published − 1`` (positive: ddlsim is too slow). A row that does
not fit under ddlsim's memory model is predicted with ``check_fit=False`` and marked.

Nemotron's layers (squared-ReLU, ungated MLP, no biases, LayerNorm1p, RoPE on half of each
head, no dropout) are ddlsim's ``nemotron`` architecture, run as the launcher configs set them
(``rotary_percentage`` 0.5, ``bias_activation_fusion`` false: Megatron's squared ReLU is its
own ``@jit_fuser`` kernel, the stack's ``fused_squared_relu``). Until 2026-12-01 they were
approximated (``≈``): 8B and 22B as ``gpt`` (biases, GeLU, learned positions, dropout), 340B
as ``llama`` with a gated MLP of 2/3 the FFN size.
"""

from __future__ import annotations

import sys

from public_runs import (DATA, padded_vocab, print_notes, print_table, read_csv, result_cells,
                         rows_summary, run_script, records)

TABLE = DATA / "nemo_2407_h100_fp8.csv"
SETTINGS = DATA / "nemo_2407_h100_settings.csv"
GPUS_PER_NODE = 8          # DGX H100: 8 GPUs per node
STACK = "megatron-core-2024"
#: Kernel switches the launcher configs set differently from model to model (settings CSV).
KERNEL_SWITCHES = ("fused_cross_entropy", "fused_bias_gelu", "fused_bias_dropout_add")
#: The runs' attention kernel: the launcher exports NVTE_FUSED_ATTN=0 to every job
#: (NeMo-Framework-Launcher 24.07 launcher_scripts/conf/config.yaml line 72, "Disable cudnn FA
#: until we've tested it more"; no training config of the table's models overrides it), so
#: TransformerEngine runs FlashAttention-2, not the stack's default cuDNN fused attention.
ATTENTION = "flash2"
#: The runs' FP8 recipe: Transformer Engine's delayed scaling, the only one of the 24.07
#: container's TE (NVIDIA/TransformerEngine v1.8, 2024-07: transformer_engine/common/recipe/
#: __init__.py defines DelayedScaling alone; Float8CurrentScaling came with v2.2), which
#: NeMo's fp8 option builds (the settings CSV: fp8 True, fp8_hybrid)
FP8_RECIPE = "te_delayed"
#: NeMo's optim.grad_sync_dtype -> ddlsim's software.kernels.grad_reduce_dtype
GRAD_SYNC = {"bf16": "param", "fp32": "fp32"}


def rows(table=TABLE, settings_csv=SETTINGS) -> list[dict]:
    """The table's rows, each joined with its model's settings; exits on a model without."""
    settings = {r["model"]: r for r in read_csv(settings_csv)}
    out = []
    for pub in read_csv(table):
        if pub["model"] not in settings:
            sys.exit(f"{pub['model']}: no row in {settings_csv.name}")
        out.append({**settings[pub["model"]], **pub})
    return out


def _int(row: dict, *keys: str) -> list[int]:
    return [int(row[k]) for k in keys]


def approximated(row: dict) -> bool:
    """True for a model ddlsim cannot express as published: none since the ``nemotron``
    architecture (2026-12-01)."""
    return False


def model_section(row: dict) -> dict:
    """The ddlsim model of one row, from the launcher config (see the settings CSV)."""
    layers, hidden, ffn, heads, kv, vocab, tp, seq = _int(
        row, "layers", "hidden", "ffn", "heads", "kv_heads", "vocab", "tp", "seq")
    common = {"name": row["model"], "num_hidden_layers": layers, "hidden_size": hidden,
              "num_attention_heads": heads, "vocab_size": padded_vocab(vocab, tp),
              "max_position_embeddings": seq, "tie_word_embeddings": row["tied"] == "true"}
    if row["activation"] == "gelu":
        return {**common, "architecture": "gpt", "intermediate_size": ffn}
    if row["activation"] == "squared-relu":   # layernorm1p: LayerNorm's kernels
        bias = row["bias"] == "true"
        return {**common, "architecture": "nemotron", "num_key_value_heads": kv,
                "intermediate_size": ffn, "attention_bias": bias, "mlp_bias": bias,
                "partial_rotary_factor": float(row["rotary_percentage"])}
    return {**common, "architecture": "llama", "num_key_value_heads": kv,
            "intermediate_size": ffn, "hidden_act": "silu"}


def config(row: dict) -> dict:
    """The ddlsim run config of one row: the table's plan, the launcher config's options."""
    gpus, tp, pp, cp, vp = _int(row, "gpus", "tp", "pp", "cp", "vp")
    parallel = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
                "context_parallel_size": cp, "data_parallel_size": gpus // (tp * pp * cp),
                "sequence_parallel": row["sequence_parallel"] == "true",
                "zero_stage": 1,                    # distributed_fused_adam
                "overlap_grad_reduce": True, "overlap_param_gather": True,
                "schedule": "1f1b"}
    # overlap_p2p_comm: the launcher config's value on interleaved pipelines ("not set":
    # Megatron's blocking batched P2P); without interleaving Megatron turns it off itself
    # (docs/overlap.md), which the stack's inactive default already does
    if pp > 1 and vp > 1:
        parallel["overlap_p2p_comm"] = row["overlap_p2p_comm"] == "true"
    # tp_comm_overlap: TE userbuffers, per GEMM, with or without context parallelism
    # (docs/overlap.md; Megatron-LM sizes the userbuffers for seq·mbs/CP tokens)
    if row["tp_comm_overlap"] == "true":
        parallel["tp_comm_overlap"] = "pipelined"
    if vp > 1:
        parallel.update(schedule="interleaved", virtual_pipeline_model_parallel_size=vp)
    if row.get("split") == "embedding+loss":   # Megatron-Core's account_for_*_in_pipeline_split
        parallel.update(account_for_embedding_in_pipeline_split=True,
                        account_for_loss_in_pipeline_split=True)
    return {
        "model": model_section(row),
        "parallel": parallel,
        "train": {"micro_batch_size": int(row["mbs"]), "global_batch_size": int(row["gbs"]),
                  "seq_length": int(row["seq"]), "dtype": "fp8", "recompute": row["recompute"]},
        "system": {"preset": "dgx-h100", "nodes": gpus // GPUS_PER_NODE,
                   "software": {"stack": STACK, "kernels": {
                       "attention": ATTENTION, "fp8_recipe": FP8_RECIPE,
                       # NeMo 24.07's get_batch drops the dataset's mask and copies only the
                       # stage's tensors on every rank (megatron_gpt_model.py 8e3d65dc lines
                       # 1222-1246, get_attention_mask_from_fusion True); Megatron-Bridge
                       # (validate_bridge) skips it too: batch_input.py
                       "batch_attention_mask": "none",
                       **{k: row[k] == "true" for k in KERNEL_SWITCHES},
                       "grad_reduce_dtype": GRAD_SYNC[row["grad_sync_dtype"]]}}},
    }


def published_time(row: dict) -> float:
    """Seconds per iteration implied by the published tokens/s/GPU."""
    gpus, gbs, seq, tput = _int(row, "gpus", "gbs", "seq", "tokens_per_s_per_gpu")
    return gbs * seq / (tput * gpus)


def evaluate(engine: str = "analytical", only: list[dict] | None = None,
             limits=None) -> list[dict]:
    """One record per row: published and predicted iteration time, error, fit note."""
    return records(rows() if only is None else only, config, published_time, engine, limits)


def _label(o: dict) -> str:
    release = f" ({o['row']['release']})" if o["row"].get("release") else ""
    return f"{o['row']['model']} on {o['row']['gpus']} GPUs{release}"


def _print(out: list[dict], markdown: bool) -> None:
    head = ["model", "GPUs", "TP", "PP", "CP", "VP", "DP", "MBS", "GBS", "seq",
            "published tok/s/GPU", "published (s)", "predicted (s)", "error"]
    lines = []
    for o in out:
        row = o["row"]
        gpus, tp, pp, cp = _int(row, "gpus", "tp", "pp", "cp")
        name = (f"{row['release']} " if row.get("release") else "") + row["model"] + (
            " ≈" if approximated(row) else "")
        cells = [name, row["gpus"], row["tp"], row["pp"], row["cp"], row["vp"],
                 str(gpus // (tp * pp * cp)), row["mbs"], row["gbs"], row["seq"],
                 row["tokens_per_s_per_gpu"], f"{o['published']:.3f}"]
        lines.append(cells + result_cells(o))
    print_table(head, lines, markdown)
    print_notes(out, _label, markdown)


def summary(out: list[dict], engine: str) -> str:
    """Mean |error|, worst row and signed mean over the rows that ran."""
    return rows_summary(out, engine, _label)


def main(argv: list[str] | None = None) -> int:
    return run_script("validate_h100", __doc__, argv, evaluate, _print, summary)


if __name__ == "__main__":
    sys.exit(main())
