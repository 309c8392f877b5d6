"""The calibration profile's YAML document as validated records (``version: 1``): α-β
segments per communicator shape, compute-efficiency curves and the measured GEMM shapes and
message sizes kept beside them. :class:`~.profile.CalibrationProfile` queries them."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .schema import OPS

__all__ = ["Segment", "Points", "CommEntry", "GemmShapeTime", "ComputeEntry", "FirstTouchEntry",
           "ProfileDoc"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Segment(_Model):
    """``t = alpha_s + beta_s_per_B · bytes`` from ``min_bytes`` up to the next segment."""

    min_bytes: float = Field(ge=0)
    max_bytes: float | None = Field(default=None, ge=0, description="largest measured size")
    alpha_s: float = Field(ge=0)
    beta_s_per_B: float = Field(ge=0)
    alpha_ci_s: tuple[float, float] | None = None
    beta_ci_s_per_B: tuple[float, float] | None = None
    alpha_se_s: float | None = None
    beta_se_s_per_B: float | None = None
    corr_alpha_beta: float | None = None
    n_points: int | None = None
    rel_rmse: float | None = None
    source: str | None = None


class Points(_Model):
    bytes: list[float]
    time_s: list[float]


class CommEntry(_Model):
    """One communicator shape of one backend and operation."""

    backend: str
    op: Literal[OPS]  # type: ignore[valid-type]
    scope: Literal["intra", "inter"]
    ranks: int = Field(ge=1)
    nodes: int = Field(ge=1)
    ranks_per_node: int = Field(ge=0, description="0: nodes hold different numbers of ranks")
    variant: Literal["", "streaming"] = ""
    library: str = ""
    library_version: str = ""
    rel_rmse: float | None = None
    bic: float | None = None
    segments: list[Segment] = Field(min_length=1)
    points: Points | None = None
    #: times measured at the very message sizes a run issues, beside its iterations (not
    #: fitted: :mod:`.sizes`); a query of one of these sizes on ``ranks`` takes its time
    sizes: Points | None = None
    source: str | None = None

    @model_validator(mode="after")
    def _ordered(self) -> "CommEntry":
        starts = [s.min_bytes for s in self.segments]
        if starts != sorted(starts) or len(set(starts)) != len(starts):
            raise ValueError(f"segments must have strictly increasing min_bytes, got {starts}")
        return self

    @property
    def measured_bytes(self) -> tuple[float, float]:
        """(smallest, largest) message size in bytes this entry was measured on.

        From its fitted points when it keeps them; otherwise from its segments: the first
        ``min_bytes`` to the last ``max_bytes`` (infinite when the entry states none, as an
        entry built by hand from published figures may).
        """
        if self.points is not None and self.points.bytes:
            return min(self.points.bytes), max(self.points.bytes)
        hi = self.segments[-1].max_bytes
        return self.segments[0].min_bytes, math.inf if hi is None else hi

    def size_time_s(self, nbytes: float) -> float | None:
        """The time measured at ``nbytes`` itself (:attr:`sizes`, within one float32
        element per rank or the profile's 7 significant digits), or None."""
        for b, t in zip(*(self.sizes.bytes, self.sizes.time_s) if self.sizes else ((), ())):
            if abs(b - nbytes) <= max(4 * self.ranks, 1e-6 * nbytes):
                return t
        return None

    def segment(self, nbytes: float) -> tuple[int, Segment]:
        """The segment that covers ``nbytes`` (first below its range, last above)."""
        i = 0
        while i + 1 < len(self.segments) and nbytes >= self.segments[i + 1].min_bytes:
            i += 1
        return i, self.segments[i]


class GemmShapeTime(_Model):
    """One GEMM shape as measured: ``batch`` × ``[m,k]·[k,n]`` took ``seconds``."""

    m: int = Field(ge=1)
    n: int = Field(ge=1)
    k: int = Field(ge=1)
    batch: int = Field(default=1, ge=1)
    seconds: float = Field(gt=0)


class ComputeEntry(_Model):
    """Achieved FLOP/s ``R(x) = rate_max · x/(x + x_half)`` of calls of *x* FLOPs; and, for
    GEMMs, each measured shape's own time (``shapes``), which times that shape exactly:
    GEMMs of equal FLOPs but other shapes run at other rates (a stack of thin attention
    GEMMs, ``k = 64``, below the squares of its size on a CPU: docs/validation.md)."""

    backend: str
    device: str
    kind: Literal["gemm", "attention"]
    dtype: str
    rate_max_flops_per_s: float = Field(gt=0)
    x_half_flops: float = Field(ge=0)
    peak_flops_per_s: float | None = Field(default=None, gt=0)
    rel_rmse: float | None = None
    n_points: int | None = None
    points: dict[str, list[float]] | None = None
    shapes: list[GemmShapeTime] | None = None
    source: str | None = None

    def shape_seconds(self, shape: tuple[float, float, float], batch: float) -> float | None:
        """Seconds measured for exactly ``batch`` × ``shape`` (M, N, K), or None."""
        want = (*(round(x) for x in shape), round(batch))
        for s in self.shapes or ():
            if (s.m, s.n, s.k, s.batch) == want:
                return s.seconds
        return None


class FirstTouchEntry(_Model):
    """The host's first-touch cost as measured (:mod:`.firsttouch`): the CPU time of copying
    ``bytes`` into fresh memory (``fresh_s``) and into the same memory again (``warm_s``),
    over ``repeats`` fresh buffers, their ``statistic`` (``mean`` since the buffers are held
    as the proxies hold theirs; ``median`` in profiles written before); their difference per
    page."""

    s_per_page: float = Field(gt=0)
    page_bytes: int = Field(ge=512)
    bytes: int = Field(ge=512)
    repeats: int = Field(ge=1)
    fresh_s: float = Field(gt=0)
    warm_s: float = Field(ge=0)
    clock: str
    statistic: Literal["median", "mean"] = "median"
    measured_utc: str
    source: str


class ProfileDoc(_Model):
    """The YAML document (``version: 1``)."""

    version: Literal[1]
    kind: Literal["ddlsim-calibration-profile"] = "ddlsim-calibration-profile"
    name: str | None = None
    provenance: dict = Field(default_factory=dict)
    comm: list[CommEntry] = Field(default_factory=list)
    compute: list[ComputeEntry] = Field(default_factory=list)
    #: the host's first-touch cost (``ddlsim calibrate first-touch``); charged to buffers a
    #: program allocates fresh every iteration (:mod:`ddlsim.workloads.freshbuffers`)
    first_touch: FirstTouchEntry | None = None
