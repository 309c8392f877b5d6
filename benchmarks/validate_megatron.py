"""Predicted vs published per-GPU throughput for Megatron-LM's Table 1 (Narayanan et al. 2021).

Run:  python benchmarks/validate_megatron.py [--engine analytical|des] [--markdown]
      [--des-rank-ops N] [--write-docs]

``--write-docs`` puts the Markdown table and the summary line between the
``<!-- validate_megatron: begin/end -->`` markers of docs/validation.md.

Every setting of every row is the one the paper's own launch script used
(NVIDIA/Megatron-LM ``examples/sc21/run_table_1.sh``, read with the CONFIG/SRUN scripts it
sources and the ``megatron/arguments.py`` defaults it leaves alone); they and their sources are
in ``data/megatron_sc21_table1.csv``. The published figures are in
``data/megatron_table1.csv``. No per-row factors and nothing tuned: the prediction is ddlsim's
model as it stands, on the ``dgx-a100`` preset with the ``megatron-lm-2021`` software stack
(the kernels those runs used; docs/compute.md).

Both published and predicted TFLOP/s use the paper's FLOP count, eq. (3) with V = 51,200,
divided by the iteration time, so the error is exactly the error in iteration time. A row that
does not fit in device memory under ddlsim's memory model is predicted with
``check_fit=False`` and marked, never dropped.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import ddlsim
from ddlsim.errors import WorkTooLargeError

DATA = Path(__file__).with_name("data")
TABLE = DATA / "megatron_table1.csv"
SETTINGS = DATA / "megatron_sc21_table1.csv"
SEQ = 2048                 # CONFIG.sh: --seq-length 2048 --max-position-embeddings 2048
PAPER_VOCAB = 51200        # the paper's (and Megatron-LM README's) V for every model
GPT2_VOCAB = 50257         # GPT2BPETokenizer (pretrain_gpt.py line 125)
VOCAB_DIVISOR = 128        # --make-vocab-size-divisible-by default (arguments.py line 290)
GPUS_PER_NODE = 8          # SRUN.sh: --ntasks-per-node=8


def _read(path: Path) -> list[dict]:
    lines = [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]
    return list(csv.DictReader(lines))


def rows() -> list[dict]:
    """Table 1's rows, each the published figures joined with the sc21 script's settings;
    exits if the two sources disagree on a column they share."""
    settings = {r["model"]: r for r in _read(SETTINGS)}
    out = []
    for pub in _read(TABLE):
        run = settings[pub["model"]]
        shared = {"tp": "tp", "pp": "pp", "batch": "global_batch", "layers": "layers",
                  "hidden": "hidden", "heads": "heads"}
        for p_col, s_col in shared.items():
            if int(pub[p_col]) != int(run[s_col]):
                sys.exit(f"{pub['model']}: Table 1 has {p_col} = {pub[p_col]} but "
                         f"run_table_1.sh has {s_col} = {run[s_col]}")
        if int(pub["gpus"]) != int(run["nodes"]) * GPUS_PER_NODE:
            sys.exit(f"{pub['model']}: Table 1 has {pub['gpus']} GPUs but run_table_1.sh "
                     f"has {run['nodes']} nodes of {GPUS_PER_NODE}")
        out.append({**pub, **run})
    return out


def padded_vocab(tp: int) -> int:
    """Megatron-LM's padded vocabulary: the GPT-2 BPE size rounded up to 128·TP."""
    multiple = VOCAB_DIVISOR * tp
    return -(-GPT2_VOCAB // multiple) * multiple


def virtual_stages(row: dict) -> int | None:
    """arguments.py lines 124-133: (layers / PP) / --num-layers-per-virtual-pipeline-stage."""
    per = row["layers_per_virtual_stage"]
    return None if not per else int(row["layers"]) // int(row["pp"]) // int(per)


def config(row: dict) -> dict:
    """The ddlsim run config of one row, every field from the sc21 script (see the CSV)."""
    tp, pp, gpus = int(row["tp"]), int(row["pp"]), int(row["nodes"]) * GPUS_PER_NODE
    parallel = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
                "data_parallel_size": gpus // (tp * pp),
                # --DDP-impl torch: PyTorch DDP's bucketed all-reduce overlaps the backward;
                # local: all-reduced after the forward/backward (training.py lines 370-374).
                "overlap_grad_reduce": row["ddp"] == "torch", "schedule": "1f1b"}
    vpp = virtual_stages(row)
    if vpp is not None:
        parallel.update(schedule="interleaved", virtual_pipeline_model_parallel_size=vpp)
    model = {"name": row["model"], "architecture": "gpt",
             "num_hidden_layers": int(row["layers"]), "hidden_size": int(row["hidden"]),
             "num_attention_heads": int(row["heads"]), "vocab_size": padded_vocab(tp),
             "max_position_embeddings": SEQ}
    return {
        "model": model,
        "parallel": parallel,
        "train": {"micro_batch_size": int(row["micro_batch"]),
                  "global_batch_size": int(row["global_batch"]), "seq_length": SEQ,
                  "dtype": "fp16", "recompute": "full"},  # --fp16; uniform, 1 layer per checkpoint
        # the 2021 runs used Megatron-LM of 2021: fused softmax (no FlashAttention), apex
        # fused LayerNorm/Adam, no gradient-accumulation fusion (ddlsim/data/software.yaml)
        "system": {"preset": "dgx-a100", "nodes": int(row["nodes"]),
                   "software": "megatron-lm-2021"},
    }


def paper_flops(row: dict) -> float:
    """One iteration's FLOPs, eq. (3): 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))."""
    B, l, h = int(row["global_batch"]), int(row["layers"]), int(row["hidden"])
    return 96.0 * B * SEQ * l * h * h * (1 + SEQ / (6 * h) + PAPER_VOCAB / (16 * l * h))


def predict_row(row: dict, engine: str, limits=None) -> tuple[ddlsim.Result, str]:
    """The prediction and "" — or, for a plan ddlsim says does not fit, the prediction made
    with ``check_fit=False`` and the reason it gave."""
    try:
        return ddlsim.predict(config(row), engine, limits=limits), ""
    except ddlsim.PlanDoesNotFitError as exc:
        return ddlsim.predict(config(row), engine, check_fit=False, limits=limits), str(exc)


def evaluate(engine: str = "analytical", limits=None) -> list[dict]:
    """One record per row: settings, published and predicted TFLOP/s, error, fit note
    (``limits``: work budgets, e.g. a larger ``des_rank_ops`` for the DES)."""
    out = []
    for row in rows():
        try:
            r, refused = predict_row(row, engine, limits)
        except WorkTooLargeError as exc:  # the DES's work budget: say so, do not drop the row
            out.append({"row": row, "result": None, "skipped": str(exc)})
            continue
        gpus = int(row["nodes"]) * GPUS_PER_NODE
        dp = gpus // (int(row["tp"]) * int(row["pp"]))
        predicted = paper_flops(row) / r.iteration_time_s / gpus / 1e12
        published = float(row["tflops_per_gpu"])
        out.append({"row": row, "result": r, "published": published, "predicted": predicted,
                    "error": (predicted - published) / published, "refused": refused,
                    "skipped": "", "dp": dp,
                    "microbatches": int(row["global_batch"]) // (int(row["micro_batch"]) * dp)})
    return out


def _print(out: list[dict], markdown: bool) -> None:
    head = ["model", "TP", "PP", "DP", "mbs", "micro-batches", "VPP", "DDP", "published TFLOP/s",
            "predicted TFLOP/s", "error", "iteration (s)"]
    lines = [head]
    for o in out:
        row, r = o["row"], o["result"]
        if r is None:
            lines.append([row["model"], row["tp"], row["pp"], *["-"] * 5, row["tflops_per_gpu"],
                          "not run (work limit)", "-", "-"])
            continue
        cells = [row["model"], row["tp"], row["pp"], str(o["dp"]), row["micro_batch"],
                 str(o["microbatches"]), str(virtual_stages(row) or "-"), row["ddp"],
                 f"{o['published']:.0f}", f"{o['predicted']:.1f}"
                 + ("" if not o["refused"] else " (does not fit; check_fit=False)"),
                 f"{100 * o['error']:+.1f}%", f"{r.iteration_time_s:.2f}"]
        lines.append(cells)
    if markdown:
        lines.insert(1, ["---"] * len(head))
        for cells in lines:
            print("| " + " | ".join(cells) + " |")
    else:
        widths = [max(len(c[i]) for c in lines) for i in range(len(head))]
        for cells in lines:
            print("  ".join(c.rjust(w) for c, w in zip(cells, widths)))
    for o in out:
        if o.get("refused") or o["skipped"]:
            print(f"\n{o['row']['model']}: {o.get('refused') or o['skipped']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="analytical", choices=["analytical", "des"])
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("--write-docs", action="store_true",
                    help="put the Markdown table and the summary line in docs/validation.md")
    ap.add_argument("--des-rank-ops", type=float, default=None, metavar="N",
                    help="the DES's work budget (default: ddlsim's, 1e7; the three largest rows "
                         "need up to 5.1e7)")
    args = ap.parse_args(argv)
    limits = None
    if args.des_rank_ops is not None:
        from ddlsim.limits import Limits
        limits = Limits(des_rank_ops=int(args.des_rank_ops))
    everything = evaluate(args.engine, limits)
    _print(everything, args.markdown)
    out = [o for o in everything if not o["skipped"]]
    if len(out) < len(everything):
        print(f"\n{len(everything) - len(out)} row(s) not run by the {args.engine} engine "
              "(reasons above); the figures below cover the rest")
    line = summary(out, args.engine)
    print("\n" + line)
    if args.write_docs:
        from public_runs import markdown_of, write_docs
        write_docs("validate_megatron",
                   markdown_of(lambda markdown: _print(everything, markdown)) + "\n\n" + line)
    return 0


def summary(out: list[dict], engine: str) -> str:
    """The summary line: mean and worst |error| and the signed mean over the rows that ran."""
    errors = [o["error"] for o in out]
    worst = max(out, key=lambda o: abs(o["error"]))
    mean = sum(abs(e) for e in errors) / len(errors)
    return (f"mean |error| {100 * mean:.2f}%, worst {100 * abs(worst['error']):.1f}% "
            f"({worst['row']['model']}), signed mean {100 * sum(errors) / len(errors):+.1f}% "
            f"({engine} engine, sc21 settings)")


if __name__ == "__main__":
    sys.exit(main())
