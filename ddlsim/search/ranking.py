"""What both search tiers return: the grid's outcome, its metrics, and the ranking.

:mod:`.evaluate` (the vectorised tier) and :mod:`.exact` (plan by plan) build their frames
with these columns and rank them with :func:`rank`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..errors import ConfigError
from .spec import OBJECTIVES

__all__ = ["Grid", "DOES_NOT_FIT", "METRICS", "rank", "pareto_mask", "with_costs",
           "setting_column"]

#: The reason of a plan over device memory when the search must fit.
DOES_NOT_FIT = "does not fit in device memory"

#: the columns each tier gives every evaluated plan
METRICS = ("iteration_time_s", "memory_per_device_bytes", "capacity_bytes", "fits", "gpus",
           "tokens_per_s", "mfu")


class Grid(NamedTuple):
    """The outcome of evaluating a grid."""

    frame: Any                  # pandas.DataFrame of the evaluated plans, best first
    rejected: dict[str, int]    # reason → plans, most frequent first
    total: int                  # plans enumerated


def setting_column(values):
    """A frame column of a config setting's values as given: a column mixing ``None`` (the
    setting left to its default) and text is kept as Python objects, since pandas would store
    it as a string column whose ``None`` reads back as NaN (and a plan rebuilt from the row
    would set the text ``'NaN'``); other columns are pandas' own inference."""
    import pandas as pd

    values = list(values)
    if any(v is None for v in values) and any(isinstance(v, str) for v in values):
        return pd.Series(values, dtype=object)
    return values


def with_costs(frame, tokens, price: float | None):
    """``frame`` with ``cost_per_iteration`` (GPU-hours × ``price``) and
    ``cost_per_million_tokens`` (``tokens``: each plan's tokens per iteration), when a
    price is given and there are plans."""
    if price is not None and len(frame):
        frame["cost_per_iteration"] = frame["iteration_time_s"] * frame["gpus"] * price / 3600
        frame["cost_per_million_tokens"] = frame["cost_per_iteration"] / tokens * 1e6
    return frame


def rank(frame, objective: str):
    """``frame`` sorted by ``objective`` (ties by plan number), with ``rank`` from 1 and
    ``pareto``: no other plan is both faster and lighter on memory."""
    column, sense = OBJECTIVES[objective]
    if len(frame) == 0:
        return frame.assign(rank=[], pareto=[])
    if column not in frame:
        raise ConfigError(f"objective {objective!r} needs price_per_gpu_hour")
    key = frame[column] if sense == "min" else -frame[column]
    order = np.lexsort((frame["plan"].to_numpy(), key.to_numpy()))
    frame = frame.iloc[order].reset_index(drop=True)
    frame.insert(0, "rank", np.arange(1, len(frame) + 1))
    frame["pareto"] = pareto_mask(frame["iteration_time_s"].to_numpy(),
                                  frame["memory_per_device_bytes"].to_numpy())
    return frame


def pareto_mask(time_s: np.ndarray, memory: np.ndarray) -> np.ndarray:
    """True for the plans no other plan beats on both time and memory (ties kept once: the
    first in time, then memory order)."""
    order = np.lexsort((memory, time_s))
    best = np.minimum.accumulate(memory[order])
    prev = np.concatenate([[np.inf], best[:-1]])
    on = np.zeros(len(time_s), dtype=bool)
    on[order] = memory[order] < prev
    return on
