"""NeMo Megatron of 2022 on DGX A100: predicted vs published GPT-3 5B and 175B throughput
(the search winner's evidence, issue 29; docs/search.md, "How far to trust the winner").

Run:  python benchmarks/validate_nemo2022.py [--engine analytical|des] [--markdown]
      [--write-docs] [--des-rank-ops N] [--without-fusion]

``--without-fusion`` runs the rows with ``gradient_accumulation_fusion`` off, the fusion's gain
taken away (the column docs/search.md and docs/validation.md quote); not with ``--write-docs``.

``data/nemo_megatron_2022_a100.csv`` holds the tokens per second that NVIDIA's NeMo Megatron
README published in July 2022 for GPT-3 175B on 16-128 DGX A100 nodes and 5B on 1-20, with the
settings of the config files the README points to (the CSV's header). They are the only
published A100 runs of a 175B GPT found that use bf16 with Megatron's gradient-accumulation
fusion (``fused_weight_gradient_mlp_cuda``, Megatron-LM 83b1e42f, 2022-02-13): Korthikanti et
al. 2022 ran fp16 without it (benchmarks/validate_recompute.py), and no published A100 run of
the 2024 stack (FlashAttention/cuDNN attention through Transformer Engine) at this model size
was found. So these rows check the walk's gradient-accumulation-fusion step on a measurement;
the attention step is not checked by them (NeMo 1.10 ran Megatron's fused softmax).

Stack: ``validate_recompute.py``'s (Megatron-LM of May 2022: the 2021 layers, the asynchronous
sequence-parallel backward, CUDA 11's cuBLAS at the 400 W ceiling) with the config's bf16 and
``gradient_accumulation_fusion: True``; no per-row factors, nothing fitted. Each row is also
predicted under the default stack (``megatron-core-2024``) to show what it adds to a measured
plan. Left as the 2022 stack has it: NeMo's PyTorch Lightning loop and data loading (not
modelled), the data-parallel all-reduce after the backward (not overlapped).
"""

from __future__ import annotations

import sys

from public_runs import (DATA, error_stats, gpt_model_flops, padded_vocab, print_notes,
                         print_table, read_csv, run_script, time_record)

TABLE = DATA / "nemo_megatron_2022_a100.csv"
SEQ = 2048                 # conf/training/gpt3/*.yaml encoder_seq_length
VOCAB = 50257              # GPT-2 BPE (tokenizer GPT2BPETokenizer)
GPUS_PER_NODE = 8          # DGX A100
PEAK = 312e12              # A100 bf16 dense tensor-core FLOP/s (A100 datasheet)
#: validate_recompute.SOFTWARE (Megatron-LM of May 2022) with the config's
#: gradient_accumulation_fusion: True (bf16 forces fp32 accumulation, which the fusion needs:
#: Megatron-LM 83b1e42f megatron/arguments.py)
SOFTWARE = {"stack": "megatron-lm-2021", "overlap": {"tp_async_backward": True},
            "kernels": {"gemm_library": "cublas-11.6", "gradient_accumulation_fusion": True},
            "what_if": True}
DEFAULT = {"stack": "megatron-core-2024"}


def rows() -> list[dict]:
    """The published rows with their configs' settings."""
    return read_csv(TABLE)


def iteration_s(row: dict) -> float:
    """Published seconds per iteration: global batch × sequence / tokens per second."""
    return int(row["global_batch"]) * SEQ / float(row["tokens_per_s"])


def config(row: dict, software: dict | None = None) -> dict:
    """The ddlsim run config of one row under ``software`` (default :data:`SOFTWARE`)."""
    tp, pp = int(row["tp"]), int(row["pp"])
    gpus = int(row["nodes"]) * GPUS_PER_NODE
    model = {"name": f"gpt-{row['model']}", "architecture": "gpt",
             "num_hidden_layers": int(row["layers"]), "hidden_size": int(row["hidden"]),
             "num_attention_heads": int(row["heads"]),
             "vocab_size": padded_vocab(VOCAB, tp), "max_position_embeddings": SEQ}
    parallel = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
                "data_parallel_size": gpus // (tp * pp),
                "sequence_parallel": row["sequence_parallel"] == "true"}
    if pp > 1:
        parallel["schedule"] = "1f1b"
    return {"model": model, "parallel": parallel,
            "train": {"micro_batch_size": int(row["micro_batch"]),
                      "global_batch_size": int(row["global_batch"]), "seq_length": SEQ,
                      "dtype": "bf16", "recompute": row["recompute"]},
            "system": {"preset": "dgx-a100", "nodes": int(row["nodes"]),
                       "software": software or SOFTWARE}}


def model_flops(row: dict) -> float:
    """Model FLOPs of one iteration, ``72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))`` (Korthikanti
    et al. 2022, Appendix A; the unpadded vocabulary)."""
    return gpt_model_flops(int(row["global_batch"]), SEQ, int(row["layers"]),
                           int(row["hidden"]), VOCAB)


def evaluate(engine: str = "analytical", only: list[dict] | None = None,
             limits=None, software: dict | None = None) -> list[dict]:
    """One record per row: published and predicted iteration time and MFU, under the 2022
    stack (``software``, default :data:`SOFTWARE`), and the default stack's prediction of the
    same plan (``default``)."""
    out = []
    for row in rows() if only is None else only:
        rec = time_record(row, config(row, software), engine, limits, iteration_s(row))
        gpus = int(row["nodes"]) * GPUS_PER_NODE
        rec["published_mfu"] = model_flops(row) / rec["published"] / gpus / PEAK
        if rec["result"] is not None:
            rec["mfu"] = model_flops(row) / rec["predicted"] / gpus / PEAK
        default = time_record(row, config(row, DEFAULT), engine, limits, iteration_s(row))
        rec["default"] = default.get("predicted")
        out.append(rec)
    return out


def _label(o: dict) -> str:
    return f"{o['row']['model']} on {o['row']['nodes']} nodes"


def _print(out: list[dict], markdown: bool) -> None:
    head = ["model", "nodes", "TP", "PP", "DP", "batch", "recompute", "published (s)",
            "predicted (s)", "error", "published MFU", "predicted MFU",
            "megatron-core-2024 (s)", "its MFU"]
    lines = []
    for o in out:
        row, r = o["row"], o["result"]
        gpus = int(row["nodes"]) * GPUS_PER_NODE
        cells = [row["model"], row["nodes"], row["tp"], row["pp"],
                 str(gpus // (int(row["tp"]) * int(row["pp"]))), row["global_batch"],
                 row["recompute"] + (" + SP" if row["sequence_parallel"] == "true" else ""),
                 f"{o['published']:.2f}"]
        if r is None:
            cells += ["not run (work limit)", "-", f"{100 * o['published_mfu']:.1f}%", "-"]
        else:
            note = " (does not fit; check_fit=False)" if o["refused"] else ""
            cells += [f"{o['predicted']:.2f}{note}", f"{100 * o['error']:+.1f}%",
                      f"{100 * o['published_mfu']:.1f}%", f"{100 * o['mfu']:.1f}%"]
        d = o["default"]
        cells += ["-", "-"] if d is None else [
            f"{d:.2f}", f"{100 * o['published_mfu'] * o['published'] / d:.1f}%"]
        lines.append(cells)
    print_table(head, lines, markdown)
    print_notes(out, _label, markdown)


def summary(out: list[dict], engine: str) -> str:
    """Mean |error| and worst row under the 2022 stack."""
    ran = sum(o["result"] is not None for o in out)
    return (f"{error_stats(out, _label)} ({engine} engine, {ran} of {len(out)} rows; "
            f"positive error = ddlsim too slow)")


def main(argv: list[str] | None = None) -> int:
    """The shared command line (:func:`public_runs.run_script`) and ``--without-fusion``
    (module docstring); exit status 2 for ``--without-fusion`` with ``--write-docs``."""
    import argparse
    import functools
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--without-fusion", action="store_true")
    known, rest = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    if not known.without_fusion:
        return run_script("validate_nemo2022", __doc__, rest, evaluate, _print, summary)
    if "--write-docs" in rest:
        print("error: --without-fusion and --write-docs do not go together: the docs' table "
              "is the config's (gradient_accumulation_fusion: True)", file=sys.stderr)
        return 2
    unfused = {**SOFTWARE, "kernels": {**SOFTWARE["kernels"],
                                       "gradient_accumulation_fusion": False}}
    print(f"rows under system.software = {unfused}\n")
    return run_script("validate_nemo2022", __doc__, rest,
                      functools.partial(evaluate, software=unfused), _print, summary)


if __name__ == "__main__":
    sys.exit(main())
