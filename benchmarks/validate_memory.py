"""Predicted vs published peak memory per GPU (torchtitan's Llama 3.1 runs on H100) and whether
a model fits (DeepSpeed's ZeRO tutorial on 32 GB V100s), with the largest model that fits.

Run:  python benchmarks/validate_memory.py [--markdown] [--eager-loss]

The published tables (pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, the
runs of torchtitan 9dec370, 2024-12, on the ``torchtitan-2024`` stack; and
llama3-8b_h200_202506_trainy-whitefiber.md, torchtitan e7c0cae, 2025-06, on
``torchtitan-2025``) and their provenance are in ``data/torchtitan_h100_memory.csv`` and
``data/torchtitan_h200_memory.csv``. torchtitan's "Memory(GiB)" is the caching allocator's
peak reserved bytes (``torch.cuda.max_memory_reserved``), so the prediction compared is
ddlsim's ``memory.reserved`` (every part but the CUDA context, which the allocator does not
hold: docs/memory.md); the error is ``predicted / published − 1``.

Each row runs as torchtitan ran it, as far as ddlsim can say it: its table's stack (with
``compile: true`` where the row names torch.compile), ZeRO-3 (FSDP2) over the FSDP
degree, context parallelism, TP with sequence parallelism, and pipelining with torchtitan's
defaults (``pipeline_parallel_degree`` micro-batches: 9dec370 ``pipelining_utils.py`` lines
79-81; two stages per rank for the interleaved schedule; the layer split of its
``generate_split_points`` as ``parallel.layers_per_virtual_stage``); Float8 as ``train.dtype: fp8``. The rows'
``selective`` checkpointing is torchtitan's per-op policy, which the stack names
(``selective_recompute: every_second_mm``) and whose kept tensors ddlsim counts
(:func:`ddlsim.workloads.decoder.memory.sac_activation_bytes`). Async TP changes no memory
ddlsim models and is not set; nor is FSDP's float8 all-gather of the H200 runs (ddlsim counts
gathered units in 16 bits). The H200 rows run on the ``dgx-h100`` preset (ddlsim has no H200):
the reserved bytes compared do not depend on the device. Nothing is tuned.

**Does it fit?** ``data/deepspeed_zero_tutorial_fits.csv`` records, from DeepSpeed's ZeRO
tutorial, a GPT-2 1.5B that runs out of memory on 8 V100-SXM3 32GB without ZeRO and trains with
ZeRO-1, and a 10B that trains on 32 with ZeRO-2. Each runs on the ``dgx2-v100`` preset with the
``deepspeed-2021`` stack (the nearest ddlsim has to the DeepSpeed of 2020) and is compared on
``fits``; the script also scans the layer count at the row's width for the largest model ddlsim
says fits, printed beside the published bound (an OOM bounds it from above, a run from below).

``--eager-loss`` prints the torchtitan rows again with every framework's compiled-loss rule
taken away (:func:`eager_loss`), so that the H200 rows, whose runs compile the loss, hold the
eager loss's 12 B per logit instead of 4 (the what-if docs/memory.md quotes); the H100 rows,
whose stack has no compiled-loss rule, do not move, and the V100 fits are not printed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from public_runs import DATA, print_table, read_csv  # noqa: E402

from ddlsim.importers.torchtitan_split import split_2024  # noqa: E402

TABLE = DATA / "torchtitan_h100_memory.csv"
#: the same form for the H200 runs of torchtitan e7c0cae (2025-06), run on torchtitan-2025
H200 = DATA / "torchtitan_h200_memory.csv"
#: each published table with the stack its runs used
TABLES = ((TABLE, "torchtitan-2024"), (H200, "torchtitan-2025"))
FITS = DATA / "deepspeed_zero_tutorial_fits.csv"
V100_STACK = "deepspeed-2021"
GPT2_VOCAB = 50304              # GPT-2's 50,257 BPE tokens padded to a multiple of 128
GPUS_PER_DGX2 = 16
GPUS_PER_NODE = 8
GIB = 2**30
#: the layers of a decoder preset (Llama 3.1: 32, 80, 126), for torchtitan's split
LAYERS = {"llama-3.1-8b": 32, "llama-3.1-70b": 80, "llama-3.1-405b": 126}


def config(row: dict, stack: str = "torchtitan-2024") -> dict:
    """The run config of one published row on ``stack`` (module docstring)."""
    pp, tp, lbs = int(row["pp"]), int(row["tp"]), int(row["local_batch"])
    v = 2 if row["schedule"] == "interleaved" else 1
    par = {"zero_stage": 3, "data_parallel_size": int(row["dp_shard"]),
           "context_parallel_size": int(row["cp"]), "tensor_model_parallel_size": tp,
           "sequence_parallel": tp > 1, "pipeline_model_parallel_size": pp}
    if int(row["cp"]) > 1:      # torchtitan's default rotation, 'allgather' (9dec370
        par["cp_comm_type"] = "all_gather"      # config_manager.py lines 365-367)
    mbs = lbs
    if pp > 1:
        mbs = lbs // pp                     # pipeline_parallel_degree micro-batches
        par["schedule"] = row["schedule"]
        if v > 1:
            par["virtual_pipeline_model_parallel_size"] = v
        par["layers_per_virtual_stage"] = split_2024(LAYERS[row["model"]], pp * v)
    software = {"stack": stack, "compile": row["compile"] == "1"}
    # torchtitan 9dec370 train.py line 107: model_config.max_seq_len = training.seq_len (the
    # rotary table is built for the run's sequence, past the HF config's 131,072 positions)
    model = {"preset": row["model"], "max_position_embeddings": int(row["seq"])}
    return {"model": model, "parallel": par,
            "train": {"micro_batch_size": mbs, "global_batch_size": int(row["global_batch"]),
                      "seq_length": int(row["seq"]), "recompute": row["ac"],
                      "dtype": "fp8" if row["float8"] == "1" else "bf16"},
            "system": {"preset": "dgx-h100", "nodes": int(row["gpus"]) // GPUS_PER_NODE,
                       "software": software}}


def evaluate(tables=TABLES) -> list[dict]:
    """Each published row with ddlsim's memory breakdown (``memory``) or why it was not
    predicted (``skipped``)."""
    import ddlsim
    out = []
    for table, stack in tables:
        out += [_evaluate_row(ddlsim, row, stack) for row in read_csv(table)]
    return out


def _evaluate_row(ddlsim, row: dict, stack: str) -> dict:
    """One row: its memory on ``stack`` and the error, or why it was not run."""
    rec = {**row, "memory": None, "skipped": None}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rec["memory"] = ddlsim.memory_per_device(ddlsim.load_config(config(row, stack)))
    except (ddlsim.errors.DDLSimError, ValueError) as e:
        rec["skipped"] = str(e).split(". ")[0]
    if rec["memory"] is not None:
        rec["error"] = rec["memory"].reserved / (float(row["memory_gib"]) * GIB) - 1
    return rec


def label(o: dict) -> str:
    table = o["table"] if not o["table"].isdigit() else f"T{o['table']}"
    return f"{table} {o['model'].removeprefix('llama-3.1-')} {o['techniques']}"


def show(out: list[dict], markdown: bool) -> None:
    """The table: published and predicted reserved GiB, the error, the pipeline stage of the
    most loaded rank (0 without pipelining) and its parts (``buffers``: FSDP's gathered
    parameters and gradient buffers, and the pipeline's receive buffers)."""
    head = ["row", "published GiB", "predicted GiB", "error", "stage", "states",
            "activations", "other", "buffers"]
    lines = []
    for o in out:
        m = o["memory"]
        if m is None:
            lines.append([label(o), o["memory_gib"], "-", "not run", "", "", "", "", ""])
            continue
        states = m.weights + m.gradients + m.optimizer
        lines.append([label(o), o["memory_gib"], f"{m.reserved / GIB:.1f}",
                      f"{100 * o['error']:+.1f}%", str(m.stage),
                      *(f"{x / GIB:.1f}" for x in (states, m.activations, m.other, m.buffers))])
    print_table(head, lines, markdown)
    for o in out:
        if o["skipped"]:
            print(f"\n{label(o)}: not run: {o['skipped']}")


def summary(out: list[dict]) -> str:
    """Mean |error| and signed mean over the rows run, the worst row, and the rows not run."""
    ran = [o for o in out if o["memory"] is not None]
    errs = [o["error"] for o in ran]
    worst = max(ran, key=lambda o: abs(o["error"]))
    within = sum(abs(e) <= 0.15 for e in errs)
    return (f"peak reserved memory, {len(ran)} rows run: mean |error| "
            f"{100 * sum(map(abs, errs)) / len(errs):.1f}%, signed "
            f"{100 * sum(errs) / len(errs):+.1f}%, worst {100 * abs(worst['error']):.1f}% "
            f"({label(worst)}), {within} within 15%; not run: {len(out) - len(ran)} of "
            f"{len(out)}")


def fits_config(row: dict, layers: int | None = None) -> dict:
    """The run config of one tutorial row (``layers`` overrides its layer count)."""
    n, gpus = layers or int(row["layers"]), int(row["gpus"])
    return {"model": {"architecture": "gpt", "name": f"gpt2-{n}x{row['hidden']}",
                      "num_hidden_layers": n, "hidden_size": int(row["hidden"]),
                      "num_attention_heads": int(row["heads"]), "vocab_size": GPT2_VOCAB,
                      "max_position_embeddings": 1024},
            "parallel": {"data_parallel_size": gpus, "zero_stage": int(row["zero_stage"])},
            "train": {"micro_batch_size": int(row["micro_batch"]),
                      "global_batch_size": int(row["micro_batch"]) * gpus, "seq_length": 1024,
                      "dtype": "fp16", "recompute": "full"},
            "system": {"preset": "dgx2-v100", "nodes": -(-gpus // GPUS_PER_DGX2),
                       "software": V100_STACK}}


def _memory(config: dict):
    import ddlsim
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ddlsim.memory_per_device(ddlsim.load_config(config))


def largest_layers(row: dict, limit: int = 400) -> int:
    """The most layers (at the row's width) whose plan ddlsim says fits: memory grows with
    the layer count, so a bisection over 1…limit."""
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _memory(fits_config(row, mid)).fits:
            lo = mid
        else:
            hi = mid - 1
    return lo


def evaluate_fits(table: Path = FITS) -> list[dict]:
    """Each tutorial row with ddlsim's memory, its verdict, and the largest model that fits."""
    out = []
    for row in read_csv(table):
        m = _memory(fits_config(row))
        n = largest_layers(row)
        shape = _shape(fits_config(row, n))
        out.append({**row, "memory": m, "agrees": m.fits == (row["fits"] == "1"),
                    "largest_layers": n, "largest_params": shape.params})
    return out


def _shape(config: dict):
    import ddlsim
    return ddlsim.load_config(config).model.shape()


def show_fits(out: list[dict], markdown: bool) -> None:
    head = ["row", "GPUs", "ZeRO", "published", "predicted GiB", "capacity GiB", "ddlsim",
            "agrees", "largest that fits (ddlsim)", "published bound"]
    lines = []
    for o in out:
        m, params = o["memory"], float(_shape(fits_config(o)).params)
        bound = (f"< {params / 1e9:.2f}B" if o["fits"] == "0" else f">= {params / 1e9:.2f}B")
        lines.append([o["model"], o["gpus"], o["zero_stage"],
                      "fits" if o["fits"] == "1" else "OOM", f"{m.total / GIB:.1f}",
                      f"{m.capacity / GIB:.1f}", "fits" if m.fits else "OOM",
                      "yes" if o["agrees"] else "NO",
                      f"{o['largest_params'] / 1e9:.2f}B ({o['largest_layers']} layers)", bound])
    print_table(head, lines, markdown)


@contextlib.contextmanager
def eager_loss():
    """Within the block, no framework has a compiled-loss rule (``logit_bytes_compiled``):
    a stack that compiles the loss is counted with its eager loss's bytes per logit. The
    registry (:data:`ddlsim.workloads.framework_memory.FRAMEWORKS`) is restored on leaving."""
    from ddlsim.workloads.framework_memory import FRAMEWORKS
    saved = dict(FRAMEWORKS)
    try:
        for name, fm in saved.items():
            FRAMEWORKS[name] = dataclasses.replace(fm, logit_bytes_compiled=None)
        yield
    finally:
        FRAMEWORKS.clear()
        FRAMEWORKS.update(saved)


def main(argv=None) -> int:
    """The torchtitan table and the V100 fits, or with ``--eager-loss`` the torchtitan table
    under :func:`eager_loss` alone."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("--eager-loss", action="store_true",
                    help="the torchtitan rows with the eager loss's bytes per logit where the "
                         "run compiled the loss (the H200 rows); no V100 fits")
    args = ap.parse_args(argv)
    if args.eager_loss:
        print("what-if: every compiled loss counted as its eager loss "
              "(torchtitan: 12 B per logit)\n")
        with eager_loss():
            out = evaluate()
        show(out, args.markdown)
        print("\n" + summary(out))
        return 0
    out = evaluate()
    show(out, args.markdown)
    print("\n" + summary(out) + "\n")
    fits = evaluate_fits()
    show_fits(fits, args.markdown)
    print(f"\nfits as published: {sum(o['agrees'] for o in fits)} of {len(fits)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
