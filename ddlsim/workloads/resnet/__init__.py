"""Bottleneck ResNets trained data-parallel with PyTorch DDP: the ``resnet`` workload family.

The model (:mod:`.layers`: torchvision's layers, parameters, FLOPs), its section
(:mod:`.schema`), the trace with DDP gradient buckets (:mod:`.build`) and its presets
(``data/resnet.yaml``). See ``docs/workloads/resnet.md``.
"""

from __future__ import annotations

from typing import Any

from ..registry import BASE_PLAN_FIELDS, WorkloadFamily, batch_phrase, register_workload
from .dataloader import check_loader, loader_phrase
from .schema import ResNetModel

__all__ = ["ResNetFamily", "ResNetModel", "bucket_phrase"]


@register_workload("resnet")
class ResNetFamily(WorkloadFamily):
    """ResNet-50/101/152, data parallel (presets in ``data/resnet.yaml``)."""

    schema = ResNetModel
    #: the plan fields its rules and trace read (any other is refused when set)
    #: a sample is one image: train.seq_length is 1 where the config leaves it out
    sample_length = 1
    plan_fields = (*BASE_PLAN_FIELDS, "parallel.overlap_grad_reduce", "parallel.grad_bucket_size",
                   "parallel.collective_buffers")
    presets_file = "resnet.yaml"

    def check(self, cfg: Any) -> None:
        """Data parallel only, DDP, one image per sample; a data loader's node has cores for
        its workers (:func:`.dataloader.check_loader`)."""
        p, t = cfg.parallel, cfg.train
        if p.tp > 1 or p.pp > 1 or p.ep > 1:
            raise ValueError(
                f"the resnet family is data-parallel only: tensor_model_parallel_size = {p.tp}, "
                f"pipeline_model_parallel_size = {p.pp} and expert_model_parallel_size = {p.ep} "
                "must be 1")
        if p.dp_strategy != "ddp" or p.zero_stage != 0:
            raise ValueError(f"the resnet family models PyTorch DDP: dp_strategy = "
                             f"{p.dp_strategy!r} and zero_stage = {p.zero_stage} must be 'ddp' "
                             "and 0")
        m = cfg.model
        if m.grad_buckets != "ddp" and "grad_bucket_size" in p.model_fields_set:
            raise ValueError(f"parallel.grad_bucket_size is DDP's bucket_cap_mb, but "
                             f"model.grad_buckets = {m.grad_buckets} lists the buckets; remove "
                             "one")
        if m.grad_sync == "ring_sendrecv" and cfg.software.overlap_grad_reduce:
            raise ValueError("model.grad_sync = 'ring_sendrecv' exchanges the buckets after the "
                             "backward (resnet50.cpp run_ring), but "
                             "parallel.overlap_grad_reduce is true; set it to false")
        if m.grad_scaler and t.dtype != "fp16":
            raise ValueError(f"model.grad_scaler = true scales the loss of fp16 autocast "
                             f"(torch.cuda.amp.GradScaler), but train.dtype = {t.dtype!r}; "
                             "set dtype: fp16 or grad_scaler: false")
        check_loader(cfg)
        if t.seq_length != 1:
            raise ValueError(f"train.seq_length = {t.seq_length}: a resnet sample is one image "
                             "(its resolution is model.image_size); set seq_length: 1")

    def build(self, cfg: Any):
        from .build import build_resnet
        return build_resnet(cfg)

    def memory(self, cfg: Any) -> list:
        from .build import resnet_memory
        return resnet_memory(cfg)

    def plan_summary(self, cfg: Any) -> str:
        """``DP32 = 32 ranks``, the gradient buckets and how they are synchronised, the batch
        and the dtype; a modelled (not proxy) run's 16-bit dtype as ``fp16 autocast (AMP)``,
        ``channels_last`` when set (:mod:`.kernels`: no NCHW/NHWC transposes) and the step's
        options that are not the defaults (:mod:`.step`); a data loader's worker pool and its
        time per batch (:mod:`.dataloader`)."""
        m, p, dtype = cfg.model, cfg.parallel, cfg.train.dtype
        sync = "ring send/recv" if m.grad_sync == "ring_sendrecv" else "all-reduce"
        when = "overlapped" if cfg.software.overlap_grad_reduce else "after the backward"
        if m.compute == "model":
            dtype += " autocast (AMP)" if dtype in ("fp16", "bf16") else ""
            dtype += ", channels_last" if m.memory_format == "channels_last" else ""
            dtype += "".join(f", {w}" for w in _step_words(m))
        loader = "" if m.data_loader == "synthetic" else f", {loader_phrase(cfg)}"
        return (f"DP{cfg.dp} = {cfg.world_size} ranks, {bucket_phrase(m.grad_buckets, p)}, "
                f"{sync} {when}, {batch_phrase(cfg)}, {dtype}{loader}")

    def summary(self, model: Any) -> str:
        return model.summary_line()


def _step_words(model: Any) -> list[str]:
    """The plan line's words for the training step's options that are not the defaults
    (:mod:`.step`)."""
    words = ["zeroed gradients"] if model.zero_grad == "zero" else []
    words += ["GradScaler"] if model.grad_scaler else []
    if model.input_pipeline != "none":
        words.append(model.input_pipeline.replace("_", " + ") + " on the device")
    return words


def bucket_phrase(buckets: Any, parallel: Any) -> str:
    """``DDP buckets of 25 MiB`` (``grad_buckets: ddp``, PyTorch's ``bucket_cap_mb``) or
    ``6 listed buckets``."""
    from ...formatting import format_bytes

    if buckets == "ddp":
        return f"DDP buckets of {format_bytes(parallel.grad_bucket_size)}"
    return f"{len(buckets)} listed buckets"
