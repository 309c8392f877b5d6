"""The field types every section of a run config shares: units read at the boundary,
plausibility bounds, counts that refuse booleans, and the strict base model.

Re-exported by :mod:`ddlsim.config`, the place to import them from.
"""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from . import units
from .limits import check_bound

__all__ = ["Dtype", "DTYPE_BYTES", "reject_bool", "count_type", "Bytes", "Bandwidth", "Seconds",
           "Flops", "BucketBytes", "Real", "DeviceId", "ModelBase"]

Dtype = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


def reject_bool(v: Any) -> Any:
    """Refuse ``true``/``false`` where a number is expected (pydantic would read them as 1/0)."""
    if isinstance(v, bool):
        raise ValueError(f"expected a number, got the boolean {str(v).lower()}")
    return v


def _bounded(name: str) -> AfterValidator:
    """The plausibility bound ``limits.BOUNDS[name]``, with its reason in the error."""
    return AfterValidator(partial(check_bound, name=name))


def count_type(bound: str) -> Any:
    """A positive whole number, never a boolean, within ``limits.BOUNDS[bound]`` (checked
    before the conversion to int too, so ``1e30`` is refused with the bound's reason)."""
    def early(v: Any) -> Any:
        v = reject_bool(v)
        return check_bound(v, bound) if isinstance(v, (int, float)) and v == v else v
    return Annotated[int, BeforeValidator(early), Field(gt=0), _bounded(bound)]


def _quantity(kind: str, bound: str, **field: Any) -> Any:
    """A float read with a unit of ``kind``, finite and within ``limits.BOUNDS[bound]``."""
    def parse(v: Any) -> Any:
        try:
            return v if v is None else units.parse_quantity(v, kind)
        except units.UnitError as exc:
            raise ValueError(str(exc)) from None
    return Annotated[(float, BeforeValidator(parse), Field(**field), _bounded(bound))]


Bytes = _quantity("bytes", "memory_bytes", gt=0)
Bandwidth = _quantity("bandwidth", "bandwidth", gt=0)
Seconds = _quantity("time", "latency", ge=0)
Flops = _quantity("flops", "flops", gt=0)
BucketBytes = _quantity("bytes", "bucket_bytes", gt=0)
#: A float that is not a boolean (finite: every model sets ``allow_inf_nan=False``).
Real = Annotated[float, BeforeValidator(reject_bool)]
DeviceId = Annotated[int, BeforeValidator(reject_bool), Field(ge=0, le=10**7)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True,
                              allow_inf_nan=False)


class ModelBase(_Strict):
    """What every model section has; each workload family's schema (an arm of the union
    discriminated on ``architecture``, see :mod:`ddlsim.workloads.registry`) extends it.
    Re-exported by :mod:`ddlsim.config`."""

    name: str = "custom"
    architecture: str
    source: str | None = None
