"""Predicted vs published training throughput of ResNet-50 v1.5 with PyTorch DDP (NVIDIA
DeepLearningExamples) on DGX A100 and DGX-1 V100, 1 and 8 GPUs.

Run:  python benchmarks/validate_resnet.py [--engine analytical|des] [--markdown] [--write-docs]
      [--des-rank-ops N] [--loader-rate R]

The published rows (NVIDIA/DeepLearningExamples PyTorch/Classification/ConvNets/resnet50v1.5
README, "Training performance results", pytorch-21.03 NGC container) and the run settings read in
that repository's configs.yml and code are in ``data/dle_resnet50_pytorch.csv``, with their
provenance. Each row is ddlsim's ``resnet50`` (torchvision v1.5) on the row's preset
(``dgx-a100``, ``dgx1-v100``), data parallel over the row's GPUs (DDP's 25 MiB buckets,
all-reduced as they fill; one GPU runs no DDP), the row's batch per GPU as one micro-batch, SGD
with momentum, the row's precision (AMP: fp16; TF32; FP32). The software stack is the default
one with what the 21.03 container ran: CUDA 11's cuBLAS (``gemm_library: cublas-11``), eager
dispatch, DDP's overlapped gradient all-reduce; and the DLE step around the model (:data:`STEP`:
zeroed gradients accumulated in place, the batch normalised and mixed up on the GPU, GradScaler
with AMP). What the runs do that ddlsim does not model, on every row: the data loader (the
published figure is ``total_ips``, loading included, with real JPEG decoding on the host), the
loss (a few kernels on batch × 1000 logits) and the host synchronisation ending each step. No
per-row factors and nothing tuned. The published rate averages 100 per-iteration rates, the
first (cuDNN autotuning) about 0: each row is compared with the steady iteration it implies,
``(PROF − 1)/PROF`` of the published time (:func:`published_time`). The 8-GPU scaling
(8-GPU img/s over 1-GPU img/s) is printed beside.

The data loader: the published runs decoded and augmented real ImageNet JPEGs in PyTorch
DataLoader workers on the host (the data file's ``host_cpu``, ``host_cores`` and
``loader_workers`` columns), which ddlsim models as ``model.data_loader``
(``ddlsim/workloads/resnet/dataloader.py``) given the images a second one worker prepares on
one core. No published rate for these CPUs and this pipeline is known to us, so the table runs
with synthetic data; ``--loader-rate R`` (img/s per core) is a what-if that sets the pool on
every row. Printed beside (:func:`loader_bound_rates`): the cores each GPU's workers run on
and the rate ``R*`` below which the pool alone would take longer than the published step
(a single rate R per host binds the rows with R < R*).
"""

from __future__ import annotations

import sys
from functools import partial

from public_runs import (DATA, print_notes, print_table, read_csv, result_cells, rows_summary,
                         run_script, records, scaling_error)

TABLE = DATA / "dle_resnet50_pytorch.csv"
#: what the pytorch-21.03 container runs, over the default stack (data file's header)
SOFTWARE = {"kernels": {"gemm_library": "cublas-11", "host_dispatch": "eager"}}
#: the DLE training step around the model (ddlsim/workloads/resnet/step.py): PyTorch 1.9's
#: zero_grad() zeroes (training.py line 178), the pytorch data backend normalises on the GPU
#: (dataloaders.py PrefetchedWrapper) and the benchmark mode keeps configs.yml's mixup 0.2
#: (main.py line 527: MixUpWrapper); GradScaler with AMP only (main.py line 477, enabled=amp)
STEP = {"zero_grad": "zero", "input_pipeline": "normalize_mixup"}
#: iterations the published benchmark averages (README: ``--prof 100``)
PROF = 100


def rows() -> list[dict]:
    """The published rows of :data:`TABLE`."""
    return read_csv(TABLE)


def config(row: dict, loader_rate: float | None = None) -> dict:
    """The ddlsim run config of one row (its preset, GPUs, batch per GPU and precision); with
    ``loader_rate`` (img/s per host core) its data loader (:func:`data_loader`)."""
    gpus, batch = int(row["gpus"]), int(row["batch_per_gpu"])
    model = {"preset": "resnet50", "weight_decay": "no_bn",
             "memory_format": "channels_last" if row["memory_format"] == "nhwc" else "contiguous",
             **STEP, "grad_scaler": row["dtype"] == "fp16"}
    if loader_rate is not None:
        model["data_loader"] = data_loader(row, loader_rate)
    return {"model": model,
            "parallel": {"data_parallel_size": gpus, "overlap_grad_reduce": True},
            "train": {"micro_batch_size": batch, "global_batch_size": batch * gpus,
                      "seq_length": 1, "dtype": row["dtype"], "optimizer": "sgd"},
            "system": {"preset": row["preset"], "nodes": 1, "devices_per_node": gpus,
                       "software": SOFTWARE}}


def data_loader(row: dict, rate: float) -> dict:
    """The row's ``model.data_loader``: its workers per GPU and host cores (data file) at
    ``rate`` images a second per core."""
    return {"workers": int(row["loader_workers"]), "image_s_per_core": rate,
            "host_cores": int(row["host_cores"])}


def loader_bound_rates(out: list[dict]) -> list[tuple[dict, float, float]]:
    """Per row: (row, cores its GPU's workers run on, ``R*``): the per-core rate at which the
    worker pool alone takes the published steady step, ``batch / (cores · published)``
    (:func:`ddlsim.workloads.resnet.dataloader.worker_cores`, the node running one training
    process per GPU of the row)."""
    from ddlsim.workloads.resnet.dataloader import DataLoaderSpec, worker_cores

    res = []
    for o in out:
        r = o["row"]
        spec = DataLoaderSpec(**data_loader(r, 1.0))
        cores = worker_cores(spec, int(r["gpus"]))
        res.append((r, cores, int(r["batch_per_gpu"]) / (cores * o["published"])))
    return res


def published_time(row: dict) -> float:
    """Seconds of a steady-state iteration: ``gpus · batch_per_gpu / img_s_steady``.

    The published ``img_s`` is ``train.total_ips``: the arithmetic mean of the per-iteration
    rates ``gpus · batch / it_time`` of the :data:`PROF` iterations the benchmark runs
    (``image_classification/logger.py``: an ``AverageMeter`` of one record per iteration;
    ``training.py`` ``train``: ``it_time`` from the end of the previous iteration's logging,
    data wait included, ``--prof 100`` stops after 100), the first one included, whose
    cuDNN autotuning (``cudnn.benchmark = True``, ``launch.py``) and data loader start take
    seconds: its rate is about 0, so ``img_s ≈ (PROF − 1)/PROF · img_s_steady``."""
    steady = float(row["img_s"]) * PROF / (PROF - 1)
    return int(row["gpus"]) * int(row["batch_per_gpu"]) / steady


def evaluate(engine: str = "analytical", only: list[dict] | None = None,
             limits=None, loader_rate: float | None = None) -> list[dict]:
    """Each row's record (:func:`public_runs.time_record`): ``only`` a sample of the rows;
    ``loader_rate`` the what-if data loader's img/s per core (:func:`config`)."""
    return records(rows() if only is None else only, partial(config, loader_rate=loader_rate),
                   published_time, engine, limits)


def _label(o: dict) -> str:
    r = o["row"]
    return f"{r['system']} {r['precision']} on {r['gpus']} GPU(s)"


def scaling(out: list[dict]) -> dict[tuple[str, str], tuple[float, float | None]]:
    """(system, precision) → (published, predicted) 8-GPU speed-up over one GPU, in img/s."""
    by = {(o["row"]["system"], o["row"]["precision"], o["row"]["gpus"]): o for o in out}
    res = {}
    for (system, precision, gpus), o8 in by.items():
        o1 = by.get((system, precision, "1"))
        if gpus != "8" or o1 is None:
            continue
        pub = float(o8["row"]["img_s"]) / float(o1["row"]["img_s"])
        pred = (8 * o1["predicted"] / o8["predicted"]
                if "predicted" in o1 and "predicted" in o8 else None)
        res[(system, precision)] = (pub, pred)
    return res


def _print(out: list[dict], markdown: bool) -> None:
    head = ["system", "precision", "GPUs", "batch/GPU", "layout", "published img/s",
            "predicted img/s", "published steady (ms)", "predicted (ms)", "error"]
    lines = []
    for o in out:
        r = o["row"]
        n = int(r["gpus"]) * int(r["batch_per_gpu"])
        pred = f"{n / o['predicted']:.0f}" if "predicted" in o else "-"
        cells = [r["system"], r["precision"], r["gpus"], r["batch_per_gpu"], r["memory_format"],
                 r["img_s"], pred, f"{o['published'] * 1e3:.1f}"]
        lines.append(cells + [c.replace(" s", "") for c in _ms_cells(o)])
    print_table(head, lines, markdown)
    print()
    sc = [[s, p, f"{pub:.2f}x", "-" if pred is None else f"{pred:.2f}x"]
          for (s, p), (pub, pred) in scaling(out).items()]
    print_table(["system", "precision", "published 8-GPU scaling", "predicted"], sc, markdown)
    print()
    lb = [[r["system"], r["precision"], r["gpus"], r["loader_workers"], f"{cores:g}",
           f"{rate:.0f}"] for r, cores, rate in loader_bound_rates(out)]
    print_table(["system", "precision", "GPUs", "workers/GPU", "worker cores/GPU",
                 "R* (img/s per core)"], lb, markdown)
    print_notes(out, _label, markdown)


def _ms_cells(o: dict) -> list[str]:
    cells = result_cells(o, 3)
    if "predicted" in o:
        cells[0] = f"{o['predicted'] * 1e3:.1f}"
    return cells


def summary(out: list[dict], engine: str) -> str:
    """The summary line: the rows' errors and the 8-GPU scaling's mean error."""
    mean = scaling_error(scaling(out))
    return (rows_summary(out, engine, _label)
            + f"; 8-GPU scaling mean |error| {100 * mean:.1f} %")


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--loader-rate", type=float, default=None, metavar="R",
                    help="what-if: every row's DataLoader workers at R img/s per host core")
    known, rest = ap.parse_known_args(argv)
    if known.loader_rate is not None and not known.loader_rate > 0:
        raise SystemExit(f"--loader-rate = {known.loader_rate}: give images a second per "
                         "core, a number > 0")
    return run_script("validate_resnet", __doc__, rest,
                      partial(evaluate, loader_rate=known.loader_rate), _print, summary)


if __name__ == "__main__":
    sys.exit(main())
