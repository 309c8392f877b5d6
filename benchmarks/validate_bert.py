"""Predicted vs published training throughput of BERT-large pre-training with PyTorch (NVIDIA
DeepLearningExamples, LAMB) on DGX A100 (40 and 80 GB), DGX-1 and DGX-2 V100, 1 to 16 GPUs,
phase 1 (sequence 128) and phase 2 (sequence 512).

Run:  python benchmarks/validate_bert.py [--engine analytical|des] [--markdown] [--write-docs]
      [--des-rank-ops N]

The published rows (NVIDIA/DeepLearningExamples PyTorch/LanguageModeling/BERT/README.md,
"Training performance results", two generations: the pytorch-20.06 container's tables at
78ec6802 and the pytorch-21.11 container's at 729963dd) and each generation's run settings read
in that commit's run_pretraining.py, modeling.py and scripts/run_pretraining.sh are in
``data/bert_dle.csv`` with their provenance. Each row is ddlsim's ``bert-large`` (vocabulary
padded to 30528, as run_pretraining.py pads it) on the row's preset, data parallel over its
GPUs, its micro-batch per GPU with the row's gradient-accumulation steps as micro-batches of
one optimizer step, at the row's precision (AMP: fp16 model, as apex O2 and ``model.half()``
run it; TF32; FP32), gradients all-reduced in that dtype once per optimizer step:

* 20.06: after the last backward, one flat all-reduce, not overlapped
  (``overlap_grad_reduce: false``; ddlsim's DDP buckets put a 1 MiB first bucket in front);
* 21.11: DDP with ``no_sync`` on every accumulation step but the last, ``bucket_cap_mb`` the
  device's memory, so one bucket after DDP's 1 MiB first one, overlapped as DDP does; the MLM
  head over the 20 / 80 masked tokens only (``mlm_predictions_per_seq``, dense sequence output).

The software stack is the default with CUDA 11's cuBLAS (both containers ship CUDA 11) and
eager dispatch. A100 40 GB rows use ``dgx-a100`` with the 40 GB part's memory and bandwidth
(:data:`A100_40GB`). Every row keeps its preset's host time per kernel. The one published
host-bound timing of a BERT-large layer on a V100 machine (``benchmarks/bert_layer_v100.py``:
~68 µs a kernel, where the V100 preset's figure, a simple op's, is 5.8 µs) comes from another
host, PyTorch version and modelling code, so it is shown, not applied. What the runs do
that ddlsim does not model, on every row: LAMB's per-tensor trust-ratio norms (ddlsim times
Adam's update: same moments and master weights; the update is once per 32-16,384 micro-batches,
< 0.1 % of a step), the data loader, the loss scaler's checks, 21.11's bias adds (its
``F.linear`` under ``torch.jit.script``; 20.06's are counted: :data:`STEP`), the host's wait on
``loss.item()`` after every micro-batch (20.06, ``run_pretraining.py`` line 609: the host's lead
is taken to build within each layer's op, not across ops, :mod:`ddlsim.simulator.kernels.host`);
the layer's kernels are those of ``ddlsim/workloads/bert/kernels.py`` (both commits'
``modeling.py``: fused LayerNorm, the rest one torch kernel each), the gradients' accumulation
over the micro-batches that of ``ddlsim/workloads/bert/step.py``. Phase-2 rows of 21.11 are
approximated (≈): their batches are binned by sequence length (LDDL, bin size 64) and padded to
the bin, not to 512, and the bins' mix is not published. No per-row factors and nothing tuned.
"""

from __future__ import annotations

import functools
import sys

from public_runs import (DATA, print_notes, print_table, read_csv, result_cells, rows_summary,
                         run_script, records, scaling_error)

TABLE = DATA / "bert_dle.csv"
#: what both containers run over the default stack (CUDA 11: 20.06 ships 11.0, 21.11 11.5)
SOFTWARE = {"kernels": {"gemm_library": "cublas-11", "host_dispatch": "eager"}}
#: the A100 SXM4 40 GB part on the ``dgx-a100`` preset (whose device is the 80 GB one)
A100_40GB = {"name": "A100-SXM4-40GB",
             "memory_bytes": "40 GiB",            # NVIDIA A100 datasheet: 40 GB HBM2
             "memory_bandwidth_Bps": "1555 GB/s"}  # NVIDIA A100 datasheet: 1,555 GB/s (40GB)
#: one gradient bucket (after DDP's 1 MiB first one): 21.11 passes the device's total memory in
#: bytes as ``bucket_cap_mb`` (85,899,345,920 MiB on an A100 80GB, over ddlsim's 1 PB bound),
#: 20.06 all-reduces one flat buffer; any cap over the model's gradients (1.34 GB in fp32) gives
#: the same single bucket, so 1 TiB stands for both
ONE_BUCKET_BYTES = float(2 ** 40)
#: bert-large's vocabulary padded to a multiple of 8 (run_pretraining.py, both commits)
VOCAB = 30528
#: each generation's training-step kernels (ddlsim/workloads/bert/kernels.py, step.py):
#: 20.06's PyTorch 1.6 adds the projections' biases in kernels of their own (F.linear on
#: 3-D input; bias_gelu_training), 21.11's F.linear under torch.jit.script is left as
#: today's fused bias (not modelled); both accumulate the micro-batches' gradients in
#: ``.grad`` with autograd, except 20.06's AMP, where apex amp O2 unscales them into fp32
#: master gradients after each backward (set in :func:`config`)
STEP = {"2006": {"linear_bias": "separate", "grad_accumulation": "autograd"},
        "2111": {"grad_accumulation": "autograd"}}


@functools.cache
def rows() -> list[dict]:
    """The published rows of :data:`TABLE`."""
    return read_csv(TABLE)


def config(row: dict) -> dict:
    """The ddlsim run config of one row (preset, GPUs, micro-batch, accumulation, precision)."""
    gpus, mb, acc = int(row["gpus"]), int(row["micro_batch"]), int(row["accumulation"])
    model = {"preset": "bert-large", "vocab_size": VOCAB, **STEP[row["set"]]}
    if row["set"] == "2006" and row["dtype"] == "fp16":
        model["grad_accumulation"] = "apex_master"
    if row["mlm_predictions"]:
        model["mlm_predictions_per_seq"] = int(row["mlm_predictions"])
    system = {"preset": row["preset"], "nodes": 1, "devices_per_node": gpus,
              "software": SOFTWARE}
    if row["gpu"] == A100_40GB["name"]:
        system["device"] = dict(A100_40GB)
    parallel = {"data_parallel_size": gpus, "overlap_grad_reduce": row["set"] == "2111",
                "grad_bucket_size": ONE_BUCKET_BYTES}
    return {"model": model, "parallel": parallel,
            "train": {"micro_batch_size": mb, "global_batch_size": mb * acc * gpus,
                      "seq_length": int(row["seq"]), "dtype": row["dtype"],
                      "optimizer": "adam"},
            "system": system}


def published_time(row: dict) -> float:
    """Seconds per optimizer step: ``gpus · micro_batch · accumulation / seq_s``."""
    n = int(row["gpus"]) * int(row["micro_batch"]) * int(row["accumulation"])
    return n / float(row["seq_s"])


def evaluate(engine: str = "analytical", only: list[dict] | None = None,
             limits=None) -> list[dict]:
    """Each row's record (:func:`public_runs.time_record`): ``only`` a sample of the rows."""
    return records(rows() if only is None else only, config, published_time, engine, limits)


def _label(o: dict) -> str:
    r = o["row"]
    return f"{r['system']} {r['precision']} seq {r['seq']} on {r['gpus']} GPU(s)"


def scaling(out: list[dict]) -> dict[tuple, tuple[float, float | None]]:
    """(set, system, precision, seq, gpus) → (published, predicted) speed-up of ``gpus`` GPUs
    over one, in sequences/s."""
    by = {(r["set"], r["system"], r["precision"], r["seq"], r["gpus"]): o
          for o in out for r in (o["row"],)}
    res = {}
    for key, on in by.items():
        o1 = by.get((*key[:4], "1"))
        if key[4] == "1" or o1 is None:
            continue
        pub = float(on["row"]["seq_s"]) / float(o1["row"]["seq_s"])
        pred = (throughput(on) / throughput(o1)
                if "predicted" in o1 and "predicted" in on else None)
        res[key] = (pub, pred)
    return res


def throughput(o: dict) -> float:
    """Predicted sequences/s of a record that ran."""
    r = o["row"]
    return int(r["gpus"]) * int(r["micro_batch"]) * int(r["accumulation"]) / o["predicted"]


def _print(out: list[dict], markdown: bool) -> None:
    head = ["set", "system", "precision", "GPUs", "seq", "micro-batch × accumulation",
            "published seq/s", "predicted seq/s", "published (s)", "predicted (s)", "error"]
    lines = []
    for o in out:
        r = o["row"]
        pred = f"{throughput(o):.1f}" if "predicted" in o else "-"
        mark = " ≈" if r["approx"] else ""
        lines.append([r["set"], r["system"], r["precision"], r["gpus"], r["seq"] + mark,
                      f"{r['micro_batch']} × {r['accumulation']}", r["seq_s"], pred,
                      f"{o['published']:.2f}", *result_cells(o, 2)])
    print_table(head, lines, markdown)
    print()
    sc = [[k[0], k[1], k[2], k[3], k[4], f"{pub:.2f}x", "-" if pred is None else f"{pred:.2f}x"]
          for k, (pub, pred) in scaling(out).items()]
    print_table(["set", "system", "precision", "seq", "GPUs", "published scaling over 1 GPU",
                 "predicted"], sc, markdown)
    print_notes(out, _label, markdown)


def _mean_abs(out: list[dict]) -> float:
    ran = [o for o in out if "predicted" in o]
    return 100 * sum(abs(o["error"]) for o in ran) / len(ran) if ran else float("nan")


def summary(out: list[dict], engine: str) -> str:
    """The summary line: the rows' errors, the rows expressed exactly (no ≈), per GPU, and the
    multi-GPU scaling's mean error."""
    exact = [o for o in out if not o["row"]["approx"]]
    per = "; ".join(f"{g} {_mean_abs([o for o in out if o['row']['gpu'] == g]):.1f} %"
                    for g in dict.fromkeys(o["row"]["gpu"] for o in out))
    mean = scaling_error(scaling(out))
    return (rows_summary(out, engine, _label)
            + f"; rows without ≈ ({len(exact)}): mean |error| {_mean_abs(exact):.1f} %"
            + f"; per GPU: {per}; multi-GPU scaling mean |error| {100 * mean:.1f} %")


def main(argv: list[str] | None = None) -> int:
    return run_script("validate_bert", __doc__, argv, evaluate, _print, summary)


if __name__ == "__main__":
    sys.exit(main())
