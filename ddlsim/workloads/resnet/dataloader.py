"""The host's input pipeline of an image-classification step: PyTorch ``DataLoader`` worker
processes decoding and augmenting JPEG images on the host's CPU cores while the GPUs train.

``model.data_loader`` is ``synthetic`` (the default: the batch is already there, as in a
synthetic-data benchmark; nothing is charged) or a worker pool (:class:`DataLoaderSpec`). Each
GPU's training process runs ``workers`` worker processes (``DataLoader(num_workers=…)``); a
worker turns one image at a time into a training sample (``open`` → JPEG decode →
``RandomResizedCrop`` → flip → copy into the batch: DeepLearningExamples' ``pytorch`` data
backend, ``image_classification/dataloaders.py``), so it keeps one core busy and prepares at
most ``image_s_per_core`` images a second. The node's ``host_cores`` are shared by the
training processes of the GPUs on it (no CPU affinity: the DLE runs of 2021 set none,
``gpu_affinity`` came in commit 0fadac23, 2021-11-22) and each training process holds one of
them: between its launches it waits for the GPU by spinning, CUDA's default for a process
with fewer contexts than cores (``cudaDeviceScheduleAuto``: "If C > P, then CUDA will yield
to other OS threads when waiting for the GPU, otherwise CUDA will not yield while waiting
for results and actively spin on the processor", CUDA Runtime API, ``cudaSetDeviceFlags``).
So a GPU's workers run on

    c = min(workers, host_cores / ranks_on_node − 1)

cores and prepare a micro-batch of ``b`` images in ``b / (image_s_per_core · c)`` seconds.

**Charged** (:func:`loader_op`) as one op per micro-batch on the rank's ``data_loader``
stream at the start of its forward block, which nothing waits for: the workers prepare the
next batch while the device runs this one (``DataLoader`` prefetching), so the step takes
``max(device step, loader time)``. Where the loader is slower its excess is the step's tail,
booked by both engines as exposed time of the ``other`` kind (``Result.breakdown``); the plan
line names the pool and its time per batch (:func:`loader_phrase`).

Not modelled: the host-to-device copy (a copy engine, overlapped by DLE's prefetcher), the
main process's unpickling of each batch and ``pin_memory``'s copy (a few ms a batch), reading
the files (the published runs read ImageNet from the page cache), SMT (cores are physical
cores: a worker on a core's second hardware thread is not counted as more throughput) and the
CPU clock's fall under an all-core load (``image_s_per_core`` is one rate at the run's load).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from ...config import _Strict, reject_bool
from ..trace import Compute, Op

__all__ = ["DataLoaderSpec", "TRAINING_PROCESS_CORES", "STREAM", "ranks_on_node",
           "worker_cores", "loader_seconds", "loader_op", "loader_phrase", "check_loader"]

#: host cores each GPU's training process holds (its spin-wait on the GPU; module docstring)
TRAINING_PROCESS_CORES = 1
#: the stream the worker pool's op runs on (a host resource, apart from ``host``, the
#: training process's issue thread)
STREAM = "data_loader"

_Workers = Annotated[int, BeforeValidator(reject_bool), Field(ge=1, le=4096)]
_Cores = Annotated[int, BeforeValidator(reject_bool), Field(ge=1, le=1_000_000)]
_Rate = Annotated[float, BeforeValidator(reject_bool), Field(gt=0, le=1e7)]


class DataLoaderSpec(_Strict):
    """A host worker pool feeding each GPU (the module docstring)."""

    workers: _Workers = Field(description="DataLoader worker processes per GPU (num_workers)")
    image_s_per_core: _Rate = Field(
        description="images a second one worker prepares on one host core (decode, "
                    "augmentation, collation), at the run's CPU load")
    host_cores: _Cores = Field(
        description="host CPU cores of a node (physical cores), shared by the training "
                    "processes and workers of the node's GPUs")


def ranks_on_node(cfg: Any) -> int:
    """Training processes on a node: one per GPU, ``min(world_size, devices_per_node)``."""
    return min(cfg.world_size, cfg.system.devices_per_node)


def worker_cores(spec: DataLoaderSpec, ranks: int) -> float:
    """Cores a GPU's workers run on: ``min(workers, host_cores / ranks − 1)`` (module
    docstring); ≤ 0 when the training processes alone fill the node (:func:`check_loader`)."""
    return min(float(spec.workers), spec.host_cores / ranks - TRAINING_PROCESS_CORES)


def loader_seconds(spec: DataLoaderSpec, images: int, ranks: int) -> float:
    """Seconds the GPU's workers take to prepare ``images``:
    ``images / (image_s_per_core · worker_cores)``."""
    return images / (spec.image_s_per_core * worker_cores(spec, ranks))


def check_loader(cfg: Any) -> None:
    """Refuse a pool whose node has no core left for workers once each training process holds
    its own (a clear error naming the fields)."""
    spec = cfg.model.data_loader
    if isinstance(spec, str):
        return
    ranks = ranks_on_node(cfg)
    if worker_cores(spec, ranks) <= 0:
        raise ValueError(
            f"model.data_loader.host_cores = {spec.host_cores} leaves no core for the data "
            f"loader's workers: the node runs {ranks} training processes (one per GPU, "
            f"system.devices_per_node = {cfg.system.devices_per_node}), each holding "
            f"{TRAINING_PROCESS_CORES} core; give more than "
            f"{ranks * TRAINING_PROCESS_CORES} host cores or set data_loader: synthetic")


def loader_op(cfg: Any) -> Op | None:
    """The op of one micro-batch's preparation on the :data:`STREAM` stream, or None for
    synthetic data."""
    spec = cfg.model.data_loader
    if isinstance(spec, str):
        return None
    s = loader_seconds(spec, cfg.train.micro_batch_size, ranks_on_node(cfg))
    return Op(Compute("data_loader", 0.0, kind="elementwise", dtype="fp32", seconds=s),
              stream=STREAM)


def loader_phrase(cfg: Any) -> str:
    """The plan line's words: ``data loader: 8 workers/GPU on 4 cores at 210 img/s each,
    152.4 ms a batch``."""
    spec = cfg.model.data_loader
    ranks = ranks_on_node(cfg)
    cores = worker_cores(spec, ranks)
    ms = 1e3 * loader_seconds(spec, cfg.train.micro_batch_size, ranks)
    return (f"data loader: {spec.workers} workers/GPU on {cores:g} cores at "
            f"{spec.image_s_per_core:g} img/s each, {ms:.1f} ms a batch")
