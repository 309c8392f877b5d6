"""The ``search:`` section of a run config: axes, constraints, objective.

.. code-block:: yaml

    search:
      axes:                                   # parallel.*, train.*, model.*, system.software, system.preset
        parallel.tensor_model_parallel_size: [1, 2, 4, 8]
        parallel.pipeline_model_parallel_size: "1:64:*2"   # a range, as ddlsim sweep reads it
        train.recompute: [none, selective, full]
      constraints:
        must_fit: true                        # plans over device memory are rejected
        max_gpus: 1024                        # TP·PP·DP at most this
        global_batch_size: 1536               # fixed (default: the train section's)
      objective: time                         # time | tokens_per_s | mfu | cost
      price_per_gpu_hour: 2.5                 # per GPU-hour (cost; optional otherwise)
      currency: USD                           # what the price is in (default USD), shown by the tables
      top: 10                                 # plans re-evaluated by the exact engine

Only ``ddlsim search`` (and :func:`ddlsim.search`) reads this section; ``ddlsim predict``
refuses a config that has one rather than ignore it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from ..errors import ConfigError, did_you_mean

__all__ = ["SearchSpec", "Constraints", "OBJECTIVES", "parse_search_section", "check_axes"]

#: objective → (result column, "min" or "max")
OBJECTIVES = {"time": ("iteration_time_s", "min"), "tokens_per_s": ("tokens_per_s", "max"),
              "mfu": ("mfu", "max"), "cost": ("cost_per_million_tokens", "min")}
#: Sections an axis may vary: the plan, the training settings and the model's own fields
#: (a CosmoFlow spatial grid, a layer count): each model value is a context of its own.
AXIS_SECTIONS = ("parallel", "train", "model")
#: System fields an axis may vary as a whole: the software stack (a name, or a mapping with
#: ``stack`` and overrides) and the cluster preset (``dgx-a100``, ``dgx-h100``, …)
SYSTEM_AXES = ("system.software", "system.preset")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Constraints(_Strict):
    """What every plan must satisfy."""

    must_fit: StrictBool = True
    max_gpus: Annotated[StrictInt, Field(ge=1)] | None = None
    global_batch_size: Annotated[StrictInt, Field(ge=1)] | None = None


class SearchSpec(_Strict):
    """The ``search:`` section, validated."""

    axes: dict[str, list[Any] | str] = Field(default_factory=dict)
    constraints: Constraints = Constraints()
    objective: Literal["time", "tokens_per_s", "mfu", "cost"] = "time"
    price_per_gpu_hour: Annotated[float, Field(gt=0)] | None = None
    currency: Annotated[str, Field(pattern=r"^[A-Za-z€$£¥]{1,8}$")] = "USD"
    top: Annotated[StrictInt, Field(ge=0, le=1000)] = 10


def parse_search_section(section: Any, where: str = "search", limits: Any = None) -> SearchSpec:
    """The ``search:`` mapping as a :class:`SearchSpec`; every problem in one paragraph.

    Axis values given as a string are read as ``ddlsim sweep --set-range`` reads them
    (``"1:64:*2"``, ``"1,2,4"``); every value, from a string or a list, is then checked by
    its field's own validator (:func:`ddlsim.fieldcheck.check_field_values`: a boolean is no
    count, 2.5 no tensor-parallel size). ``limits.axis_values`` bounds each axis's length,
    counted before a range is expanded.
    """
    from ..fieldcheck import check_field_values
    from ..limits import check_budget
    from ..sweeps import SweepError, parse_values

    if section is None:
        section = {}
    if not isinstance(section, dict):
        raise ConfigError(f"{where} must be a mapping with keys axes, constraints, objective, "
                          f"price_per_gpu_hour, currency, top; got {type(section).__name__}")
    try:
        spec = SearchSpec.model_validate(section)
    except ValidationError as exc:
        raise ConfigError(_paragraph(exc, where)) from None
    axes = {}
    for path, values in spec.axes.items():
        if isinstance(values, str):
            try:
                values = parse_values(values, f"{where}.axes.{path}", limits)
            except SweepError as exc:
                raise ConfigError(str(exc)) from None
        check_budget({"axis_values": len(values)}, limits, f"{where}.axes.{path}")
        if not values:
            raise ConfigError(f"{where}.axes.{path} has no values; give a list such as "
                              "[1, 2, 4] or a range such as '1:64:*2'")
        axes[path] = check_field_values(path, values, f"{where}.axes.{path}",
                                        keep_text=False)
    if spec.objective == "cost" and spec.price_per_gpu_hour is None:
        raise ConfigError(f"{where}.objective = 'cost' needs {where}.price_per_gpu_hour (the "
                          "price of one GPU for one hour, e.g. 2.5)")
    return spec.model_copy(update={"axes": axes})


def _paragraph(exc: ValidationError, where: str) -> str:
    known = {"": list(SearchSpec.model_fields), "constraints": list(Constraints.model_fields)}
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"] if not str(x).startswith(("list[", "str")))
        key = str(err["loc"][-1]) if err["loc"] else ""
        parent = ".".join(str(x) for x in err["loc"][:-1])
        if err["type"] == "extra_forbidden":
            allowed = known.get(parent, [])
            parts.append(f"{where}.{loc} is not a field{did_you_mean(key, allowed)}; allowed: "
                         f"{', '.join(allowed)}")
        else:
            parts.append(f"{where}.{loc} = {err.get('input')!r}: {err['msg']}")
    return "; ".join(parts)


def check_axes(axes: dict[str, list[Any]], base: dict, fixed_batch: bool) -> None:
    """Refuse an axis outside ``parallel.*`` / ``train.*`` / ``model.*`` / :data:`SYSTEM_AXES`,
    a field the config does not have, or ``train.global_batch_size`` together with the fixed-batch
    constraint."""
    from ..sweeps import _lookup

    for path in axes:
        if path in SYSTEM_AXES:
            continue
        section = path.split(".", 1)[0]
        if section not in AXIS_SECTIONS or "." not in path:
            raise ConfigError(f"search.axes: {path!r} is not a parallel.*, train.* or model.* "
                              f"field, nor one of {', '.join(SYSTEM_AXES)}; a search varies the "
                              "plan, the training settings, the model's fields, the software "
                              "stack and the cluster preset (use ddlsim sweep --set-range for "
                              "other system what-ifs)")
        try:
            _lookup(base, path)
        except KeyError as exc:
            raise ConfigError(f"search.axes: cannot vary {path!r}: {exc.args[0]}") from None
    if fixed_batch and "train.global_batch_size" in axes:
        raise ConfigError("search.axes varies train.global_batch_size but "
                          "search.constraints.global_batch_size fixes it; drop one")
