"""The ``cosmoflow`` model section: the MLPerf HPC CosmoFlow 3-D CNN and its spatial plan.

Layer list of the MLPerf HPC reference (mlcommons/hpc, ``cosmoflow/models/cosmoflow.py``,
``build_model``): ``n_conv_layers`` blocks of Conv3D (``conv_size·2^i`` filters, ``padding=
'same'``) → LeakyReLU → MaxPool3D(2), then Flatten → Dense(fc1) → LeakyReLU → Dropout →
Dense(fc2) → LeakyReLU → Dropout → Dense(target_size, tanh) → ×1.2.

The plan fields of the family live here too (PROXY_COMMON: not in ``ddlsim/config.py``):
``spatial_grid`` (each sample's volume split over ``px × py × pz`` ranks, the
tensor-model-parallel axis of the mesh), ``halo_overlap``, and the options that reproduce
the departures of the seed's MPI proxy (``proxies/cosmoflow.cpp``) from the model, each
defaulting to the model's behaviour (docs/workloads/cosmoflow.md).
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, StrictBool, model_validator

from ...config import ModelBase, count_type, reject_bool
from ...errors import did_you_mean

__all__ = ["CosmoFlowModel", "timing_keys"]

_MAX_TIMING_S = 3600.0


def _duration(v: object) -> float:
    """A proxy compute time: a number of seconds or a string with a time unit."""
    from ...units import parse_time

    v = reject_bool(v)
    s = parse_time(v) if isinstance(v, str) else v
    if not isinstance(s, (int, float)) or not math.isfinite(s) or not 0 <= s <= _MAX_TIMING_S:
        raise ValueError(f"a proxy timing must be a time between 0 and 1 h, e.g. '6567 us'; "
                         f"got {v!r}")
    return float(s)


Duration = Annotated[float, BeforeValidator(_duration)]
_Side = Annotated[int, BeforeValidator(reject_bool), Field(ge=1, le=2**16)]
_Kernel = Annotated[int, BeforeValidator(reject_bool), Field(ge=1, le=15)]
_Grid = Annotated[int, BeforeValidator(reject_bool), Field(ge=1, le=4096)]


def timing_keys(n_conv: int, n_dense: int) -> list[str]:
    """The keys ``proxy_timings`` must hold: ``forward.<layer>`` in forward order,
    ``backward.<layer>`` in backward order, and ``optimizer``."""
    layers = [f"conv{i}" for i in range(n_conv)] + [f"dense{j}" for j in range(n_dense)]
    return ([f"forward.{n}" for n in layers] + [f"backward.{n}" for n in reversed(layers)]
            + ["optimizer"])


class CosmoFlowModel(ModelBase):
    """CosmoFlow: 3-D convolutions on ``input_shape`` volumes, pooling, dense layers."""

    architecture: Literal["cosmoflow"] = "cosmoflow"
    input_shape: tuple[_Side, _Side, _Side, _Side] = Field(
        default=(128, 128, 128, 4), description="x, y, z, channels (MLPerf HPC: 128³×4)")
    conv_size: count_type("hidden_size") = Field(
        default=32, description="filters of the first conv; doubled at every conv layer")
    n_conv_layers: count_type("layers") = 5
    kernel_size: _Kernel = Field(default=3, description="cubic kernel side, 'same' padding")
    pool_size: _Kernel = Field(default=2, description="MaxPool3D size and stride")
    fc_sizes: tuple[count_type("hidden_size"), ...] = (128, 64)
    target_size: count_type("hidden_size") = 4
    spatial_grid: tuple[_Grid, _Grid, _Grid] = Field(
        default=(1, 1, 1), description="px, py, pz: each sample split over px·py·pz ranks "
                                       "(= parallel.tensor_model_parallel_size)")
    halo_overlap: StrictBool = Field(
        default=False, description="compute the interior while the halos are in flight")
    compute: Literal["model", "proxy"] = "model"
    proxy_timings: dict[str, Duration] | None = None
    forward_halo: Literal["input", "previous_output"] = Field(
        default="input", description="input: the conv's own (pooled) input, the model; "
        "previous_output: the previous conv's output before pooling (cosmoflow.cpp:33)")
    input_halo: Literal["exchange", "loaded"] = Field(
        default="exchange", description="exchange: conv0 exchanges its input's halo; loaded: "
        "the reader loads it with the sub-volume (cosmoflow.cpp:72 starts at layer 1)")
    conv_grad_allreduce: Literal["world", "spatial_then_data"] = Field(
        default="world", description="world: one all-reduce of a conv layer's weight gradients "
        "over every rank (spatial partial sums and replicas at once), as the proxy "
        "(cosmoflow.cpp:118); spatial_then_data: over the spatial group, then over dp")
    backward_halo: Literal["before_compute", "after_compute"] = Field(
        default="before_compute", description="before_compute: dY's halo before the conv's "
        "backward, the model; after_compute: after it (cosmoflow.cpp:99-111)")

    @property
    def n_dense_layers(self) -> int:
        return len(self.fc_sizes) + 1

    @model_validator(mode="after")
    def _check(self) -> "CosmoFlowModel":
        shrink = self.pool_size ** self.n_conv_layers
        sides = self.input_shape[:3]
        if any(s % shrink for s in sides):
            raise ValueError(f"input_shape = {list(self.input_shape)}: each side must be "
                             f"divisible by pool_size^n_conv_layers = {self.pool_size}^"
                             f"{self.n_conv_layers} = {shrink}, as every conv layer is followed "
                             "by a MaxPool3D that halves it without padding")
        if self.halo_overlap and self.backward_halo == "after_compute":
            raise ValueError("halo_overlap = true needs backward_halo = 'before_compute': with "
                             "'after_compute' (the proxy's order) the backward halo follows the "
                             "layer's compute, so there is no compute left to overlap it with")
        self._check_timings()
        return self

    def _check_timings(self) -> None:
        t = self.proxy_timings
        if self.compute == "model":
            if t is not None:
                raise ValueError("proxy_timings is given but compute = 'model' times the layers "
                                 "with the cost model; set compute: proxy to use them, or remove "
                                 "proxy_timings")
            return
        keys = timing_keys(self.n_conv_layers, self.n_dense_layers)
        if not t:
            raise ValueError(f"compute = 'proxy' needs proxy_timings with the keys "
                             f"{', '.join(keys)} (the proxy's usleep times)")
        unknown = [k for k in t if k not in keys]
        if unknown:
            raise ValueError(f"proxy_timings has unknown key {unknown[0]!r}"
                             f"{did_you_mean(unknown[0], keys)}; allowed: {', '.join(keys)}")
        missing = [k for k in keys if k not in t]
        if missing:
            raise ValueError(f"proxy_timings lacks {', '.join(missing)}: compute = 'proxy' "
                             "takes every layer's time from it (write '0 us' for a step the "
                             "proxy does not time)")
