"""``model.compute: model | proxy`` and ``model.proxy_timings``, as every family reads them.

With ``compute: proxy`` a workload's compute ops take the proxy's own ``usleep`` constants
(``Compute.seconds``) instead of the cost model, so a prediction answers "what would this MPI
proxy print on that cluster". The timings are written with units (``"119 ms"``); a missing
one, an unknown one, or timings given with ``compute: model`` is an error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from .. import units
from ..errors import did_you_mean

__all__ = ["ComputeMode", "ProxySeconds", "ProxyTimings", "check_proxy_timings"]

ComputeMode = Literal["model", "proxy"]
_MAX_S = 3600.0  # an hour per compute phase: any larger value is a unit mistake


def _seconds(v: Any) -> float:
    if isinstance(v, bool):
        raise ValueError(f"expected a duration such as '1.5 ms', got the boolean {str(v).lower()}")
    try:
        s = units.parse_quantity(v, "time")
    except units.UnitError as exc:
        raise ValueError(str(exc)) from None
    if not 0.0 <= s <= _MAX_S:
        raise ValueError(f"a proxy timing of {v!r} is outside 0 s .. 1 h (a bare number is in "
                         "seconds: write '119 ms', not 119)")
    return s


#: A duration given with units, in seconds inside.
ProxySeconds = Annotated[float, BeforeValidator(_seconds)]
ProxyTimings = dict[str, ProxySeconds] | None
TIMINGS_FIELD = Field(default=None, description="with compute: proxy, the proxy's usleep "
                      "constants by name, with units")


def check_proxy_timings(compute: str, timings: Mapping[str, float] | None,
                        required: Iterable[str], family: str) -> None:
    """Raise ``ValueError`` unless ``timings`` suit ``compute`` for ``family``.

    ``compute: proxy`` needs exactly the names in ``required``; ``compute: model`` takes none.
    """
    need = tuple(required)
    if compute == "model":
        if timings is not None:
            raise ValueError(f"model.proxy_timings is given but model.compute is 'model': the "
                             f"timings would be ignored; set compute: proxy to use them, or "
                             f"remove proxy_timings")
        return
    have = dict(timings or {})
    missing = [n for n in need if n not in have]
    if missing:
        raise ValueError(f"model.compute = 'proxy' needs model.proxy_timings.{missing[0]} (the "
                         f"{family} family's proxy timings are {', '.join(need)}; write the "
                         f"proxy's usleep constants with units, '0 s' for a comm_only proxy)")
    extra = [n for n in have if n not in need]
    if extra:
        raise ValueError(f"model.proxy_timings.{extra[0]} is not a timing of the {family} "
                         f"family{did_you_mean(extra[0], need)}; allowed: {', '.join(need)}")
