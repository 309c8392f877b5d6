"""A check shared by the tests of plans the vectorised search tier leaves to the exact one."""

from __future__ import annotations

import ddlsim

__all__ = ["assert_searched_by_the_exact_tier"]


def assert_searched_by_the_exact_tier(cfg: dict, predict) -> None:
    """``cfg`` (a run config with a ``search`` over ``train.micro_batch_size`` [1, 2]) is
    searched plan by plan by the exact engine, and its best plan's time is
    ``predict(plan)``'s, bit for bit."""
    frame = ddlsim.search(cfg, top=1)
    assert frame.attrs["tier"] == "exact" and len(frame) == 2
    plan = {k: v for k, v in cfg.items() if k != "search"}
    best = frame.iloc[0]
    plan["train"] = {**plan["train"], "micro_batch_size": int(best["train.micro_batch_size"])}
    assert best["iteration_time_s"] == predict(plan).iteration_time_s
