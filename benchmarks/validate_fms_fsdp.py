"""Predicted vs published iteration time of IBM's fms-fsdp Llama 2 runs (PyTorch FSDP1) on A100.

Run:  python benchmarks/validate_fms_fsdp.py [--engine analytical|des] [--markdown]
      [--write-docs] [--des-rank-ops N]
      python benchmarks/validate_fms_fsdp.py --breakdown [--markdown]   (:func:`breakdown`)

The rows are the A100 columns of the two throughput tables of foundation-model-stack/fms-fsdp's
README (:data:`ROWS`, each with its commit and line): the eager table of 2024-05-02 (3759b766)
and the compiled one of 2024-05-09 (ed74fd5d, "numbers are updated with torch.compile"), both
"on 128 A100 GPUs ... A100 80G 128 GPUs with 400Gbps", "the exact same scripts and
configurations" for every size. Every row trains at the repo's defaults
(fms_fsdp/config/training.py at ed74fd5d: ``seq_length`` 4096, ``batch_size`` 2 per GPU as
the tables say, bf16 mixed precision), on the software stack ``fms-fsdp-2024``
(``ddlsim/data/software.yaml``: FSDP1 per LLaMABlock with ``limit_all_gathers``, gradients
reduce-scattered in bf16, SDPA FlashAttention-2, foreach AdamW, the fms model's separate
projections), with the row's settings: ``HSDP`` as HYBRID_SHARD (shards within a node, 16
replicas: ``data_parallel_replicate_size`` 16), ``FSDP`` as FULL_SHARD over the 128 GPUs,
``Compile`` as the stack's ``compile``, the checkpointing as :func:`recompute_share` reads it.
No per-row factors and nothing tuned.

fms-fsdp's "selective" checkpointing is a share ``p`` of whole blocks (fms_fsdp/policies/
ac_handler.py: every 1/p-th LLaMABlock); the tables do not state ``p``. The tables give both
MFU (PaLM's 6N + 12·L·h·s per token, no recomputation) and HFU (PyTorch's FLOP counter, the
recomputed forward included), so ``p`` is read from their ratio (:func:`recompute_share`): the
rows the tables call "No AC" read 0.05, "Full AC" 1.04 and 1.12; the compiled 34B and 70B
rows' "Selective AC" read 1.07 and 1.05, i.e. every block (fms-fsdp's default
``selective_checkpointing=1``), the 13B rows 0.52 (eager) and 0.44 (compiled), run as every
second block (``recompute_every_n_layers: 2``, the nearest 1/n; p = 0.44 on 40 blocks would be
18 of them, 20 are run).

The published iteration time is ``batch_size · seq_length / (tokens/s/GPU)`` (fms-fsdp's own
throughput, fms_fsdp/utils/train_utils.py lines 117-123 at ed74fd5d); the error is
``predicted / published − 1`` (positive: ddlsim too slow).

The system is ``aws-p4de-a100`` (EC2 p4de.24xlarge: A100 SXM 80 GB at 400 W, 8 per node on
NVSwitch, 4 × 100 Gb/s EFA = 400 Gb/s per node). The README states "A100 80G 128 GPUs with
400Gbps"; the repo's launch scripts at ed74fd5d (scripts/train.sh lines 3-6: "On AWS, the EFA
and OFI paths enable NCCL to use optimized networking", FI_EFA_SET_CUDA_SYNC_MEMOPS) and its
default paths (``/fsx/...``, AWS FSx) point to AWS's A100 80 GB instance, whose network is
400 Gb/s: an inference, not the README's word (IBM's Vela cluster, the other candidate, has
100 Gb/s Ethernet links; docs/validation.md, "IBM fms-fsdp").

The 34B model is fms-fsdp's ``34b`` variant (fms_fsdp/utils/config_utils.py lines 35-42 at
ed74fd5d: emb_dim 8192, 64 heads, 8 K/V heads, 48 layers, hidden 22016; vocabulary 32,000, the
LLaMAConfig default), Llama 2 70B's shape with 48 layers and that hidden size.
"""

from __future__ import annotations

import sys

from public_runs import (error_stats, print_notes, print_table, result_cells, rows_summary,
                         run_script, records)

#: fms-fsdp's README tables (foundation-model-stack/fms-fsdp), the A100 80G column of each:
#: ``set`` the table's date, ``commit`` and ``line`` where its row is, ``tps`` tokens/s/GPU,
#: ``mfu``/``hfu`` the same row of the MFU/HFU table below it (``mfu_line``)
ROWS: tuple[dict, ...] = tuple(
    dict(zip(("set", "commit", "line", "mfu_line", "size", "sharding", "compile", "ac", "tps",
              "mfu", "hfu"), r)) for r in (
        ("2024-05-02 eager", "3759b766", 14, 25, "7b", "HSDP", False, "No AC", 3700, 0.57, 0.57),
        ("2024-05-02 eager", "3759b766", 15, 26, "13b", "FSDP", False, "Selective AC", 1800,
         0.51, 0.59),
        ("2024-05-02 eager", "3759b766", 16, 27, "34b", "FSDP", False, "Full AC", 700, 0.47, 0.64),
        ("2024-05-02 eager", "3759b766", 17, 28, "70b", "FSDP", False, "Full AC", 370, 0.50, 0.67),
        ("2024-05-09 compiled", "ed74fd5d", 16, 27, "7b", "HSDP", True, "No AC", 4550, 0.68, 0.68),
        ("2024-05-09 compiled", "ed74fd5d", 17, 28, "13b", "FSDP", True, "Selective AC", 2150,
         0.61, 0.69),
        ("2024-05-09 compiled", "ed74fd5d", 18, 29, "34b", "FSDP", True, "Selective AC", 820,
         0.55, 0.74),
        ("2024-05-09 compiled", "ed74fd5d", 19, 30, "70b", "FSDP", True, "Selective AC", 410,
         0.55, 0.74)))

GPUS = 128                  # README: "A100 80G 128 GPUs"
GPUS_PER_NODE = 8           # scripts/train.sh at ed74fd5d: torchrun --nproc_per_node=8
BATCH = 2                   # README tables: Batch Size 2 (per GPU, config/training.py batch_size)
SEQ = 4096                  # fms_fsdp/config/training.py at ed74fd5d: seq_length = 4096
SYSTEM = "aws-p4de-a100"    # module docstring: 400 Gb/s per node, an inference
STACK = "fms-fsdp-2024"

#: the models as fms-fsdp's config_utils.py at ed74fd5d defines them (7b, 13b, 70b, lines
#: 26-51: Llama 2's shapes, the ddlsim presets; 34b, lines 35-42: the 70B shape at 48 layers
#: and hidden 22016)
MODELS = {"7b": {"preset": "llama-2-7b"}, "13b": {"preset": "llama-2-13b"},
          "34b": {"preset": "llama-2-70b", "name": "fms-llama2-34b", "num_hidden_layers": 48,
                  "intermediate_size": 22016},
          "70b": {"preset": "llama-2-70b"}}


def rows() -> list[dict]:
    return [dict(r) for r in ROWS]


def _shape(row: dict) -> dict:
    """The row's model fields (its preset's config.json with :data:`MODELS`' overrides)."""
    import warnings

    from ddlsim.configload import resolve_section
    spec = MODELS[row["size"]]
    with warnings.catch_warnings():     # the config.json keys ddlsim does not model
        warnings.simplefilter("ignore")
        preset = resolve_section("model", spec["preset"])
    return {**preset, **{k: v for k, v in spec.items() if k != "preset"}}


def _flops_per_token(row: dict) -> tuple[float, float, float]:
    """(MFU FLOPs, HFU FLOPs without recomputation, one forward of the blocks) per token.

    MFU: PaLM's ``6N + 12·L·h·s`` (Chowdhery et al. 2022, Appendix B; nanoGPT's
    ``estimate_mfu``), N every parameter. HFU: what PyTorch's FLOP counter counts (README's
    link, torch/utils/flop_counter.py at 2240018c): 2 FLOPs per multiply-add of every matmul,
    the blocks' linears and the head, and SDPA's two batched products over the full s × s
    scores (``sdpa_flop_count``: "NB: We aren't accounting for causal attention here", also
    in torch 2.13); the backward twice the forward.
    """
    m = _shape(row)
    h, f, layers, vocab = (m["hidden_size"], m["intermediate_size"], m["num_hidden_layers"],
                           m["vocab_size"])
    kv = h // m["num_attention_heads"] * m["num_key_value_heads"]
    block = 2 * h * h + 2 * h * kv + 3 * h * f           # q, o; k, v; w1, wg, w2
    params = layers * block + 2 * vocab * h              # untied embedding and head
    mfu = 6 * params + 12 * layers * h * SEQ
    forward_blocks = 2 * layers * block + 4 * layers * SEQ * h
    return mfu, 3 * (forward_blocks + 2 * vocab * h), forward_blocks


def recompute_share(row: dict) -> float:
    """The share of blocks the row recomputes, read from the table's HFU / MFU (module
    docstring): ``(HFU/MFU · MFU FLOPs − HFU FLOPs without recomputation) / forward FLOPs``.

    Parameters
    ----------
    row : dict
        A row of :data:`ROWS`.

    Returns
    -------
    float
        About 0 for a run without checkpointing, about 1 where every block is recomputed.
    """
    mfu, hfu0, forward = _flops_per_token(row)
    return (row["hfu"] / row["mfu"] * mfu - hfu0) / forward


def _recompute(row: dict) -> dict:
    """The train fields of a row's checkpointing: none, every block, or every n-th block at the
    nearest 1/n to :func:`recompute_share` (a "Selective AC" row)."""
    if row["ac"] == "No AC":
        return {"recompute": "none"}
    share = recompute_share(row)
    if row["ac"] == "Full AC" or share >= 0.75:
        return {"recompute": "full"}
    return {"recompute": "full", "recompute_every_n_layers": max(1, round(1 / share))}


def config(row: dict) -> dict:
    """The ddlsim run config of one row (module docstring)."""
    parallel = {"zero_stage": 3, "data_parallel_size": GPUS}
    if row["sharding"] == "HSDP":       # HYBRID_SHARD: shards within a node, replicas across
        parallel["data_parallel_replicate_size"] = GPUS // GPUS_PER_NODE
    return {"model": {**MODELS[row["size"]], "max_position_embeddings": SEQ},
            "parallel": parallel,
            "train": {"micro_batch_size": BATCH, "global_batch_size": BATCH * GPUS,
                      "seq_length": SEQ, "dtype": "bf16", **_recompute(row)},
            "system": {"preset": SYSTEM, "nodes": GPUS // GPUS_PER_NODE,
                       "software": {"stack": STACK, "compile": row["compile"]}}}


def published_time(row: dict) -> float:
    """Seconds per iteration implied by the published tokens/s/GPU."""
    return BATCH * SEQ / row["tps"]


def evaluate(engine: str = "analytical", only: list[dict] | None = None,
             limits=None) -> list[dict]:
    """One record per row: published and predicted iteration time, error, fit note."""
    return records(rows() if only is None else only, config, published_time, engine, limits)


def _label(o: dict) -> str:
    row = o["row"]
    return f"{row['set']} {row['size']} {row['sharding']} {row['ac']}"


def _ac_cell(row: dict) -> str:
    fields = _recompute(row)
    if fields["recompute"] == "none":
        return row["ac"]
    n = fields.get("recompute_every_n_layers", 1)
    run = "every block" if n == 1 else f"every {n}th block" if n > 2 else "every 2nd block"
    return f"{row['ac']} (p {recompute_share(row):.2f}: {run})"


def _print(out: list[dict], markdown: bool) -> None:
    head = ["set", "model", "sharding", "checkpointing (p from HFU/MFU: run as)",
            "published tok/s/GPU", "published (s)", "predicted (s)", "error"]
    lines = []
    for o in out:
        row = o["row"]
        lines.append([row["set"], f"Llama 2 {row['size'].upper()}", row["sharding"],
                      _ac_cell(row), str(row["tps"]), f"{o['published']:.3f}"]
                     + result_cells(o))
    print_table(head, lines, markdown)
    print_notes([o for o in out if not o["refused"]], _label, markdown)


def summary(out: list[dict], engine: str) -> str:
    """Mean |error|, worst row and signed mean over the rows that ran, and per table."""
    text = rows_summary(out, engine, _label)
    for name in dict.fromkeys(o["row"]["set"] for o in out):
        on = [o for o in out if o["row"]["set"] == name and o["result"] is not None]
        if on:
            text += f"; {name}: {error_stats(on, _label)}"
    return text


def breakdown(only: list[dict] | None = None) -> list[dict]:
    """Where each row's analytical prediction goes: the first rank's compute by kind
    (``kernel_breakdown.step_breakdown``) and the exposed data-parallel communication, beside
    the published time: a diagnostic of the error, not a fit.

    Returns
    -------
    list of dict
        Per row: ``row``, ``published`` and ``predicted`` iteration time, ``exposed_dp`` and
        ``kinds`` (compute seconds by kind), all in seconds, and ``mfu_predicted``: the MFU
        the prediction implies (the table's MFU times published / predicted).
    """
    import warnings

    import ddlsim
    from kernel_breakdown import step_breakdown
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for row in rows() if only is None else only:
            cfg = ddlsim.load_config(config(row))
            r = ddlsim.predict(cfg, check_fit=False)
            published = published_time(row)
            out.append({"row": row, "published": published, "predicted": r.iteration_time_s,
                        "exposed_dp": r.breakdown.exposed_comm_s.get("dp", 0.0),
                        "kinds": step_breakdown(cfg)[0],
                        "mfu_predicted": row["mfu"] * published / r.iteration_time_s})
    return out


def _print_breakdown(argv: list[str]) -> int:
    """``--breakdown [--markdown]``: one column per row, compute seconds by kind."""
    import argparse
    ap = argparse.ArgumentParser(description=breakdown.__doc__.splitlines()[0])
    ap.add_argument("--breakdown", action="store_true", required=True)
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args(argv)
    out = breakdown()
    kinds = list(dict.fromkeys(k for o in out for k in o["kinds"]))
    head = ["seconds", *(f"{o['row']['set'].split()[1]} {o['row']['size']}" for o in out)]
    lines = [[k, *(f"{o['kinds'].get(k, 0.0):.3f}" for o in out)] for k in kinds]
    lines += [["exposed data-parallel communication", *(f"{o['exposed_dp']:.3f}" for o in out)],
              ["predicted", *(f"{o['predicted']:.3f}" for o in out)],
              ["published", *(f"{o['published']:.3f}" for o in out)],
              ["MFU published", *(f"{o['row']['mfu']:.2f}" for o in out)],
              ["MFU the prediction implies", *(f"{o['mfu_predicted']:.2f}" for o in out)]]
    print_table(head, lines, args.markdown)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--breakdown" in argv:
        return _print_breakdown(argv)
    return run_script("validate_fms_fsdp", __doc__, argv, evaluate, _print, summary)


if __name__ == "__main__":
    sys.exit(main())
