"""``model.compute: model | proxy`` and ``model.proxy_timings``, as every family reads them.

With ``compute: proxy`` a workload's compute ops take the proxy's own ``usleep`` constants
(``Compute.seconds``) instead of the cost model, so a prediction answers "what would this MPI
proxy print on that cluster". The timings are written with units (``"119 ms"``); a missing
one, an unknown one, or timings given with ``compute: model`` is an error.

A ``usleep(T)`` lasts longer than ``T`` on Linux: the kernel lets a normal thread's sleep
end up to its *timer slack* late, so that wake-ups can be batched, and an otherwise idle
core wakes the thread at the end of that window (:func:`usleep_s`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from .. import units
from ..errors import did_you_mean

__all__ = ["ComputeMode", "ProxySeconds", "ProxyTimings", "TIMER_SLACK_S", "check_proxy_timings",
           "usleep_s"]

ComputeMode = Literal["model", "proxy"]
_MAX_S = 3600.0  # an hour per compute phase: any larger value is a unit mistake

#: Linux's default timer slack of a normal (non-real-time) thread, seconds: prctl(2),
#: PR_SET_TIMERSLACK, "The default value for the timer slack of a thread is 50
#: microseconds" (the kernel's init_task.timer_slack_ns = 50000; /proc/<pid>/timerslack_ns).
#: On this project's 2-core machine a niced C ``usleep(T)`` took T + 55-66 us (median of 200
#: each, T = 1-910 us; docs/validation.md, "The seed's C++ proxies on this machine").
TIMER_SLACK_S = 50e-6


def usleep_s(t: float | None) -> float | None:
    """Wall seconds of a proxy's ``usleep(t)`` on Linux: ``t`` plus the timer slack.

    Parameters
    ----------
    t : float or None
        The proxy's sleep argument, seconds; 0 (a part the proxy does not sleep for: no
        call) and None (``compute: model``) are returned as they are.

    Returns
    -------
    float or None
        ``t + TIMER_SLACK_S`` for ``t > 0``.

    References
    ----------
    prctl(2), PR_SET_TIMERSLACK (the 50 us default); Linux kernel/time/hrtimer.c,
    hrtimer_nanosleep (the sleep's expiry range is [t, t + current->timer_slack_ns], slack 0
    for real-time tasks only; the core's timer is programmed for the end of the range unless
    another timer interrupt comes first).
    """
    return t + TIMER_SLACK_S if t else t


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
            raise ValueError("model.proxy_timings is given but model.compute is 'model': the "
                             "timings would be ignored; set compute: proxy to use them, or "
                             "remove proxy_timings")
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
