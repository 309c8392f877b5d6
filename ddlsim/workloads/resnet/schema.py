"""The ``resnet`` model section: a torchvision bottleneck ResNet and how DDP buckets it."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, StrictBool, model_validator

from ...config import ModelBase, count_type, reject_bool
from ...units import parse_quantity
from ..buckets import FIRST_BUCKET_BYTES
from ..proxytime import TIMINGS_FIELD, ComputeMode, ProxyTimings, check_proxy_timings
from .dataloader import DataLoaderSpec
from .layers import BLOCKS, Layer, Tensor, resnet_layers
from .step import INPUT_PIPELINES, STEP_FIELDS

__all__ = ["ResNetModel", "PROXY_TIMINGS"]

#: ``compute: proxy`` timings: the whole forward, and the backward compute before each
#: bucket's all-reduce (DNN-cpp-proxies resnet152.cpp:29-30, ``fwd_rt_whole_model`` and
#: ``bwd_rt_per_B``, slept at lines 35 and 48).
PROXY_TIMINGS = ("forward", "backward_per_bucket")


def _bytes(v):
    v = reject_bool(v)
    return parse_quantity(v, "bytes") if isinstance(v, str) else v


class ResNetModel(ModelBase):
    """A bottleneck ResNet (He et al. 2016) as torchvision defines it, trained with PyTorch DDP.

    Departures a proxy needs are explicit fields (defaults: the real model and DDP):
    ``num_classes`` (TF-slim's 1001), ``shortcut_first`` (TF-slim's variable order),
    ``grad_buckets`` (a list of gradients per bucket instead of DDP's size rule),
    ``grad_sync: ring_sendrecv`` (resnet50.cpp's second timed phase).
    """

    architecture: Literal["resnet"] = "resnet"
    depth: Annotated[Literal[50, 101, 152], BeforeValidator(reject_bool)] = Field(
        description="layers: 50, 101 or 152 (torchvision resnet50/101/152)")
    num_classes: count_type("vocab_size") = 1000
    image_size: Annotated[int, BeforeValidator(reject_bool), Field(ge=32, le=8192)] = 224
    shortcut_first: StrictBool = Field(
        default=False, description="register each projection shortcut before its block's conv1 "
                                   "(TF-slim's variable order) instead of after bn3")
    grad_buckets: Literal["ddp"] | list[count_type("layers")] = Field(
        default="ddp", description="'ddp': PyTorch's size rule; or gradients per bucket, in "
                                   "gradient-ready order")
    first_bucket_size: Annotated[float, BeforeValidator(_bytes), Field(gt=0, le=1e12)] = Field(
        default=FIRST_BUCKET_BYTES, description="DDP's first bucket (1 MiB)")
    grad_sync: Literal["allreduce", "ring_sendrecv"] = Field(
        default="allreduce", description="ring_sendrecv: per bucket, receive from the previous "
                                         "and send to the next data-parallel rank instead")
    memory_format: Literal["contiguous", "channels_last"] = Field(
        default="contiguous", description="activation layout: contiguous (NCHW, PyTorch's "
                                          "default) or channels_last (NHWC: no transposes "
                                          "around Tensor Core convolutions)")
    weight_decay: Literal["none", "all", "no_bn"] = Field(
        default="none", description="which tensors SGD decays: none (torch.optim.SGD's default "
                                    "weight_decay=0), all, or no_bn (not the batch norms' "
                                    "weight and bias)")
    zero_grad: Literal["set_to_none", "zero"] = Field(
        default="set_to_none", description="how optimizer.zero_grad() clears the gradients: "
                                           "set_to_none (PyTorch 2's default: no kernel) or "
                                           "zero (PyTorch 1.x's default: a zero_ kernel per "
                                           "tensor, then an in-place add per tensor in the "
                                           "backward)")
    grad_scaler: StrictBool = Field(
        default=False, description="torch.cuda.amp.GradScaler's kernels (fp16 autocast): the "
                                   "unscale over every gradient and the scale update")
    input_pipeline: Literal[tuple(INPUT_PIPELINES)] = Field(
        default="none", description="the input batch's work on the device: none, normalize "
                                    "(uint8 to fp32, minus mean, over std) or "
                                    "normalize_mixup (then mixup of the batch and targets)")
    broadcast_buffers: StrictBool = Field(
        default=True, description="DDP's broadcast of the batch norms' buffers from rank 0 "
                                  "before each forward (DistributedDataParallel's default "
                                  "broadcast_buffers=True); data parallel runs only")
    data_loader: Literal["synthetic"] | DataLoaderSpec = Field(
        default="synthetic", description="the host's input pipeline: synthetic (the batch is "
                                         "ready, nothing charged) or a DataLoader worker pool "
                                         "{workers, image_s_per_core, host_cores} "
                                         "(ddlsim/workloads/resnet/dataloader.py)")
    compute: ComputeMode = "model"
    proxy_timings: ProxyTimings = TIMINGS_FIELD

    @model_validator(mode="after")
    def _check(self) -> "ResNetModel":
        check_proxy_timings(self.compute, self.proxy_timings, PROXY_TIMINGS, "resnet")
        steps = sorted(f for f in STEP_FIELDS if f in self.model_fields_set)
        if self.compute == "proxy" and steps:
            raise ValueError(f"model.{steps[0]} is a kernel of a modelled training step, but "
                             "model.compute = 'proxy' times the proxy's sleeps alone; remove "
                             "it or set compute: model")
        if self.compute == "proxy" and self.data_loader != "synthetic":
            raise ValueError("model.data_loader is the host's input pipeline of a modelled "
                             "training step, but model.compute = 'proxy' times the proxy's "
                             "sleeps alone; set data_loader: synthetic or compute: model")
        if self.grad_buckets != "ddp" and "first_bucket_size" in self.model_fields_set:
            raise ValueError(f"model.first_bucket_size is DDP's first-bucket limit, but "
                             f"grad_buckets = {self.grad_buckets} lists the buckets; remove one")
        return self

    @property
    def layers(self) -> tuple[Layer, ...]:
        """Every layer in forward order (:func:`~.layers.resnet_layers`)."""
        return resnet_layers(self.depth, self.num_classes, self.image_size, self.shortcut_first)

    @property
    def tensors(self) -> tuple[Tensor, ...]:
        """Trainable tensors in registration order."""
        return tuple(t for layer in self.layers for t in layer.params)

    @property
    def params(self) -> int:
        """Trainable parameters (torchvision resnet50: 25,557,032; resnet152: 60,192,808)."""
        return sum(t.numel for t in self.tensors)

    @property
    def forward_flops(self) -> float:
        """Forward FLOPs of one image."""
        return sum(layer.flops for layer in self.layers)

    def summary_line(self) -> str:
        blocks = "-".join(str(b) for b in BLOCKS[self.depth])
        return (f"{self.name}: ResNet-{self.depth} (bottleneck blocks {blocks}), "
                f"{self.image_size}² input, {self.num_classes} classes, "
                f"{self.params / 1e6:.3f} M params, {self.forward_flops / 1e9:.2f} GFLOP/image")
